//! Which way a single collective runs, and who chose it.
//!
//! Any task of a one-rank communicator, inside a group or not, takes the one-rank route
//! ([`one_rank`]). A collective outside a group may run around the planner (coll/group.rs
//! tries, in order: one rank, the symmetric paths, the board of small calls and its single
//! copies, the plan cache) or through it. Where a tuner plugin is loaded, its table decides first, as in NCCL, which
//! asks the tuner for every task: [`tuner_choice`] asks it once for the call, and where its
//! table speaks (its `getCollInfo` changed the cost table or set the channels) the ways around
//! the planner step aside and the planner runs what the tuner chose. Where it is silent,
//! rustccl's own choice stands, fast ways included.
//!
//! Every collective logs one TRACE line (target `COLL`) naming its way and who chose it, e.g.
//! `AllReduce 4096 B: way=board chosen by rustccl` or
//! `AllReduce 8192 B: way=planner TREE/SIMPLE 2 ch chosen by tuner csv-table`.

use super::plan::{self, Choice, ChosenBy, TaskPlan};
use super::Task;
use crate::comm::Communicator;
use crate::plugin::tuner::TunerInstance;
pub(crate) use crate::work::Way;

/// Whether the one-rank route serves `tasks`, one communicator's share of a group (a single
/// call is a group of one) on a communicator of `nranks`: one rank, and every task leaves its
/// input as it is ([`plan::one_rank_identity`]: no operator that computes) or is a send to
/// self or a receive from self. Then nothing goes to the planner or a device kernel: in place
/// (a send/recv pair with one buffer) nothing runs, out of place one copy per task
/// (`coll::one_rank`), inside groups, on blocking and non-blocking communicators
/// alike, as NCCL, whose one-rank calls cost a host-side check and at most a
/// `cudaMemcpyAsync`. Check mode (`RUSTCCL_CHECK_COLLECTIVES`) checks each call's plan, so
/// its calls go the full way. The one place that decides it (the router takes it over).
pub(crate) fn one_rank<'a>(nranks: u32, tasks: impl IntoIterator<Item = &'a Task>) -> bool {
    nranks == 1 && !super::check::enabled() && tasks.into_iter().all(|t| t.kind.is_p2p() || plan::one_rank_identity(t))
}

/// What the tuner says for `task`, a collective of several ranks that may take a way around the
/// planner (the router asks it first, for single calls and inside groups alike): `None` where no tuner is loaded (one check on the hot path) or
/// the call goes to the planner anyway (which asks the tuner itself); else the planner's
/// choice for it, the tuner asked once, as NCCL asks once per task (never memoized: a tuner
/// may answer differently from call to call). Its `by` is [`ChosenBy::Tuner`] where the
/// tuner's table spoke for this call; the caller then runs the planner with it
/// ([`plan::build_chosen`]), and passes it on otherwise too, so that the planner does not
/// ask again. Where no choice can be made (`NCCL_ALGO` leaves nothing for this collective, a
/// released communicator) `None` too: the way the call takes reports it, or runs it where it
/// needs no algorithm (a symmetric path), as without a tuner.
pub(crate) fn tuner_choice(comm: &Communicator, task: &Task) -> Option<Choice> {
    if !comm.has_tuner() || comm.nranks_unchecked() < 2 || task.count == 0 || task.kind.is_p2p() || super::check::enabled() {
        return None;
    }
    let start = crate::profile::start();
    let choice = plan::PlanEnv::with(comm, |env| plan::choose(env, task));
    crate::profile::stage(crate::profile::Stage::Plan, start);
    choice.inspect_err(|e| tracing::debug!(target: "COLL", "{}: no choice before the ways around the planner: {}", task.kind.name(), e.message)).ok()
}

/// Logs that `task` took `way`, a way around the planner (chosen by rustccl: none of them
/// runs where the tuner spoke or where `NCCL_ALGO` / `NCCL_PROTO` is set).
pub(crate) fn trace(task: &Task, nranks: usize, way: Way) {
    trace_named(task, nranks, way.name(), ChosenBy::Rustccl);
}

/// Logs that `task` ran a plan the planner made for an earlier call of the same shape
/// (the planned route's memo, `coll::planned`).
pub(crate) fn trace_cached(task: &Task, nranks: usize) {
    trace_named(task, nranks, "plan-cache", ChosenBy::untuned());
}

fn trace_named(task: &Task, nranks: usize, way: &str, by: ChosenBy) {
    if !tracing::enabled!(target: "COLL", tracing::Level::TRACE) {
        return;
    }
    tracing::trace!(target: "COLL", "{} {} B: way={way} chosen by {}", task.kind.name(), plan::task_bytes(task, nranks), who(by, None));
}

/// Logs how the planner runs `task`, from what it chose (`plan`): its algorithm, protocol,
/// channels and who chose them, or the one-rank way (point-to-point tasks have no line).
pub(crate) fn trace_planned(task: &Task, nranks: u32, plan: &TaskPlan, tuner: Option<&TunerInstance>) {
    if !tracing::enabled!(target: "COLL", tracing::Level::TRACE) {
        return;
    }
    match (plan.algo, plan.proto, plan.by) {
        (Some(algo), Some(proto), Some(by)) => tracing::trace!(
            target: "COLL",
            "{} {} B: way=planner {}/{} {} ch chosen by {}",
            task.kind.name(),
            plan::task_bytes(task, nranks as usize),
            algo.name(),
            proto.name(),
            plan.channels,
            who(by, tuner)
        ),
        _ if nranks == 1 && !task.kind.is_p2p() => trace(task, 1, Way::OneRank),
        _ => {}
    }
}

/// Who chose, as the TRACE lines say it.
fn who(by: ChosenBy, tuner: Option<&TunerInstance>) -> String {
    match by {
        ChosenBy::Rustccl => "rustccl".into(),
        ChosenBy::Tuner => format!("tuner {}", tuner.map_or("?", |t| t.plugin.name.as_str())),
        ChosenBy::Env => plan::forced_by().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{DevicePtr, Stream};
    use crate::coll::{CollKind, ReduceOp, Scalar};
    use crate::types::DataType;

    fn task(kind: CollKind, op: ReduceOp) -> Task {
        Task { kind, send: DevicePtr(64), recv: DevicePtr(64), count: 4, dtype: DataType::Float32, op, stream: Stream::DEFAULT, profile: Default::default(), options: Default::default() }
    }

    #[test]
    fn the_one_rank_route_takes_every_task_of_one_rank_unless_an_operator_computes() {
        let sum = task(CollKind::AllReduce, ReduceOp::Sum);
        let pair = [task(CollKind::Send { peer: 0 }, ReduceOp::Sum), task(CollKind::Recv { peer: 0 }, ReduceOp::Sum)];
        let group = [sum.clone(), pair[0].clone(), task(CollKind::AllGather, ReduceOp::Sum), pair[1].clone()];
        assert!(one_rank(1, [&sum]));
        assert!(one_rank(1, &pair), "a send/recv pair to self");
        assert!(one_rank(1, &pair[..1]), "a send alone: the route gives the planner's error");
        assert!(one_rank(1, &group), "a group of them");
        assert!(one_rank(1, &[task(CollKind::AllReduce, ReduceOp::PreMulSum(Scalar::Host(1.0)))]));
        assert!(!one_rank(2, &group), "two ranks");
        for computes in [ReduceOp::PreMulSum(Scalar::Host(2.0)), ReduceOp::PreMulSum(Scalar::Device(DevicePtr(8)))] {
            let mut g = group.to_vec();
            g.push(task(CollKind::Reduce { root: 0 }, computes));
            assert!(!one_rank(1, &g), "{computes:?} in the group: the planner runs it all");
        }
    }
}
