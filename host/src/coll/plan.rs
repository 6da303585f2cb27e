//! The planner: turns one communicator's tasks into work items — each a program of steps over
//! links, with the buffers and reduction it applies — choosing for each collective the
//! algorithm (ring or tree), the protocol, the number of channels and the chunk size. The
//! choice comes from a cost model, which `NCCL_ALGO` / `NCCL_PROTO` restrict and the tuner
//! plugin may override (NCCL's cost-table contract).
//!
//! Work items are keyed by the links they use: all collectives on ring channel `c` go, in call
//! order, into one item; each peer's sends into one item and its receives into another; so
//! that every FIFO carries its messages in the order both ends expect.

use rustccl_plugin_api::{Algorithm, CostTable, Protocol, ALGO_PROTO_IGNORE};

use crate::program::{self, Ring, Step};
use super::{CollKind, ReduceOp, Scalar, Task};
use crate::backend::DevicePtr;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::exec::executor::Executor;
use crate::params;
use crate::reduce::{DevOp, Reducer};
use crate::backend::Capabilities;
use crate::work::{LocalCopy, OpCtx, Work, WorkItem};
use crate::transport::SLOT_BYTES;
use crate::types::DataType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ItemKey {
    Ring(u32),
    Tree(u32),
    Direct(u32),
    SendTo(u32, u32),
    RecvFrom(u32, u32),
    Local(u32),
}

/// One communicator's share of a group: its work, whether it runs on a device, and what the
/// planner chose for each task.
pub struct CommRun {
    pub comm: Communicator,
    pub work: Work,
    /// Whether the buffers are device memory (the device executor runs the work).
    pub device: bool,
    /// What the planner chose for each task that runs, always (the observer's events read it).
    pub plans: Vec<TaskPlan>,
    /// The observer's events of this share (ended when it is dropped).
    pub profile: Option<crate::observe::RunEvents>,
}

/// What the planner chose for one task that runs (a count of 0 runs nothing): one per
/// context of the work, in order (`work.ctxs[i]` is the context of `plans[i].task`). The
/// TRACE way lines and the observer's Coll / P2p events say it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TaskPlan {
    /// The task's index among those planned.
    pub task: usize,
    /// The algorithm (none for point-to-point and one-rank tasks: they have none of NCCL's).
    pub algo: Option<Algorithm>,
    /// The protocol of its steps (none for one-rank tasks).
    pub proto: Option<Protocol>,
    pub channels: u32,
    /// Who chose algorithm, protocol and channels (with `algo`).
    pub by: Option<ChosenBy>,
}

/// What the planner chose for one collective.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    pub algo: Algorithm,
    pub proto: Protocol,
    pub channels: u32,
    pub chunk_bytes: usize,
    /// Estimated time, microseconds.
    pub time_us: f32,
    /// Who made the choice (the TRACE line of each collective says it).
    pub by: ChosenBy,
}

/// Who chose a collective's algorithm, protocol and channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChosenBy {
    /// rustccl's cost model.
    Rustccl,
    /// The tuner plugin: its `getCollInfo` changed the cost table or set the channels.
    Tuner,
    /// The user, through `NCCL_ALGO` / `NCCL_PROTO` (the cost model chose among what is left).
    Env,
}

impl ChosenBy {
    /// Who chose when the tuner was silent: the user's `NCCL_ALGO` / `NCCL_PROTO`, else rustccl.
    pub(crate) fn untuned() -> ChosenBy {
        if forced() {
            ChosenBy::Env
        } else {
            ChosenBy::Rustccl
        }
    }
}

/// Bytes a task moves per rank (NCCL's `nBytes` for the tuner).
pub(crate) fn task_bytes(task: &Task, nranks: usize) -> usize {
    task.count * task.dtype.size() * task.kind.spec().count_multiple(nranks)
}

/// The cost model: time of `algo`/`proto` for `bytes` on `n` ranks, or IGNORE if unusable.
fn model_time(caps: &Capabilities, kind: &CollKind, algo: Algorithm, proto: Protocol, bytes: usize, n: usize) -> f32 {
    let cost = caps.protocol(proto);
    let lat = cost.latency_us;
    let bw = if caps.bandwidth_per_channel { cost.gbps * caps.channels_for(proto, bytes, n as u32) as f32 } else { cost.gbps };
    let nf = n as f32;
    let gb = bytes as f32 / 1e3; // bytes / (GB/s) in microseconds = bytes / 1e3 / bw
    if caps.one_shot_ll && proto == Protocol::Ll && algo == Algorithm::Ring {
        // One hop; each rank writes (and the reducing ones read) n - 1 copies of its input.
        return match kind {
            CollKind::AllReduce | CollKind::Broadcast { .. } | CollKind::Reduce { .. } => lat + (nf - 1.0) * gb / bw,
            CollKind::AllGather | CollKind::ReduceScatter => lat + (nf - 1.0) / nf * gb / bw,
            CollKind::Send { .. } | CollKind::Recv { .. } => lat + gb / bw,
        };
    }
    match (kind, algo) {
        (CollKind::AllReduce, Algorithm::Ring) => 2.0 * (nf - 1.0) * lat + 2.0 * (nf - 1.0) / nf * gb / bw,
        (CollKind::AllReduce, Algorithm::Tree) => 2.0 * nf.log2().ceil().max(1.0) * lat + 2.0 * gb / bw,
        (CollKind::AllGather | CollKind::ReduceScatter, Algorithm::Ring) => (nf - 1.0) * lat + (nf - 1.0) / nf * gb / bw,
        (CollKind::Broadcast { .. } | CollKind::Reduce { .. }, Algorithm::Ring) => (nf - 1.0) * lat + gb / bw,
        (CollKind::Send { .. } | CollKind::Recv { .. }, Algorithm::Ring) => lat + gb / bw,
        _ => ALGO_PROTO_IGNORE,
    }
}

/// Names allowed by `NCCL_ALGO` / `NCCL_PROTO` (comma list; `^` excludes); `None`: all.
fn allowed(setting: Option<&str>, name: &str) -> bool {
    let Some(v) = setting else { return true };
    let (exclude, list) = match v.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let hit = list.split(',').any(|x| x.trim().eq_ignore_ascii_case(name));
    hit != exclude
}

/// `NCCL_ALGO` and `NCCL_PROTO`, read once per process as NCCL reads its parameters (a getenv
/// per candidate is not free on every operation).
fn algo_setting() -> Option<&'static str> {
    static V: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    V.get_or_init(|| params::env_str("NCCL_ALGO")).as_deref()
}

/// Whether `NCCL_ALGO` or `NCCL_PROTO` is set (the user chose the programs: ways around the
/// planner step aside).
pub(crate) fn forced() -> bool {
    algo_setting().is_some() || proto_setting().is_some()
}

/// Which of `NCCL_ALGO` / `NCCL_PROTO` is set (who chose, when [`forced`]).
pub(crate) fn forced_by() -> &'static str {
    match (algo_setting().is_some(), proto_setting().is_some()) {
        (true, true) => "NCCL_ALGO/NCCL_PROTO",
        (true, false) => "NCCL_ALGO",
        _ => "NCCL_PROTO",
    }
}

fn proto_setting() -> Option<&'static str> {
    static V: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    V.get_or_init(|| params::env_str("NCCL_PROTO")).as_deref()
}

/// What the planner reads: the rank's place, the backend's capabilities, the channel limits
/// of the config, the tuner, and how a buffer is resolved for the executor (a host address
/// on the host backend, checked to lie in known memory; the device address on devices). No
/// I/O: planning is a function of these and the tasks, tested without a backend.
pub struct PlanEnv<'a> {
    pub rank: u32,
    pub nranks: u32,
    pub caps: &'a Capabilities,
    /// What runs the work (the communicator's engine's executor): the shape of the programs
    /// and whether the work runs on a device depend on it.
    pub executor: Executor,
    pub min_ctas: i32,
    pub max_ctas: i32,
    pub tuner: Option<&'a crate::plugin::tuner::TunerInstance>,
    pub resolve: &'a dyn Fn(DevicePtr, usize) -> Result<usize>,
}

impl PlanEnv<'_> {
    /// Plans `comm`'s tasks with its environment.
    pub fn with<T>(comm: &Communicator, f: impl FnOnce(&PlanEnv) -> Result<T>) -> Result<T> {
        let plugins = comm.plugins()?;
        Self::with_tuner(comm, plugins.tuner.as_ref(), f)
    }

    fn with_tuner<T>(
        comm: &Communicator,
        tuner: Option<&crate::plugin::tuner::TunerInstance>,
        f: impl FnOnce(&PlanEnv) -> Result<T>,
    ) -> Result<T> {
        let backend = comm.backend();
        let caps = backend.capabilities();
        let executor = comm.engine().executor();
        let resolve = |ptr: DevicePtr, bytes: usize| -> Result<usize> {
            if !executor.cpu_reads_buffers() {
                return Ok(ptr.0 as usize);
            }
            backend.host_access_or_err("the plan's buffers")?.host_address(ptr, bytes)
        };
        let config = comm.config();
        let env = PlanEnv {
            rank: comm.rank_unchecked(),
            nranks: comm.nranks_unchecked(),
            caps,
            executor,
            min_ctas: config.min_ctas,
            max_ctas: config.max_ctas,
            tuner,
            resolve: &resolve,
        };
        f(&env)
    }
}

/// Chooses algorithm, protocol, channels and chunk for a task.
pub fn choose(env: &PlanEnv, task: &Task) -> Result<Choice> {
    let n = env.nranks as usize;
    let bytes = task_bytes(task, n);
    let (n_algo, n_proto) = (Algorithm::ALL.len(), Protocol::ALL.len());
    // On the stack: asked on every call where a tuner is loaded, board-sized ones included.
    let mut costs = [ALGO_PROTO_IGNORE; Algorithm::ALL.len() * Protocol::ALL.len()];
    let caps = env.caps;
    for &a in Algorithm::ALL {
        for &p in Protocol::ALL {
            if allowed(algo_setting(), a.name()) && allowed(proto_setting(), p.name()) && task.options.allows(a, p) {
                costs[a.index() * n_proto + p.index()] = model_time(caps, &task.kind, a, p, bytes, n);
            }
        }
    }
    let mut channels = -1i32;
    let model = costs;
    let mut table = CostTable::new(&mut costs, n_algo, n_proto).map_err(Error::internal)?;
    if let Some(t) = env.tuner {
        if let Err(e) = t.plugin.api.get_coll_info(t.ctx, task.kind.spec().func, bytes, 1, &mut table, &mut channels) {
            tracing::info!(target: "TUNING", "tuner {} declined ({}); using the cost model", t.plugin.name, e.message);
        }
    }
    let best = table.best();
    // The tuner's table spoke for this call when it changed a cost or set the channels (an
    // error leaves what it wrote, as NCCL, which ignores the error but not the table).
    let by = if env.tuner.is_some() && (channels > 0 || costs != model) { ChosenBy::Tuner } else { ChosenBy::untuned() };
    let (algo, proto, time_us) = match best {
        Some(b) => b,
        // What the user forced does not exist for this collective (a tree all-gather): ring.
        None if caps.ring_simple_fallback => {
            tracing::info!(
                target: "TUNING",
                "{}: no allowed algorithm runs this on device buffers (NCCL_ALGO / NCCL_PROTO); using Ring/Simple",
                task.kind.name()
            );
            let time = model_time(caps, &task.kind, Algorithm::Ring, Protocol::Simple, bytes, n);
            (Algorithm::Ring, Protocol::Simple, time)
        }
        None => {
            return Err(Error::invalid_usage(format!(
                "{}: no algorithm and protocol left to use (check NCCL_ALGO / NCCL_PROTO and the call's algorithm selection)",
                task.kind.name()
            )))
        }
    };
    let wanted = if channels > 0 { channels as u32 } else { caps.channels_for(proto, bytes, env.nranks) };
    let comm_max = (env.max_ctas.max(1) as u32).min(caps.max_channels);
    let channels = task.options.channels(wanted, (env.min_ctas.max(1) as u32).min(comm_max), comm_max);
    let most_chunk = max_chunk(env.executor, caps, proto);
    let mut chunk_bytes = match caps.protocol(proto).chunk_bytes {
        0 => most_chunk,
        c => c.min(most_chunk),
    };
    if let Some(t) = env.tuner {
        if let Ok(Some(c)) = t.plugin.api.get_chunk_size(t.ctx, task.kind.spec().func, bytes, algo, proto, channels as i32) {
            chunk_bytes = c.clamp(task.dtype.size(), most_chunk);
        }
    }
    Ok(Choice { algo, proto, channels, chunk_bytes, time_us, by })
}

/// The most payload bytes one step of `proto` carries: a slot's worth in the protocol's format
/// (the protocol's own slot where it has one), a multiple of 16; the host executor's steps
/// carry bytes as they are.
pub fn max_chunk(executor: Executor, caps: &Capabilities, proto: Protocol) -> usize {
    use rustccl_kernels::exec::{payload_capacity, PROTO_LL, PROTO_LL128, PROTO_SIMPLE};
    if !executor.steps_use_protocol_format() {
        return caps.slot_bytes;
    }
    let capacity = match proto {
        Protocol::Ll => payload_capacity(PROTO_LL, caps.ll_slot_bytes),
        Protocol::Ll128 => payload_capacity(PROTO_LL128, caps.ll128_slot_bytes),
        Protocol::Simple => payload_capacity(PROTO_SIMPLE, caps.slot_bytes),
    };
    capacity / 16 * 16
}

/// The cost model's estimate for a task, in microseconds (`ncclGroupSimulateEnd`).
pub fn estimate(comm: &Communicator, task: &Task) -> Result<f32> {
    if task.count == 0 || comm.nranks_unchecked() == 1 {
        return Ok(0.0);
    }
    PlanEnv::with(comm, |env| Ok(choose(env, task)?.time_us))
}

/// A PreMulSum's scalar: its value when given by value, else 1 for now and the address the
/// executor reads it from when the operation runs (the kernel on devices: the caller's stream
/// may not have written it yet, and a captured graph replays with the value of each replay).
fn scalar_of(env: &PlanEnv, op: ReduceOp, dtype: DataType) -> Result<(Option<f64>, usize)> {
    Ok(match op {
        ReduceOp::PreMulSum(Scalar::Host(v)) => (Some(v), 0),
        ReduceOp::PreMulSum(Scalar::Device(p)) => (Some(1.0), address(env, p, dtype.size(), &|| "PreMulSum scalar".into())?),
        _ => (None, 0),
    })
}

/// The address the executor uses for `ptr..ptr+bytes` (0 for an empty range).
fn address(env: &PlanEnv, ptr: DevicePtr, bytes: usize, what: &dyn Fn() -> String) -> Result<usize> {
    if bytes == 0 {
        return Ok(0);
    }
    (env.resolve)(ptr, bytes).map_err(|e| e.context(what()))
}

/// The context of one task: its buffers resolved (checked to lie in known memory), its
/// reducer and signature; the protocol is Simple until the planner chooses one.
pub(crate) fn op_ctx(env: &PlanEnv, task: &Task) -> Result<OpCtx> {
    let (n, rank) = (env.nranks, env.rank);
    let (scalar, scalar_at) = scalar_of(env, task.op, task.dtype)?;
    let op = DevOp::from_user(task.op.red_op(), scalar, task.dtype, n as usize)?;
    let name = task.kind.name();
    let (src_len, dst_len) = task.extent_bytes(n as usize, rank as usize);
    Ok(OpCtx {
        src: address(env, task.send, src_len, &|| format!("{name}: send buffer"))?,
        dst: address(env, task.recv, dst_len, &|| format!("{name}: receive buffer"))?,
        src_len,
        dst_len,
        reducer: Reducer::new(task.dtype, op),
        proto: Protocol::Simple,
        sig: super::check::OpSig::of(task),
        scalar_at,
        dst_remote: 0,
    })
}

/// [`op_ctx`] of `task` on `comm` (what the ways around the planner need: no tuner).
pub(crate) fn task_ctx(comm: &Communicator, task: &Task) -> Result<OpCtx> {
    PlanEnv::with_tuner(comm, None, |env| op_ctx(env, task))
}

/// Builds the work of one communicator's tasks.
pub fn build(comm: &Communicator, tasks: &[Task]) -> Result<CommRun> {
    build_chosen(comm, tasks, &[])
}

/// [`build`]; `chosen`: empty, or for each task the choice already made for it, if one was
/// (the router asked the tuner before the ways around the planner: it is not asked again).
pub(crate) fn build_chosen(comm: &Communicator, tasks: &[Task], chosen: &[Option<Choice>]) -> Result<CommRun> {
    let (work, device, plans) = PlanEnv::with(comm, |env| plan_chosen(env, tasks, chosen))?;
    Ok(CommRun { comm: comm.handle(), work, device, plans, profile: None })
}

/// The work of one rank's tasks, and whether it runs on a device.
pub fn plan(env: &PlanEnv, tasks: &[Task]) -> Result<(Work, bool)> {
    plan_chosen(env, tasks, &[]).map(|(work, device, _)| (work, device))
}

/// [`plan`], and what it chose for each task that runs; with the choice made already for a
/// task where `chosen` (empty, or one per task) gives one. Each task's TRACE way line is
/// logged from what it chose.
fn plan_chosen(env: &PlanEnv, tasks: &[Task], chosen: &[Option<Choice>]) -> Result<(Work, bool, Vec<TaskPlan>)> {
    debug_assert!(chosen.is_empty() || chosen.len() == tasks.len());
    let (n, rank, caps) = (env.nranks, env.rank, env.caps);
    let device = !env.executor.runs_on_host();
    let p2p_chunk = caps.slot_bytes;
    let mut ctxs = Vec::new();
    let mut items: Vec<(ItemKey, Vec<(usize, Step)>)> = Vec::new();
    let mut push = |key: ItemKey, ctx: usize, steps: Vec<Step>| {
        let list = match items.iter_mut().find(|(k, _)| *k == key) {
            Some((_, l)) => l,
            None => {
                items.push((key, Vec::new()));
                &mut items.last_mut().unwrap().1
            }
        };
        list.extend(steps.into_iter().map(|s| (ctx, s)));
    };
    let mut self_sends: Vec<(usize, usize)> = Vec::new();
    let mut self_recvs: Vec<(usize, usize)> = Vec::new();
    let mut copies = Vec::new();
    // One rank, and nothing to compute in any operation: plain copies (in call order). With a
    // computing operation among them, every one runs as steps, in call order.
    let all_copies = n == 1 && tasks.iter().all(one_rank_identity);
    let mut plans: Vec<TaskPlan> = Vec::with_capacity(tasks.len());
    for (ti, task) in tasks.iter().enumerate() {
        if task.count == 0 {
            continue;
        }
        let e = task.dtype.size();
        let b = task.count * e;
        let ctx = op_ctx(env, task)?;
        let ci = ctxs.len();
        ctxs.push(ctx);
        let mut planned = TaskPlan { task: ti, algo: None, proto: None, channels: 1, by: None };
        if n == 1 || matches!(task.kind, CollKind::Send { peer } | CollKind::Recv { peer } if peer == rank) {
            match task.kind {
                CollKind::Send { .. } => self_sends.push((ci, b)),
                CollKind::Recv { .. } => self_recvs.push((ci, b)),
                // One rank: the result is this rank's input, through the op (pre and post).
                // Nothing to compute: in place nothing at all, else one plain copy.
                _ if all_copies => {
                    let ctx = &ctxs[ci];
                    if ctx.src != ctx.dst {
                        copies.push(LocalCopy { src: ctx.src, dst: ctx.dst, bytes: b });
                    }
                }
                _ => {
                    planned.channels = caps.p2p_channels(b, n);
                    for (c, steps) in local_channels(b, task.kind.reduces(), planned.channels) {
                        push(ItemKey::Local(c), ci, steps);
                    }
                }
            }
            plans.push(planned);
            continue;
        }
        match task.kind {
            CollKind::Send { peer } | CollKind::Recv { peer } => {
                let nch = caps.p2p_channels(b, n);
                // Small messages as LL lines (both ends see the same size, so they agree), as
                // NCCL below NCCL_P2P_LL_THRESHOLD; `NCCL_PROTO` may rule LL out.
                let proto = if b <= caps.p2p_ll_bytes && allowed(proto_setting(), Protocol::Ll.name()) {
                    Protocol::Ll
                } else {
                    Protocol::Simple
                };
                ctxs[ci].proto = proto;
                let chunk = if proto == Protocol::Ll { max_chunk(env.executor, caps, proto) } else { p2p_chunk };
                plans.push(TaskPlan { proto: Some(proto), channels: nch, ..planned });
                for c in 0..nch {
                    let range = program::p2p_range(b, c, nch);
                    if range.0 == range.1 && c > 0 {
                        continue;
                    }
                    if matches!(task.kind, CollKind::Send { .. }) {
                        push(ItemKey::SendTo(peer, c), ci, program::p2p_send(peer, c, range, chunk));
                    } else {
                        push(ItemKey::RecvFrom(peer, c), ci, program::p2p_recv(peer, c, range, chunk));
                    }
                }
                continue;
            }
            _ => {}
        }
        let choice = match chosen.get(ti).copied().flatten() {
            Some(c) => c,
            None => choose(env, task)?,
        };
        plans.push(TaskPlan { algo: Some(choice.algo), proto: Some(choice.proto), channels: choice.channels, by: Some(choice.by), ..planned });
        ctxs[ci].proto = choice.proto;
        let chunk = (choice.chunk_bytes / e).max(1);
        tracing::debug!(target: "COLL", "{} {} x {}: {:?}", task.kind.name(), task.count, task.dtype, choice);
        let one_shot = caps.one_shot_ll && choice.proto == Protocol::Ll && choice.algo == Algorithm::Ring;
        for c in 0..choice.channels {
            let ring = Ring { rank, nranks: n, channel: c };
            let range = program::channel_range(task.count, c, choice.channels, e);
            if one_shot {
                use program::direct;
                let steps = match task.kind {
                    CollKind::AllReduce => direct::all_reduce(rank, n, c, range, chunk, e),
                    CollKind::AllGather => direct::all_gather(rank, n, c, range, task.count, chunk, e),
                    CollKind::ReduceScatter => direct::reduce_scatter(rank, n, c, range, task.count, chunk, e),
                    CollKind::Broadcast { root } => direct::broadcast(rank, n, root, c, range, chunk, e),
                    CollKind::Reduce { root } => direct::reduce(rank, n, root, c, range, chunk, e),
                    CollKind::Send { .. } | CollKind::Recv { .. } => unreachable!("handled above"),
                };
                push(ItemKey::Direct(c), ci, steps);
                continue;
            }
            let (key, steps) = match (&task.kind, choice.algo) {
                (CollKind::AllReduce, Algorithm::Tree) => (ItemKey::Tree(c), program::tree_all_reduce(rank, n, c, range, chunk, e)),
                (CollKind::AllReduce, _) => (ItemKey::Ring(c), program::ring_all_reduce(ring, range, chunk, e)),
                (CollKind::AllGather, _) => (ItemKey::Ring(c), program::ring_all_gather(ring, range, task.count, chunk, e)),
                (CollKind::ReduceScatter, _) => (ItemKey::Ring(c), program::ring_reduce_scatter(ring, range, task.count, chunk, e)),
                (CollKind::Broadcast { root }, _) => (ItemKey::Ring(c), program::ring_broadcast(ring, *root, range, chunk, e)),
                (CollKind::Reduce { root }, _) => (ItemKey::Ring(c), program::ring_reduce(ring, *root, range, chunk, e)),
                (CollKind::Send { .. } | CollKind::Recv { .. }, _) => unreachable!("handled above"),
            };
            push(key, ci, steps);
        }
    }
    for (s, r, sb) in self_pairs(self_sends, self_recvs)? {
        // The receive's context gets the send's source.
        ctxs[r].src = ctxs[s].src;
        ctxs[r].src_len = ctxs[s].src_len;
        // A plain copy (a copy engine on devices) when no other operation of the group touches
        // its memory (copies run before the steps); else steps, in order with the others.
        let copy = LocalCopy { src: ctxs[s].src, dst: ctxs[r].dst, bytes: sb };
        let apart = ctxs.iter().enumerate().filter(|(i, _)| *i != s && *i != r).all(|(_, o)| {
            let hits = |a: usize, b: usize, len: usize| len > 0 && a < b + len && b < a + copy.bytes;
            !hits(copy.dst, o.src, o.src_len) && !hits(copy.dst, o.dst, o.dst_len) && !hits(copy.src, o.dst, o.dst_len)
        });
        if apart && copy.src != copy.dst {
            copies.push(copy);
            continue;
        }
        for (c, steps) in local_channels(sb, false, caps.p2p_channels(sb, n)) {
            push(ItemKey::Local(c), r, steps);
        }
    }
    let items = items.into_iter().map(|(_, steps)| WorkItem { steps, pc: 0 }).collect();
    let stream = tasks.first().map(|t| t.stream).unwrap_or(crate::backend::Stream::DEFAULT);
    debug_assert_eq!(plans.len(), ctxs.len(), "one plan per context");
    for planned in &plans {
        super::way::trace_planned(&tasks[planned.task], n, planned, env.tuner);
    }
    Ok((Work { ctxs, items, copies, stream }, device, plans))
}

/// The sends to self and receives from self of a group, each `(task or context, bytes)` in
/// call order, paired in order (the k-th send with the k-th receive, as NCCL matches them):
/// `(send, receive, bytes)`; an error when they do not pair up or a pair's sizes differ.
pub(crate) fn self_pairs(sends: Vec<(usize, usize)>, recvs: Vec<(usize, usize)>) -> Result<Vec<(usize, usize, usize)>> {
    if sends.len() != recvs.len() {
        return Err(Error::invalid_usage(format!(
            "{} send(s) to self but {} receive(s) from self in this group; they must pair up",
            sends.len(),
            recvs.len()
        )));
    }
    sends
        .into_iter()
        .zip(recvs)
        .map(|((s, sb), (r, rb))| {
            if sb != rb {
                return Err(Error::invalid_usage(format!("a send to self of {sb} bytes meets a receive from self of {rb} bytes")));
            }
            Ok((s, r, sb))
        })
        .collect()
}

/// Whether a task on one rank leaves its input as it is: no reduction, or one that does
/// nothing to a single input (sum, prod, min, max, avg over the one rank, a host scalar of 1).
pub(crate) fn one_rank_identity(task: &Task) -> bool {
    if !task.kind.reduces() {
        return !task.kind.is_p2p();
    }
    match task.op {
        ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Min | ReduceOp::Max | ReduceOp::Avg => true,
        ReduceOp::PreMulSum(Scalar::Host(v)) => v == 1.0,
        ReduceOp::PreMulSum(Scalar::Device(_)) => false,
    }
}

/// A local copy (or pass through the op) of `bytes`, spread over `nch` channels: each
/// channel's steps.
fn local_channels(bytes: usize, reduce: bool, nch: u32) -> impl Iterator<Item = (u32, Vec<Step>)> {
    (0..nch).map(move |c| (c, local_steps(program::p2p_range(bytes, c, nch), reduce)))
}

/// Steps that copy (or, with `reduce`, pass through the op) the bytes `range` from src to dst
/// locally.
fn local_steps(range: (usize, usize), reduce: bool) -> Vec<Step> {
    let mut steps = Vec::new();
    let (mut off, bytes) = range;
    while off < bytes {
        let len = SLOT_BYTES.min(bytes - off);
        steps.push(Step {
            recv: vec![],
            send: vec![],
            src: Some(off),
            dst: Some(off),
            bytes: len,
            reduce,
            post: reduce,
            src_in_dst: false,
        });
        off += len;
    }
    steps
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Stream;
    use rustccl_plugin_api::CollType;

    fn env<'a>(caps: &'a Capabilities, rank: u32, nranks: u32, resolve: &'a dyn Fn(DevicePtr, usize) -> Result<usize>) -> PlanEnv<'a> {
        PlanEnv { rank, nranks, caps, executor: Executor::of(caps), min_ctas: 1, max_ctas: 64, tuner: None, resolve }
    }

    fn task(kind: CollKind, count: usize, op: ReduceOp) -> Task {
        Task { kind, send: DevicePtr(0x1000), recv: DevicePtr(0x9000), count, dtype: DataType::Float32, op, stream: Stream(7), profile: Default::default(), options: Default::default() }
    }

    #[test]
    fn plans_come_from_capabilities_alone() {
        let identity = |p: DevicePtr, _: usize| -> Result<usize> { Ok(p.0 as usize) };
        let (host, gpu) = (Capabilities::host(), Capabilities::gpu());
        let big = task(CollKind::AllReduce, 8 << 20, ReduceOp::Sum);
        // The host backend: two channels from 4 MiB on, its chunk; runs on the host.
        let c = choose(&env(&host, 0, 2, &identity), &big).unwrap();
        assert_eq!(c.channels, 2);
        assert!(c.chunk_bytes <= host.slot_bytes);
        let (work, device) = plan(&env(&host, 0, 2, &identity), std::slice::from_ref(&big)).unwrap();
        assert!(!device);
        assert_eq!(work.stream, Stream(7));
        assert_eq!(work.items.len(), 2, "one item per ring channel");
        // A GPU: one channel per 128 KiB up to 32, a chunk in the protocol's slot.
        let c = choose(&env(&gpu, 0, 2, &identity), &big).unwrap();
        assert_eq!(c.channels, 32);
        assert!(c.chunk_bytes <= max_chunk(Executor::of(&gpu), &gpu, c.proto));
        let (work, device) = plan(&env(&gpu, 0, 2, &identity), std::slice::from_ref(&big)).unwrap();
        assert!(device);
        assert_eq!(work.items.len(), 32);
        // Every step of a 2-rank ring moves at most a chunk.
        assert!(work.items.iter().flat_map(|i| &i.steps).all(|(_, s)| s.bytes <= c.chunk_bytes));
    }

    #[test]
    fn the_gpu_cost_model_counts_the_channels_the_planner_uses() {
        // LL for small all-reduces, LL128 in between, Simple for large ones (2 ranks), and
        // the channels of the choice are NCCL's rule for that protocol.
        let identity = |p: DevicePtr, _: usize| -> Result<usize> { Ok(p.0 as usize) };
        let gpu = Capabilities::gpu();
        let pick = |bytes: usize| {
            let c = choose(&env(&gpu, 0, 2, &identity), &task(CollKind::AllReduce, bytes / 4, ReduceOp::Sum)).unwrap();
            assert_eq!(c.channels, gpu.channels_for(c.proto, bytes, 2), "{bytes} B");
            c.proto
        };
        if algo_setting().is_none() && proto_setting().is_none() {
            assert_eq!(pick(1 << 10), Protocol::Ll);
            assert_eq!(pick(1 << 20), Protocol::Ll128);
            assert_eq!(pick(64 << 20), Protocol::Simple);
        }
    }

    #[test]
    fn per_call_options_choose_the_algorithm_and_bound_the_channels() {
        use crate::coll::options::CollOptions;
        use crate::spec::Collective;
        let identity = |p: DevicePtr, _: usize| -> Result<usize> { Ok(p.0 as usize) };
        let gpu = Capabilities::gpu();
        let big = task(CollKind::AllReduce, 64 << 20, ReduceOp::Sum);
        let free = choose(&env(&gpu, 0, 4, &identity), &big).unwrap();
        assert!(free.channels > 1, "the model uses several channels for 256 MiB");
        let with = |sel: &str, max: Option<u32>| {
            let mut options = CollOptions { max_channels: max, ..Default::default() };
            options.select(sel, true, Collective::AllReduce, "t").unwrap();
            choose(&env(&gpu, 0, 4, &identity), &Task { options, ..big.clone() }).unwrap()
        };
        // Whatever the model prefers, the selection is what it chooses among.
        for (sel, algo, proto) in [("TREE_LL+^TREE_LL128", Algorithm::Tree, Protocol::Ll), ("tree_simple", Algorithm::Tree, Protocol::Simple), ("ring_ll128", Algorithm::Ring, Protocol::Ll128), ("RING+^RING_LL+^RING_LL128", Algorithm::Ring, Protocol::Simple)] {
            let c = with(sel, None);
            assert_eq!((c.algo, c.proto), (algo, proto), "{sel}");
        }
        let c = with("", Some(1));
        assert_eq!((c.algo, c.proto, c.channels), (free.algo, free.proto, 1), "maxCTAs 1: one channel");
        let c = choose(&env(&gpu, 0, 4, &identity), &Task { options: CollOptions { min_channels: Some(3), ..Default::default() }, ..task(CollKind::AllReduce, 16, ReduceOp::Sum) }).unwrap();
        assert_eq!(c.channels, 3, "minCTAs 3 on a tiny call");
    }

    /// A tuner that lowers one entry of the table and/or sets the channels, for every call.
    struct Says {
        lower: Option<(Algorithm, Protocol)>,
        channels: i32,
    }

    impl rustccl_plugin_api::tuner::Tuner for Says {
        fn init(&self, _: u64, _: usize, _: usize, _: rustccl_plugin_api::LogFn) -> std::result::Result<rustccl_plugin_api::PluginHandle, rustccl_plugin_api::PluginError> {
            Ok(rustccl_plugin_api::PluginHandle { id: 1 })
        }
        fn get_coll_info(
            &self,
            _: rustccl_plugin_api::PluginHandle,
            _: CollType,
            _: usize,
            _: i32,
            costs: &mut CostTable<'_>,
            n_channels: &mut i32,
        ) -> std::result::Result<(), rustccl_plugin_api::PluginError> {
            if let Some((a, p)) = self.lower {
                costs.set(a, p, 0.0);
            }
            if self.channels > 0 {
                *n_channels = self.channels;
            }
            Ok(())
        }
        fn finalize(&self, _: rustccl_plugin_api::PluginHandle) -> std::result::Result<(), rustccl_plugin_api::PluginError> {
            Ok(())
        }
    }

    #[test]
    fn the_choice_says_whether_the_tuner_spoke() {
        use crate::plugin::tuner::TunerInstance;
        let identity = |p: DevicePtr, _: usize| -> Result<usize> { Ok(p.0 as usize) };
        let host = Capabilities::host();
        let t = task(CollKind::AllReduce, 1024, ReduceOp::Sum);
        let untuned = choose(&env(&host, 0, 2, &identity), &t).unwrap();
        assert_eq!(untuned.by, ChosenBy::untuned());
        let with = |says: Says| {
            let tuner = TunerInstance { plugin: std::sync::Arc::new(crate::plugin::Plugin::builtin(std::sync::Arc::new(says), "says", 2)), ctx: rustccl_plugin_api::PluginHandle { id: 1 } };
            let mut e = env(&host, 0, 2, &identity);
            e.tuner = Some(&tuner);
            choose(&e, &t).unwrap()
        };
        // Silent: the table as the model made it, no channels: rustccl's choice.
        assert_eq!(with(Says { lower: None, channels: -1 }), untuned);
        // An entry lowered: its choice, whoever would have won.
        let c = with(Says { lower: Some((Algorithm::Tree, Protocol::Simple)), channels: -1 });
        assert_eq!((c.algo, c.proto, c.by), (Algorithm::Tree, Protocol::Simple, ChosenBy::Tuner));
        // Only the channels set: the model's algorithm and protocol on the tuner's channels.
        let c = with(Says { lower: None, channels: 2 });
        assert_eq!((c.algo, c.proto, c.channels, c.by), (untuned.algo, untuned.proto, 2, ChosenBy::Tuner));
    }

    #[test]
    fn a_device_scalar_is_an_address_for_the_executor_not_a_value() {
        let identity = |p: DevicePtr, _: usize| -> Result<usize> { Ok(p.0 as usize) };
        let gpu = Capabilities::gpu();
        let t = task(CollKind::AllReduce, 1024, ReduceOp::PreMulSum(Scalar::Device(DevicePtr(0x5000))));
        let (work, _) = plan(&env(&gpu, 1, 2, &identity), &[t]).unwrap();
        assert_eq!(work.ctxs[0].scalar_at, 0x5000, "read when the operation runs");
        let t = task(CollKind::AllReduce, 1024, ReduceOp::PreMulSum(Scalar::Host(0.5)));
        let (work, _) = plan(&env(&gpu, 1, 2, &identity), &[t]).unwrap();
        assert_eq!(work.ctxs[0].scalar_at, 0);
        assert_eq!(work.ctxs[0].reducer.op, DevOp::PreMulSum { scalar: 0.5 });
    }

    /// Issue 32 item 6: the planner returns what it chose for every task that runs, always
    /// (no profiler asks here), one per context of the work and in its order, so that the
    /// TRACE lines and an observer read the same choice.
    #[test]
    fn the_planner_returns_each_tasks_choice_one_per_context() {
        let identity = |p: DevicePtr, _: usize| -> Result<usize> { Ok(p.0 as usize) };
        let host = Capabilities::host();
        let e = env(&host, 0, 2, &identity);
        let tasks = [
            task(CollKind::AllReduce, 1 << 20, ReduceOp::Sum),
            task(CollKind::Send { peer: 1 }, 0, ReduceOp::Sum),
            task(CollKind::Send { peer: 1 }, 64, ReduceOp::Sum),
            task(CollKind::Recv { peer: 1 }, 64, ReduceOp::Sum),
        ];
        let (work, _, plans) = plan_chosen(&e, &tasks, &[]).unwrap();
        assert_eq!(plans.len(), work.ctxs.len());
        assert_eq!(plans.iter().map(|p| p.task).collect::<Vec<_>>(), [0, 2, 3], "a count of 0 runs nothing");
        let c = choose(&e, &tasks[0]).unwrap();
        assert_eq!(plans[0], TaskPlan { task: 0, algo: Some(c.algo), proto: Some(c.proto), channels: c.channels, by: Some(c.by) });
        for (p, ci) in plans[1..].iter().zip(1..) {
            assert_eq!((p.algo, p.by), (None, None), "point-to-point has no algorithm");
            assert_eq!(p.proto, Some(work.ctxs[ci].proto));
            assert_eq!(p.channels, host.p2p_channels(256, 2));
        }
        // A choice made before (the tuner asked once) is the one returned.
        let chosen = Choice { algo: Algorithm::Tree, proto: Protocol::Simple, channels: 2, chunk_bytes: 4096, time_us: 1.0, by: ChosenBy::Tuner };
        let (_, _, plans) = plan_chosen(&e, &tasks[..1], &[Some(chosen)]).unwrap();
        assert_eq!(plans, [TaskPlan { task: 0, algo: Some(Algorithm::Tree), proto: Some(Protocol::Simple), channels: 2, by: Some(ChosenBy::Tuner) }]);
        // One rank: no algorithm or protocol; a copy on one channel.
        let (work, _, plans) = plan_chosen(&env(&host, 0, 1, &identity), &tasks[..1], &[]).unwrap();
        assert_eq!(work.copies.len(), 1);
        assert_eq!(plans, [TaskPlan { task: 0, algo: None, proto: None, channels: 1, by: None }]);
    }

    #[test]
    fn buffers_the_backend_does_not_know_are_refused_while_planning() {
        let refuse = |_: DevicePtr, _: usize| -> Result<usize> { Err(Error::invalid_argument("not a live allocation")) };
        let Err(e) = plan(&env(&Capabilities::host(), 0, 2, &refuse), &[task(CollKind::AllReduce, 4, ReduceOp::Sum)]) else {
            panic!("planned over unknown buffers");
        };
        assert!(e.message.contains("AllReduce: send buffer"), "{}", e.message);
    }
}

#[cfg(test)]
mod p2p_tests {
    use super::*;
    use crate::backend::Stream;

    #[test]
    fn small_messages_go_as_ll_lines_on_gpus_and_simple_elsewhere() {
        let identity = |p: DevicePtr, _: usize| -> Result<usize> { Ok(p.0 as usize) };
        let send = |count: usize| Task { kind: CollKind::Send { peer: 1 }, send: DevicePtr(0x1000), recv: DevicePtr(0), count, dtype: DataType::Float32, op: ReduceOp::Sum, stream: Stream(1), profile: Default::default(), options: Default::default() };
        let recv = |count: usize| Task { kind: CollKind::Recv { peer: 0 }, send: DevicePtr(0), recv: DevicePtr(0x9000), count, dtype: DataType::Float32, op: ReduceOp::Sum, stream: Stream(1), profile: Default::default(), options: Default::default() };
        let gpu = Capabilities::gpu();
        let host = Capabilities::host();
        let env = |caps, rank| PlanEnv { rank, nranks: 2, caps, executor: Executor::of(caps), min_ctas: 1, max_ctas: 64, tuner: None, resolve: &identity };
        if proto_setting().is_some() {
            return;
        }
        let ll = gpu.p2p_ll_bytes / 4;
        for (count, want) in [(1, Protocol::Ll), (ll, Protocol::Ll), (ll + 1, Protocol::Simple), (1 << 20, Protocol::Simple)] {
            // Both ends choose alike, and an LL step fits an LL slot.
            let (ws, _) = plan(&env(&gpu, 0), &[send(count)]).unwrap();
            let (wr, _) = plan(&env(&gpu, 1), &[recv(count)]).unwrap();
            assert_eq!((ws.ctxs[0].proto, wr.ctxs[0].proto), (want, want), "{count} floats");
            let most = max_chunk(Executor::of(&gpu), &gpu, want);
            assert!(ws.items.iter().chain(&wr.items).flat_map(|i| &i.steps).all(|(_, s)| s.bytes <= most));
        }
        let (w, _) = plan(&env(&host, 0), &[send(1)]).unwrap();
        assert_eq!(w.ctxs[0].proto, Protocol::Simple, "the host backend's LL is the one-shot exchange, not for messages");
    }
}

#[cfg(test)]
mod one_rank_tests {
    use super::*;
    use crate::backend::Stream;

    #[test]
    fn one_rank_is_a_plain_copy_or_nothing_unless_the_op_computes() {
        let identity = |p: DevicePtr, _: usize| -> Result<usize> { Ok(p.0 as usize) };
        let caps = Capabilities::gpu();
        let env = PlanEnv { rank: 0, nranks: 1, caps: &caps, executor: Executor::of(&caps), min_ctas: 1, max_ctas: 64, tuner: None, resolve: &identity };
        let t = |kind, send, recv, op| Task { kind, send: DevicePtr(send), recv: DevicePtr(recv), count: 1000, dtype: DataType::Float32, op, stream: Stream(1), profile: Default::default(), options: Default::default() };
        // Out of place: one copy, no step.
        let (w, _) = plan(&env, &[t(CollKind::AllReduce, 0x1000, 0x9000, ReduceOp::Sum)]).unwrap();
        assert_eq!(w.copies, vec![LocalCopy { src: 0x1000, dst: 0x9000, bytes: 4000 }]);
        assert!(w.items.is_empty());
        // In place: nothing at all; avg over one rank is the identity too.
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
            let (w, _) = plan(&env, &[t(CollKind::AllReduce, 0x1000, 0x1000, op)]).unwrap();
            assert!(w.copies.is_empty() && w.items.is_empty(), "{op:?}");
        }
        let (w, _) = plan(&env, &[t(CollKind::Broadcast { root: 0 }, 0x1000, 0x9000, ReduceOp::Sum)]).unwrap();
        assert_eq!(w.copies.len(), 1);
        // PreMulSum computes: the interpreter's local steps.
        let (w, _) = plan(&env, &[t(CollKind::AllReduce, 0x1000, 0x9000, ReduceOp::PreMulSum(Scalar::Host(2.0)))]).unwrap();
        assert!(w.copies.is_empty() && !w.items.is_empty());
        // With a computing operation in the group, every operation runs as steps, in order
        // (the second reads what the first wrote).
        let (w, _) = plan(
            &env,
            &[
                t(CollKind::AllReduce, 0x1000, 0x9000, ReduceOp::PreMulSum(Scalar::Host(2.0))),
                t(CollKind::AllReduce, 0x9000, 0x11000, ReduceOp::Sum),
            ],
        )
        .unwrap();
        assert!(w.copies.is_empty());
        assert_eq!(w.items.iter().flat_map(|i| &i.steps).map(|(ci, _)| *ci).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn a_send_to_self_is_a_copy_unless_another_operation_touches_its_memory() {
        let identity = |p: DevicePtr, _: usize| -> Result<usize> { Ok(p.0 as usize) };
        let caps = Capabilities::gpu();
        let env = PlanEnv { rank: 0, nranks: 2, caps: &caps, executor: Executor::of(&caps), min_ctas: 1, max_ctas: 64, tuner: None, resolve: &identity };
        let t = |kind, send, recv| Task { kind, send: DevicePtr(send), recv: DevicePtr(recv), count: 256, dtype: DataType::Float32, op: ReduceOp::Sum, stream: Stream(1), profile: Default::default(), options: Default::default() };
        // An all-to-all's own block, and a send to the peer elsewhere: the self part is a copy.
        let group = [
            t(CollKind::Send { peer: 0 }, 0x1000, 0, ),
            t(CollKind::Recv { peer: 0 }, 0, 0x9000),
            t(CollKind::Send { peer: 1 }, 0x1400, 0),
            t(CollKind::Recv { peer: 1 }, 0, 0x9400),
        ];
        let (w, _) = plan(&env, &group).unwrap();
        assert_eq!(w.copies, vec![LocalCopy { src: 0x1000, dst: 0x9000, bytes: 1024 }]);
        assert!(w.items.iter().flat_map(|i| &i.steps).all(|(ci, _)| *ci >= 2), "no local step for the self part");
        // The peer's data lands where the self copy reads: steps, in order.
        let group = [
            t(CollKind::Recv { peer: 1 }, 0, 0x1000),
            t(CollKind::Send { peer: 0 }, 0x1000, 0),
            t(CollKind::Recv { peer: 0 }, 0, 0x9000),
            t(CollKind::Send { peer: 1 }, 0x5000, 0),
        ];
        let (w, _) = plan(&env, &group).unwrap();
        assert!(w.copies.is_empty());
    }
}
