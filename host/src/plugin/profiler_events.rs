//! The profiler as an observer: the events of NCCL's profiler v5 hierarchy, made from what
//! the core tells its observer ([`crate::observe`]: plain descriptors of operations, their
//! plans and their transfers) and sent to the communicator's profiler
//! (`CommPlugins::profiler`, whose [`ProfilerInstance`] implements [`Observer`]). This module
//! knows nothing of the core's types: `coll::observe` describes the tasks, `exec::observe`
//! the transfers of the planner's work, the proxy the slots it moves; `observe` keeps the
//! order of events (the thread's group, channels, transfers) for every observer.
//!
//! | event | where | parent |
//! |---|---|---|
//! | GroupApi | the calling thread's outermost group (a call outside a group is a group of one); states GroupStartApiStop (first operation) and GroupEndApiStart (group end) | none |
//! | CollApi / P2pApi | each operation call, stopped when the call returns; `user_tag` the call's profiler tag | GroupApi |
//! | Group | each communicator's share of a group that runs | none |
//! | Coll / P2p | each planned task (algorithm, protocol, channels; `user_tag` its call's) | CollApi / P2pApi; `parent_group` = Group |
//! | KernelLaunch | device work enqueued on its stream | GroupApi |
//! | KernelCh | each channel of a Coll / P2p: started when its work starts, KernelChStop (with the stop timer) and stop when it completed | Coll / P2p |
//! | ProxyOp | the proxy's share of one task on one network connection; a transfer without a network proxy (below) | Coll / P2p |
//! | ProxyStep | one slot of a proxy op: SendWait or RecvWait when posted, RecvGPUWait when a receive lands | ProxyOp |
//!
//! Every way an operation runs gives these events: the planner's (host executor, shared
//! memory or network, and device launches), and the ways around it for single collectives
//! (the board of small collectives and its single copies, one-rank copies, the symmetric
//! paths), which report one channel (`coll::observe::single_op`); so a profiler that
//! completes an operation on its KernelCh stops (NCCL's Inspector, Google's CoMMA) sees
//! every one complete.
//!
//! ProxyOp on paths without a network proxy (shared memory or device connections of the
//! planner's runs, the board and its single copies, one-rank copies, the symmetric paths):
//! a profiler may end an operation only when a ProxyOp under it stops (Google's CoMMA does,
//! and reclaims at a timeout an operation that got none), so every Coll / P2p that moves
//! data gets ProxyOps there too (`observe::RunEvents::add_local`). On a planner's run one
//! stands for one task's slots on one connection (channel, peer, direction; nSteps its
//! slots, chunkSize the largest); on a way around the planner one send and one receive per
//! peer (per the rank itself on one rank) on channel 0, one step of the operation's bytes:
//! the exchange of data with that peer, whatever the path does in detail. They start when
//! the work starts on the host (when it completes for device work, which the host does not
//! watch: the watchdog starts and stops them, on one thread as NCCL's proxy does) and stop
//! when it completed, with the KernelCh events; their ProxySteps, one per slot (SendWait
//! with its bytes, or RecvWait then RecvGPUWait), are reported at completion, since no proxy
//! thread watches the slots one by one. They come only when ProxyOp or ProxyStep is asked
//! for.
//!
//! KernelCh timers (`pTimer` at start and at KernelChStop) are nanoseconds of the host's
//! clock ([`host_timer_ns`], on the Unix epoch like the GPU's globaltimer NCCL reads): on the
//! host backend taken when the channel's work starts and when the executor has finished it
//! (the host executor finishes every channel of a run before it returns, so they share the
//! stop); on a GPU when the work is launched and when the host learns it completed (the
//! communicator's watchdog sees the launch's event done), not the kernel's globaltimer.
//!
//! A type starts when its own bit or a descendant's is in the profiler's mask, as NCCL does
//! ([`activated_by`]): a profiler that asks for Coll only still gets each Coll under its
//! CollApi event (the parent handle it was given), and one that asks for KernelCh gets the
//! Coll / P2p its channels belong to. Every started event is an [`Event`],
//! stopped when dropped, so errors and aborts stop them too; an event of the execution
//! hierarchy (Group → Coll → ProxyOp → ProxyStep) holds its parent, which therefore stops
//! after its children (a collective's event lasts until the proxy has moved its data).
//!
//! With no profiler in the process each hook is one load and one branch
//! ([`crate::observe::any_active`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use abi_stable::std_types::RStr;
use rustccl_plugin_api::profiler::{event_type as ty, state, EventDescr, StateArgs};
use rustccl_plugin_api::PluginHandle;

use super::profiler::ProfilerInstance;
use crate::observe::{GroupApiEvents, KernelChannels, Observer, OpDescr, OpPlan, ProxyOpDescr, ProxyOpEvents, RunObserver, Span};
use crate::spec::Collective;
use crate::types::DataType;

const NONE: PluginHandle = PluginHandle { id: 0 };

/// A started event; stopped when dropped (after which its parent, if it holds one, may stop).
pub struct Event {
    prof: Arc<ProfilerInstance>,
    handle: PluginHandle,
    _parent: Option<Arc<Event>>,
}

impl Event {
    /// Starts an event if its type or a descendant's is in the mask ([`activated_by`]) and
    /// the plugin tracks it.
    fn start(prof: &Arc<ProfilerInstance>, descr: &EventDescr<'_>, parent: Option<Arc<Event>>) -> Option<Event> {
        if !prof.wants(activated_by(descr.event_type)) {
            return None;
        }
        match prof.plugin.api.start_event(prof.ctx, descr) {
            Ok(h) if h.id != 0 => Some(Event { prof: Arc::clone(prof), handle: h, _parent: parent }),
            Ok(_) => None,
            Err(e) => {
                tracing::trace!(target: "PROFILE", "PROFILER/{}: start_event failed: {}", prof.plugin.name, e.message);
                None
            }
        }
    }

    pub fn handle(&self) -> PluginHandle {
        self.handle
    }

    fn record(&self, st: u32, args: &StateArgs) {
        if let Err(e) = self.prof.plugin.api.record_event_state(self.handle, st, args) {
            tracing::trace!(target: "PROFILE", "PROFILER/{}: record_event_state failed: {}", self.prof.plugin.name, e.message);
        }
    }

    /// As a span of the observer interface.
    fn span(self) -> Span {
        Span::new(self.handle.id, self)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Err(e) = self.prof.plugin.api.stop_event(self.handle) {
            tracing::trace!(target: "PROFILE", "PROFILER/{}: stop_event failed: {}", self.prof.plugin.name, e.message);
        }
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event({})", self.handle.id)
    }
}

/// The mask bits that start events of `event_type`: its own and its descendants' (NCCL's
/// `groupApiMask`, `collApiMask`, `p2pApiMask` and the task and proxy rules of
/// `src/plugin/profiler.cc`), so that a child's parent is there to be named.
pub fn activated_by(event_type: u32) -> u32 {
    let under_step = ty::PROXY_STEP | ty::NET_PLUGIN;
    let under_op = ty::PROXY_OP | under_step;
    let under_task = under_op | ty::KERNEL_CH;
    match event_type {
        ty::GROUP_API => ty::ALL & !ty::PROXY_CTRL,
        ty::COLL_API => ty::COLL_API | ty::COLL | under_task,
        ty::P2P_API => ty::P2P_API | ty::P2P | under_task,
        ty::GROUP => ty::GROUP | ty::COLL | ty::P2P | under_task,
        ty::COLL => ty::COLL | under_task,
        ty::P2P => ty::P2P | under_task,
        ty::PROXY_OP => under_op,
        ty::PROXY_STEP => under_step,
        t => t,
    }
}

/// The host's clock for KernelCh timers: nanoseconds since the Unix epoch (as the GPU's
/// globaltimer), read from a monotonic clock anchored once, so that a stop never reads
/// before its start.
pub fn host_timer_ns() -> u64 {
    use std::time::{Instant, SystemTime, UNIX_EPOCH};
    static ANCHOR: std::sync::OnceLock<(Instant, u64)> = std::sync::OnceLock::new();
    let (at, epoch_ns) = *ANCHOR.get_or_init(|| {
        let ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
        (Instant::now(), ns)
    });
    epoch_ns + at.elapsed().as_nanos() as u64
}

fn handle_of<E: std::borrow::Borrow<Event>>(e: Option<&E>) -> PluginHandle {
    e.map_or(NONE, |e| e.borrow().handle)
}

/// NCCL's name of a data type (`ncclFloat32`, ...).
pub fn nccl_type_name(t: DataType) -> &'static str {
    match t {
        DataType::Int8 => "ncclInt8",
        DataType::Uint8 => "ncclUint8",
        DataType::Int32 => "ncclInt32",
        DataType::Uint32 => "ncclUint32",
        DataType::Int64 => "ncclInt64",
        DataType::Uint64 => "ncclUint64",
        DataType::Float16 => "ncclFloat16",
        DataType::Float32 => "ncclFloat32",
        DataType::Float64 => "ncclFloat64",
        DataType::Bfloat16 => "ncclBfloat16",
        DataType::Float8e4m3 => "ncclFloat8e4m3",
        DataType::Float8e5m2 => "ncclFloat8e5m2",
    }
}

/// An event field's rank (-1: none).
fn rank_field(r: Option<u32>) -> i32 {
    r.map_or(-1, |r| r as i32)
}

/// What a Coll event names for an algorithm or protocol: NCCL's name, or NCCL's "Unknown"
/// (`ncclAlgoToString` / `ncclProtoToString` of none) where the way taken has none of NCCL's.
/// Profilers parse these names: an empty one kills Google's CoMMA (it reads its last byte).
fn nccl_name_or_unknown(name: &'static str) -> &'static str {
    if name.is_empty() {
        "Unknown"
    } else {
        name
    }
}

// ---------------------------------------------------------------------------------------
// The communicator's observer: API events, and the start of a run.

impl Observer for ProfilerInstance {
    fn group_api(&self, group_depth: u32) -> Option<Box<dyn GroupApiEvents>> {
        let prof = self.arc()?;
        let d = EventDescr { group_depth: group_depth as i32, ..EventDescr::new(ty::GROUP_API, NONE, prof.rank) };
        Event::start(&prof, &d, None).map(|e| Box::new(GroupApi(e)) as Box<dyn GroupApiEvents>)
    }

    fn api_call(&self, op: &OpDescr, group_api: u64) -> Option<Span> {
        let prof = self.arc()?;
        let event_type = if op.coll.spec().p2p { ty::P2P_API } else { ty::COLL_API };
        let d = EventDescr {
            func: RStr::from_str(op.coll.spec().name),
            count: op.count,
            datatype: RStr::from_str(nccl_type_name(op.dtype)),
            root: rank_field(op.root),
            stream: op.stream as usize,
            user_tag: op.user_tag,
            ..EventDescr::new(event_type, PluginHandle { id: group_api }, prof.rank)
        };
        Event::start(&prof, &d, None).map(Event::span)
    }

    fn run(&self, group_api: u64, ops: &[(OpDescr, OpPlan)]) -> Option<Box<dyn RunObserver>> {
        let prof = self.arc()?;
        if !prof.wants(activated_by(ty::GROUP) | ty::KERNEL_LAUNCH) {
            return None;
        }
        let group = Event::start(&prof, &EventDescr::new(ty::GROUP, NONE, prof.rank), None).map(Arc::new);
        let by_op = ops.iter().map(|(op, plan)| (start_op(&prof, op, plan, &group), plan.channels)).collect();
        Some(Box::new(Run { prof, by_op, group_api: PluginHandle { id: group_api }, _group: group }))
    }
}

/// The GroupApi event of the thread's outermost group.
struct GroupApi(Event);

impl GroupApiEvents for GroupApi {
    fn id(&self) -> u64 {
        self.0.handle.id
    }

    fn start_api_stopped(&self) {
        self.0.record(state::GROUP_START_API_STOP, &StateArgs::default());
    }

    fn end_api_started(&self) {
        self.0.record(state::GROUP_END_API_START, &StateArgs::default());
    }
}

/// Starts the Coll / P2p event of `op` (parent: its CollApi / P2pApi event; `group` its
/// Group event).
fn start_op(prof: &Arc<ProfilerInstance>, op: &OpDescr, plan: &OpPlan, group: &Option<Arc<Event>>) -> Option<Arc<Event>> {
    let spec = op.coll.spec();
    let common = EventDescr {
        func: RStr::from_str(spec.name),
        count: op.count,
        datatype: RStr::from_str(nccl_type_name(op.dtype)),
        n_channels: plan.channels as i32,
        parent_group: handle_of(group.as_ref()),
        user_tag: op.user_tag,
        ..EventDescr::new(ty::COLL, PluginHandle { id: op.parents.api }, prof.rank)
    };
    let d = if spec.p2p {
        let is_send = op.coll == Collective::Send;
        EventDescr {
            event_type: ty::P2P,
            peer: rank_field(op.peer),
            send_buff: if is_send { op.send } else { 0 },
            recv_buff: if is_send { 0 } else { op.recv },
            ..common
        }
    } else {
        EventDescr {
            seq_number: prof.seq[spec.func.index()].fetch_add(1, Ordering::Relaxed),
            root: rank_field(op.root),
            send_buff: op.send,
            recv_buff: op.recv,
            algo: RStr::from_str(nccl_name_or_unknown(plan.algo)),
            proto: RStr::from_str(nccl_name_or_unknown(plan.proto)),
            ..common
        }
    };
    Event::start(prof, &d, group.clone()).map(Arc::new)
}

// ---------------------------------------------------------------------------------------
// A running share of a group: Group, Coll / P2p, KernelLaunch, KernelCh, and the ProxyOps.

/// The events of one communicator's share of a running group; they stop when it is dropped
/// (the Coll / P2p events later while their channels or proxy ops still run).
struct Run {
    prof: Arc<ProfilerInstance>,
    /// Per operation: its Coll / P2p event and how many channels it uses.
    by_op: Vec<(Option<Arc<Event>>, u32)>,
    group_api: PluginHandle,
    _group: Option<Arc<Event>>,
}

impl RunObserver for Run {
    fn wants_proxy_ops(&self) -> bool {
        self.prof.wants(ty::PROXY_OP | ty::PROXY_STEP)
    }

    fn proxy_op(&self, op: &ProxyOpDescr) -> Box<dyn ProxyOpEvents> {
        let plan = ProxyOpPlan {
            prof: Arc::clone(&self.prof),
            parent: self.by_op.get(op.op).and_then(|(e, _)| e.clone()),
            channel: op.channel as i32,
            peer: op.peer as i32,
            is_send: op.is_send,
            n_steps: op.n_steps(),
            chunk_size: op.chunk_size().min(i32::MAX as usize) as i32,
        };
        Box::new(ProxyOp { plan, begun: false, event: None, steps: Vec::new() })
    }

    fn kernel_launch(&self, stream: u64) -> Option<Span> {
        let d = EventDescr { stream: stream as usize, ..EventDescr::new(ty::KERNEL_LAUNCH, self.group_api, self.prof.rank) };
        Event::start(&self.prof, &d, None).map(Event::span)
    }

    fn kernel_channels(&self) -> Option<Box<dyn KernelChannels>> {
        if !self.prof.wants(ty::KERNEL_CH) {
            return None;
        }
        let mut events = Vec::new();
        for (op, n) in &self.by_op {
            let Some(op) = op else { continue };
            for c in 0..*n {
                let at = host_timer_ns();
                let d = EventDescr { channel_id: c as i32, seq_number: at, ..EventDescr::new(ty::KERNEL_CH, op.handle, self.prof.rank) };
                if let Some(e) = Event::start(&self.prof, &d, Some(Arc::clone(op))) {
                    events.push((e, at));
                }
            }
        }
        (!events.is_empty()).then(|| Box::new(ChannelEvents(events)) as Box<dyn KernelChannels>)
    }
}

/// The KernelCh events of operations whose work has started, each with the start timer
/// taken when it started.
struct ChannelEvents(Vec<(Event, u64)>);

impl KernelChannels for ChannelEvents {
    /// Each channel records KernelChStop with the host's time (after its start: a profiler
    /// divides by the difference) and stops.
    fn complete(self: Box<Self>) {
        let now = host_timer_ns();
        for (e, started) in self.0 {
            e.record(state::KERNEL_CH_STOP, &StateArgs { p_timer: now.max(started + 1), ..Default::default() });
        }
    }
}

/// One transfer of a task on one connection, as the profiler names it.
struct ProxyOpPlan {
    prof: Arc<ProfilerInstance>,
    parent: Option<Arc<Event>>,
    channel: i32,
    peer: i32,
    is_send: bool,
    n_steps: u32,
    chunk_size: i32,
}

impl ProxyOpPlan {
    /// Starts its ProxyOp event (parent: its Coll / P2p), in progress.
    fn start(&self) -> Option<Arc<Event>> {
        let d = EventDescr {
            channel_id: self.channel,
            peer: self.peer,
            n_steps: self.n_steps as i32,
            chunk_size: self.chunk_size,
            is_send: self.is_send,
            ..EventDescr::new(ty::PROXY_OP, handle_of(self.parent.as_ref()), self.prof.rank)
        };
        let event = Event::start(&self.prof, &d, self.parent.clone()).map(Arc::new);
        if let Some(e) = &event {
            e.record(state::PROXY_OP_IN_PROGRESS, &StateArgs::default());
        }
        event
    }

    /// Starts the ProxyStep event of its step `step` under `op`: SendWait with the `bytes`
    /// sent, or RecvWait.
    fn start_step(&self, op: &Option<Arc<Event>>, step: u64, bytes: usize) -> Option<Event> {
        let d = EventDescr { step: step as i32, ..EventDescr::new(ty::PROXY_STEP, handle_of(op.as_ref()), self.prof.rank) };
        let event = Event::start(&self.prof, &d, op.clone())?;
        let (st, size) = if self.is_send { (state::PROXY_STEP_SEND_WAIT, bytes) } else { (state::PROXY_STEP_RECV_WAIT, 0) };
        event.record(st, &StateArgs { trans_size: size, ..Default::default() });
        Some(event)
    }
}

/// The ProxyOp and ProxyStep events of one transfer.
struct ProxyOp {
    plan: ProxyOpPlan,
    begun: bool,
    event: Option<Arc<Event>>,
    /// Per step: its ProxyStep event, from posted to completed.
    steps: Vec<Option<Event>>,
}

impl ProxyOpEvents for ProxyOp {
    fn begin(&mut self) {
        if !self.begun {
            self.begun = true;
            self.event = self.plan.start();
        }
    }

    fn posted(&mut self, step: u64, bytes: usize) {
        self.begin();
        let Some(event) = self.plan.start_step(&self.event, step, bytes) else { return };
        let at = step as usize;
        if self.steps.len() <= at {
            self.steps.resize_with(at + 1, || None);
        }
        self.steps[at] = Some(event);
    }

    /// A receive records RecvGPUWait (its `bytes` landed); then the step stops.
    fn completed(&mut self, step: u64, bytes: usize) {
        self.begin();
        let Some(event) = self.steps.get_mut(step as usize).and_then(Option::take) else { return };
        if !self.plan.is_send {
            event.record(state::PROXY_STEP_RECV_GPU_WAIT, &StateArgs { trans_size: bytes, ..Default::default() });
        }
    }
}
