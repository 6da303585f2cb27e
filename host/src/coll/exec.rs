//! The host executor: it runs the work items of every communicator of a group on the calling
//! thread, by polling: each item advances as far as its FIFOs allow, then the next, until all
//! are done. Nothing waits on one item while another could move, so programs whose progress
//! depends on each other (a rank's sends and receives, several ranks in one process) never
//! deadlock. While nothing moves it checks for failures: an aborted or revoked communicator,
//! a dead peer, a broken network connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::plan::{CommRun, OpCtx};
use super::program::{Link, Step};
use crate::error::{Error, Result};
use crate::transport::{Connection, Dir, SLOT_BYTES};

/// How often (in idle rounds) failures are checked.
const CHECK_EVERY: u32 = 256;

/// Runs every item of every communicator to completion (connections are made first). When
/// it fails after data started moving, every communicator of the group is marked broken.
pub fn run(runs: &mut [CommRun]) -> Result<()> {
    let conns = connect(runs)?;
    let result = execute(runs, &conns);
    if let Err(e) = &result {
        for run in runs.iter() {
            run.comm.mark_broken(e);
        }
    }
    result
}

fn execute(runs: &mut [CommRun], conns: &[Links]) -> Result<()> {
    let mut devices: Vec<Option<DeviceState>> = Vec::with_capacity(runs.len());
    for run in runs.iter() {
        devices.push(if run.device { Some(DeviceState::new(run)?) } else { None });
    }
    let result = execute_with(runs, conns, &mut devices);
    for (run, d) in runs.iter().zip(devices) {
        if let Some(d) = d {
            d.release(run);
        }
    }
    result
}

fn execute_with(runs: &mut [CommRun], conns: &[Links], devices: &mut [Option<DeviceState>]) -> Result<()> {
    let mut scratch = vec![0u8; SLOT_BYTES];
    let mut idle = 0u32;
    loop {
        let mut progressed = false;
        let mut pending = false;
        for ((run, links), dev) in runs.iter_mut().zip(conns).zip(devices.iter_mut()) {
            if let Some(dev) = dev {
                let (moved, left) = dev.progress(run, links).map_err(|e| run.comm.record_error(e.context("collective")))?;
                progressed |= moved;
                pending |= left;
                continue;
            }
            for item in run.items.iter_mut() {
                while let Some((ci, step)) = item.steps.get(item.pc) {
                    let ok = try_step(step, &run.ctxs[*ci], links, &mut scratch)
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
                if let Some(e) = links.values().find_map(|c| c.failure()) {
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
            }
            std::thread::yield_now();
        }
    }
    Ok(out)
}

/// Performs one step if every FIFO it needs is ready; `Ok(false)` if not yet.
fn try_step(step: &Step, ctx: &OpCtx, links: &Links, scratch: &mut [u8]) -> Result<bool> {
    let conn = |l: &Link, d: Dir| links.get(&(*l, d)).expect("every link was connected");
    // All inputs present and all outputs free?
    let mut inputs: Vec<(&Arc<Connection>, u64, &[u8])> = Vec::with_capacity(step.recv.len());
    for l in &step.recv {
        let c = conn(l, Dir::Recv);
        match c.fifo.ready_slot() {
            Some((idx, data)) => {
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
        c.fifo.push(*idx, n);
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

/// Device work of one step, enqueued and not yet known to be complete.
struct InFlight {
    event: crate::backend::Event,
    pushes: Vec<(Arc<Connection>, u64, usize)>,
    pops: Vec<(Arc<Connection>, u64)>,
}

/// Steps of one work item the device may run ahead.
const DEVICE_PIPELINE: usize = 4;

/// The executor's state for a communicator whose buffers are device memory: each step is a
/// small device plan (a reduce kernel or copies) enqueued on one stream and followed by an
/// event; up to [`DEVICE_PIPELINE`] steps per work item are in flight, each on FIFO slots
/// reserved ahead of the counters, which move (in order) as the events complete.
struct DeviceState {
    /// Events not in use.
    free_events: Vec<crate::backend::Event>,
    all_events: Vec<crate::backend::Event>,
    inflight: Vec<std::collections::VecDeque<InFlight>>,
    /// Per connection (by address): the next slot index this rank will fill or empty, ahead
    /// of the FIFO counters while steps are in flight.
    reserved: HashMap<usize, u64>,
    /// Device memory for copies whose source and destination overlap (in-place all-to-all),
    /// made when first needed.
    scratch: Option<crate::backend::DevicePtr>,
    device: usize,
    /// Where the steps run: the caller's stream, or, when the caller passed a default stream
    /// (which names no device), the communicator's own stream, ordered after it.
    stream: crate::backend::Stream,
}

impl DeviceState {
    fn new(run: &CommRun) -> Result<DeviceState> {
        let backend = run.comm.backend();
        let device = run.comm.device()? as usize;
        let n = run.items.len() * DEVICE_PIPELINE;
        let mut cache = run.comm.device_cache();
        while cache.events.len() < n + 1 {
            let e = backend.create_event(device)?;
            cache.events.push(e);
        }
        let events: Vec<_> = cache.events.drain(..n).collect();
        let own_stream = run.stream.0 <= 2;
        let stream = if own_stream {
            let s = match cache.stream {
                Some(s) => s,
                None => *cache.stream.insert(backend.create_stream(device)?),
            };
            // Ordered after the caller's work on the default stream of this device.
            let e = cache.events[0];
            backend.record_event(e, run.stream)?;
            backend.stream_wait_event(s, e)?;
            s
        } else {
            run.stream
        };
        Ok(DeviceState {
            free_events: events.clone(),
            all_events: events,
            inflight: (0..run.items.len()).map(|_| Default::default()).collect(),
            reserved: HashMap::new(),
            scratch: None,
            device,
            stream,
        })
    }

    /// Gives the events back to the communicator's pool (every step has completed, or the
    /// operation failed and the communicator is broken).
    fn release(self, run: &CommRun) {
        let backend = run.comm.backend();
        if let Some(p) = self.scratch {
            let _ = backend.synchronize(self.stream);
            let _ = backend.free(p);
        }
        run.comm.device_cache().events.extend(self.all_events);
    }

    /// Completes finished steps and starts the next ones; returns (moved, work left).
    fn progress(&mut self, run: &mut CommRun, links: &Links) -> Result<(bool, bool)> {
        let backend = Arc::clone(run.comm.backend());
        let mut moved = false;
        let mut left = false;
        for (i, item) in run.items.iter_mut().enumerate() {
            while let Some(f) = self.inflight[i].front() {
                if !backend.query_event(f.event)? {
                    break;
                }
                let f = self.inflight[i].pop_front().expect("front exists");
                for (c, idx, n) in &f.pushes {
                    c.fifo.push(*idx, *n);
                }
                for (c, idx) in &f.pops {
                    c.fifo.pop(*idx);
                }
                self.free_events.push(f.event);
                moved = true;
            }
            while self.inflight[i].len() < DEVICE_PIPELINE {
                let Some((ci, step)) = item.steps.get(item.pc) else { break };
                if step_needs_scratch(step, &run.ctxs[*ci]) && self.scratch.is_none() {
                    self.scratch = Some(backend.alloc(self.device, crate::transport::GPU_SLOT_BYTES)?);
                }
                let scratch = self.scratch.unwrap_or(crate::backend::DevicePtr::NULL);
                let Some((pushes, pops)) =
                    start_device_step(step, &run.ctxs[*ci], links, &*backend, self.stream, scratch, &mut self.reserved)?
                else {
                    break;
                };
                let event = self.free_events.pop().ok_or_else(|| Error::internal("no free event"))?;
                backend.record_event(event, self.stream)?;
                self.inflight[i].push_back(InFlight { event, pushes, pops });
                item.pc += 1;
                moved = true;
            }
            left |= item.pc < item.steps.len() || !self.inflight[i].is_empty();
        }
        Ok((moved, left))
    }
}

/// Whether a local copy step's source and destination overlap without being equal.
fn step_needs_scratch(step: &Step, ctx: &OpCtx) -> bool {
    match (step.reduce, step.src, step.dst, step.recv.is_empty(), step.send.is_empty()) {
        (false, Some(s), Some(d), true, true) => {
            let (a, b) = (ctx.src + s, ctx.dst + d);
            a != b && a < b + step.bytes && b < a + step.bytes
        }
        _ => false,
    }
}

/// The FIFO slots a step fills and empties.
type Slots = (Vec<(Arc<Connection>, u64, usize)>, Vec<(Arc<Connection>, u64)>);

/// Enqueues one step as device work if its FIFOs have the slots (beyond those reserved by
/// steps still in flight); `None` if not yet.
fn start_device_step(
    step: &Step,
    ctx: &OpCtx,
    links: &Links,
    backend: &dyn crate::backend::DeviceBackend,
    stream: crate::backend::Stream,
    scratch: crate::backend::DevicePtr,
    reserved: &mut HashMap<usize, u64>,
) -> Result<Option<Slots>> {
    use crate::backend::{DevicePtr, LocalPlan, Step as DStep};
    let conn = |l: &Link, d: Dir| links.get(&(*l, d)).expect("every link was connected");
    if step.recv.len() > 1 && !step.reduce {
        return Err(Error::internal("a copy step cannot read several peers"));
    }
    let key = |c: &Arc<Connection>| Arc::as_ptr(c) as usize;
    let mut pops = Vec::new();
    for l in &step.recv {
        let c = conn(l, Dir::Recv);
        let idx = reserved.get(&key(c)).copied().unwrap_or(0).max(c.fifo.head());
        if idx >= c.fifo.tail() {
            return Ok(None);
        }
        let len = c.fifo.size_of(idx);
        if len != step.bytes {
            return Err(Error::invalid_usage(format!(
                "rank {} sent {len} bytes where this rank expected {}: the ranks' counts or types do not match",
                l.peer, step.bytes
            )));
        }
        pops.push((Arc::clone(c), idx));
    }
    let mut pushes = Vec::new();
    for l in &step.send {
        let c = conn(l, Dir::Send);
        let idx = reserved.get(&key(c)).copied().unwrap_or(0).max(c.fifo.tail());
        if idx - c.fifo.head() >= crate::transport::fifo::STEPS as u64 {
            return Ok(None);
        }
        pushes.push((Arc::clone(c), idx, step.bytes));
    }
    for (c, idx) in &pops {
        reserved.insert(key(c), idx + 1);
    }
    for (c, idx, _) in &pushes {
        reserved.insert(key(c), idx + 1);
    }
    let n = step.bytes;
    let recv = pops.first().map(|(c, idx)| DevicePtr(c.fifo.slot_addr(*idx)));
    let src = step.src.map(|o| DevicePtr((if step.src_in_dst { ctx.dst } else { ctx.src } + o) as u64));
    let dst = step.dst.map(|o| DevicePtr((ctx.dst + o) as u64));
    let mut outs: Vec<DevicePtr> = pushes.iter().map(|(c, idx, _)| DevicePtr(c.fifo.slot_addr(*idx))).collect();
    outs.extend(dst);
    let Some(&first) = outs.first() else {
        return Err(Error::internal("a step without output"));
    };
    let mut plan = LocalPlan::new();
    if n > 0 {
        let r = &ctx.reducer;
        if step.reduce {
            // acc = recv0 ⊕ pre(src), then ⊕ each further peer's partial (tree steps with two
            // children; the planner keeps PreMulSum, whose pre would apply to them, on rings).
            let count = n / r.elem_size();
            let more: Vec<DevicePtr> = pops.iter().skip(1).map(|(c, idx)| DevicePtr(c.fifo.slot_addr(*idx))).collect();
            plan.push(DStep::CollReduce {
                dst: first,
                acc: recv,
                local: src,
                count,
                dtype: r.dtype,
                op: r.op,
                post: step.post && more.is_empty(),
            });
            for (k, &p) in more.iter().enumerate() {
                plan.push(DStep::CollReduce {
                    dst: first,
                    acc: Some(first),
                    local: Some(p),
                    count,
                    dtype: r.dtype,
                    op: r.op,
                    post: step.post && k + 1 == more.len(),
                });
            }
        } else {
            let from = src.or(recv).ok_or_else(|| Error::internal("a step without input"))?;
            let overlap = from != first && from.0 < first.0 + n as u64 && first.0 < from.0 + n as u64;
            if overlap && n <= crate::transport::GPU_SLOT_BYTES {
                // Overlapping blocks of an in-place exchange: through scratch, like memmove.
                plan.push(DStep::Copy { dst: scratch, src: from, bytes: n });
                plan.push(DStep::Copy { dst: first, src: scratch, bytes: n });
            } else if from != first {
                plan.push(DStep::Copy { dst: first, src: from, bytes: n });
            }
        }
        for &o in &outs[1..] {
            plan.push(DStep::Copy { dst: o, src: first, bytes: n });
        }
        backend.launch(&plan, stream)?;
    }
    Ok(Some((pushes, pops)))
}
