//! Large collectives on the host backend straight between the ranks' buffers: each rank copies
//! from and to its peers' buffers with `process_vm_readv` / `process_vm_writev` (the kernel
//! copies between the two processes' memory; no shared mapping of the user's buffers is
//! needed), where the FIFO path moves every byte twice (into a FIFO, out of it).
//!
//! - **all_gather:** each rank reads every peer's part into its receive buffer.
//! - **reduce_scatter:** each rank reduces its own part: it reads that part of each peer's send
//!   buffer, a chunk at a time, into a scratch buffer and folds it into its output.
//! - **all_reduce:** each rank reduces its slice (`1/n`) so, into its receive buffer, and
//!   writes each reduced chunk into every peer's receive buffer while it is in cache. That
//!   slice of a peer's buffer is read by nobody else (in place it is the peer's input for this
//!   rank's slice, which this rank has already read), so the writes need no second handshake.
//! - **broadcast:** in place the work is split: each non-root reads the tail of the root's
//!   buffer while the root writes the head (`1/n` of it) into every non-root's buffer, so the
//!   root's and the non-roots' cores copy at once (on 2 ranks half each), as the FIFO path's
//!   two copies run at once. Out of place the root copies its own part and the non-roots
//!   read everything.
//!
//! Runs on the board of small collectives (`board`), which every communicator whose ranks
//! share a host has ([`SingleCopyOp`]): a call takes a board entry with no data, whose header
//! carries the addresses of the rank's buffers in its own process (and its PreMulSum scalar:
//! each rank's input is scaled by its own). It stores its arrival, waits for the arrival of
//! every peer it copies with, checks their headers (signature, call number), copies, then
//! stores `DONE` and waits until every such peer has stored it too: no buffer is left while a
//! peer still reads or writes it. A copy that fails ends the call with an error on that rank
//! (the kernel refuses an unmapped address: never a crash) and the others learn it from the
//! failure's announcement.
//!
//! Taken (coll decides: `coll::route`) where the board is and every rank found at the board's
//! making that it may reach every peer's memory (same user, no ptrace rule against it:
//! `Board::single_copy`), for calls of at least [`threshold`] bytes
//! (`RUSTCCL_HOST_SINGLE_COPY_BYTES`, 32 KiB; broadcasts from 8 times that,
//! `coll::route::BROADCAST_SINGLE_COPY_FACTOR`). On the 2-core development machine
//! (`rustccl-bench`, host backend, 2 ranks, 2026-12-07), from 64 KiB on (per rank) these are
//! faster than the FIFO path: all_reduce of 128 KiB 16 µs against 24, all_gather of 2 × 128 KiB
//! 9 against 15; all_reduce of 256 MiB in place 53 ms against 60, of 8 MiB 1.05 ms against
//! 1.8, broadcast of 8 MiB in place 0.5 ms against 1.0. Everything the choice depends on is
//! the same on every rank.

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use super::board::{Board, Entry, Route, ARRIVE, DONE};
use super::{HostCall, HostOp, Progress, Wait};
use crate::error::{Error, Result};
use crate::reduce::{DevOp, Reducer};
use crate::spec::Collective;
use crate::work::Way;

/// Bytes of a peer's input read and folded at a time (they stay in the core's cache between
/// the read and the fold).
const CHUNK: usize = 128 << 10;
/// Slices and split points fall on multiples of this many bytes (whole pages for the kernel's
/// copies) where the sizes allow.
const ALIGN: usize = 4096;

/// Header words of an entry (after the signature and the call number): the rank's send
/// buffer, its receive buffer and its PreMulSum scalar (`f64` bits), in its own process.
const SRC_WORD: usize = 2;
const DST_WORD: usize = 3;
const SCALAR_WORD: usize = 4;

/// `RUSTCCL_HOST_SINGLE_COPY_BYTES`: the least bytes of a call (one rank's send buffer) that
/// copies straight between the ranks' buffers (0: never).
pub fn threshold() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| crate::params::env_int("RUSTCCL_HOST_SINGLE_COPY_BYTES").ok().flatten().map_or(32 << 10, |v| v.max(0) as usize))
}

/// Copies `bytes` between `remote` in process `pid` and `local` in this one, all of it or an
/// error: from the remote range into the local one (`write` false: `process_vm_readv`) or the
/// other way (`process_vm_writev`).
///
/// # Safety
/// `local` must be valid for `bytes` bytes: for writes when reading, for reads when writing.
/// The remote range is only touched by the kernel, which checks it against the other
/// process's mappings.
unsafe fn remote_copy(pid: u32, remote: u64, local: *mut u8, bytes: usize, write: bool) -> Result<()> {
    let mut done = 0usize;
    while done < bytes {
        let l = libc::iovec { iov_base: unsafe { local.add(done) }.cast(), iov_len: bytes - done };
        let r = libc::iovec { iov_base: (remote as usize + done) as *mut libc::c_void, iov_len: bytes - done };
        // SAFETY: one local and one remote iovec, as built above; the caller vouches for the
        // local range, the kernel checks the remote one.
        let n = unsafe {
            if write {
                libc::process_vm_writev(pid as libc::pid_t, &l, 1, &r, 1, 0)
            } else {
                libc::process_vm_readv(pid as libc::pid_t, &l, 1, &r, 1, 0)
            }
        };
        if n <= 0 {
            let e = std::io::Error::last_os_error();
            if n < 0 && e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            let (what, call) = if write { ("writing", "process_vm_writev") } else { ("reading", "process_vm_readv") };
            return Err(Error::system(format!(
                "{what} {} bytes at {:#x} of process {pid} ({call}): {e}; \
                 set RUSTCCL_HOST_SINGLE_COPY_BYTES=0 to copy through shared memory instead",
                bytes - done,
                remote as usize + done
            )));
        }
        done += n as usize;
    }
    Ok(())
}

/// Copies `bytes` from `remote` in process `pid` to `local` in this one (all of it, or an
/// error).
///
/// # Safety
/// `local` must be valid for writes of `bytes` bytes. `remote` is only read, by the kernel,
/// which checks it against the other process's mappings.
pub(super) unsafe fn read_remote(pid: u32, remote: u64, local: *mut u8, bytes: usize) -> Result<()> {
    // SAFETY: as this function's contract.
    unsafe { remote_copy(pid, remote, local, bytes, false) }
}

/// Copies `bytes` from `local` in this process to `remote` in process `pid`.
///
/// # Safety
/// `local` must be valid for reads of `bytes` bytes. `remote` is only written by the kernel,
/// which checks it against the other process's mappings; the caller must know that the peer
/// lets it write there now (the peer's receive buffer, which the peer keeps until this rank
/// stores `DONE`).
unsafe fn write_remote(pid: u32, remote: u64, local: *const u8, bytes: usize) -> Result<()> {
    // SAFETY: as this function's contract; the kernel only reads the local range.
    unsafe { remote_copy(pid, remote, local.cast_mut(), bytes, true) }
}

/// Runs `f` with this thread's scratch buffer of [`CHUNK`] bytes (8-byte aligned, for any
/// element type).
fn with_scratch<R>(f: impl FnOnce(&mut [u8]) -> R) -> R {
    thread_local!(static SCRATCH: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) });
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < CHUNK / 8 {
            s.resize(CHUNK / 8, 0);
        }
        // SAFETY: the vector's own memory, CHUNK bytes of initialized u64s viewed as bytes.
        f(unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), CHUNK) })
    })
}

/// Elements `[lo, hi)` of `count` that rank `p` of `n` reduces in an all_reduce: `n` slices as
/// even as whole [`ALIGN`] blocks allow (the last ones may be short or empty).
fn slice_of(count: usize, elem: usize, n: usize, p: usize) -> (usize, usize) {
    let block = (ALIGN / elem).max(1);
    let per = count.div_ceil(n).next_multiple_of(block);
    let lo = (p * per).min(count);
    (lo, (lo + per).min(count))
}

/// Bytes at the head of a broadcast of `bytes` that the root writes into every non-root's
/// buffer (the non-roots read the rest): `1/n` of it, on a page boundary where it is large
/// enough, so that the root's writes to `n - 1` peers take as long as each peer's read.
fn pushed_head(bytes: usize, n: usize) -> usize {
    let head = bytes / n;
    if head >= ALIGN {
        head - head % ALIGN
    } else {
        head
    }
}

/// Where a [`SingleCopyOp`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Take the (dataless) entry.
    Enter,
    /// Wait until no peer still reads the ring bytes the entry reuses.
    Reuse,
    /// Publish this rank's buffers, arrive, copy its own part out of place.
    Offer,
    /// Wait for every peer this rank copies with to arrive.
    Arrivals,
    /// Copy (and reduce), then store `DONE`.
    Copy,
    /// Wait until every peer this rank copies with is done with its buffers.
    Peers,
    Done,
}

/// A peer's buffers and scalar as its header gives them.
#[derive(Clone, Copy, Debug)]
struct PeerBuffers {
    src: u64,
    dst: u64,
    scalar: f64,
}

/// One all_gather, all_reduce, reduce_scatter or broadcast by single copies (see the module
/// docs), polled by the driver.
pub struct SingleCopyOp<'a> {
    board: &'a Board,
    call: HostCall,
    step: Step,
    number: u64,
    entry: Entry,
    /// Index into the peers (`peer`) in `Arrivals` and `Peers`, or the peer in `Reuse`.
    at: usize,
    /// This rank's reducer (its PreMulSum scalar read when the call runs).
    reducer: Reducer,
}

impl<'a> SingleCopyOp<'a> {
    /// `call` (an all_gather, all_reduce, reduce_scatter or broadcast) on `board`, which must
    /// allow single copies (`Board::single_copy`).
    pub fn new(board: &'a Board, call: HostCall) -> SingleCopyOp<'a> {
        let reducer = call.ctx.reducer;
        SingleCopyOp { board, call, step: Step::Enter, number: 0, entry: Entry { start: 0, reuses: None }, at: 0, reducer }
    }

    fn root(&self) -> Option<usize> {
        (self.call.coll == Collective::Broadcast).then_some(self.call.root)
    }

    /// The peers this rank copies with (each reads or writes the other's buffers), in order:
    /// every peer from the next rank on (so that the ranks do not all start with rank 0), or
    /// for a broadcast's non-root the root alone.
    fn peer(&self, i: usize) -> Option<usize> {
        let (n, me) = (self.board.nranks(), self.board.rank());
        match self.root() {
            Some(r) if r != me => (i == 0).then_some(r),
            _ => (i + 1 < n).then(|| (me + i + 1) % n),
        }
    }

    /// Every peer of [`SingleCopyOp::peer`], in order.
    fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..).map_while(|i| self.peer(i))
    }

    /// The peer this op waits for now, and the word and value it waits for.
    fn awaited(&self) -> Option<(usize, usize, u64)> {
        match self.step {
            Step::Reuse if self.at != self.board.rank() && self.at < self.board.nranks() => Some((self.at, ARRIVE, self.entry.reuses? + 1)),
            Step::Arrivals => Some((self.peer(self.at)?, ARRIVE, self.number)),
            Step::Peers => Some((self.peer(self.at)?, DONE, self.number)),
            _ => None,
        }
    }

    fn reached(&self, p: usize, word: usize, value: u64) -> bool {
        self.board.word(p, word).load(Ordering::Acquire) >= value
    }

    fn buffers_of(&self, p: usize) -> PeerBuffers {
        let w = |i| self.board.header(p, self.entry.start, i).load(Ordering::Relaxed);
        PeerBuffers { src: w(SRC_WORD), dst: w(DST_WORD), scalar: f64::from_bits(w(SCALAR_WORD)) }
    }

    /// Publishes this rank's buffers and arrives; copies what it copies within itself.
    fn offer(&mut self) {
        let (me, ctx) = (self.board.rank(), self.call.ctx);
        self.reducer = ctx.host_reducer();
        let scalar = match self.reducer.op {
            DevOp::PreMulSum { scalar } => scalar,
            _ => 0.0,
        };
        for (i, v) in [(SRC_WORD, ctx.src as u64), (DST_WORD, ctx.dst as u64), (SCALAR_WORD, scalar.to_bits())] {
            self.board.header(me, self.entry.start, i).store(v, Ordering::Relaxed);
        }
        self.board.arrive(&self.entry, self.number, ctx.sig);
        let part = self.call.part();
        let own = match self.call.coll {
            // In place this rank's part of the receive buffer is its send buffer.
            Collective::AllGather => Some(ctx.dst + me * part),
            Collective::Broadcast if self.root() == Some(me) => Some(ctx.dst),
            _ => None,
        };
        if let Some(at) = own.filter(|&at| at != ctx.src) {
            // SAFETY: the send buffer (`part` bytes) and this rank's part of the receive
            // buffer, resolved by the backend; out of place they do not overlap (checked by
            // the API).
            unsafe { std::ptr::copy(ctx.src as *const u8, at as *mut u8, part) };
        }
    }

    /// Every copy of this rank (every peer it copies with has arrived and offered its buffers).
    fn copy(&self) -> Result<()> {
        let (n, me) = (self.board.nranks(), self.board.rank());
        let (ctx, part) = (self.call.ctx, self.call.part());
        match self.call.coll {
            Collective::AllGather => {
                for p in self.peers() {
                    // SAFETY: part p of the receive buffer (`part` bytes inside the resolved
                    // receive buffer); the peer's part stays put until this rank stores DONE.
                    unsafe { read_remote(self.board.pid(p), self.buffers_of(p).src, (ctx.dst + p * part) as *mut u8, part)? };
                }
            }
            Collective::Broadcast => {
                // Out of place the root copies its own part: then the non-roots read it all.
                let root = self.buffers_of(self.call.root);
                let head = if root.src == root.dst { pushed_head(part, n) } else { 0 };
                if self.root() == Some(me) {
                    for q in self.peers() {
                        // SAFETY: the head of the send buffer (`part` bytes resolved by the
                        // backend); the peer keeps its receive buffer until this rank stores
                        // DONE and reads only its tail meanwhile.
                        unsafe { write_remote(self.board.pid(q), self.buffers_of(q).dst, ctx.src as *const u8, head)? };
                    }
                } else {
                    // SAFETY: the tail of the receive buffer (`part` bytes resolved by the
                    // backend); the root writes only the head meanwhile.
                    unsafe { read_remote(self.board.pid(self.call.root), root.src + head as u64, (ctx.dst + head) as *mut u8, part - head)? };
                }
            }
            Collective::AllReduce => {
                let elem = self.call.dtype.size();
                let (lo, hi) = slice_of(self.call.count, elem, n, me);
                let (off, len) = (lo * elem, (hi - lo) * elem);
                self.reduce_slice(off, ctx.dst + off, len, true)?;
            }
            Collective::ReduceScatter => self.reduce_slice(me * part, ctx.dst, part, false)?,
            c => return Err(Error::internal(format!("{} does not run by single copies", c.spec().name))),
        }
        Ok(())
    }

    /// Reduces bytes `[off, off + len)` of every rank's send buffer into `out` (this rank's
    /// memory), a chunk at a time: each peer's chunk, in rank order, is read into the scratch
    /// and folded in (the first one together with this rank's own input, in one pass), then
    /// the post-op; an all_reduce then writes the chunk into every peer's receive buffer at
    /// the same offset while it is still in this core's cache (`push`).
    fn reduce_slice(&self, off: usize, out: usize, len: usize, push: bool) -> Result<()> {
        let (n, me, ctx) = (self.board.nranks(), self.board.rank(), self.call.ctx);
        // Each peer's buffers and reducer (its own PreMulSum scalar), read once per call.
        let peers: SmallVec<[(usize, PeerBuffers, Reducer); 8]> = (0..n)
            .filter(|&p| p != me)
            .map(|p| {
                let theirs = self.buffers_of(p);
                let reducer = match self.reducer.op {
                    DevOp::PreMulSum { .. } => Reducer::new(self.reducer.dtype, DevOp::PreMulSum { scalar: theirs.scalar }),
                    _ => self.reducer,
                };
                (p, theirs, reducer)
            })
            .collect();
        with_scratch(|scratch| {
            let mut done = 0;
            while done < len {
                let l = CHUNK.min(len - done);
                let (own, at) = (ctx.src + off + done, out + done);
                // SAFETY: `l` bytes of the receive buffer and of the send buffer at the same
                // offset of this rank's slice, both resolved by the backend; in place they are
                // the same bytes (then only `acc` is used), else they do not overlap.
                let acc = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, l) };
                for (k, &(p, theirs, reducer)) in peers.iter().enumerate() {
                    // SAFETY: the scratch holds CHUNK ≥ `l` bytes; the peer's send buffer stays
                    // put until this rank stores DONE.
                    unsafe { read_remote(self.board.pid(p), theirs.src + (off + done) as u64, scratch.as_mut_ptr(), l)? };
                    let incoming = &mut scratch[..l];
                    if k > 0 {
                        reducer.pre_combine_into(acc, incoming);
                        continue;
                    }
                    // The first peer: acc = pre(own) ⊕ pre_p(incoming) (`pre` scales only for
                    // PreMulSum).
                    reducer.pre_in_place(incoming);
                    if own == at {
                        self.reducer.pre_in_place(acc);
                        self.reducer.combine_into(acc, incoming);
                    } else {
                        // SAFETY: the send buffer's chunk (see above), apart from `acc`.
                        let own = unsafe { std::slice::from_raw_parts(own as *const u8, l) };
                        self.reducer.pre_combine(own, incoming, acc);
                    }
                }
                self.reducer.post(acc);
                for &(p, theirs, _) in peers.iter().filter(|_| push) {
                    // SAFETY: the chunk just reduced (`l` bytes of this rank's receive buffer);
                    // the peer keeps its receive buffer until this rank stores DONE, and
                    // nobody else reads or writes this slice of it meanwhile.
                    unsafe { write_remote(self.board.pid(p), theirs.dst + (off + done) as u64, at as *const u8, l)? };
                }
                done += l;
            }
            Ok(())
        })
    }
}

impl HostOp for SingleCopyOp<'_> {
    fn poll(&mut self) -> Result<Progress> {
        let (n, me) = (self.board.nranks(), self.board.rank());
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
                    self.offer();
                    self.at = 0;
                    self.step = Step::Arrivals;
                }
                Step::Arrivals => {
                    while let Some(p) = self.peer(self.at) {
                        if !self.board.arrived(p, self.number) {
                            return waiting(moved);
                        }
                        self.board.check_header(p, &self.entry, self.number, self.call.ctx.sig, self.call.seq)?;
                        self.at += 1;
                        moved = true;
                    }
                    self.step = Step::Copy;
                }
                Step::Copy => {
                    self.copy()?;
                    self.board.word(me, DONE).store(self.number, Ordering::Release);
                    self.at = 0;
                    self.step = Step::Peers;
                }
                Step::Peers => {
                    // Nobody still reads or writes this rank's buffers when it returns.
                    while let Some(p) = self.peer(self.at) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_count_once_on_whole_blocks() {
        for (count, elem, n) in [(1usize, 4usize, 2usize), (1000, 4, 3), (1 << 20, 4, 2), (3 << 20, 2, 8), (5, 8, 8), (4097, 1, 4)] {
            let mut next = 0;
            for p in 0..n {
                let (lo, hi) = slice_of(count, elem, n, p);
                assert_eq!(lo, next.min(count), "{count} {elem} {n} rank {p}");
                assert!(hi >= lo);
                assert!(lo * elem % ALIGN == 0 || lo == count, "{count} {elem} {n} rank {p}: {lo}");
                next = hi;
            }
            assert_eq!(next, count, "{count} {elem} {n}");
        }
        assert_eq!(slice_of(1 << 20, 4, 2, 0), (0, 1 << 19), "two even halves");
    }

    #[test]
    fn the_root_pushes_a_page_aligned_nth_of_a_broadcast() {
        assert_eq!(pushed_head(8 << 20, 2), 4 << 20);
        assert_eq!(pushed_head(8 << 20, 3), (8 << 20) / 3 / ALIGN * ALIGN);
        assert_eq!(pushed_head(100, 2), 50, "small: not aligned");
        assert_eq!(pushed_head(3, 4), 0);
    }
}
