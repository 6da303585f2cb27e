//! Groups (`ncclGroupStart` / `ncclGroupEnd`): per thread, nested; operations called inside a
//! group are queued and run together at the end of the outermost one, across every
//! communicator they were called on (several ranks of one process in one group work, because
//! one executor progresses all of them at once). Outside a group an operation is a group of one.

use std::cell::RefCell;

use super::{exec, plan, Task};
use crate::comm::Communicator;
use crate::error::{Error, Result};

#[derive(Default)]
struct GroupState {
    depth: u32,
    tasks: Vec<(Communicator, Task)>,
    /// The first operation refused inside the group: the group then runs nothing and its
    /// end returns this error (a group's operations succeed or fail together).
    error: Option<Error>,
}

thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

/// `ncclGroupStart`.
pub fn group_start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// Leaves one level of grouping; the queued tasks when it was the outermost (or the error
/// that cancelled them).
fn leave(what: &str) -> Result<Option<Vec<(Communicator, Task)>>> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::invalid_usage(format!("{what} without a matching group_start")).record());
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        let tasks = std::mem::take(&mut g.tasks);
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
/// have completed.
pub fn group_end() -> Result<()> {
    match leave("group_end")? {
        Some(tasks) if !tasks.is_empty() => run(tasks),
        _ => Ok(()),
    }
}

/// `ncclGroupSimulateEnd`: ends the group like `group_end` but runs nothing; returns the cost
/// model's estimate of the time the queued operations would take, in microseconds.
pub fn group_simulate_end() -> Result<f32> {
    let tasks = leave("group_simulate_end")?.unwrap_or_default();
    let mut total = 0.0f32;
    for (comm, task) in &tasks {
        total += plan::estimate(comm, task)?;
    }
    Ok(total)
}

/// Queues a task, or runs it at once outside a group.
pub(crate) fn enqueue(comm: &Communicator, task: Task) -> Result<()> {
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.tasks.push((comm.handle(), task.clone()));
            true
        } else {
            false
        }
    });
    if queued {
        Ok(())
    } else {
        run(vec![(comm.handle(), task)])
    }
}

/// Plans, connects and runs tasks, grouped by communicator in call order.
fn run(tasks: Vec<(Communicator, Task)>) -> Result<()> {
    let mut by_comm: Vec<(Communicator, Vec<Task>)> = Vec::new();
    for (comm, task) in tasks {
        match by_comm.iter_mut().find(|(c, _)| c.same_as(&comm)) {
            Some((_, list)) => list.push(task),
            None => by_comm.push((comm, vec![task])),
        }
    }
    let start = std::time::Instant::now();
    if super::check::enabled() {
        for (comm, tasks) in &by_comm {
            super::check::check_group(comm, tasks).map_err(|e| comm.record_error(e))?;
        }
    }
    let mut runs = Vec::with_capacity(by_comm.len());
    for (comm, tasks) in &by_comm {
        runs.push(plan::build(comm, tasks).map_err(|e| comm.record_error(e))?);
    }
    super::profile::record(super::profile::Stage::Plan, start);
    for (comm, tasks) in &by_comm {
        comm.op_log().started(tasks);
    }
    let r = exec::run(&mut runs);
    // Device work finishes later (the watchdog sees it); host work has finished or failed.
    for run in runs.iter().filter(|run| !run.device || r.is_err()) {
        run.comm.op_log().all_finished();
    }
    super::profile::record(super::profile::Stage::Total, start);
    r
}
