//! The executor. Communicators with device buffers hand their work to the device executor
//! ([`super::device`]), which launches it and returns. The host executor runs the work items
//! of the others on the calling thread, by polling: each item advances as far as its FIFOs
//! allow, then the next, until all are done. Nothing waits on one item while another could move, so programs whose progress
//! depends on each other (a rank's sends and receives, several ranks in one process) never
//! deadlock. While nothing moves it checks for failures: an aborted or revoked communicator,
//! a dead peer, a broken network connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::check::{self, OpSig};
use super::plan::{CommRun, OpCtx};
use crate::program::{Link, Step};
use crate::error::{Error, Result};
use crate::transport::{Connection, Dir, SLOT_BYTES};

/// How often (in idle rounds) failures are checked.
const CHECK_EVERY: u32 = 256;

/// Runs every item of every communicator to completion (connections are made first). When
/// it fails after data started moving, every communicator of the group is marked broken.
pub fn run(runs: &mut [CommRun]) -> Result<()> {
    match runs.iter().find(|r| r.device).map(|r| Arc::clone(r.comm.backend())) {
        Some(backend) => backend.with_relaxed_capture(&mut || run_all(runs)),
        None => run_all(runs),
    }
}

fn run_all(runs: &mut [CommRun]) -> Result<()> {
    let start = std::time::Instant::now();
    let result = connect(runs).and_then(|conns| {
        super::profile::record(super::profile::Stage::Connect, start);
        execute(runs, &conns)
    });
    if let Err(e) = &result {
        for run in runs.iter() {
            run.comm.mark_broken(e);
        }
    }
    result
}

fn execute(runs: &mut [CommRun], conns: &[Links]) -> Result<()> {
    // Device work is enqueued on its streams (the interpreter runs it); host work runs here.
    for (run, links) in runs.iter().zip(conns) {
        if run.device {
            super::device::launch(run, links).map_err(|e| run.comm.record_error(e.context("collective")))?;
        }
    }
    if runs.iter().all(|r| r.device) {
        return Ok(());
    }
    let mut scratch = vec![0u8; SLOT_BYTES];
    let mut idle = 0u32;
    loop {
        let mut progressed = false;
        let mut pending = false;
        for (run, links) in runs.iter_mut().zip(conns).filter(|(r, _)| !r.device) {
            for item in run.items.iter_mut() {
                while let Some((ci, step)) = item.steps.get(item.pc) {
                    let ok = try_step(run.comm.rank_unchecked(), step, &run.ctxs[*ci], links, &mut scratch)
                        .map_err(|e| run.comm.record_error(e.context("collective")))?;
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
        if idle % CHECK_EVERY == 0 {
            for (run, links) in runs.iter().zip(conns) {
                run.comm.check_running("collective").map_err(|e| run.comm.record_error(e))?;
                run.comm.check_op_health().map_err(|e| run.comm.record_error(e))?;
                // Only connections a waiting step needs: a peer that has finished and left may
                // fail receives posted ahead that nothing waits for.
                let waiting = run.items.iter().filter_map(|item| item.steps.get(item.pc)).flat_map(|(_, step)| {
                    step.recv.iter().map(|l| (*l, Dir::Recv)).chain(step.send.iter().map(|l| (*l, Dir::Send)))
                });
                if let Some(e) = waiting.filter_map(|key| links.get(&key)).find_map(|c| c.failure()) {
                    return Err(run.comm.record_error(e));
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

type Links = HashMap<(Link, Dir), Arc<Connection>>;

/// Makes (or finds) every connection the items use, all at once.
fn connect(runs: &[CommRun]) -> Result<Vec<Links>> {
    let mut out = Vec::with_capacity(runs.len());
    let mut pending = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let mut wanted: Vec<(Link, Dir)> = Vec::new();
        for item in &run.items {
            for (_, s) in &item.steps {
                wanted.extend(s.recv.iter().map(|l| (*l, Dir::Recv)));
                wanted.extend(s.send.iter().map(|l| (*l, Dir::Send)));
            }
        }
        wanted.sort();
        wanted.dedup();
        let (have, missing) = run.comm.cached_connections(&wanted);
        out.push(have);
        pending.extend(missing.into_iter().map(|(l, d)| (i, l, d, crate::transport::Establish::new(l, d))));
    }
    if pending.is_empty() {
        return Ok(out);
    }
    let deadline = Instant::now() + crate::params::bootstrap_timeout();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for (i, link, dir, mut est) in pending {
            let comm = &runs[i].comm;
            match comm.with_transport(|cx| est.poll(cx)) {
                Ok(Some(conn)) => {
                    comm.cache_connection(link, dir, Arc::clone(&conn));
                    out[i].insert((link, dir), conn);
                }
                Ok(None) => still.push((i, link, dir, est)),
                Err(e) => return Err(comm.record_error(e.context(format!("connecting to rank {}", link.peer)))),
            }
        }
        pending = still;
        if !pending.is_empty() {
            if Instant::now() > deadline {
                let (i, link, _, _) = &pending[0];
                return Err(runs[*i].comm.record_error(Error::remote(format!(
                    "connecting to rank {}: timed out (RUSTCCL_BOOTSTRAP_TIMEOUT)",
                    link.peer
                ))));
            }
            for run in runs {
                run.comm.check_running("connect").map_err(|e| run.comm.record_error(e))?;
                run.comm.check_op_health().map_err(|e| run.comm.record_error(e))?;
            }
            std::thread::yield_now();
        }
    }
    Ok(out)
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
                    return Err(check::mismatch(me, ctx.sig, l.peer, theirs));
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
