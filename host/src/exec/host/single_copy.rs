//! Large all_gather on the host backend in one copy: each rank copies the peers'
//! parts straight from their buffers into its own with `process_vm_readv` (the kernel copies
//! from the other process's memory; no shared mapping of the user's buffers is needed), where
//! the usual way moves every byte twice (into a FIFO, out of it).
//!
//! Runs on the board of small collectives (`board`), which every communicator whose ranks
//! share a host has ([`SingleCopyOp`]): a call takes a board entry with no data, whose header
//! carries the address of the rank's part in its own process; it stores its arrival, then for
//! each peer it needs waits for that peer's arrival, checks the header (signature, call number)
//! and copies the peer's part from that address. It then stores `DONE` and waits until every
//! rank that reads its buffer has stored it too, so no buffer is left while a peer still
//! reads it. A copy that fails ends the call with an error on that rank (the kernel refuses an
//! unmapped address: never a crash) and the others learn it from the failure's announcement.
//!
//! Taken (coll decides: `coll::small`) where the board is and every rank found at the board's
//! making that it may read every peer's memory (same user, no ptrace rule against it:
//! `Board::single_copy`), for parts of at least [`threshold`] (`RUSTCCL_HOST_SINGLE_COPY_BYTES`,
//! 256 KiB: on the 2-core development machine a 256 KiB `process_vm_readv` takes about 30 µs
//! against 48 for the FIFO path's two copies, and 4 MiB 0.65 ms against 1.7). Everything the
//! choice depends on is the same on every rank.
//!
//! Broadcast can run this way too ([`SingleCopyOp`] handles it) but does not take it: there the FIFO
//! path's two copies run at once on two cores (the root fills the next slot while a non-root
//! empties the last), and one `process_vm_readv`, slower than a copy on this machine, lost to
//! them in place (2 ranks, 4 MiB: 0.64–0.9 ms against 0.5–0.57); it won out of place only
//! (0.67–0.87 against 1.6–1.9), which the root alone knows.

use std::sync::atomic::Ordering;

use super::board::{Board, Entry, Route, ARRIVE, DONE};
use super::{HostCall, HostOp, Progress, Wait};
use crate::error::{Error, Result};
use crate::spec::Collective;
use crate::work::Way;

/// `RUSTCCL_HOST_SINGLE_COPY_BYTES`: the least bytes per rank of a call that copies straight
/// from the peers' buffers (0: never).
pub fn threshold() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| crate::params::env_int("RUSTCCL_HOST_SINGLE_COPY_BYTES").ok().flatten().map_or(256 << 10, |v| v.max(0) as usize))
}

/// Copies `bytes` from `remote` in process `pid` to `local` in this one (all of it, or an
/// error).
///
/// # Safety
/// `local` must be valid for writes of `bytes` bytes. `remote` is only read, by the kernel,
/// which checks it against the other process's mappings.
pub(super) unsafe fn read_remote(pid: u32, remote: u64, local: *mut u8, bytes: usize) -> Result<()> {
    let mut done = 0usize;
    while done < bytes {
        let l = libc::iovec { iov_base: unsafe { local.add(done) }.cast(), iov_len: bytes - done };
        let r = libc::iovec { iov_base: (remote as usize + done) as *mut libc::c_void, iov_len: bytes - done };
        // SAFETY: one local and one remote iovec, as built above; the caller vouches for the
        // local range, the kernel checks the remote one.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &l, 1, &r, 1, 0) };
        if n <= 0 {
            let e = std::io::Error::last_os_error();
            if n < 0 && e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::system(format!(
                "reading {} bytes at {:#x} of process {pid} (process_vm_readv): {e}; \
                 set RUSTCCL_HOST_SINGLE_COPY_BYTES=0 to copy through shared memory instead",
                bytes - done,
                remote as usize + done
            )));
        }
        done += n as usize;
    }
    Ok(())
}

/// Where a [`SingleCopyOp`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Take the (dataless) entry.
    Enter,
    /// Wait until no peer still reads the ring bytes the entry reuses.
    Reuse,
    /// Offer this rank's part, arrive, copy its own part out of place.
    Offer,
    /// Copy each source peer's part once it has arrived.
    Copy,
    /// Wait until every reader of this rank's buffer is done.
    Readers,
    Done,
}

/// One all_gather (or broadcast) by single copies (see the module docs), polled by the driver.
pub struct SingleCopyOp<'a> {
    board: &'a Board,
    call: HostCall,
    step: Step,
    number: u64,
    entry: Entry,
    /// Index into `sources()` (`Copy`) or `readers()` (`Readers`), or the peer (`Reuse`).
    at: usize,
}

impl<'a> SingleCopyOp<'a> {
    /// `call` (an all_gather or a broadcast) on `board`, which must allow single copies
    /// (`Board::single_copy`).
    pub fn new(board: &'a Board, call: HostCall) -> SingleCopyOp<'a> {
        SingleCopyOp { board, call, step: Step::Enter, number: 0, entry: Entry { start: 0, reuses: None }, at: 0 }
    }

    fn root(&self) -> Option<usize> {
        (self.call.coll == Collective::Broadcast).then_some(self.call.root)
    }

    /// The peers this rank reads from, in order: every peer (all_gather; from the next rank on,
    /// so that the ranks do not all read rank 0 first), or the root (a broadcast's non-root).
    fn source(&self, i: usize) -> Option<usize> {
        let (n, me) = (self.board.nranks(), self.board.rank());
        match self.root() {
            Some(r) if r == me => None,
            Some(r) => (i == 0).then_some(r),
            None => (i + 1 < n).then(|| (me + i + 1) % n),
        }
    }

    /// The peers that read this rank's buffer, in order.
    fn reader(&self, i: usize) -> Option<usize> {
        let (n, me) = (self.board.nranks(), self.board.rank());
        match self.root() {
            Some(r) if r != me => None,
            _ => (0..n).filter(|&p| p != me).nth(i),
        }
    }

    /// Where peer `p`'s part goes in the receive buffer.
    fn part_at(&self, p: usize) -> usize {
        match self.call.coll {
            Collective::AllGather => self.call.ctx.dst + p * self.call.part(),
            _ => self.call.ctx.dst,
        }
    }

    /// The peer this op waits for now, and the word and value it waits for.
    fn awaited(&self) -> Option<(usize, usize, u64)> {
        match self.step {
            Step::Reuse if self.at != self.board.rank() && self.at < self.board.nranks() => Some((self.at, ARRIVE, self.entry.reuses? + 1)),
            Step::Copy => Some((self.source(self.at)?, ARRIVE, self.number)),
            Step::Readers => Some((self.reader(self.at)?, DONE, self.number)),
            _ => None,
        }
    }

    fn reached(&self, p: usize, word: usize, value: u64) -> bool {
        self.board.word(p, word).load(Ordering::Acquire) >= value
    }
}

impl HostOp for SingleCopyOp<'_> {
    fn poll(&mut self) -> Result<Progress> {
        let (n, me) = (self.board.nranks(), self.board.rank());
        let part = self.call.part();
        let ctx = self.call.ctx;
        let mut moved = false;
        let waiting = |moved: bool| Ok(if moved { Progress::Moved } else { Progress::Waiting });
        loop {
            match self.step {
                Step::Enter => {
                    if !self.board.single_copy() {
                        return Err(Error::internal("single copies are off on this board"));
                    }
                    (self.number, self.entry) = self.board.take_entry(0);
                    self.at = 0;
                    self.step = if self.entry.reuses.is_some() { Step::Reuse } else { Step::Offer };
                }
                Step::Reuse => {
                    let reused = self.entry.reuses.unwrap_or(0);
                    while self.at < n {
                        if self.at != me && !self.board.arrived(self.at, reused + 1) {
                            return waiting(moved);
                        }
                        self.at += 1;
                    }
                    self.step = Step::Offer;
                }
                Step::Offer => {
                    // The part this rank offers, in its own process (the root's send buffer;
                    // in an in-place all_gather this rank's part of the receive buffer, which
                    // is the same).
                    let offers = self.root().is_none_or(|r| r == me);
                    let offer = if offers { ctx.src as u64 } else { 0 };
                    self.board.header(me, self.entry.start, 2).store(offer, Ordering::Relaxed);
                    self.board.arrive(&self.entry, self.number, ctx.sig);
                    let own_at = self.part_at(me);
                    if offers && ctx.src != own_at {
                        // SAFETY: the send buffer (`part` bytes) and this rank's part of the
                        // receive buffer, resolved by the backend; out of place they do not
                        // overlap (checked by the API).
                        unsafe { std::ptr::copy(ctx.src as *const u8, own_at as *mut u8, part) };
                    }
                    self.at = 0;
                    self.step = Step::Copy;
                }
                Step::Copy => {
                    while let Some(p) = self.source(self.at) {
                        if !self.board.arrived(p, self.number) {
                            return waiting(moved);
                        }
                        self.board.check_header(p, &self.entry, self.number, ctx.sig, self.call.seq)?;
                        let at = self.board.header(p, self.entry.start, 2).load(Ordering::Relaxed);
                        // SAFETY: part p of the receive buffer (`part` bytes inside the
                        // resolved receive buffer); the peer's part stays put until this rank
                        // stores DONE (below).
                        unsafe { read_remote(self.board.pid(p), at, self.part_at(p) as *mut u8, part)? };
                        self.at += 1;
                        moved = true;
                    }
                    self.board.word(me, DONE).store(self.number, Ordering::Release);
                    self.at = 0;
                    self.step = Step::Readers;
                }
                Step::Readers => {
                    // Nobody still reads this rank's buffer when it returns.
                    while let Some(p) = self.reader(self.at) {
                        if !self.reached(p, DONE, self.number) {
                            return waiting(moved);
                        }
                        self.at += 1;
                    }
                    self.board.count_single_copy();
                    self.step = Step::Done;
                }
                Step::Done => return Ok(Progress::Done),
            }
            moved = true;
        }
    }

    fn check_peers(&self) -> Result<()> {
        let Some((p, word, value)) = self.awaited() else { return Ok(()) };
        let mine = Route { seq: self.call.seq, way: Way::SingleCopy, sig: self.call.ctx.sig };
        self.board.check_route(p, mine, || !self.reached(p, word, value))
    }

    fn wait(&self) -> Wait {
        match self.awaited() {
            Some((p, ..)) => self.board.wait_for(p),
            None => Wait { spin: 0, naps: false },
        }
    }

    fn what(&self) -> String {
        format!("{} (single copy)", self.call.coll.spec().name)
    }
}
