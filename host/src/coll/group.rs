//! Groups (`ncclGroupStart` / `ncclGroupEnd`): per thread, nested; operations called inside a
//! group are queued and run together at the end of the outermost one, across every
//! communicator they were called on (several ranks of one process in one group work, because
//! one executor progresses all of them at once). Outside a group an operation is a group of one.
//!
//! A group of non-blocking communicators (`blocking = 0`) is handed to a background job
//! (`comm::jobs`) and its end (the call, outside a group) returns `InProgress`; as in
//! NCCL, one group cannot hold both blocking and non-blocking communicators.
//!
//! The tasks of a one-rank communicator take the one-rank route (`way::one_rank`) at the
//! group's end, or at once outside a group: in place nothing runs, out of place one copy
//! each; on a non-blocking communicator too, so its call then returns `Ok`, not `InProgress`
//! (unless earlier jobs of it still run: then it queues behind them as usual).

use std::cell::RefCell;

use super::call::Call;
use super::check::OpSig;
use super::route::{self, Route};
use super::symmetric::SymRun;
use super::{exec, plan, Task};
use crate::exec::host::HostOp;
use crate::work::Way;
use crate::comm::Communicator;
use super::observe as profiler_events;
use crate::error::{Error, Result};

/// A task queued to run at the end of its group (a single call is a group of one).
pub(crate) struct Queued {
    comm: Communicator,
    task: Task,
    /// Its collective number on `comm` when it was called (the key of its route-ring entry,
    /// published when the group runs).
    seq: u64,
    /// The way, where the router already chose it (a single call); else it routes at the
    /// group's end.
    route: Option<Route>,
}

impl Queued {
    fn new(comm: &Communicator, task: Task, route: Option<Route>) -> Queued {
        Queued { comm: comm.handle(), seq: comm.collective_number(), task, route }
    }
}

/// A one-sided operation (`coll::one_sided`) called inside a group, checked and resolved
/// when called: it runs at the group's end, with the group's other one-sided operations in
/// call order, before the group's collectives and point-to-point operations (as NCCL
/// schedules a group's RMA tasks ahead of its other plans).
pub(crate) struct Deferred {
    comm: Communicator,
    run: DeferredRun,
}

/// What a deferred operation does when its group ends, on its communicator.
pub(crate) type DeferredRun = Box<dyn FnOnce(&Communicator) -> Result<()>>;

/// Queues `run` on `comm` to run at the end of the calling thread's group; gives it back when
/// the thread is not in a group (the caller runs it at once).
pub(crate) fn defer(comm: &Communicator, run: DeferredRun) -> Option<DeferredRun> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Some(run);
        }
        g.deferred.push(Deferred { comm: comm.handle(), run });
        None
    })
}

/// Runs a group's one-sided operations in call order; the first failure ends the group.
fn run_deferred(deferred: Vec<Deferred>) -> Result<()> {
    deferred.into_iter().try_for_each(|d| (d.run)(&d.comm))
}

#[derive(Default)]
struct GroupState {
    depth: u32,
    tasks: Vec<Queued>,
    /// The one-sided operations called in the group, in call order.
    deferred: Vec<Deferred>,
    /// The first operation refused inside the group: the group then runs nothing and its
    /// end returns this error (a group's operations succeed or fail together).
    error: Option<Error>,
    /// Whether the group's communicators are blocking (set by its first operation).
    blocking: Option<bool>,
}

thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

/// Whether the calling thread is inside a group (the typed API refuses single operations
/// there: their buffers would be borrowed only until the call returns).
pub fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// `ncclGroupStart`.
pub fn group_start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// The calling thread's group depth (0: not in a group).
pub fn depth() -> u32 {
    GROUP.with(|g| g.borrow().depth)
}

/// Leaves one level of grouping; the queued tasks and one-sided operations when it was the
/// outermost (or the error that cancelled them).
fn leave(what: &str) -> Result<Option<(Vec<Queued>, Vec<Deferred>)>> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::invalid_usage(format!("{what} without a matching group_start"))
                .with_kind(crate::error::ErrorKind::GroupUnbalanced)
                .record());
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        let tasks = std::mem::take(&mut g.tasks);
        let deferred = std::mem::take(&mut g.deferred);
        g.blocking = None;
        match g.error.take() {
            Some(e) => Err(e.context(format!("{what}: an operation in the group was refused, so none ran"))),
            None => Ok(Some((tasks, deferred))),
        }
    })
}

/// Records a refused operation: inside a group, the group will run nothing.
pub(crate) fn fail(e: &Error) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 && g.error.is_none() {
            g.error = Some(e.clone());
        }
    });
}

/// `ncclGroupEnd`: at the outermost level, runs every queued operation and returns when all
/// have completed; or, for non-blocking communicators, queues them as a background job and
/// returns `InProgress`.
pub fn group_end() -> Result<()> {
    let r = match leave("group_end") {
        Ok(Some((tasks, deferred))) if !tasks.is_empty() || !deferred.is_empty() => run_deferred(deferred).and_then(|_| {
            if tasks.is_empty() {
                return Ok(());
            }
            profiler_events::group_end_api_start();
            start(tasks)
        }),
        Ok(_) => Ok(()),
        Err(e) => Err(e),
    };
    profiler_events::group_ended(depth);
    r
}

/// `ncclGroupSimulateEnd`: ends the group like `group_end` but runs nothing; returns the cost
/// model's estimate of the time the queued operations would take, in microseconds.
pub fn group_simulate_end() -> Result<f32> {
    let left = leave("group_simulate_end");
    profiler_events::group_ended(depth);
    let (tasks, _one_sided) = left?.unwrap_or_default();
    let mut total = 0.0f32;
    for q in &tasks {
        total += plan::estimate(&q.comm, &q.task)?;
    }
    Ok(total)
}

/// Queues a task, or starts it at once outside a group.
pub(crate) fn enqueue(comm: &Communicator, task: Task) -> Result<()> {
    let blocking = comm.config().blocking;
    let task_is_p2p = task.kind.is_p2p();
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Ok(false);
        }
        if *g.blocking.get_or_insert(blocking) != blocking {
            let e = Error::invalid_usage(format!(
                "{}: blocking and non-blocking communicators cannot be in one group (this one is {}, the group's first is {}); \
                 end the group first, or give the communicators the same config.blocking",
                task.kind.name(),
                if blocking { "blocking" } else { "non-blocking" },
                if blocking { "non-blocking" } else { "blocking" },
            ));
            g.error.get_or_insert_with(|| e.clone());
            return Err(e);
        }
        g.tasks.push(Queued::new(comm, task.clone(), None));
        Ok(true)
    })?;
    if queued {
        // Routed at the group's end, with the group's other tasks.
        return Ok(());
    }
    profiler_events::group_end_api_start();
    if !blocking {
        // A non-blocking communicator: one rank at once (nothing to wait for), everything
        // else routed and run in its background job.
        if let Some(r) = super::one_rank::try_one_rank(comm, &task) {
            return r;
        }
        return start(vec![Queued::new(comm, task, None)]);
    }
    // The router decides the way (the tuner asked once, where one is loaded: its choice goes
    // along to the planner).
    let tuned = super::way::tuner_choice(comm, &task);
    let mut placed = super::symmetric::Placed::new(comm, &task);
    let route = route::route(&task, &route_caps(comm), &mut placed, tuned, route::Settings::get()).map_err(|e| comm.record_error(e))?;
    match route {
        Route::OneRank => super::one_rank::run_one_rank(comm, std::slice::from_ref(&task)),
        Route::Symmetric(way) => super::symmetric::run(comm, &task, way, placed),
        Route::Board => super::small::run(comm, &task, Way::Board),
        Route::SingleCopy => super::small::run(comm, &task, Way::SingleCopy),
        Route::Planned(chosen) => {
            // The ways around the planner publish their way themselves; the planner's, here.
            if !task_is_p2p {
                comm.publish_route(Way::Planned, OpSig::of(&task));
            }
            if chosen.is_some() {
                // Asked only where a tuner is loaded: the plan cache is off with a tuner.
                return run(vec![Queued::new(comm, task, Some(route))]);
            }
            if let Some(r) = super::planned::run_single(comm, &task) {
                return r;
            }
            run(vec![Queued::new(comm, task, Some(route))])
        }
    }
}

/// What the router knows of `comm` (fixed for its life, the same on every rank).
fn route_caps(comm: &Communicator) -> route::Caps {
    let symmetric = comm.engine().executor().symmetric();
    let board = comm.board().filter(|b| b.has_ring()).map(|b| route::BoardCaps { single_copy: b.single_copy() });
    route::Caps { nranks: comm.nranks_unchecked(), symmetric, board }
}

/// Runs the tasks of a group that ended: here, or, for non-blocking communicators, as a
/// background job (then `InProgress`).
fn start(tasks: Vec<Queued>) -> Result<()> {
    // Every communicator of a group is blocking, or every one is not (checked as queued).
    if tasks[0].comm.config().blocking {
        return run(tasks);
    }
    let mut comms: Vec<Communicator> = Vec::new();
    for q in &tasks {
        if !comms.iter().any(|k| k.same_as(&q.comm)) {
            comms.push(q.comm.handle());
        }
    }
    // An earlier job that failed left the communicator unusable, as its asynchronous error
    // says: refuse at once rather than queue behind it.
    for c in &comms {
        if let Some(e) = c.background_jobs().error() {
            return Err(c.record_error(e.context("an earlier non-blocking operation on this communicator failed (see async_error; abort it)")));
        }
    }
    // One rank, nothing to compute: done at once, nothing to queue (unless earlier jobs
    // still run: then after them, in call order).
    let one_rank = |c: &Communicator| super::way::one_rank(c.nranks_unchecked(), tasks.iter().filter(|q| q.comm.same_as(c)).map(|q| &q.task));
    if comms.iter().all(|c| super::one_rank::may_run_now(c) && one_rank(c)) {
        return run(tasks);
    }
    crate::comm::jobs::launch(comms, move || run(tasks));
    Err(Error::in_progress(
        "the operations were queued on a non-blocking communicator; poll async_error until it is no longer InProgress",
    ))
}

/// One communicator's share of a group: its tasks in call order, with their collective
/// numbers and, where already chosen, their routes.
struct Share {
    comm: Communicator,
    tasks: Vec<(Task, u64, Option<Route>)>,
}

/// A task of a share the router sent around the planner, ready to run.
enum Around<'c> {
    /// A host operation: the board, a single copy, the symmetric CPU twin.
    Host(Box<dyn HostOp + 'c>),
    /// Device work: a symmetric kernel or the copy engines.
    Device(SymRun),
}

/// A share routed: what goes to the planner (with the choice made for each task, if one
/// was), what goes around it, and every collective's route entry (number, way, signature)
/// in call order.
struct Routed<'c> {
    comm: &'c Communicator,
    planned: Vec<Task>,
    choices: Vec<Option<plan::Choice>>,
    around: Vec<Around<'c>>,
    entries: Vec<(u64, Way, OpSig)>,
    /// The tasks that do work, for the call guard (op log), and those around the planner
    /// (their observer events).
    working: Vec<&'c Task>,
    around_tasks: Vec<&'c Task>,
}

/// Routes every task of `share` (the router decides each, as for a single call: inside a
/// group the same ways serve it) and makes ready those that go around the planner. An error
/// is the caller's (a bad buffer): nothing ran, nothing was published.
fn route_share(share: &Share) -> Result<Routed<'_>> {
    let comm = &share.comm;
    let caps = route_caps(comm);
    let mut routed = Routed {
        comm,
        planned: Vec::new(),
        choices: Vec::new(),
        around: Vec::new(),
        entries: Vec::new(),
        working: Vec::new(),
        around_tasks: Vec::new(),
    };
    let n = comm.nranks_unchecked() as usize;
    for (task, seq, known) in &share.tasks {
        if task.count > 0 {
            routed.working.push(task);
        }
        let mut placed = super::symmetric::Placed::new(comm, task);
        let route = match known {
            Some(r) => *r,
            None => {
                let tuned = super::way::tuner_choice(comm, task);
                route::route(task, &caps, &mut placed, tuned, route::Settings::get())?
            }
        };
        let way = match route {
            // (One-rank shares are run apart; a one-rank route here is a planner's task.)
            Route::Planned(_) | Route::OneRank => {
                routed.planned.push(task.clone());
                routed.choices.push(if let Route::Planned(c) = route { c } else { None });
                Way::Planned
            }
            Route::Symmetric(way) => {
                let ready = super::symmetric::prepare(comm, task, way, &mut placed, *seq)?;
                let way = ready.way();
                routed.around.push(match ready.host_op(comm) {
                    Some(op) => Around::Host(Box::new(op)),
                    None => Around::Device(ready),
                });
                routed.around_tasks.push(task);
                way
            }
            Route::Board | Route::SingleCopy => {
                let way = if route == Route::Board { Way::Board } else { Way::SingleCopy };
                let (board, call) = super::small::prepare(comm, task, *seq)?;
                routed.around.push(Around::Host(super::small::op(board, call, way)));
                routed.around_tasks.push(task);
                way
            }
        };
        if !task.kind.is_p2p() {
            if way != Way::Planned {
                super::way::trace(task, n, way);
            }
            routed.entries.push((*seq, way, OpSig::of(task)));
        }
    }
    Ok(routed)
}

/// Routes, plans, connects and runs tasks, by communicator in call order. The shares of
/// one-rank communicators that the one-rank route serves (`way::one_rank`) take it; every
/// other task is routed (`route_share`): the planner's are planned together (a share that
/// cannot be planned or routed fails the group before anything ran), then every
/// communicator's route entries are published, and the work runs under one call guard per
/// share: the planner's work and the host operations around it driven together by the host
/// executor; on devices the planner's launch first, then the ways around it in call order.
fn run(tasks: Vec<Queued>) -> Result<()> {
    let mut shares: Vec<Share> = Vec::new();
    for q in tasks {
        match shares.iter_mut().find(|s| s.comm.same_as(&q.comm)) {
            Some(s) => s.tasks.push((q.task, q.seq, q.route)),
            None => shares.push(Share { comm: q.comm, tasks: vec![(q.task, q.seq, q.route)] }),
        }
    }
    let (one_rank, shares): (Vec<Share>, Vec<Share>) =
        shares.into_iter().partition(|s| super::way::one_rank(s.comm.nranks_unchecked(), s.tasks.iter().map(|(t, _, _)| t)));
    let start = crate::profile::start();
    if super::check::enabled() {
        for s in &shares {
            let tasks: Vec<Task> = s.tasks.iter().map(|(t, _, _)| t.clone()).collect();
            super::check::check_group(&s.comm, &tasks).map_err(|e| s.comm.record_error(e))?;
        }
    }
    let mut routed = Vec::with_capacity(shares.len());
    for s in &shares {
        routed.push(route_share(s).map_err(|e| s.comm.record_error(e))?);
    }
    let mut runs = Vec::with_capacity(routed.len());
    for r in routed.iter().filter(|r| !r.planned.is_empty()) {
        let mut run = plan::build_chosen(r.comm, &r.planned, &r.choices).map_err(|e| r.comm.record_error(e))?;
        run.profile = profiler_events::start_run(r.comm, &r.planned, &run.plans);
        runs.push(run);
    }
    crate::profile::stage(crate::profile::Stage::Plan, start);
    for s in &one_rank {
        let tasks: Vec<Task> = s.tasks.iter().map(|(t, _, _)| t.clone()).collect();
        super::one_rank::run_one_rank(&s.comm, &tasks)?;
    }
    if routed.is_empty() {
        return Ok(());
    }
    for r in &routed {
        for &(seq, way, sig) in &r.entries {
            r.comm.publish_route_at(seq, way, sig);
        }
    }
    let mut guards: Vec<Call<'_>> = Vec::with_capacity(routed.len());
    let mut host_ops: Vec<exec::HostOps<'_>> = Vec::new();
    let mut device_ops: Vec<(&Communicator, Vec<SymRun>)> = Vec::new();
    for r in routed {
        let device = runs.iter().any(|run| run.device && run.comm.same_as(r.comm)) || r.around.iter().any(|a| matches!(a, Around::Device(_)));
        let mut guard = Call::start(r.comm, device, r.working.iter().copied());
        r.around_tasks.iter().for_each(|t| guard.around_planner(t));
        guards.push(guard);
        let (mut host, mut dev) = (Vec::new(), Vec::new());
        for a in r.around {
            match a {
                Around::Host(op) => host.push(op),
                Around::Device(d) => dev.push(d),
            }
        }
        host_ops.push(exec::HostOps { comm: r.comm, ops: host });
        device_ops.push((r.comm, dev));
    }
    let mut r = exec::run_with(&mut runs, &mut host_ops);
    drop(host_ops);
    if r.is_ok() {
        r = device_ops.into_iter().try_for_each(|(comm, ops)| ops.into_iter().try_for_each(|op| op.launch(comm)));
    }
    crate::profile::stage(crate::profile::Stage::Total, start);
    // Every share ends with the group's outcome.
    let mut out = Ok(());
    for g in guards {
        if let Err(e) = g.end(r.clone()) {
            out = out.and(Err(e));
        }
    }
    out
}
