//! The host executor: runs the work of every host-backend communicator of a group on the
//! calling thread, by polling: each work item advances as far as its FIFOs allow, then the
//! next, until all are done. Nothing waits on one item while another could move, so programs
//! whose progress depends on each other (a rank's sends and receives, several ranks in one
//! process) never deadlock. While nothing moves it asks each communicator whether to go on
//! (an abort, a revoke, a failed peer, a hang report or timeout) and looks at the connections
//! a waiting step needs.

use std::sync::Arc;
use std::time::Duration;

use super::{CommSide, Links};
use crate::error::{Error, Result};
use crate::program::{Link, Step};
use crate::transport::{Connection, Dir, SLOT_BYTES};
use crate::work::{OpCtx, OpSig, Work};

/// How often (in idle rounds) failures are checked.
const CHECK_EVERY: u32 = 256;

/// One communicator's work with its connections.
pub struct HostRun<'a> {
    pub work: &'a mut Work,
    pub links: &'a Links,
    pub comm: &'a dyn CommSide,
}

/// Runs every item of every run to completion.
pub fn run(runs: &mut [HostRun<'_>]) -> Result<()> {
    if runs.is_empty() {
        return Ok(());
    }
    for run in runs.iter_mut() {
        read_scalars(run.work);
        for c in &run.work.copies {
            // SAFETY: the planner resolved both ranges through the backend (live memory of
            // `bytes` each); they may overlap only as the caller's buffers do, hence memmove.
            unsafe { std::ptr::copy(c.src as *const u8, c.dst as *mut u8, c.bytes) };
        }
    }
    if runs.iter().all(|r| r.work.items.is_empty()) {
        return Ok(());
    }
    // Where a step that sends nothing computes (a slot's worth), kept per thread: a fresh
    // 512 KiB per call would cost more than a small operation.
    SCRATCH.with(|cell| {
        let mut scratch = cell.take();
        scratch.resize(SLOT_BYTES, 0);
        let r = poll(runs, &mut scratch);
        cell.set(scratch);
        r
    })
}

thread_local! {
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

fn poll(runs: &mut [HostRun<'_>], scratch: &mut [u8]) -> Result<()> {
    let mut idle = 0u32;
    loop {
        let mut progressed = false;
        let mut pending = false;
        for run in runs.iter_mut() {
            let (work, links) = (&mut *run.work, run.links);
            for item in work.items.iter_mut() {
                while let Some((ci, step)) = item.steps.get(item.pc) {
                    let ok = try_step(run.comm.rank(), step, &work.ctxs[*ci], links, scratch)
                        .map_err(|e| run.comm.record(e.context("collective")))?;
                    if !ok {
                        break;
                    }
                    item.pc += 1;
                    progressed = true;
                }
                pending |= item.pc < item.steps.len();
            }
        }
        if !pending {
            return Ok(());
        }
        if progressed {
            idle = 0;
            continue;
        }
        idle += 1;
        if idle.is_multiple_of(CHECK_EVERY) {
            for run in runs.iter() {
                run.comm.check("collective").map_err(|e| run.comm.record(e))?;
                let links = run.links;
                // Only connections a waiting step needs: a peer that has finished and left may
                // fail receives posted ahead that nothing waits for.
                let waiting = run.work.items.iter().filter_map(|item| item.steps.get(item.pc)).flat_map(|(_, step)| {
                    step.recv.iter().map(|l| (*l, Dir::Recv)).chain(step.send.iter().map(|l| (*l, Dir::Send)))
                });
                if let Some(e) = waiting.filter_map(|key| links.get(&key)).find_map(|c| c.failure()) {
                    return Err(run.comm.record(e));
                }
            }
        }
        if idle < 64 {
            std::hint::spin_loop();
        } else if idle < 4096 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}


/// Reads the PreMulSum scalars given by address, now that the operation runs.
fn read_scalars(work: &mut Work) {
    for ctx in work.ctxs.iter_mut().filter(|c| c.scalar_at != 0) {
        let dtype = ctx.reducer.dtype;
        // SAFETY: the planner resolved the address through the backend, which checked that one
        // element of the operation's type lies in live memory there.
        let bytes = unsafe { std::slice::from_raw_parts(ctx.scalar_at as *const u8, dtype.size()) };
        let scalar = crate::reduce::decode_scalar(dtype, bytes);
        ctx.reducer = crate::reduce::Reducer::new(dtype, crate::reduce::DevOp::PreMulSum { scalar });
    }
}

/// Performs one step if every FIFO it needs is ready; `Ok(false)` if not yet.
fn try_step(me: u32, step: &Step, ctx: &OpCtx, links: &Links, scratch: &mut [u8]) -> Result<bool> {
    let conn = |l: &Link, d: Dir| links.get(&(*l, d)).expect("every link was connected");
    // All inputs present and all outputs free?
    let mut inputs: Vec<(&Arc<Connection>, u64, &[u8])> = Vec::with_capacity(step.recv.len());
    for l in &step.recv {
        let c = conn(l, Dir::Recv);
        match c.fifo.ready_slot() {
            Some((idx, data)) => {
                let theirs = OpSig(c.fifo.sig_of(idx));
                if theirs.is_known() && ctx.sig.is_known() && theirs != ctx.sig {
                    return Err(crate::work::mismatch(me, ctx.sig, l.peer, theirs));
                }
                if data.len() != step.bytes {
                    return Err(Error::invalid_usage(format!(
                        "rank {} sent {} bytes where this rank expected {}: the ranks' counts or types do not match",
                        l.peer,
                        data.len(),
                        step.bytes
                    )));
                }
                inputs.push((c, idx, data));
            }
            None => return Ok(false),
        }
    }
    let mut outputs = Vec::with_capacity(step.send.len());
    for l in &step.send {
        let c = conn(l, Dir::Send);
        match c.fifo.free_slot() {
            Some((idx, slot)) => outputs.push((c, idx, slot)),
            None => return Ok(false),
        }
    }
    let n = step.bytes;
    let src: Option<&[u8]> = step.src.map(|off| {
        let base = if step.src_in_dst { ctx.dst } else { ctx.src };
        // SAFETY: the planner resolved the buffer through the backend, which checked that the
        // whole operand lies in live memory; the program keeps `off + n` inside it.
        unsafe { std::slice::from_raw_parts((base + off) as *const u8, n) }
    });
    // The result goes first to the first send slot (never user memory, so it cannot alias the
    // source), else to scratch.
    let (result, rest): (&mut [u8], &mut [(&Arc<Connection>, u64, &mut [u8])]) = match outputs.split_first_mut() {
        Some((first, rest)) => (&mut first.2[..n], rest),
        None => (&mut scratch[..n], &mut []),
    };
    compute(step, ctx, src, &inputs, result)?;
    if let Some(off) = step.dst {
        // SAFETY: as for `src`; the destination may be the same memory as the source, which
        // was read completely above.
        let dst = unsafe { std::slice::from_raw_parts_mut((ctx.dst + off) as *mut u8, n) };
        dst.copy_from_slice(result);
    }
    for (_, _, slot) in rest.iter_mut() {
        slot[..n].copy_from_slice(result);
    }
    for (c, idx, _) in &outputs {
        c.fifo.push_signed(*idx, n, ctx.sig.0);
    }
    for (c, idx, _) in &inputs {
        c.fifo.pop(*idx);
    }
    Ok(true)
}

/// Computes a step's result into `out`.
fn compute(step: &Step, ctx: &OpCtx, src: Option<&[u8]>, inputs: &[(&Arc<Connection>, u64, &[u8])], out: &mut [u8]) -> Result<()> {
    let r = &ctx.reducer;
    let mut recvd = inputs.iter().map(|(_, _, d)| *d);
    match (step.reduce, src) {
        (true, Some(s)) => match recvd.next() {
            Some(first) => r.pre_combine(s, first, out),
            None => r.pre(s, out),
        },
        (true, None) => match recvd.next() {
            Some(first) => out.copy_from_slice(first),
            None => return Err(Error::internal("a reduce step without inputs")),
        },
        (false, Some(s)) => out.copy_from_slice(s),
        (false, None) => match recvd.next() {
            Some(first) => out.copy_from_slice(first),
            None => return Err(Error::internal("a step without input")),
        },
    }
    for more in recvd {
        r.combine_into(out, more);
    }
    if step.post {
        r.post(out);
    }
    Ok(())
}
