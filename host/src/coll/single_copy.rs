//! Large all_gather on the host backend in one copy: each rank copies the peers'
//! parts straight from their buffers into its own with `process_vm_readv` (the kernel copies
//! from the other process's memory; no shared mapping of the user's buffers is needed), where
//! the usual way moves every byte twice (into a FIFO, out of it).
//!
//! Runs on the board of small collectives (`coll::small`), which every call of a one-host
//! communicator outside a group passes: a call takes a board entry with no data, whose header
//! carries the address of the rank's part in its own process; it stores its arrival, then for
//! each peer it needs waits for that peer's arrival, checks the header (signature, call number)
//! and copies the peer's part from that address. It then stores `DONE` and waits until every
//! rank that reads its buffer has stored it too, so no buffer is left while a peer still
//! reads it. A copy that fails ends the call with an error on that rank (the kernel refuses an
//! unmapped address: never a crash) and the others learn it from the failure's announcement.
//!
//! Taken where the board is and every rank found at the board's making that it may read every
//! peer's memory (same user, no ptrace rule against it: `Board::single_copy`), for parts of at
//! least `RUSTCCL_HOST_SINGLE_COPY_BYTES` (256 KiB: on the 2-core development machine a 256 KiB
//! `process_vm_readv` takes about 30 µs against 48 for the FIFO path's two copies, and 4 MiB
//! 0.65 ms against 1.7). Everything the choice depends on is the same on every rank.
//!
//! Broadcast can run this way too (`run` handles it) but does not take it: there the FIFO
//! path's two copies run at once on two cores (the root fills the next slot while a non-root
//! empties the last), and one `process_vm_readv`, slower than a copy on this machine, lost to
//! them in place (2 ranks, 4 MiB: 0.64–0.9 ms against 0.5–0.57); it won out of place only
//! (0.67–0.87 against 1.6–1.9), which the root alone knows.

use std::sync::atomic::Ordering;

use super::small::{check_header, wait_arrival, wait_word, Board, DONE};
use super::{CollKind, Task};
use crate::comm::Communicator;
use crate::error::{Error, Result};

/// `RUSTCCL_HOST_SINGLE_COPY_BYTES`: the least bytes per rank of a call that copies straight
/// from the peers' buffers (0: never).
fn threshold() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| crate::params::env_int("RUSTCCL_HOST_SINGLE_COPY_BYTES").ok().flatten().map_or(256 << 10, |v| v.max(0) as usize))
}

/// Whether any call may take this way (the board is made for it too).
pub(super) fn wanted() -> bool {
    threshold() > 0
}

/// Whether `task` (of `bytes` per rank) takes this way on `board`.
pub(super) fn takes(board: &Board, task: &Task, bytes: usize) -> bool {
    let t = threshold();
    board.single_copy && t > 0 && bytes >= t && matches!(task.kind, CollKind::AllGather)
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

/// Runs `task` (all_gather or broadcast, `part` bytes per rank) on `board`.
pub(super) fn run(comm: &Communicator, board: &mut Board, task: &Task, part: usize) -> Result<()> {
    let n = board.regions.len();
    let me = comm.rank_unchecked() as usize;
    let ctx = super::plan::task_ctx(comm, task)?;
    let seq = comm.collective_number();
    // Who reads from whom: every rank from every peer (all_gather), non-roots from the root.
    let root = match task.kind {
        CollKind::Broadcast { root } => Some(root as usize),
        _ => None,
    };
    let sources: Vec<usize> = match root {
        Some(r) if r == me => Vec::new(),
        Some(r) => vec![r],
        // From the next rank on, so that the ranks do not all read rank 0 first.
        None => (1..n).map(|i| (me + i) % n).collect(),
    };
    let readers: Vec<usize> = match root {
        Some(r) if r == me => (0..n).filter(|&p| p != me).collect(),
        Some(_) => Vec::new(),
        None => (0..n).filter(|&p| p != me).collect(),
    };
    // The part this rank offers, in its own process (the root's send buffer; in an in-place
    // all_gather this rank's part of the receive buffer, which is the same).
    let offer = if root.is_none_or(|r| r == me) { ctx.src as u64 } else { 0 };
    let (call, entry) = board.enter(comm, 0, seq)?;
    board.header(me, entry.start, 2).store(offer, Ordering::Relaxed);
    board.arrive(me, &entry, call, ctx.sig);
    // This rank's own part, out of place.
    let own_at = match task.kind {
        CollKind::AllGather => ctx.dst + me * part,
        _ => ctx.dst,
    };
    if root.is_none_or(|r| r == me) && ctx.src != own_at {
        // SAFETY: the send buffer (`part` bytes) and this rank's part of the receive buffer,
        // resolved by the backend; out of place they do not overlap (checked by the API).
        unsafe { std::ptr::copy(ctx.src as *const u8, own_at as *mut u8, part) };
    }
    for &p in &sources {
        wait_arrival(comm, board, p, call, seq)?;
        check_header(board, p, &entry, call, ctx.sig, me, seq)?;
        let at = board.header(p, entry.start, 2).load(Ordering::Relaxed);
        let into = match task.kind {
            CollKind::AllGather => ctx.dst + p * part,
            _ => ctx.dst,
        };
        // SAFETY: part p of the receive buffer (`part` bytes inside the resolved receive
        // buffer); the peer's part stays put until this rank stores DONE (below).
        unsafe { read_remote(board.pids[p], at, into as *mut u8, part)? };
    }
    board.word(me, DONE).store(call, Ordering::Release);
    // Nobody still reads this rank's buffer when it returns.
    for &p in &readers {
        wait_word(comm, board, p, DONE, call, seq)?;
    }
    Ok(())
}
