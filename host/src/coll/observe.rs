//! coll's side of the observer interface ([`crate::observe`]): the calls coll makes about its
//! tasks, which describe each as an [`OpDescr`] (with its communicator) and hand it to the
//! communicator's observer (its profiler, `CommPlugins::observer`).
//!
//! Where the events come from: each operation call ([`api_call`], `Communicator::submit`)
//! and the thread's group ([`group_end_api_start`], [`group_ended`], `coll/group.rs`); a
//! planned share of a group ([`start_run`], with what the planner chose for each task,
//! `plan::CommRun::plans`; its transfers from the executors, `exec::observe`, and the
//! proxy); each way around the planner ([`single_op`]: one channel, a send and a receive per
//! peer). With no observer in the process each call is one load and one branch
//! ([`observe::any_active`]); only then is a descriptor made.

use std::sync::Arc;

use super::plan::TaskPlan;
use super::{CollKind, Task};
use crate::comm::Communicator;
use crate::observe::{self, Channels, CommDescr, Observer, OpDescr, ProxyOpDescr};

pub use crate::observe::{end_group_api, group_end_api_start, group_ended, ApiCall, OpPlan, RunEvents};

/// The communicator's observer, if it has one.
fn observer_of(comm: &Communicator) -> Option<Arc<dyn Observer>> {
    comm.plugins().ok()?.observer()
}

/// `task` of `comm`, described.
pub(crate) fn describe(comm: &Communicator, task: &Task) -> OpDescr {
    let (root, peer) = match task.kind {
        CollKind::Broadcast { root } | CollKind::Reduce { root } => (Some(root), None),
        CollKind::Send { peer } | CollKind::Recv { peer } => (None, Some(peer)),
        CollKind::AllReduce | CollKind::AllGather | CollKind::ReduceScatter => (None, None),
    };
    OpDescr {
        comm: CommDescr { hash: comm.hash(), rank: comm.rank_unchecked(), nranks: comm.nranks_unchecked() },
        coll: task.kind.spec().coll,
        count: task.count,
        dtype: task.dtype,
        root,
        peer,
        op: task.kind.reduces().then(|| task.op.red_op().name()),
        send: task.send.0 as usize,
        recv: task.recv.0 as usize,
        stream: task.stream.0,
        parents: task.profile,
        user_tag: task.options.profiler_tag,
    }
}

impl From<&TaskPlan> for OpPlan {
    fn from(p: &TaskPlan) -> OpPlan {
        OpPlan { algo: p.algo.map_or("", |a| a.name()), proto: p.proto.map_or("", |p| p.name()), channels: p.channels }
    }
}

/// An operation call begins (`group_depth` tells the caller's group depth; 0 = outside a
/// group): the observer's events of the thread's group (if it has none) and of the call,
/// whose names `task` keeps for its events when it runs. They end when the value is dropped
/// (the call returned).
#[inline]
pub fn api_call(comm: &Communicator, task: &mut Task, group_depth: impl FnOnce() -> u32) -> Option<ApiCall> {
    if !observe::any_active() {
        return None;
    }
    api_call_observed(comm, task, group_depth())
}

#[cold]
fn api_call_observed(comm: &Communicator, task: &mut Task, group_depth: u32) -> Option<ApiCall> {
    let observer = observer_of(comm)?;
    let (parents, call) = observe::api_call(&observer, &describe(comm, task), group_depth);
    task.profile = parents;
    Some(call)
}

/// An observer is there to see what the planner chose for each task (then a single call
/// goes the planner's way rather than the plan cache's, which keeps no choice per task).
#[inline]
pub fn wants_plan_record() -> bool {
    observe::any_active()
}

/// The observer's events of a planned share of a group (`plans`: what the planner chose for
/// each task that runs, `CommRun::plans`); they end when dropped.
pub fn start_run(comm: &Communicator, tasks: &[Task], plans: &[TaskPlan]) -> Option<RunEvents> {
    if !observe::any_active() {
        return None;
    }
    let observer = observer_of(comm)?;
    let ops: Vec<(OpDescr, OpPlan)> = plans.iter().map(|p| (describe(comm, &tasks[p.task]), OpPlan::from(p))).collect();
    let group_api = tasks.first().map_or(0, |t| t.profile.group_api);
    observer.run(group_api, &ops).map(RunEvents::new)
}

/// The events of a single operation that took a way around the planner (the board of small
/// collectives, a single copy, a one-rank copy, a symmetric path): a run of one operation,
/// its channels started, and its transfers (see [`single_op`]).
#[derive(Debug)]
pub struct SingleOp {
    channels: Channels,
    _run: RunEvents,
}

/// `task` starts on a way around the planner (`plan`: what its events say of it).
#[inline]
pub fn single_op(comm: &Communicator, task: &Task, plan: impl FnOnce() -> OpPlan) -> Option<SingleOp> {
    if !observe::any_active() {
        return None;
    }
    single_op_observed(comm, task, plan())
}

#[cold]
fn single_op_observed(comm: &Communicator, task: &Task, plan: OpPlan) -> Option<SingleOp> {
    let observer = observer_of(comm)?;
    let op = describe(comm, task);
    let run = RunEvents::new(observer.run(task.profile.group_api, &[(op, plan)])?);
    if run.wants_proxy_ops() {
        exchange(&op).into_iter().for_each(|t| run.add_local(t));
    }
    // Host work starts now; device work is launched, seen done by the watchdog.
    let channels = if comm.engine().executor().runs_on_host() { run.start_channels() } else { run.launch_channels() };
    Some(SingleOp { channels, _run: run })
}

/// The transfers of a single operation on a way around the planner: a send and a receive per
/// peer (the rank itself on one rank), channel 0, one step of the operation's bytes — the
/// exchange of data with that peer, whatever the way does in detail.
fn exchange(op: &OpDescr) -> Vec<ProxyOpDescr> {
    let (n, me) = (op.comm.nranks, op.comm.rank);
    let bytes = op.bytes();
    (0..n)
        .filter(|&p| p != me || n == 1)
        .flat_map(|peer| [true, false].map(|is_send| ProxyOpDescr { op: 0, channel: 0, peer, is_send, step_bytes: vec![bytes] }))
        .collect()
}

/// The operation of `op` ended with `r` on the host: on success its channels complete; then
/// its events end.
pub fn end_single_op<T>(op: Option<SingleOp>, r: &crate::error::Result<T>) {
    if let Some(op) = op {
        if r.is_ok() {
            op.channels.complete();
        }
    }
}

/// The operation of `op` was launched on a device (`r`): its channels complete when the
/// communicator's watchdog sees the launch done.
pub fn launched_single_op<T>(op: Option<SingleOp>, comm: &Communicator, r: &crate::error::Result<T>) {
    if let Some(op) = op {
        if r.is_ok() {
            comm.engine().profiled_launch(op.channels);
        }
    }
}
