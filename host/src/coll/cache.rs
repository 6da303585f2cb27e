//! Plans cached by shape: a single collective called again with the same shape (kind, root,
//! count, type, operator) reuses the work the planner made the first time, and the
//! connections its steps use, looked up then; the call only resolves its buffers (checked to
//! lie in known memory, as the planner does) and runs. What the planner chooses depends on the
//! shape and on what is fixed for the communicator's life (its ranks, the backend's
//! capabilities, its config, `NCCL_ALGO` / `NCCL_PROTO`, read once per process), never on the
//! buffers: so a cached plan is the plan a fresh call would make.
//!
//! On the host backend an entry holds the host executor's prepared run. On a device backend
//! it holds the launch made for the plan (`exec::gpu::cached`): the program image, encoded
//! once and kept in the image arena (a buffer or a PreMulSum scalar is a kernel parameter,
//! not part of the image), the kernel, and the peer access of its connections; a call then
//! checks its two buffers, fills the kernel parameter and launches. The first call of a
//! shape goes the full way, then keeps what it planned.
//!
//! Backends use it when their capabilities ask for it (`Capabilities::plan_cache`: the host
//! and the GPU ones), unless `RUSTCCL_PLAN_CACHE=0`. Calls that need what the cache skips go
//! the full way: inside a group, on a non-blocking communicator, with a tuner plugin (which is
//! asked on every call), with a profiler loaded (its events come from the planner; the other ways around the
//! planner give their own, see `profiler_events::single_op`; kept so since a hit saves a
//! profiled call nothing measurable next to its events, docs/STATUS.md), with
//! `RUSTCCL_CHECK_COLLECTIVES`, point-to-point, one rank, and empty operations.
//!
//! The cache lives with the communicator's connections (`comm::Transports`): when those go
//! (suspend), the plans that name them go too. An entry is taken out while it runs and put
//! back after; one whose run failed is dropped (the communicator is broken by then anyway).

use std::sync::atomic::{AtomicU64, Ordering};
use super::observe as profiler_events;

use rustccl_plugin_api::Protocol;

use super::{plan, CollKind, Task};
use crate::comm::Communicator;
use crate::error::Result;
use crate::exec::gpu::cached::CachedLaunch;
use crate::exec::host::{HostRun, Prepared};
use crate::types::{DataType, RedOp};
use crate::work::Work;

/// Entries kept per communicator (least recently used go first).
const MAX_ENTRIES: usize = 32;

/// What a plan depends on, of a task.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PlanKey {
    kind: CollKind,
    count: usize,
    dtype: DataType,
    /// The operator (the plan does not depend on it today; kept in the key so that it never
    /// silently starts to).
    op: RedOp,
}

impl PlanKey {
    pub(crate) fn of(task: &Task) -> PlanKey {
        PlanKey { kind: task.kind.clone(), count: task.count, dtype: task.dtype, op: task.op.red_op() }
    }
}

/// One cached plan: the work (its contexts rewritten per call) and what runs it.
pub(crate) struct Entry {
    key: PlanKey,
    work: Work,
    exec: Exec,
    /// The protocol the planner chose (part of each call's context).
    proto: Protocol,
}

/// What runs a cached plan.
enum Exec {
    /// The host executor's run, with its steps' connections.
    Host(Prepared),
    /// The device launch (image, kernel, connections); boxed, as it is larger than the rest.
    Device(Box<CachedLaunch>),
}

/// A communicator's cached plans.
pub(crate) struct PlanCache {
    /// Names this cache (and so the connections its entries hold): an entry taken from one
    /// cache goes back only into the same one.
    epoch: u64,
    /// Least recently used first.
    entries: Vec<Entry>,
    /// Set when the communicator has a tuner: every call asks it, nothing is cached.
    bypass: bool,
}

impl Default for PlanCache {
    fn default() -> PlanCache {
        static EPOCH: AtomicU64 = AtomicU64::new(1);
        PlanCache { epoch: EPOCH.fetch_add(1, Ordering::Relaxed), entries: Vec::new(), bypass: false }
    }
}

/// What a look-up found.
pub(crate) enum Lookup {
    Hit(Entry, u64),
    Miss(u64),
    Bypass,
}

impl PlanCache {
    pub(crate) fn take(&mut self, key: &PlanKey) -> Lookup {
        if self.bypass {
            return Lookup::Bypass;
        }
        match self.entries.iter().rposition(|e| e.key == *key) {
            Some(i) => Lookup::Hit(self.entries.remove(i), self.epoch),
            None => Lookup::Miss(self.epoch),
        }
    }

    pub(crate) fn put(&mut self, entry: Entry, epoch: u64) {
        if epoch != self.epoch {
            return;
        }
        if self.entries.len() >= MAX_ENTRIES {
            self.entries.remove(0);
        }
        self.entries.push(entry);
    }

    pub(crate) fn set_bypass(&mut self) {
        self.bypass = true;
        self.entries.clear();
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Whether `RUSTCCL_PLAN_CACHE` leaves the cache on (read once).
fn switched_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::params::env_int_or("RUSTCCL_PLAN_CACHE", 1) != 0)
}

/// Whether the fast path may run `task` (outside a group) on `comm`.
fn eligible(comm: &Communicator, task: &Task) -> bool {
    comm.nranks_unchecked() > 1
        && comm.backend().capabilities().plan_cache
        && switched_on()
        && may_skip_planner(comm, task)
        && !profiler_events::wants_plan_record()
}

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

/// Runs a single operation (outside a group) from the cache; `None` when it must go the full
/// way (see the module's documentation).
pub(crate) fn try_run(comm: &Communicator, task: &Task) -> Option<Result<()>> {
    if !eligible(comm, task) {
        return None;
    }
    let start = crate::profile::start();
    let key = PlanKey::of(task);
    let (entry, epoch) = match comm.take_plan(&key) {
        Lookup::Bypass => return None,
        Lookup::Hit(entry, epoch) => (Some(entry), epoch),
        Lookup::Miss(epoch) => (None, epoch),
    };
    let entry = match entry {
        Some(mut entry) => match patch(comm, task, &mut entry) {
            Ok(()) => entry,
            Err(e) => return Some(Err(comm.record_error(e))),
        },
        None => match comm.plugins() {
            Ok(p) if p.tuner.is_some() => {
                comm.bypass_plans();
                return None;
            }
            Ok(_) => match plan::build(comm, std::slice::from_ref(task)) {
                Ok(run) if run.work.ctxs.len() == 1 => {
                    let proto = run.work.ctxs[0].proto;
                    return Some(if run.device {
                        run_new_device(comm, task, run, key, proto, epoch, start)
                    } else {
                        run_new(comm, task, run, key, proto, epoch, start)
                    });
                }
                Ok(_) => return None,
                Err(e) => return Some(Err(comm.record_error(e))),
            },
            Err(e) => return Some(Err(e)),
        },
    };
    crate::profile::stage(crate::profile::Stage::Plan, start);
    super::way::trace_cached(task, comm.nranks_unchecked() as usize);
    Some(run_entry(comm, task, entry, epoch, start))
}

/// A miss: connects what the new plan uses, then runs it and keeps it.
fn run_new(comm: &Communicator, task: &Task, run: plan::CommRun, key: PlanKey, proto: Protocol, epoch: u64, start: Option<std::time::Instant>) -> Result<()> {
    crate::profile::stage(crate::profile::Stage::Plan, start);
    comm.op_log().started(std::slice::from_ref(&task.shape()));
    let runs = std::slice::from_ref(&run);
    let links = match super::exec::connect(runs) {
        Ok(mut links) => links.remove(0),
        Err(e) => {
            comm.mark_broken(&e);
            comm.op_log().all_finished();
            return Err(e);
        }
    };
    let prep = Prepared::new(&run.work, &links);
    let entry = Entry { key, work: run.work, exec: Exec::Host(prep), proto };
    execute(comm, entry, epoch, start)
}

/// A miss on a device: runs the new plan the full way (connections, encode, launch), then
/// keeps it with a launch made for it (when it is one launch: see `CachedLaunch::new`).
fn run_new_device(comm: &Communicator, task: &Task, run: plan::CommRun, key: PlanKey, proto: Protocol, epoch: u64, start: Option<std::time::Instant>) -> Result<()> {
    crate::profile::stage(crate::profile::Stage::Plan, start);
    comm.op_log().started(std::slice::from_ref(&task.shape()));
    let mut runs = [run];
    if let Err(e) = super::exec::run(&mut runs) {
        comm.op_log().all_finished();
        return Err(e);
    }
    crate::profile::stage(crate::profile::Stage::Total, start);
    let [run] = runs;
    // Every connection was made by the run: this finds them.
    let made = super::exec::connect(std::slice::from_ref(&run)).map(|mut l| l.remove(0));
    let launch = made.and_then(|links| comm.with_device_exec(|backend, device, _| CachedLaunch::new(backend, device, &run.work, &links)));
    match launch {
        Ok(Some(launch)) => comm.keep_plan(Entry { key, work: run.work, exec: Exec::Device(Box::new(launch)), proto }, epoch),
        Ok(None) => {}
        Err(e) => tracing::debug!(target: "COLL", "rank {}: the launch is not cached ({})", comm.rank_unchecked(), e.message),
    }
    Ok(())
}

/// A hit: runs the cached plan.
fn run_entry(comm: &Communicator, task: &Task, entry: Entry, epoch: u64, start: Option<std::time::Instant>) -> Result<()> {
    comm.op_log().started(std::slice::from_ref(&task.shape()));
    execute(comm, entry, epoch, start)
}

fn execute(comm: &Communicator, mut entry: Entry, epoch: u64, start: Option<std::time::Instant>) -> Result<()> {
    let (r, device) = match &mut entry.exec {
        Exec::Host(prep) => {
            let mut runs = [HostRun { work: &mut entry.work, prep, comm }];
            (crate::exec::host::run(&mut runs), false)
        }
        Exec::Device(launch) => {
            // This call's receive buffer may be registered: zero-copy, as uncached.
            comm.resolve_direct_receives(&mut entry.work, launch.links());
            let r = comm.with_device_exec(|backend, device, state| launch.launch(backend, device, state, &entry.work));
            (r.map_err(|e| comm.record_error(e.context("collective"))), true)
        }
    };
    if r.is_ok() {
        comm.keep_plan(entry, epoch);
    }
    finish(comm, &r, device);
    crate::profile::stage(crate::profile::Stage::Total, start);
    r
}

/// Points a cached plan at this call's buffers: its one context, made as the planner makes it
/// (`PlanEnv::with`'s resolve: a checked host address on the host backend; the address
/// itself on devices, whose launch checks it).
fn patch(comm: &Communicator, task: &Task, entry: &mut Entry) -> Result<()> {
    let backend = comm.backend();
    let caps = backend.capabilities();
    let resolve = |ptr: crate::backend::DevicePtr, bytes: usize| -> Result<usize> {
        if !caps.host_addressable {
            return Ok(ptr.0 as usize);
        }
        backend.host_access_or_err("a cached plan's buffers")?.host_address(ptr, bytes)
    };
    let config = comm.config();
    let env = plan::PlanEnv {
        rank: comm.rank_unchecked(),
        nranks: comm.nranks_unchecked(),
        caps,
        min_ctas: config.min_ctas,
        max_ctas: config.max_ctas,
        // A communicator with a tuner never uses the cache.
        tuner: None,
        resolve: &resolve,
    };
    point_at(&env, task, &mut entry.work, entry.proto)
}

/// Points `work`, a cached plan of one context with protocol `proto`, at `task`'s buffers
/// (and scalar, and stream): the context the planner makes for `task` with `env`.
pub(crate) fn point_at(env: &plan::PlanEnv, task: &Task, work: &mut Work, proto: Protocol) -> Result<()> {
    let mut ctx = plan::op_ctx(env, task)?;
    ctx.proto = proto;
    work.ctxs[0] = ctx;
    work.stream = task.stream;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{DevicePtr, Stream};
    use crate::coll::{ReduceOp, Scalar};

    fn task(kind: CollKind, count: usize, dtype: DataType, op: ReduceOp) -> Task {
        Task { kind, send: DevicePtr(0x1000), recv: DevicePtr(0x2000), count, dtype, op, stream: Stream(0), profile: Default::default() }
    }

    fn entry(key: PlanKey) -> Entry {
        let work = Work { ctxs: vec![], items: vec![], copies: vec![], stream: Stream(0) };
        let prep = Prepared::new(&work, &Default::default());
        Entry { key, work, exec: Exec::Host(prep), proto: Protocol::Ll }
    }

    #[test]
    fn keys_differ_in_every_thing_a_plan_depends_on_and_not_in_buffers() {
        let base = task(CollKind::AllReduce, 4, DataType::Float32, ReduceOp::Sum);
        let k = PlanKey::of(&base);
        let others = [
            task(CollKind::AllReduce, 5, DataType::Float32, ReduceOp::Sum),
            task(CollKind::AllReduce, 4, DataType::Int32, ReduceOp::Sum),
            task(CollKind::AllReduce, 4, DataType::Float32, ReduceOp::Max),
            task(CollKind::AllGather, 4, DataType::Float32, ReduceOp::Sum),
            task(CollKind::Broadcast { root: 0 }, 4, DataType::Float32, ReduceOp::Sum),
        ];
        for o in &others {
            assert_ne!(PlanKey::of(o), k, "{o:?}");
        }
        assert_ne!(PlanKey::of(&task(CollKind::Broadcast { root: 1 }, 4, DataType::Float32, ReduceOp::Sum)), PlanKey::of(&others[4]));
        let elsewhere = Task { send: DevicePtr(0x9000), recv: DevicePtr(0x9000), ..base.clone() };
        assert_eq!(PlanKey::of(&elsewhere), k, "buffers are patched per call, not keyed");
    }

    #[test]
    fn an_entry_goes_back_only_to_its_cache_and_a_bypassed_cache_serves_nothing() {
        let key = PlanKey::of(&task(CollKind::AllReduce, 4, DataType::Float32, ReduceOp::Sum));
        let mut cache = PlanCache::default();
        let Lookup::Miss(epoch) = cache.take(&key) else { panic!("empty cache hit") };
        cache.put(entry(key.clone()), epoch);
        let Lookup::Hit(e, epoch) = cache.take(&key) else { panic!("no hit") };
        assert_eq!(cache.len(), 0, "taken out while it runs");
        // The connections were replaced (suspend): a new cache; the old entry is not kept.
        let mut fresh = PlanCache::default();
        fresh.put(e, epoch);
        assert_eq!(fresh.len(), 0);
        assert!(matches!(fresh.take(&key), Lookup::Miss(_)));
        fresh.set_bypass();
        assert!(matches!(fresh.take(&key), Lookup::Bypass));
    }

    #[test]
    fn premulsum_scalars_are_not_keyed() {
        let scalar = |s| task(CollKind::AllReduce, 4, DataType::Float32, ReduceOp::PreMulSum(s));
        let k = PlanKey::of(&scalar(Scalar::Host(0.5)));
        assert_eq!(PlanKey::of(&scalar(Scalar::Host(2.0))), k, "a call value (the kernel parameter on devices)");
        assert_eq!(PlanKey::of(&scalar(Scalar::Device(DevicePtr(0x40)))), k);
        assert_ne!(PlanKey::of(&task(CollKind::AllReduce, 4, DataType::Float32, ReduceOp::Sum)), k);
    }

    /// A device entry (the launch made for a plan on other buffers) serves calls of its shape
    /// with what the uncached path launches for them, and no other shape.
    #[test]
    fn a_device_entry_serves_its_shape_as_the_uncached_path_would() {
        use crate::exec::gpu::cached::tests as g;
        use crate::exec::gpu::ExecState;
        let made = g::task(1000, ReduceOp::Sum, 0xb000_0000, 0xb100_0000);
        let call = g::task(1000, ReduceOp::Sum, 0xa000_0000, 0xa100_0000);
        let work = g::planned(&made);
        let links = crate::exec::gpu::fake::links_for(&work);
        let (fake, backend) = g::backend();
        let launch = CachedLaunch::new(&backend, 0, &work, &links).unwrap().expect("one launch");
        let proto = work.ctxs[0].proto;
        let mut cache = PlanCache::default();
        let Lookup::Miss(epoch) = cache.take(&PlanKey::of(&made)) else { panic!("empty cache hit") };
        cache.put(Entry { key: PlanKey::of(&made), work, exec: Exec::Device(Box::new(launch)), proto }, epoch);
        let others = [
            g::task(2000, ReduceOp::Sum, 0xa000_0000, 0xa100_0000),
            Task { dtype: DataType::Float64, ..call.clone() },
            g::task(1000, ReduceOp::Max, 0xa000_0000, 0xa100_0000),
            Task { kind: CollKind::Reduce { root: 0 }, ..call.clone() },
        ];
        for o in &others {
            assert!(matches!(cache.take(&PlanKey::of(o)), Lookup::Miss(_)), "{o:?}");
        }
        let Lookup::Hit(mut e, _) = cache.take(&PlanKey::of(&call)) else { panic!("no hit") };
        g::with_env(|env| point_at(env, &call, &mut e.work, e.proto)).unwrap();
        let Exec::Device(launch) = &mut e.exec else { panic!("a host entry") };
        launch.launch(&backend, 0, &mut ExecState::default(), &e.work).unwrap();
        let (reference, ref_backend) = g::backend();
        crate::exec::gpu::launch(&ref_backend, 0, &mut ExecState::default(), &g::planned(&call), &links).unwrap();
        let (got, want) = (fake.log(), reference.log());
        assert_eq!(got.launches.len(), 1);
        assert_eq!(got.launches, want.launches);
        assert_eq!(got.uploads, want.uploads);
        assert_eq!(got.launches[0].args.calls[0].src, 0xa000_0000);
    }

    #[test]
    fn the_least_recently_used_entry_goes_first() {
        let mut cache = PlanCache::default();
        let key = |c: usize| PlanKey::of(&task(CollKind::AllReduce, c, DataType::Float32, ReduceOp::Sum));
        let epoch = cache.epoch;
        for c in 1..=MAX_ENTRIES {
            cache.put(entry(key(c)), epoch);
        }
        let Lookup::Hit(e, _) = cache.take(&key(1)) else { panic!() };
        cache.put(e, epoch);
        cache.put(entry(key(1000)), epoch);
        assert_eq!(cache.len(), MAX_ENTRIES);
        assert!(matches!(cache.take(&key(1)), Lookup::Hit(..)), "used lately: kept");
        assert!(matches!(cache.take(&key(2)), Lookup::Miss(_)), "least recently used: dropped");
    }
}
