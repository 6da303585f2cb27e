//! What the ways around the planner share, and the one-rank route: [`may_skip_planner`] (what
//! every way around the planner needs of a task), [`finish`] (the end of a call that skipped
//! the planner), and the one-rank route's run ([`try_one_rank`], [`run_one_rank`]). (The plan
//! cache that gave this module its name is now the planned route's memo: `coll::planned` and
//! `exec::memo`.)

use super::observe as profiler_events;

use super::{plan, CollKind, Task};
use crate::comm::Communicator;
use crate::error::Result;
use crate::exec::host::{HostRun, Prepared};
use crate::work::Work;

/// What every way around the planner needs (a single collective outside a group is the
/// caller's business): a non-empty collective, not point-to-point, on a blocking
/// communicator, and no check mode (which checks each call's plan). A profiler does not keep
/// an operation from them: each gives its events (`profiler_events::single_op`).
pub(super) fn may_skip_planner(comm: &Communicator, task: &Task) -> bool {
    task.count > 0 && !task.kind.is_p2p() && comm.config().blocking && !super::check::enabled()
}

/// The end of a call that skipped the planner: a failure breaks the communicator, and the
/// op log hears that the operation finished unless device work still runs (the watchdog sees
/// it end). Also the end of the symmetric collectives (`coll::symmetric`).
pub(super) fn finish(comm: &Communicator, r: &Result<()>, device: bool) {
    if let Err(e) = r {
        comm.mark_broken(e);
    }
    if !device || r.is_err() {
        comm.op_log().all_finished();
    }
}

/// A single operation on a one-rank communicator that the one-rank route serves
/// ([`super::way::one_rank`]), run now by [`run_one_rank`]; `None` when it must go the usual
/// way: the route does not serve it, or, on a non-blocking communicator, work queued earlier
/// is still running (the operation waits behind it as a background job) or failed (the usual
/// way refuses it).
pub(crate) fn try_one_rank(comm: &Communicator, task: &Task) -> Option<Result<()>> {
    let eligible = super::way::one_rank(comm.nranks_unchecked(), std::slice::from_ref(task)) && may_run_now(comm);
    eligible.then(|| run_one_rank(comm, std::slice::from_ref(task)))
}

/// Whether work on `comm` may run on the calling thread now: always on a blocking
/// communicator; on a non-blocking one when no background job of it is queued or running
/// (work runs in call order) and none failed.
pub(crate) fn may_run_now(comm: &Communicator) -> bool {
    if comm.config().blocking {
        return true;
    }
    let jobs = comm.background_jobs();
    !jobs.busy() && jobs.error().is_none()
}

/// One communicator's share of a group on the one-rank route ([`super::way::one_rank`]): the
/// buffers of every task resolved and checked as the planner does it, sends to self paired
/// with receives from self in order (the planner's errors when they do not pair up), then in
/// place nothing at all, out of place one copy per collective (in call order) and per pair
/// (after them, as the planner orders its copies) — a copy on the task's stream on devices
/// (the pair's: its receive's), a copy by the host executor on the host backend. Nothing
/// goes to the planner, the device interpreter or the FIFOs; on a non-blocking communicator
/// it has completed (as far as the host is concerned) when it returns. Each task gets the
/// profiler events of a way around the planner (one channel) and a TRACE way line; the op
/// log hears of the tasks that copy.
pub(crate) fn run_one_rank(comm: &Communicator, tasks: &[Task]) -> Result<()> {
    let start = crate::profile::start();
    let r = run_one_rank_untimed(comm, tasks);
    crate::profile::stage(crate::profile::Stage::Total, start);
    r
}

fn run_one_rank_untimed(comm: &Communicator, tasks: &[Task]) -> Result<()> {
    let tasks: Vec<&Task> = tasks.iter().filter(|t| t.count > 0).collect();
    let mut ctxs = Vec::with_capacity(tasks.len());
    for task in &tasks {
        ctxs.push(plan::task_ctx(comm, task).map_err(|e| comm.record_error(e))?);
    }
    // (task, bytes) of the sends to self and of the receives from self, in call order.
    let of = |send: bool| -> Vec<(usize, usize)> {
        let kind_is = |t: &Task| if send { matches!(t.kind, CollKind::Send { .. }) } else { matches!(t.kind, CollKind::Recv { .. }) };
        tasks.iter().enumerate().filter(|(_, t)| kind_is(t)).map(|(i, t)| (i, t.count * t.dtype.size())).collect()
    };
    let pairs = plan::self_pairs(of(true), of(false)).map_err(|e| comm.record_error(e))?;
    // The copies: (source, destination, bytes, the tasks they serve), collectives first.
    let mut copies: Vec<(usize, usize, usize, [usize; 2])> = Vec::new();
    for (i, (task, ctx)) in tasks.iter().zip(&ctxs).enumerate() {
        if !task.kind.is_p2p() && ctx.src != ctx.dst {
            copies.push((ctx.src, ctx.dst, ctx.dst_len, [i, i]));
        }
    }
    for &(s, r, bytes) in &pairs {
        if ctxs[s].src != ctxs[r].dst {
            copies.push((ctxs[s].src, ctxs[r].dst, bytes, [s, r]));
        }
    }
    let events: Vec<_> = tasks
        .iter()
        .map(|task| {
            super::way::trace(task, 1, super::way::Way::OneRank);
            profiler_events::single_op(comm, task, || profiler_events::OpPlan { algo: "", proto: "", channels: 1 })
        })
        .collect();
    let r = if copies.is_empty() { Ok(()) } else { copy(comm, &tasks, &copies) };
    // (Device copies are enqueued by then, in stream order; their channels complete here.)
    events.into_iter().for_each(|e| profiler_events::end_single_op(e, &r));
    r
}

/// The copies of [`run_one_rank`], told to the op log.
fn copy(comm: &Communicator, tasks: &[&Task], copies: &[(usize, usize, usize, [usize; 2])]) -> Result<()> {
    let shapes: Vec<_> = copies.iter().flat_map(|c| if c.3[0] == c.3[1] { &c.3[..1] } else { &c.3[..] }).map(|&i| tasks[i].shape()).collect();
    comm.op_log().started(&shapes);
    let r = if !comm.backend().capabilities().host_addressable {
        // Device copies in stream order, as NCCL's one-rank calls: they read and write only
        // the caller's buffers and cannot hang, so they need neither the executor's event
        // (the watchdog's and teardown's view of running kernels) nor ordering after the
        // communicator's work on other streams, nor a capture check (copies are captured as
        // they are).
        let t = crate::profile::start();
        let r = copies.iter().try_for_each(|&(src, dst, bytes, [_, task])| {
            let (dst, src) = (crate::backend::DevicePtr(dst as u64), crate::backend::DevicePtr(src as u64));
            comm.backend().copy(dst, src, bytes, tasks[task].stream)
        });
        crate::profile::stage(crate::profile::Stage::Copy, t);
        r.map_err(|e| comm.record_error(e.context("collective")))
    } else {
        let mut work = Work {
            ctxs: Vec::new(),
            items: Vec::new(),
            copies: copies.iter().map(|&(src, dst, bytes, _)| crate::work::LocalCopy { src, dst, bytes }).collect(),
            stream: tasks[copies[0].3[1]].stream,
        };
        let links = crate::exec::Links::new();
        let mut prep = Prepared::new(&work, &links);
        crate::exec::host::run(&mut [HostRun { work: &mut work, prep: &mut prep, comm }])
    };
    finish(comm, &r, false);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DataType;

    #[test]
    fn one_rank_collectives_copy_or_do_nothing_and_computing_ones_still_compute() {
        use crate::backend::{DevicePtr, Stream};
        use crate::coll::ReduceOp;
        std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
        let id = crate::get_unique_id().unwrap();
        let c = Communicator::init_rank(1, &id, 0).unwrap();
        let b = std::sync::Arc::clone(c.backend());
        let n = 1001usize;
        let (x, y) = (b.alloc(0, n * 4).unwrap(), b.alloc(0, n * 4).unwrap());
        let input: Vec<f32> = (0..n).map(|i| i as f32 - 7.5).collect();
        let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
        let read = |p: DevicePtr| {
            let mut out = vec![0u8; n * 4];
            b.copy_from_device(&mut out, p, Stream::DEFAULT).unwrap();
            out.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<f32>>()
        };
        b.copy_to_device(x, &bytes(&input), Stream::DEFAULT).unwrap();
        b.memset(y, 0xff, n * 4, Stream::DEFAULT).unwrap();
        // Out of place: the input, copied (sum, max and avg over one rank are the identity).
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
            b.memset(y, 0xff, n * 4, Stream::DEFAULT).unwrap();
            try_one_rank(&c, &Task { kind: CollKind::AllReduce, send: x, recv: y, count: n, dtype: DataType::Float32, op, stream: Stream::DEFAULT, profile: Default::default() })
                .expect("the one-rank path takes it")
                .unwrap();
            b.synchronize(Stream::DEFAULT).unwrap();
            assert_eq!(read(y), input, "{op:?}, direct");
            b.memset(y, 0xff, n * 4, Stream::DEFAULT).unwrap();
            c.all_reduce(x, y, n, DataType::Float32, op, Stream::DEFAULT).unwrap();
            b.synchronize(Stream::DEFAULT).unwrap();
            assert_eq!(read(y), input, "{op:?}");
        }
        // In place: untouched. A broadcast out of place: a copy.
        c.all_reduce(x, x, n, DataType::Float32, ReduceOp::Sum, Stream::DEFAULT).unwrap();
        assert_eq!(read(x), input);
        b.memset(y, 0, n * 4, Stream::DEFAULT).unwrap();
        c.broadcast(x, y, n, DataType::Float32, 0, Stream::DEFAULT).unwrap();
        b.synchronize(Stream::DEFAULT).unwrap();
        assert_eq!(read(y), input);
        // PreMulSum computes: not this path, and the result is scaled.
        let premul = ReduceOp::PreMulSum(crate::coll::Scalar::Host(2.0));
        assert!(try_one_rank(&c, &Task { kind: CollKind::AllReduce, send: x, recv: y, count: n, dtype: DataType::Float32, op: premul, stream: Stream::DEFAULT, profile: Default::default() }).is_none());
        c.all_reduce(x, y, n, DataType::Float32, premul, Stream::DEFAULT).unwrap();
        b.synchronize(Stream::DEFAULT).unwrap();
        assert_eq!(read(y), input.iter().map(|v| v * 2.0).collect::<Vec<_>>());
        // Memory the backend does not know is refused as the planner refuses it.
        let e = c.all_reduce(x, DevicePtr(0x10), n, DataType::Float32, ReduceOp::Sum, Stream::DEFAULT).unwrap_err();
        assert!(e.message.contains("receive buffer"), "{}", e.message);
        b.free(x).unwrap();
        b.free(y).unwrap();
        c.destroy().unwrap();
    }
}
