//! The one-rank route (`route::Route::OneRank`, eligibility in [`super::way::one_rank`]): one
//! communicator's share of a group (a single call is a group of one) on a one-rank
//! communicator whose tasks all leave their input as it is. The buffers of every task are
//! resolved and checked as the planner does it, sends to self are paired with receives from
//! self in order (the planner's errors when they do not pair up); then in place nothing runs
//! at all, out of place one copy per collective (in call order) and per pair (after them, as
//! the planner orders its copies), made by the executor (`exec::local_copies`: on a device a
//! copy on the task's stream, the pair's receive's; on the host backend by the calling
//! thread). Nothing goes to the planner, the device interpreter or the FIFOs; on a
//! non-blocking communicator the share has completed (as far as the host is concerned) when it
//! returns.
//!
//! It runs under the call guard (`coll::call`), as a host share (device copies are enqueued in
//! stream order when it returns and cannot hang, so nothing waits for them): the op log hears
//! only of the tasks that copy (an in-place call leaves it as it was), each task gets the
//! profiler events of a way around the planner (one channel) and a TRACE way line, and a copy
//! that fails breaks the communicator. Errors found before anything ran (a buffer the backend
//! does not know, a send without its receive) are the caller's.

use super::call::Call;
use super::{plan, CollKind, Task};
use crate::backend::Stream;
use crate::comm::Communicator;
use crate::error::Result;
use crate::work::LocalCopy;

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

/// Runs one communicator's share of a group on the one-rank route (see the module docs).
pub(crate) fn run_one_rank(comm: &Communicator, tasks: &[Task]) -> Result<()> {
    let start = crate::profile::start();
    let r = run_untimed(comm, tasks);
    crate::profile::stage(crate::profile::Stage::Total, start);
    r
}

fn run_untimed(comm: &Communicator, tasks: &[Task]) -> Result<()> {
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
    // The copies, collectives first, each on its stream (a pair's: its receive's), and the
    // tasks they serve in that order (the ones the op log hears of).
    let mut copies: Vec<(LocalCopy, Stream)> = Vec::new();
    let mut copying: Vec<usize> = Vec::new();
    for (i, (task, ctx)) in tasks.iter().zip(&ctxs).enumerate() {
        if !task.kind.is_p2p() && ctx.src != ctx.dst {
            copies.push((LocalCopy { src: ctx.src, dst: ctx.dst, bytes: ctx.dst_len }, task.stream));
            copying.push(i);
        }
    }
    for &(s, r, bytes) in &pairs {
        if ctxs[s].src != ctxs[r].dst {
            copies.push((LocalCopy { src: ctxs[s].src, dst: ctxs[r].dst, bytes }, tasks[r].stream));
            copying.extend([s, r]);
        }
    }
    let mut call = Call::start(comm, false, copying.iter().map(|&i| tasks[i]));
    for task in &tasks {
        super::way::trace(task, 1, super::way::Way::OneRank);
        call.around_planner(task);
    }
    let r = if copies.is_empty() { Ok(()) } else { crate::exec::local_copies(&**comm.backend(), &copies) };
    call.end(r.map_err(|e| e.context("collective")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::DevicePtr;
    use crate::coll::ReduceOp;
    use crate::types::DataType;

    #[test]
    fn one_rank_collectives_copy_or_do_nothing_and_computing_ones_still_compute() {
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
            try_one_rank(&c, &Task { kind: CollKind::AllReduce, send: x, recv: y, count: n, dtype: DataType::Float32, op, stream: Stream::DEFAULT, profile: Default::default(), options: Default::default() })
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
        assert!(try_one_rank(&c, &Task { kind: CollKind::AllReduce, send: x, recv: y, count: n, dtype: DataType::Float32, op: premul, stream: Stream::DEFAULT, profile: Default::default(), options: Default::default() }).is_none());
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

    /// The op log hears only of the tasks that copy: in place nothing, so device work
    /// launched earlier stays shown running (the watchdog says when it ends); out of place the
    /// copies' tasks start and finish (a collective, a send/recv pair to self: three), and
    /// the in-place task among them is not counted.
    #[test]
    fn the_op_log_hears_only_of_the_tasks_that_copy() {
        std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
        let id = crate::get_unique_id().unwrap();
        let c = Communicator::init_rank(1, &id, 0).unwrap();
        let b = std::sync::Arc::clone(c.backend());
        let n = 64usize;
        let (x, y, z) = (b.alloc(0, n * 4).unwrap(), b.alloc(0, n * 4).unwrap(), b.alloc(0, n * 4).unwrap());
        let task = |kind: CollKind, send: DevicePtr, recv: DevicePtr| Task { kind, send, recv, count: n, dtype: DataType::Float32, op: ReduceOp::Sum, stream: Stream::DEFAULT, profile: Default::default(), options: Default::default() };
        let seq = || c.op_log().status().started.map_or(0, |d| d.seq);
        // Device work launched earlier, still running.
        c.op_log().started(&[task(CollKind::AllReduce, x, y).shape()]);
        let before = seq();
        run_one_rank(&c, &[task(CollKind::AllReduce, x, x)]).unwrap();
        run_one_rank(&c, &[task(CollKind::Send { peer: 0 }, x, x), task(CollKind::Recv { peer: 0 }, x, x)]).unwrap();
        assert_eq!(seq(), before, "in place: no operation started");
        assert!(c.op_log().status().busy, "in place: the earlier work is still shown running");
        let group = [
            task(CollKind::AllReduce, x, x),
            task(CollKind::Send { peer: 0 }, x, x),
            task(CollKind::Broadcast { root: 0 }, x, y),
            task(CollKind::Recv { peer: 0 }, z, z),
        ];
        run_one_rank(&c, &group).unwrap();
        assert_eq!(seq(), before + 3, "the broadcast and the pair copy; the in-place all_reduce does not");
        assert!(!c.op_log().status().busy, "the copies finished with the call");
        for p in [x, y, z] {
            b.free(p).unwrap();
        }
        c.destroy().unwrap();
    }
}
