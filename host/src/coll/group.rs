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

use super::check::OpSig;
use super::route::{self, Route};
use super::{exec, plan, Task};
use crate::work::Way;
use crate::comm::Communicator;
use super::observe as profiler_events;
use crate::error::{Error, Result};

#[derive(Default)]
struct GroupState {
    depth: u32,
    tasks: Vec<(Communicator, Task)>,
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

/// Leaves one level of grouping; the queued tasks when it was the outermost (or the error
/// that cancelled them).
fn leave(what: &str) -> Result<Option<Vec<(Communicator, Task)>>> {
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
        g.blocking = None;
        match g.error.take() {
            Some(e) => Err(e.context(format!("{what}: an operation in the group was refused, so none ran"))),
            None => Ok(Some(tasks)),
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
        Ok(Some(tasks)) if !tasks.is_empty() => {
            profiler_events::group_end_api_start();
            start(tasks)
        }
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
    let tasks = left?.unwrap_or_default();
    let mut total = 0.0f32;
    for (comm, task) in &tasks {
        total += plan::estimate(comm, task)?;
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
        g.tasks.push((comm.handle(), task.clone()));
        Ok(true)
    })?;
    if queued {
        // Inside a group every collective takes the planner (for now).
        if !task_is_p2p {
            comm.publish_route(Way::Planned, OpSig::of(&task));
        }
        return Ok(());
    }
    profiler_events::group_end_api_start();
    if !blocking {
        // A non-blocking communicator: one rank at once (nothing to wait for), everything
        // else planned in its background job.
        if let Some(r) = super::cache::try_one_rank(comm, &task) {
            return r;
        }
        if !task_is_p2p {
            comm.publish_route(Way::Planned, OpSig::of(&task));
        }
        return start(vec![(comm.handle(), task)]);
    }
    // The router decides the way (the tuner asked once, where one is loaded: its choice goes
    // along to the planner).
    let tuned = super::way::tuner_choice(comm, &task);
    let mut placed = super::symmetric::Placed::new(comm, &task);
    let route = route::route(&task, &route_caps(comm), &mut placed, tuned, route::Settings::get()).map_err(|e| comm.record_error(e))?;
    match route {
        Route::OneRank => super::cache::run_one_rank(comm, std::slice::from_ref(&task)),
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
                return run(vec![(comm.handle(), task)], chosen);
            }
            if let Some(r) = super::planned::run_single(comm, &task) {
                return r;
            }
            start(vec![(comm.handle(), task)])
        }
    }
}

/// What the router knows of `comm` (fixed for its life, the same on every rank).
fn route_caps(comm: &Communicator) -> route::Caps {
    let caps = comm.backend().capabilities();
    let symmetric = match (caps.symmetric_kernels, caps.host_addressable) {
        (false, _) => route::SymExec::None,
        (true, true) => route::SymExec::Cpu,
        (true, false) => route::SymExec::Kernels,
    };
    let board = comm.board().filter(|b| b.has_ring()).map(|b| route::BoardCaps { single_copy: b.single_copy() });
    route::Caps { nranks: comm.nranks_unchecked(), symmetric, board }
}

/// Runs the tasks of a group that ended: here, or, for non-blocking communicators, as a
/// background job (then `InProgress`).
fn start(tasks: Vec<(Communicator, Task)>) -> Result<()> {
    // Every communicator of a group is blocking, or every one is not (checked as queued).
    if tasks[0].0.config().blocking {
        return run(tasks, None);
    }
    let mut comms: Vec<Communicator> = Vec::new();
    for (c, _) in &tasks {
        if !comms.iter().any(|k| k.same_as(c)) {
            comms.push(c.handle());
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
    if comms.iter().all(|c| super::cache::may_run_now(c) && super::way::one_rank(c.nranks_unchecked(), of_comm(&tasks, c))) {
        return run(tasks, None);
    }
    crate::comm::jobs::launch(comms, move || run(tasks, None));
    Err(Error::in_progress(
        "the operations were queued on a non-blocking communicator; poll async_error until it is no longer InProgress",
    ))
}

/// The tasks of `comm` among a group's.
fn of_comm<'a>(tasks: &'a [(Communicator, Task)], comm: &'a Communicator) -> impl Iterator<Item = &'a Task> {
    tasks.iter().filter(|(c, _)| c.same_as(comm)).map(|(_, t)| t)
}

/// Plans, connects and runs tasks, grouped by communicator in call order; `chosen`: the
/// choice made already for a single collective (`way::tuner_choice`). The shares of
/// one-rank communicators that the one-rank route serves (`way::one_rank`) take it instead,
/// after the others are planned (a share that cannot be planned fails the group before
/// anything ran) and before they run.
fn run(tasks: Vec<(Communicator, Task)>, chosen: Option<plan::Choice>) -> Result<()> {
    let mut by_comm: Vec<(Communicator, Vec<Task>)> = Vec::new();
    for (comm, task) in tasks {
        match by_comm.iter_mut().find(|(c, _)| c.same_as(&comm)) {
            Some((_, list)) => list.push(task),
            None => by_comm.push((comm, vec![task])),
        }
    }
    let (one_rank, by_comm): (Vec<_>, Vec<_>) = by_comm.into_iter().partition(|(c, t)| super::way::one_rank(c.nranks_unchecked(), t));
    let start = crate::profile::start();
    if super::check::enabled() {
        for (comm, tasks) in &by_comm {
            super::check::check_group(comm, tasks).map_err(|e| comm.record_error(e))?;
        }
    }
    let mut runs = Vec::with_capacity(by_comm.len());
    for (comm, tasks) in &by_comm {
        let mut run = plan::build_chosen(comm, tasks, chosen).map_err(|e| comm.record_error(e))?;
        run.profile = profiler_events::start_run(comm, tasks, &run.plans);
        runs.push(run);
    }
    crate::profile::stage(crate::profile::Stage::Plan, start);
    for (comm, tasks) in &one_rank {
        super::cache::run_one_rank(comm, tasks)?;
    }
    if runs.is_empty() {
        return Ok(());
    }
    for (comm, tasks) in &by_comm {
        comm.op_log().started(&tasks.iter().map(Task::shape).collect::<Vec<_>>());
    }
    let r = exec::run(&mut runs);
    // Device work finishes later (the watchdog sees it); host work has finished or failed.
    for run in runs.iter().filter(|run| !run.device || r.is_err()) {
        run.comm.op_log().all_finished();
    }
    crate::profile::stage(crate::profile::Stage::Total, start);
    r
}
