//! The planned route's memo, coll's side: a single collective the router sent to the planner
//! ([`super::route::Route::Planned`]) called again with the same shape (kind, root, count,
//! type, operator) reuses the work the planner made the first time and the executor's
//! prepared run of it, kept by the communicator's engine (`exec::memo`); the call only
//! resolves its buffers (checked to lie in known memory, as the planner does) and runs. What
//! the planner chooses depends on the shape and on what is fixed for the communicator's life
//! (its ranks, the backend's capabilities, its config, `NCCL_ALGO` / `NCCL_PROTO`, read once
//! per process), never on the buffers: so a kept plan is the plan a fresh call would make.
//!
//! On the host backend an entry holds the host executor's prepared run. On a device backend
//! it holds the launch made for the plan (`exec::gpu::cached`): the program image, encoded
//! once and kept in the image arena (a buffer or a PreMulSum scalar is a kernel parameter,
//! not part of the image), the kernel, and the peer access of its connections; a call then
//! checks its two buffers, fills the kernel parameter and launches. The first call of a
//! shape goes the full way, then keeps what it planned.
//!
//! Which tasks reach it is the router's business (several ranks, some data, no
//! point-to-point, no check mode: `route::memo_may_serve`; blocking communicators outside
//! groups: `group::enqueue`). Its own conditions: the backend's capabilities ask for it
//! (`Capabilities::plan_cache`: the host and the GPU ones), `RUSTCCL_PLAN_CACHE` is not 0, no
//! tuner plugin (asked on every call: the memo is bypassed for good), and no profiler (its
//! events come from the planner; kept so since a hit saves a profiled call nothing measurable
//! next to its events, docs/STATUS.md). Its runs go through the call guard
//! ([`super::call::Call`]): the op log, failure marking, the last error.

use rustccl_plugin_api::Protocol;

use super::call::Call;
use super::observe as profiler_events;
use super::{plan, route, CollKind, Task};
use crate::backend::Stream;
use crate::comm::Communicator;
use crate::error::Result;
use crate::exec::memo::{Entry, Exec, Lookup, MemoKey, NO_RANK};
use crate::profile::{self, Stage};
use crate::work::{OpCtx, Work};

/// Runs `task`, a single collective on the planned route, from the memo: `None` when it must
/// go the full way (see the module's documentation); else its result, after it ran (the first
/// call of a shape the full way, then kept).
pub(crate) fn run_single(comm: &Communicator, task: &Task) -> Option<Result<()>> {
    if !memo_serves(comm, task) {
        return None;
    }
    let start = profile::start();
    let key = key_of(task);
    match comm.engine().take_plan(&key) {
        Lookup::Bypass => None,
        Lookup::Miss(epoch) => run_first(comm, task, key, epoch, start),
        Lookup::Hit(mut entry, epoch) => {
            if let Err(e) = point_at_call(comm, task, &mut entry) {
                return Some(Err(comm.record_error(e)));
            }
            profile::stage(Stage::Plan, start);
            super::way::trace_cached(task, comm.nranks_unchecked() as usize);
            let call = Call::start(comm, entry.exec.on_device(), std::iter::once(task));
            Some(run_entry(comm, call, entry, epoch, start))
        }
    }
}

/// Whether the memo serves `task` on `comm`: the router's rules, then the memo's own.
fn memo_serves(comm: &Communicator, task: &Task) -> bool {
    route::memo_may_serve(task, comm.nranks_unchecked(), route::Settings::get())
        && comm.backend().capabilities().plan_cache
        && switched_on()
        && !profiler_events::wants_plan_record()
}

/// Whether `RUSTCCL_PLAN_CACHE` leaves the memo on (read once).
fn switched_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::params::env_int_or("RUSTCCL_PLAN_CACHE", 1) != 0)
}

/// The memo's key of `task`: what a plan depends on.
fn key_of(task: &Task) -> MemoKey {
    let rank = match task.kind {
        CollKind::AllReduce | CollKind::AllGather | CollKind::ReduceScatter => NO_RANK,
        CollKind::Broadcast { root } | CollKind::Reduce { root } => root,
        CollKind::Send { peer } | CollKind::Recv { peer } => peer,
    };
    MemoKey { collective: task.kind.collective(), rank, count: task.count, dtype: task.dtype, op: task.op.red_op() }
}

/// A miss: plans `task` the full way, runs it, and keeps it (when the plan is one context;
/// else `None`, and the caller goes the full way). With a tuner, the memo is bypassed from
/// now on.
fn run_first(comm: &Communicator, task: &Task, key: MemoKey, epoch: u64, start: Option<std::time::Instant>) -> Option<Result<()>> {
    match comm.plugins() {
        Ok(p) if p.tuner.is_some() => {
            comm.engine().bypass_plans();
            return None;
        }
        Ok(_) => {}
        Err(e) => return Some(Err(e)),
    }
    let run = match plan::build(comm, std::slice::from_ref(task)) {
        Ok(run) if run.work.ctxs.len() == 1 => run,
        Ok(_) => return None,
        Err(e) => return Some(Err(comm.record_error(e))),
    };
    profile::stage(Stage::Plan, start);
    let proto = run.work.ctxs[0].proto;
    let call = Call::start(comm, run.device, std::iter::once(task));
    Some(if run.device { run_first_device(comm, call, run, key, proto, epoch, start) } else { run_first_host(comm, call, run, key, proto, epoch, start) })
}

/// A miss on the host: connects what the new plan uses, prepares its run, runs it and keeps
/// it.
fn run_first_host(comm: &Communicator, call: Call<'_>, run: plan::CommRun, key: MemoKey, proto: Protocol, epoch: u64, start: Option<std::time::Instant>) -> Result<()> {
    let links = match super::exec::connect(std::slice::from_ref(&run)) {
        Ok(mut links) => links.remove(0),
        Err(e) => return call.end(Err(e)),
    };
    let exec = Exec::host(&run.work, &links);
    run_entry(comm, call, Entry { key, work: run.work, exec, proto }, epoch, start)
}

/// A miss on a device: runs the new plan the full way (connections, encode, launch), then
/// keeps it with a launch made for it (when it is one launch: see `CachedLaunch::new`).
fn run_first_device(comm: &Communicator, call: Call<'_>, run: plan::CommRun, key: MemoKey, proto: Protocol, epoch: u64, start: Option<std::time::Instant>) -> Result<()> {
    let mut runs = [run];
    if let Err(e) = super::exec::run(&mut runs) {
        return call.end(Err(e));
    }
    profile::stage(Stage::Total, start);
    let [run] = runs;
    // Every connection was made by the run: this finds them.
    let made = super::exec::connect(std::slice::from_ref(&run)).map(|mut l| l.remove(0));
    match made.and_then(|links| Exec::device(comm.engine(), &run.work, &links)) {
        Ok(Some(exec)) => comm.engine().keep_plan(Entry { key, work: run.work, exec, proto }, epoch),
        Ok(None) => {}
        Err(e) => tracing::debug!(target: "COLL", "rank {}: the launch is not kept ({})", comm.rank_unchecked(), e.message),
    }
    call.end(Ok(()))
}

/// Runs a memo entry pointed at this call's buffers, and keeps it again if it ran.
fn run_entry(comm: &Communicator, call: Call<'_>, mut entry: Entry, epoch: u64, start: Option<std::time::Instant>) -> Result<()> {
    if let Some(links) = entry.exec.device_links() {
        // This call's receive buffer may be registered: zero-copy, as uncached.
        comm.resolve_direct_receives(&mut entry.work, links);
    }
    let r = entry.exec.run(&mut entry.work, comm.engine(), comm);
    if r.is_ok() {
        comm.engine().keep_plan(entry, epoch);
    }
    let r = call.end(r);
    profile::stage(Stage::Total, start);
    r
}

/// Points a kept plan at this call's buffers: its one context, made as the planner makes it
/// (the address checked on the host backend; the address itself on devices, whose launch
/// checks it).
fn point_at_call(comm: &Communicator, task: &Task, entry: &mut Entry) -> Result<()> {
    let ctx = plan::task_ctx(comm, task)?;
    point_at(&mut entry.work, ctx, entry.proto, task.stream);
    Ok(())
}

/// Points `work`, a kept plan of one context with protocol `proto`, at a call's context `ctx`
/// (made by the planner's `op_ctx`) and its stream.
fn point_at(work: &mut Work, mut ctx: OpCtx, proto: Protocol, stream: Stream) {
    ctx.proto = proto;
    work.ctxs[0] = ctx;
    work.stream = stream;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Capabilities, DeviceBackend, DevicePtr};
    use crate::coll::{ReduceOp, Scalar};
    use crate::exec::gpu::cached::CachedLaunch;
    use crate::exec::gpu::fake::{links_for, FakeDevice};
    use crate::exec::gpu::ExecState;
    use crate::exec::memo::Memo;
    use crate::types::DataType;
    use std::sync::Arc;

    fn task(kind: CollKind, count: usize, dtype: DataType, op: ReduceOp) -> Task {
        Task { kind, send: DevicePtr(0x1000), recv: DevicePtr(0x2000), count, dtype, op, stream: Stream(0), profile: Default::default(), options: Default::default() }
    }

    #[test]
    fn keys_differ_in_every_thing_a_plan_depends_on_and_not_in_buffers() {
        let base = task(CollKind::AllReduce, 4, DataType::Float32, ReduceOp::Sum);
        let k = key_of(&base);
        let others = [
            task(CollKind::AllReduce, 5, DataType::Float32, ReduceOp::Sum),
            task(CollKind::AllReduce, 4, DataType::Int32, ReduceOp::Sum),
            task(CollKind::AllReduce, 4, DataType::Float32, ReduceOp::Max),
            task(CollKind::AllGather, 4, DataType::Float32, ReduceOp::Sum),
            task(CollKind::Broadcast { root: 0 }, 4, DataType::Float32, ReduceOp::Sum),
        ];
        for o in &others {
            assert_ne!(key_of(o), k, "{o:?}");
        }
        assert_ne!(key_of(&task(CollKind::Broadcast { root: 1 }, 4, DataType::Float32, ReduceOp::Sum)), key_of(&others[4]));
        let elsewhere = Task { send: DevicePtr(0x9000), recv: DevicePtr(0x9000), ..base.clone() };
        assert_eq!(key_of(&elsewhere), k, "buffers are patched per call, not keyed");
    }

    #[test]
    fn premulsum_scalars_are_not_keyed() {
        let scalar = |s| task(CollKind::AllReduce, 4, DataType::Float32, ReduceOp::PreMulSum(s));
        let k = key_of(&scalar(Scalar::Host(0.5)));
        assert_eq!(key_of(&scalar(Scalar::Host(2.0))), k, "a call value (the kernel parameter on devices)");
        assert_eq!(key_of(&scalar(Scalar::Device(DevicePtr(0x40)))), k);
        assert_ne!(key_of(&task(CollKind::AllReduce, 4, DataType::Float32, ReduceOp::Sum)), k);
    }

    /// An all_reduce sum of `count` floats at `send` / `recv` on stream 7.
    fn sum(count: usize, op: ReduceOp, send: u64, recv: u64) -> Task {
        Task { send: DevicePtr(send), recv: DevicePtr(recv), stream: Stream(7), ..task(CollKind::AllReduce, count, DataType::Float32, op) }
    }

    /// Runs `f` with the planner's environment of rank 0 of 2 on a GPU.
    fn with_env<T>(f: impl FnOnce(&plan::PlanEnv) -> T) -> T {
        let identity = |p: DevicePtr, _: usize| -> Result<usize> { Ok(p.0 as usize) };
        let caps = Capabilities::gpu();
        f(&plan::PlanEnv { rank: 0, nranks: 2, caps: &caps, executor: crate::exec::executor::Executor::of(&caps), min_ctas: 1, max_ctas: 64, tuner: None, resolve: &identity })
    }

    /// The planner's work for `task` on rank 0 of 2 on a GPU.
    fn planned(task: &Task) -> Work {
        let (work, device) = with_env(|env| plan::plan(env, std::slice::from_ref(task))).unwrap();
        assert!(device);
        work
    }

    fn fake_backend() -> (Arc<FakeDevice>, Arc<dyn DeviceBackend>) {
        let fake = Arc::new(FakeDevice::default());
        let dynb: Arc<dyn DeviceBackend> = fake.clone();
        (fake, dynb)
    }

    /// A device entry (the launch made for a plan on other buffers) serves calls of its shape
    /// with what the uncached path launches for them, and no other shape.
    #[test]
    fn a_device_entry_serves_its_shape_as_the_uncached_path_would() {
        let made = sum(1000, ReduceOp::Sum, 0xb000_0000, 0xb100_0000);
        let call = sum(1000, ReduceOp::Sum, 0xa000_0000, 0xa100_0000);
        let work = planned(&made);
        let links = links_for(&work);
        let (fake, backend) = fake_backend();
        let launch = CachedLaunch::new(&backend, 0, &work, &links).unwrap().expect("one launch");
        let proto = work.ctxs[0].proto;
        let mut memo = Memo::default();
        let Lookup::Miss(epoch) = memo.take(&key_of(&made)) else { panic!("empty memo hit") };
        memo.put(Entry { key: key_of(&made), work, exec: Exec::Device(Box::new(launch)), proto }, epoch);
        let others = [
            sum(2000, ReduceOp::Sum, 0xa000_0000, 0xa100_0000),
            Task { dtype: DataType::Float64, ..call.clone() },
            sum(1000, ReduceOp::Max, 0xa000_0000, 0xa100_0000),
            Task { kind: CollKind::Reduce { root: 0 }, ..call.clone() },
        ];
        for o in &others {
            assert!(matches!(memo.take(&key_of(o)), Lookup::Miss(_)), "{o:?}");
        }
        let Lookup::Hit(mut e, _) = memo.take(&key_of(&call)) else { panic!("no hit") };
        let ctx = with_env(|env| plan::op_ctx(env, &call)).unwrap();
        point_at(&mut e.work, ctx, e.proto, call.stream);
        let Exec::Device(launch) = &mut e.exec else { panic!("a host entry") };
        launch.launch(&backend, 0, &mut ExecState::default(), &e.work).unwrap();
        let (reference, ref_backend) = fake_backend();
        crate::exec::gpu::launch(&ref_backend, 0, &mut ExecState::default(), &planned(&call), &links).unwrap();
        let (got, want) = (fake.log(), reference.log());
        assert_eq!(got.launches.len(), 1);
        assert_eq!(got.launches, want.launches);
        assert_eq!(got.uploads, want.uploads);
        assert_eq!(got.launches[0].args.calls[0].src, 0xa000_0000);
    }
}
