//! The symmetric collectives on the host backend: the same choice as on GPUs (a collective on
//! buffers in `NCCL_WIN_COLL_SYMMETRIC` windows, chosen by coll), run by the calling thread with
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
//! kernels. [`SymOp`] is polled by the driver (`exec::host`), whose waits give up when the
//! communicator fails (a dead peer, an abort), when the peer a barrier waits for ran this
//! collective another way (its route entry on the board, `board::Board::check_route`: a rank
//! that passed plain buffers where others passed windows is `ncclInvalidUsage` on the waiting
//! ranks, and the others learn it from the failure's announcement or their own waits), and at
//! `NCCL_OP_TIMEOUT_MS`: an error, never a hang.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rustccl_kernels::exec::{SYM_RES_EPOCH, SYM_RES_INBOX, SYM_RES_SCALAR};

use super::board::{Board, Route};
use super::{HostCall, HostOp, Progress, Wait};
use crate::error::Result;
use crate::reduce::{DevOp, Reducer};
use crate::spec::Collective;
use crate::work::{SymmetricPlace, Way};

/// Bytes reduced at a time (the accumulator).
const CHUNK: usize = 128 << 10;
/// Spinning rounds of a barrier's wait before it naps (`Backoff::napping`).
const SPIN: u32 = 4096;

/// Symmetric collectives this process ran on the host (for tests and tools: proof that a run
/// took them).
static LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// How many symmetric collectives this process ran on the host.
pub fn launches() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// Where a [`SymOp`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Read the epoch, publish the scalar, signal the entry barrier.
    Start,
    /// Wait for every peer at the entry barrier.
    Entry,
    /// The phase's loads and stores, then signal the exit barrier.
    Body,
    /// Wait for every peer at the exit barrier.
    Exit,
    Done,
}

/// One symmetric collective on the host, polled by the driver.
pub struct SymOp<'a> {
    place: SymmetricPlace,
    n: usize,
    call: HostCall,
    /// The communicator's board (its route rings), where it has one.
    board: Option<&'a Board>,
    step: Step,
    epoch: u32,
    /// The next peer to wait for at the current barrier.
    peer: usize,
    /// Every rank's reducer (its own PreMulSum scalar).
    reducers: Vec<Reducer>,
}

impl<'a> SymOp<'a> {
    /// `call` on the symmetric windows at `place` of a communicator of `nranks`: an all_reduce,
    /// all_gather, reduce_scatter or broadcast, or an out-of-place all_to_all (`count`
    /// elements to and from every rank; its `ctx` gives no buffers, only the signature).
    pub fn new(place: SymmetricPlace, nranks: usize, call: HostCall, board: Option<&'a Board>) -> SymOp<'a> {
        SymOp { place, n: nranks, call, board, step: Step::Start, epoch: 0, peer: 0, reducers: Vec::new() }
    }

    fn word<T>(&self, addr: u64) -> &T {
        // SAFETY: `addr` lies in the resource memory of a rank (mapped in every process of the
        // communicator while its windows exist, for the whole call), aligned for `T` (offsets
        // of the resource layout are multiples of 8), and only accessed atomically there.
        unsafe { &*(addr as *const T) }
    }

    /// The value of the barrier of `phase` (1: entry, 2: exit) of this epoch.
    fn target(&self, phase: u32) -> u32 {
        self.epoch.wrapping_mul(2).wrapping_add(phase)
    }

    /// This rank's inbox flag from peer `p`.
    fn flag(&self, p: usize) -> &AtomicU32 {
        self.word::<AtomicU32>(self.place.res + SYM_RES_INBOX + 4 * p as u64)
    }

    fn reached(&self, p: usize, target: u32) -> bool {
        (self.flag(p).load(Ordering::Acquire).wrapping_sub(target) as i32) >= 0
    }

    /// Stores the barrier's value into every peer's inbox.
    fn signal(&self, phase: u32) {
        let inbox = self.place.res + SYM_RES_INBOX;
        for p in (0..self.n).filter(|&p| p != self.place.rank) {
            self.word::<AtomicU32>(self.place.peer(inbox, p) + 4 * self.place.rank as u64).store(self.target(phase), Ordering::Release);
        }
    }

    /// Waits (without blocking) for every peer at the barrier of `phase`: whether all came.
    fn arrived(&mut self, phase: u32) -> bool {
        while self.peer < self.n {
            if self.peer != self.place.rank && !self.reached(self.peer, self.target(phase)) {
                return false;
            }
            self.peer += 1;
        }
        true
    }

    /// The phase, by kind.
    fn body(&self) {
        let (place, n, me) = (self.place, self.n, self.place.rank);
        let part = self.call.part();
        let reducers = &self.reducers;
        // SAFETY (every block below): the addresses are the call's buffers in this rank's and
        // the peers' windows; each phase touches only what the module docs say.
        match self.call.coll {
            Collective::AllReduce => {
                // Slices of whole elements; the last may be short or empty.
                let all: Vec<usize> = (0..n).collect();
                let slice = self.call.count.div_ceil(n) * self.call.dtype.size();
                let lo = (me * slice).min(part);
                let hi = (lo + slice).min(part);
                unsafe { self.reduce(reducers, place.send, lo as u64, hi - lo, place.recv + lo as u64, &all) };
            }
            Collective::AllGather => {
                for p in 0..n {
                    unsafe { self.copy(place.peer(place.recv, p) + (me * part) as u64, place.send, part) };
                }
            }
            Collective::ReduceScatter => unsafe { self.reduce(reducers, place.send, (me * part) as u64, part, place.recv, &[me]) },
            Collective::Broadcast if self.call.root == me => {
                for p in 0..n {
                    unsafe { self.copy(place.peer(place.recv, p), place.send, part) };
                }
            }
            Collective::Broadcast => {}
            Collective::AlltoAll => {
                for p in 0..n {
                    // Block `me` of every peer's send window is read by this rank alone, and
                    // block `p` of this rank's receive window written by it alone.
                    unsafe { self.copy(place.recv + (p * part) as u64, place.peer(place.send, p) + (me * part) as u64, part) };
                }
            }
            _ => unreachable!("only the kinds coll::symmetric::place_of finds a place for"),
        }
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
    /// As [`SymOp::copy`] for every rank's `src + off` and the destinations.
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

    /// The barrier phase this op waits at, if it waits.
    fn phase(&self) -> Option<u32> {
        match self.step {
            Step::Entry => Some(1),
            Step::Exit => Some(2),
            _ => None,
        }
    }
}

impl HostOp for SymOp<'_> {
    fn poll(&mut self) -> Result<Progress> {
        let mut moved = false;
        loop {
            match self.step {
                Step::Start => {
                    // This rank's reducer (its PreMulSum scalar read now when given by address).
                    let reducer = match self.call.coll {
                        Collective::AlltoAll => Reducer::new(crate::types::DataType::Uint8, DevOp::Sum),
                        _ => self.call.ctx.host_reducer(),
                    };
                    self.epoch = self.word::<AtomicU32>(self.place.res + SYM_RES_EPOCH).load(Ordering::Relaxed);
                    if let DevOp::PreMulSum { scalar } = reducer.op {
                        self.word::<AtomicU64>(self.place.res + SYM_RES_SCALAR).store(scalar.to_bits(), Ordering::Relaxed);
                    }
                    self.reducers = vec![reducer; self.n];
                    self.signal(1);
                    self.peer = 0;
                    self.step = Step::Entry;
                }
                Step::Entry => {
                    if !self.arrived(1) {
                        return Ok(if moved { Progress::Moved } else { Progress::Waiting });
                    }
                    // Each rank's reducer: its own PreMulSum scalar (read after the entry barrier).
                    if let DevOp::PreMulSum { .. } = self.reducers[0].op {
                        let dtype = self.reducers[0].dtype;
                        for r in 0..self.n {
                            let bits = self.word::<AtomicU64>(self.place.peer(self.place.res + SYM_RES_SCALAR, r)).load(Ordering::Relaxed);
                            self.reducers[r] = Reducer::new(dtype, DevOp::PreMulSum { scalar: f64::from_bits(bits) });
                        }
                    }
                    self.step = Step::Body;
                }
                Step::Body => {
                    self.body();
                    self.signal(2);
                    self.peer = 0;
                    self.step = Step::Exit;
                }
                Step::Exit => {
                    if !self.arrived(2) {
                        return Ok(if moved { Progress::Moved } else { Progress::Waiting });
                    }
                    self.word::<AtomicU32>(self.place.res + SYM_RES_EPOCH).store(self.epoch.wrapping_add(1), Ordering::Relaxed);
                    LAUNCHES.fetch_add(1, Ordering::Relaxed);
                    self.step = Step::Done;
                }
                Step::Done => return Ok(Progress::Done),
            }
            moved = true;
        }
    }

    fn check_peers(&self) -> Result<()> {
        let (Some(board), Some(phase)) = (self.board, self.phase()) else { return Ok(()) };
        let p = self.peer;
        let mine = Route { seq: self.call.seq, way: Way::SymmetricCpu, sig: self.call.ctx.sig };
        board.check_route(p, mine, || !self.reached(p, self.target(phase)))
    }

    fn wait(&self) -> Wait {
        Wait { spin: SPIN, naps: true }
    }

    fn what(&self) -> String {
        format!("{} (symmetric, host)", self.call.coll.spec().name)
    }
}
