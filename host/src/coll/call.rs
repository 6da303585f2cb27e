//! The call guard: what every route needs around one communicator's share of a group, in one
//! place. When the share starts, the op log hears of its tasks (hang reports say what each
//! rank was doing) and the observer (profiler) gets the events of the tasks that take a way
//! around the planner (the planned ones get theirs from the planner's choices,
//! `observe::start_run`). When it ends: a failure breaks the communicator (its peers hear of
//! it) and becomes its last error; the events end (on a device, when the watchdog sees the
//! launch complete); the op log hears that the share finished, unless device work still runs
//! (the watchdog tells it then) or it heard of none of the share's tasks (the caller says
//! which tasks it hears of: the one-rank route tells it only of those that copy, so an
//! in-place call on one rank leaves the op log as it was, earlier device work still running
//! included).
//!
//! Errors found before anything ran (a buffer the backend does not know, a send without its
//! receive) are the caller's: they are recorded as the last error and do not break the
//! communicator, as NCCL refuses such calls; only what fails once data may have moved goes
//! through [`Call::end`].

use super::observe::{self, OpPlan, SingleOp};
use super::Task;
use crate::comm::health::OpShape;
use crate::comm::Communicator;
use crate::error::{Error, Result};

/// One communicator's share of a group, running.
pub(crate) struct Call<'a> {
    comm: &'a Communicator,
    /// Whether the share's work runs on a device (it outlives the call).
    device: bool,
    /// Whether the op log heard that tasks of the share started (then it hears that they
    /// finished).
    logged: bool,
    /// The observer's events of the tasks on ways around the planner.
    events: Vec<SingleOp>,
}

impl<'a> Call<'a> {
    /// The share of `comm` starts: `tasks` are those that do work (count > 0), the ones the
    /// op log hears of.
    pub(crate) fn start<'t>(comm: &'a Communicator, device: bool, tasks: impl Iterator<Item = &'t Task>) -> Call<'a> {
        let shapes: smallvec::SmallVec<[OpShape; 4]> = tasks.map(Task::shape).collect();
        Call::start_shapes(comm, device, &shapes)
    }

    /// [`Call::start`] for operations that are not tasks (an all_to_all on symmetric windows).
    pub(crate) fn start_shapes(comm: &'a Communicator, device: bool, shapes: &[OpShape]) -> Call<'a> {
        let logged = !shapes.is_empty();
        if logged {
            comm.op_log().started(shapes);
        }
        Call { comm, device, logged, events: Vec::new() }
    }

    /// `task` takes a way around the planner: its observer events start (one channel, no
    /// NCCL algorithm).
    pub(crate) fn around_planner(&mut self, task: &Task) {
        if let Some(e) = observe::single_op(self.comm, task, || OpPlan { algo: "", proto: "", channels: 1 }) {
            self.events.push(e);
        }
    }

    /// The share ended with `r` (its failure already in context): the events end, a failure
    /// breaks the communicator and is recorded; returns `r`.
    pub(crate) fn end(self, r: Result<()>) -> Result<()> {
        for e in self.events {
            if self.device {
                observe::launched_single_op(Some(e), self.comm, &r);
            } else {
                observe::end_single_op(Some(e), &r);
            }
        }
        let r = r.map_err(|e: Error| {
            self.comm.mark_broken(&e);
            self.comm.record_error(e)
        });
        if self.logged && (!self.device || r.is_err()) {
            self.comm.op_log().all_finished();
        }
        r
    }
}
