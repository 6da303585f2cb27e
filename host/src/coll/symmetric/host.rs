//! The symmetric collectives on the host backend: the same choice as on GPUs (a single
//! collective on buffers in `NCCL_WIN_COLL_SYMMETRIC` windows), run by the calling thread with
//! loads and stores in the peers' windows, which are mapped in this process. Between two
//! barriers on the resource memory (each rank stores `2 × epoch + phase` into every peer's
//! inbox, then waits until its own inbox holds at least that from every peer), each rank
//! reads or writes only what no other rank touches in that phase:
//! - all_reduce in two shots: rank r reduces slice r from every peer and stores it into every
//!   peer's receive window (slice r of any buffer is only touched by rank r, so in place is
//!   safe). Every rank reducing the whole buffer itself (one shot) was slower out of place
//!   from 32 KiB (2 ranks on the 2-core development machine: 2.4 against 2.0 µs; 256 KiB 14.8
//!   against 10.7) and no faster below;
//! - all_gather: each rank stores its part into every peer's receive window;
//! - reduce_scatter: each rank reduces its part from every peer's send window;
//! - broadcast: the root stores its send buffer into every rank's receive window (the root
//!   alone knows where its send buffer is);
//! - all_to_all (out of place): each rank copies its block from every peer's send window.
//!
//! Reductions run in rank order with each rank's own PreMulSum scalar (published in its
//! resource memory before the first barrier), so every rank gets the same bits as the GPU
//! kernels. A wait gives up when the communicator fails (a dead peer, an abort), when the
//! peer it waits for took the usual way for this collective (each rank publishes which way
//! its current collective goes, `PATH_WORD`: a rank that passed plain buffers where others
//! passed windows is `ncclInvalidUsage` on the waiting ranks, and the others learn it from
//! the failure's announcement), and honours `NCCL_OP_TIMEOUT_MS`: an error, never a hang.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustccl_kernels::exec::{SYM_RES_EPOCH, SYM_RES_INBOX, SYM_RES_SCALAR};

use super::super::{CollKind, Task};
use crate::comm::health::OpShape;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::reduce::{DevOp, Reducer};
use crate::window::{SymmetricPlace, PATH_WORD};

/// Bytes reduced at a time (the accumulator).
const CHUNK: usize = 128 << 10;

/// One rank's view of a symmetric collective on the host.
struct Sym<'a> {
    comm: &'a Communicator,
    place: SymmetricPlace,
    n: usize,
    /// This collective's number on this communicator (0: not counted).
    seq: u64,
}

impl Sym<'_> {

    fn word<T>(&self, addr: u64) -> &T {
        // SAFETY: `addr` lies in the resource memory of a rank (mapped in every process of the
        // communicator while its windows exist, for the whole call), aligned for `T` (offsets
        // of the resource layout are multiples of 8), and only accessed atomically there.
        unsafe { &*(addr as *const T) }
    }

    /// The barrier of `phase` (1: entry, 2: exit) of launch `epoch`.
    fn barrier(&self, epoch: u32, phase: u32) -> Result<()> {
        let target = epoch.wrapping_mul(2).wrapping_add(phase);
        let inbox = self.place.res + SYM_RES_INBOX;
        for p in (0..self.n).filter(|&p| p != self.place.rank) {
            self.word::<AtomicU32>(self.place.peer(inbox, p) + 4 * self.place.rank as u64).store(target, Ordering::Release);
        }
        let start = Instant::now();
        let limit = self.comm.config().op_timeout;
        for p in (0..self.n).filter(|&p| p != self.place.rank) {
            let flag = self.word::<AtomicU32>(inbox + 4 * p as u64);
            let mut spins = 0u32;
            while (flag.load(Ordering::Acquire).wrapping_sub(target) as i32) < 0 {
                spins += 1;
                if spins < 4096 {
                    std::hint::spin_loop();
                    continue;
                }
                if spins.is_multiple_of(64) {
                    self.comm.check_running("symmetric collective")?;
                    self.check_same_path(p, flag, target)?;
                    if let Some(limit) = limit {
                        if start.elapsed() > limit {
                            return Err(Error::timeout(format!(
                                "symmetric collective: rank {p} did not reach it within NCCL_OP_TIMEOUT_MS ({} ms); \
                                 did every rank pass buffers in symmetric windows?",
                                limit.as_millis()
                            )));
                        }
                    }
                }
                std::thread::sleep(Duration::from_micros(if spins < 8192 { 1 } else { 50 }));
            }
        }
        Ok(())
    }

    /// A peer that started this collective the usual way (its buffers are not in symmetric
    /// windows there), or a later one, will never reach this barrier: an error, not a hang.
    /// (Its arrival is looked at again after its path: a peer that arrived and went on to the
    /// next collective published that after its arrival.)
    fn check_same_path(&self, p: usize, flag: &AtomicU32, target: u32) -> Result<()> {
        if self.seq == 0 {
            return Ok(());
        }
        let word = self.word::<AtomicU64>(self.place.peer(self.place.res + PATH_WORD, p)).load(Ordering::Acquire);
        let (seq, path) = (word >> 2, word & 3);
        let other_way = (seq == self.seq && path == super::PATH_USUAL) || seq > self.seq;
        let arrived = (flag.load(Ordering::Acquire).wrapping_sub(target) as i32) >= 0;
        if other_way && !arrived {
            return Err(Error::invalid_usage(format!(
                "rank {p} runs this collective (number {}) without symmetric windows: every rank must pass buffers \
                 in NCCL_WIN_COLL_SYMMETRIC windows at the same offsets, or none",
                self.seq
            )));
        }
        Ok(())
    }

    /// `bytes` bytes at `addr` (any rank's flat address), read.
    ///
    /// # Safety
    /// `addr..addr+bytes` lies in a window of this communicator, and no rank writes it in the
    /// current phase.
    unsafe fn bytes(&self, addr: u64, bytes: usize) -> &[u8] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(addr as *const u8, bytes) }
    }

    /// Copies `bytes` from `src` to `dst` (flat addresses; the same address: nothing).
    ///
    /// # Safety
    /// Both ranges lie in windows of this communicator; nobody else touches `dst`, and
    /// nobody writes `src`, in the current phase.
    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) {
        if dst != src && bytes > 0 {
            // SAFETY: the caller's contract; windows of one rank never overlap another's.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        }
    }

    /// Reduces `bytes` at offset `off` of `src` (this rank's flat address) over every rank in
    /// rank order, each scaled by its own reducer, and stores the result at `dst` (this rank's
    /// flat address) on each rank of `dsts`.
    ///
    /// # Safety
    /// As [`Sym::copy`] for every rank's `src + off` and the destinations.
    unsafe fn reduce(&self, reducers: &[Reducer], src: u64, off: u64, bytes: usize, dst: u64, dsts: &[usize]) {
        let r0 = reducers[0];
        let premul = matches!(r0.op, DevOp::PreMulSum { .. });
        let step = CHUNK / r0.elem_size() * r0.elem_size();
        let mut acc = vec![0u8; step.min(bytes)];
        let mut done = 0;
        while done < bytes {
            let len = step.min(bytes - done);
            let acc = &mut acc[..len];
            // SAFETY: the caller's contract (no rank writes a send window's part now).
            let input = |r: usize| unsafe { self.bytes(self.place.peer(src, r) + off + done as u64, len) };
            // In rank order, in one pass per input: acc = x0 ⊕ x1 ⊕ ..., each x scaled by its
            // rank's PreMulSum scalar (added as pre(x) ⊕ acc: addition is commutative).
            if premul || reducers.len() == 1 {
                r0.pre(input(0), acc);
                for (r, red) in reducers.iter().enumerate().skip(1) {
                    red.pre_combine_into(acc, input(r));
                }
            } else {
                r0.combine(input(0), input(1), acc);
                for r in 2..reducers.len() {
                    r0.combine_into(acc, input(r));
                }
            }
            r0.post(acc);
            for &d in dsts {
                let at = self.place.peer(dst, d) + done as u64;
                // SAFETY: the caller's contract: only this rank writes there in this phase.
                unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), at as *mut u8, len) };
            }
            done += len;
        }
    }
}

/// Runs `task` (an all_reduce, all_gather, reduce_scatter or broadcast) on the symmetric
/// windows at `place`.
pub(crate) fn run_task(comm: &Communicator, task: &Task, place: SymmetricPlace) -> Result<()> {
    let (n, me) = (comm.nranks_unchecked() as usize, place.rank);
    let part = task.count * task.dtype.size();
    run(comm, task.shape(), place, Some(task), |sym, reducers| {
        // SAFETY (every block below): the addresses are the task's buffers in this rank's and
        // the peers' windows; each phase touches only what the module docs say.
        match task.kind {
            CollKind::AllReduce => {
                // Slices of whole elements; the last may be short or empty.
                let all: Vec<usize> = (0..n).collect();
                let slice = task.count.div_ceil(n) * task.dtype.size();
                let lo = (me * slice).min(part);
                let hi = (lo + slice).min(part);
                unsafe { sym.reduce(reducers, place.send, lo as u64, hi - lo, place.recv + lo as u64, &all) };
            }
            CollKind::AllGather => {
                for p in 0..n {
                    unsafe { sym.copy(place.peer(place.recv, p) + (me * part) as u64, place.send, part) };
                }
            }
            CollKind::ReduceScatter => unsafe {
                sym.reduce(reducers, place.send, (me * part) as u64, part, place.recv, &[me])
            },
            CollKind::Broadcast { root } if root as usize == me => {
                for p in 0..n {
                    unsafe { sym.copy(place.peer(place.recv, p), place.send, part) };
                }
            }
            CollKind::Broadcast { .. } => {}
            _ => unreachable!("only the kinds coll::symmetric::place_of finds a place for"),
        }
        Ok(())
    })
}

/// `ncclAlltoAll` on the symmetric windows at `place` (out of place): `part` bytes to and from
/// every rank.
pub(crate) fn run_all_to_all(comm: &Communicator, shape: OpShape, place: SymmetricPlace, part: usize) -> Result<()> {
    let (n, me) = (comm.nranks_unchecked() as usize, place.rank);
    run(comm, shape, place, None, |sym, _| {
        for p in 0..n {
            // SAFETY: block `me` of every peer's send window is read by this rank alone, and
            // block `p` of this rank's receive window written by it alone.
            unsafe { sym.copy(place.recv + (p * part) as u64, place.peer(place.send, p) + (me * part) as u64, part) };
        }
        Ok(())
    })
}

/// This rank's reducer for `task` (its PreMulSum scalar read now when given by address).
fn reducer_of(comm: &Communicator, task: &Task) -> Result<Reducer> {
    Ok(super::super::plan::task_ctx(comm, task)?.host_reducer())
}

/// The frame of every host symmetric collective: the op log, the epoch, the scalars (of
/// `task`, when it reduces), the two barriers around `body`.
fn run(
    comm: &Communicator,
    shape: OpShape,
    place: SymmetricPlace,
    task: Option<&Task>,
    body: impl FnOnce(&Sym, &[Reducer]) -> Result<()>,
) -> Result<()> {
    let n = comm.nranks_unchecked() as usize;
    let seq = comm.publish_path(super::PATH_SYMMETRIC);
    let sym = Sym { comm, place, n, seq };
    comm.op_log().started(std::slice::from_ref(&shape));
    let r = (|| {
        let reducer = match task {
            Some(t) => reducer_of(comm, t)?,
            None => Reducer::new(crate::types::DataType::Uint8, DevOp::Sum),
        };
        let dtype = reducer.dtype;
        let epoch_word = sym.word::<AtomicU32>(place.res + SYM_RES_EPOCH);
        let epoch = epoch_word.load(Ordering::Relaxed);
        if let DevOp::PreMulSum { scalar } = reducer.op {
            sym.word::<AtomicU64>(place.res + SYM_RES_SCALAR).store(scalar.to_bits(), Ordering::Relaxed);
        }
        sym.barrier(epoch, 1)?;
        // Each rank's reducer: its own PreMulSum scalar (read after the entry barrier).
        let reducers: Vec<Reducer> = (0..n)
            .map(|r| match reducer.op {
                DevOp::PreMulSum { .. } => {
                    let bits = sym.word::<AtomicU64>(place.peer(place.res + SYM_RES_SCALAR, r)).load(Ordering::Relaxed);
                    Reducer::new(dtype, DevOp::PreMulSum { scalar: f64::from_bits(bits) })
                }
                _ => reducer,
            })
            .collect();
        body(&sym, &reducers)?;
        sym.barrier(epoch, 2)?;
        epoch_word.store(epoch.wrapping_add(1), Ordering::Relaxed);
        super::LAUNCHES.fetch_add(1, Ordering::Relaxed);
        Ok(())
    })();
    super::super::cache::finish(comm, &r, false);
    r.map_err(|e| comm.record_error(e.context(format!("{} (symmetric, host)", shape.kind))))
}
