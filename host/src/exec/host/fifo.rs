//! The FIFO poller: the planner's work of one communicator (programs of steps over FIFOs in
//! shared memory or network buffers) run by polling: each work item advances as far as its
//! FIFOs allow, then the next. Nothing waits on one item while another could move, so programs
//! whose progress depends on each other (a rank's sends and receives, several ranks in one
//! process) never deadlock. The driver (`exec::host`) polls it with the other host ways, and
//! while nothing moves asks each communicator whether to go on (an abort, a revoke, a failed
//! peer, a hang report or timeout) and this run for the connections a waiting step needs.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::exec::{CommSide, Links, NetReceives};
use crate::program::{Link, Step};
use crate::transport::{Connection, Dir, SLOT_BYTES};
use crate::work::{OpCtx, OpSig, Work};

/// One communicator's work with its connections.
pub struct HostRun<'a> {
    pub work: &'a mut Work,
    /// The connections of its steps, in order (see [`Prepared`]).
    pub prep: &'a mut Prepared,
    pub comm: &'a dyn CommSide,
}

/// The connections of every step of a work, looked up once: all of them in item and step
/// order (a step's receives, then its sends), where each item's steps begin, and per item
/// where its current step's begin while the work runs. Made per call, or kept with a cached
/// plan (`exec::memo`): it stays valid as long as the work's steps and the connections do.
pub struct Prepared {
    conns: Vec<Arc<Connection>>,
    firsts: Vec<usize>,
    cursors: Vec<usize>,
    /// What each run tells the proxy it will receive.
    net_receives: NetReceives,
}

impl Prepared {
    /// The connections of `work`'s steps (from each item's first step).
    pub fn new(work: &Work, links: &Links) -> Prepared {
        let conn = |l: &Link, d: Dir| Arc::clone(links.get(&(*l, d)).expect("every link was connected"));
        let mut conns = Vec::new();
        let mut firsts = Vec::with_capacity(work.items.len());
        for item in &work.items {
            firsts.push(conns.len());
            for (_, step) in &item.steps {
                conns.extend(step.recv.iter().map(|l| conn(l, Dir::Recv)));
                conns.extend(step.send.iter().map(|l| conn(l, Dir::Send)));
            }
        }
        Prepared { conns, cursors: Vec::with_capacity(firsts.len()), firsts, net_receives: NetReceives::of(work, links) }
    }
}

impl HostRun<'_> {
    /// Before its first round: the PreMulSum scalars given by address are read, the plain
    /// copies made, the proxy told what the items will receive, every item set at its first
    /// step.
    pub(super) fn start(&mut self) {
        read_scalars(self.work);
        super::local_copies(&self.work.copies);
        if self.work.items.is_empty() {
            return;
        }
        let p = &mut *self.prep;
        p.net_receives.expect();
        p.cursors.clear();
        p.cursors.extend_from_slice(&p.firsts);
        for item in self.work.items.iter_mut() {
            item.pc = 0;
        }
    }

    /// Whether a step is still to run.
    pub(super) fn pending(&self) -> bool {
        self.work.items.iter().any(|item| item.pc < item.steps.len())
    }

    /// One round: each item advances as far as its FIFOs allow. Returns whether a step ran,
    /// and whether a step is still to run. `scratch`: a slot's worth of bytes, where a step
    /// that sends nothing computes.
    pub(super) fn poll(&mut self, scratch: &mut [u8]) -> Result<(bool, bool)> {
        let work = &mut *self.work;
        let Prepared { conns, cursors, .. } = &mut *self.prep;
        let me = self.comm.rank();
        let (mut progressed, mut pending) = (false, false);
        for (item, at) in work.items.iter_mut().zip(cursors.iter_mut()) {
            while let Some((ci, step)) = item.steps.get(item.pc) {
                let used = step.recv.len() + step.send.len();
                if !try_step(me, step, &work.ctxs[*ci], &conns[*at..*at + used], scratch)? {
                    break;
                }
                item.pc += 1;
                *at += used;
                progressed = true;
            }
            pending |= item.pc < item.steps.len();
        }
        Ok((progressed, pending))
    }

    /// While it waits: the failure of a connection a waiting step needs (only those: a peer
    /// that has finished and left may fail receives posted ahead that nothing waits for).
    pub(super) fn check_connections(&self) -> Result<()> {
        let p = &*self.prep;
        let waiting = self.work.items.iter().zip(&p.cursors).filter_map(|(item, &at)| {
            item.steps.get(item.pc).map(|(_, step)| &p.conns[at..at + step.recv.len() + step.send.len()])
        });
        match waiting.flatten().find_map(|c| c.failure()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Runs `f` with the calling thread's scratch slot (a fresh 512 KiB per call would cost more
/// than a small operation).
pub(super) fn with_scratch<T>(f: impl FnOnce(&mut [u8]) -> T) -> T {
    SCRATCH.with(|cell| {
        let mut scratch = cell.take();
        scratch.resize(SLOT_BYTES, 0);
        let r = f(&mut scratch);
        cell.set(scratch);
        r
    })
}

thread_local! {
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// How the calling thread waits while none of its FIFO steps can move: `exec::backoff` (spin,
/// then yield the core until 2 ms have passed, then short naps; the failure checks run all
/// along), spinning `RUSTCCL_HOST_SPIN` rounds (a round polls every waiting step once: tens of
/// nanoseconds), read once; with more ranks on this host than cores, at most 16 (a peer that is
/// not running needs a core to get on).
///
/// Spinning pays when the peer runs on another core at the same time: it answers within a
/// microsecond. When the scheduler keeps both ranks on one core (as it may on a loaded
/// machine), every hand-off costs the spin, then a context switch. Measured (2-rank 8 B-8 KiB
/// all-reduce on 2 loaded cores, runs interleaved): 64 rounds gave 1.3-7 µs a call, 16 rounds
/// 4.7-7, 256 rounds 1.6 µs when the ranks ran apart but 12-17 when together, 4096 rounds
/// 1.2 µs apart but 140-170 together. 64 is the default: never far off.
pub(super) fn spin_rounds() -> u32 {
    static N: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *N.get_or_init(|| crate::params::env_int_or("RUSTCCL_HOST_SPIN", 64).clamp(0, 1 << 30) as u32)
}

/// The cores this process may run on, read once.
pub(crate) fn cores() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}


/// Reads the PreMulSum scalars given by address, now that the operation runs.
fn read_scalars(work: &mut Work) {
    for ctx in work.ctxs.iter_mut().filter(|c| c.scalar_at != 0) {
        ctx.reducer = ctx.host_reducer();
    }
}

/// Performs one step if every FIFO it needs is ready; `Ok(false)` if not yet. `conns` are the
/// step's connections: one per receive link, then one per send link.
fn try_step(me: u32, step: &Step, ctx: &OpCtx, conns: &[Arc<Connection>], scratch: &mut [u8]) -> Result<bool> {
    let (recv, send) = conns.split_at(step.recv.len());
    // All inputs present and all outputs free? (Looked at first without allocating: this runs
    // on every round of a wait.)
    if recv.iter().any(|c| c.fifo.ready_slot().is_none()) || send.iter().any(|c| c.fifo.free_slot().is_none()) {
        return Ok(false);
    }
    let mut inputs: SmallVec<[(&Arc<Connection>, u64, &[u8]); 8]> = SmallVec::new();
    for c in recv {
        let Some((idx, data)) = c.fifo.ready_slot() else { return Ok(false) };
        let theirs = OpSig(c.fifo.sig_of(idx));
        let peer = c.link.peer;
        if theirs.is_known() && ctx.sig.is_known() && theirs != ctx.sig {
            return Err(crate::work::mismatch(me, ctx.sig, peer, theirs));
        }
        let data = if c.fifo.size_reported(idx) {
            if data.len() != step.bytes {
                return Err(Error::invalid_usage(format!(
                    "rank {peer} sent {} bytes where this rank expected {}: the ranks' counts or types do not match",
                    data.len(),
                    step.bytes
                )));
            }
            data
        } else {
            // The network plugin did not report the size (some never do): the step's, as NCCL.
            data.get(..step.bytes).ok_or_else(|| {
                Error::internal(format!("a step of {} bytes does not fit a FIFO slot of {}", step.bytes, data.len()))
            })?
        };
        inputs.push((c, idx, data));
    }
    let mut outputs: SmallVec<[_; 8]> = SmallVec::new();
    for c in send {
        let Some((idx, slot)) = c.fifo.free_slot() else { return Ok(false) };
        outputs.push((c, idx, slot));
    }
    let n = step.bytes;
    let src: Option<&[u8]> = step.src.map(|off| {
        let base = if step.src_in_dst { ctx.dst } else { ctx.src };
        // SAFETY: the planner resolved the buffer through the backend, which checked that the
        // whole operand lies in live memory; the program keeps `off + n` inside it.
        unsafe { std::slice::from_raw_parts((base + off) as *const u8, n) }
    });
    let dst_addr = step.dst.map(|off| ctx.dst + off);
    let overlaps_src = |d: usize| src.is_some_and(|s| (s.as_ptr() as usize) < d + n && d < s.as_ptr() as usize + n);
    // A copy from the first send slot to the destination, made after the sends are published.
    let mut late_copy: Option<(*const u8, usize)> = None;
    match (outputs.split_first_mut(), dst_addr) {
        // A plain copy onto itself (an in-place all-gather's own block, a broadcast root in
        // place): only the sends.
        (Some((first, rest)), Some(d)) if !step.reduce && src.is_some_and(|s| s.as_ptr() as usize == d) => {
            compute(me, step, ctx, src, &inputs, &mut first.2[..n])?;
            for (_, _, slot) in rest.iter_mut() {
                slot[..n].copy_from_slice(&first.2[..n]);
            }
        }
        // The result goes first to the first send slot (never user memory, so it cannot alias
        // the source), then to the other slots, and to the destination once the slots are
        // published (the next rank gets on meanwhile).
        (Some((first, rest)), d) => {
            compute(me, step, ctx, src, &inputs, &mut first.2[..n])?;
            for (_, _, slot) in rest.iter_mut() {
                slot[..n].copy_from_slice(&first.2[..n]);
            }
            late_copy = d.map(|d| (first.2.as_ptr(), d));
        }
        // Nothing to send: straight into the destination when it does not overlap the source
        // (the inputs are FIFO slots, never user memory), else through scratch.
        (None, Some(d)) if !overlaps_src(d) => {
            // SAFETY: as for `src`; no other slice of this step covers these bytes.
            let dst = unsafe { std::slice::from_raw_parts_mut(d as *mut u8, n) };
            compute(me, step, ctx, src, &inputs, dst)?;
        }
        (None, d) => {
            compute(me, step, ctx, src, &inputs, &mut scratch[..n])?;
            if let Some(d) = d {
                // SAFETY: as for `src`; the source was read completely above.
                let dst = unsafe { std::slice::from_raw_parts_mut(d as *mut u8, n) };
                dst.copy_from_slice(&scratch[..n]);
            }
        }
    }
    for (c, idx, _) in &outputs {
        c.fifo.push_signed(*idx, n, ctx.sig.0);
    }
    for (c, idx, _) in &inputs {
        c.fifo.pop(*idx);
    }
    if let Some((slot, d)) = late_copy {
        // SAFETY: the slot stays as this rank wrote it until this rank fills it again (the
        // consumer only reads it); the destination is as for `src` and may be the same memory
        // as the source, which was read completely above.
        unsafe { std::ptr::copy_nonoverlapping(slot, d as *mut u8, n) };
    }
    Ok(true)
}

/// Computes a step's result into `out`, combining the inputs in rank order (see
/// `crate::program`): the received slots from ranks below `me`, then `src`, then the rest.
fn compute(me: u32, step: &Step, ctx: &OpCtx, src: Option<&[u8]>, inputs: &[(&Arc<Connection>, u64, &[u8])], out: &mut [u8]) -> Result<()> {
    let r = &ctx.reducer;
    let recvd: SmallVec<[&[u8]; 8]> = inputs.iter().map(|(_, _, d)| *d).collect();
    match (step.reduce, src) {
        (true, Some(s)) => {
            let below = inputs.iter().take_while(|(c, _, _)| c.link.peer < me).count();
            match recvd.split_first() {
                None => r.pre(s, out),
                Some((first, rest)) if below == 0 => {
                    r.pre_combine(s, first, out);
                    rest.iter().for_each(|more| r.combine_into(out, more));
                }
                Some((first, rest)) => {
                    out.copy_from_slice(first);
                    rest[..below - 1].iter().for_each(|more| r.combine_into(out, more));
                    r.pre_combine_into(out, s);
                    rest[below - 1..].iter().for_each(|more| r.combine_into(out, more));
                }
            }
        }
        (true, None) => match recvd.split_first() {
            Some((first, rest)) => {
                out.copy_from_slice(first);
                rest.iter().for_each(|more| r.combine_into(out, more));
            }
            None => return Err(Error::internal("a reduce step without inputs")),
        },
        (false, Some(s)) => out.copy_from_slice(s),
        (false, None) => match recvd.first() {
            Some(first) => out.copy_from_slice(first),
            None => return Err(Error::internal("a step without input")),
        },
    }
    if step.post {
        r.post(out);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::Purpose;
    use crate::reduce::{DevOp, Reducer};
    use crate::transport::fifo::{fifo_bytes, Fifo, LocalMemory};
    use crate::transport::Kind;
    use crate::types::DataType;

    fn conn(peer: u32) -> Arc<Connection> {
        let mem = LocalMemory::new(fifo_bytes(16));
        // SAFETY: `mem` is zeroed and kept by the connection as long as the FIFO.
        let fifo = unsafe { Fifo::new(mem.ptr(), 16) };
        Arc::new(Connection::for_test(Link { peer, purpose: Purpose::Direct(0) }, Dir::Recv, Kind::Shm, fifo, mem))
    }

    #[test]
    fn every_rank_reduces_in_rank_order_and_gets_the_same_bits() {
        // In f32, (1e8 + 1) - 1e8 is 0 but (1e8 - 1e8) + 1 is 1: the order shows.
        let x = [1.0e8f32, 1.0, -1.0e8];
        let ctx = OpCtx {
            src: 0,
            dst: 0,
            src_len: 4,
            dst_len: 4,
            reducer: Reducer::new(DataType::Float32, DevOp::Sum),
            proto: rustccl_plugin_api::Protocol::Ll,
            sig: OpSig(0),
            scalar_at: 0,
            dst_remote: 0,
        };
        let step = Step { src: Some(0), dst: Some(0), reduce: true, post: true, ..Step::new(4) };
        let conns: Vec<Arc<Connection>> = (0..3).map(conn).collect();
        let bytes: Vec<[u8; 4]> = x.iter().map(|v| v.to_le_bytes()).collect();
        let results: Vec<f32> = (0..3u32)
            .map(|me| {
                let inputs: Vec<(&Arc<Connection>, u64, &[u8])> =
                    (0..3).filter(|&p| p != me).map(|p| (&conns[p as usize], 0, &bytes[p as usize][..])).collect();
                let mut out = [0u8; 4];
                compute(me, &step, &ctx, Some(&bytes[me as usize]), &inputs, &mut out).unwrap();
                f32::from_le_bytes(out)
            })
            .collect();
        assert_eq!(results, vec![(x[0] + x[1]) + x[2]; 3]);
    }
}
