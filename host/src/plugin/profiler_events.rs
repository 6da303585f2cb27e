//! The core's profiler hooks: the events of NCCL's profiler v5 hierarchy, made at small call
//! sites in the core and sent to the communicator's profiler (`CommPlugins::profiler`).
//!
//! | event | where | parent |
//! |---|---|---|
//! | GroupApi | the calling thread's outermost group (a call outside a group is a group of one); states GroupStartApiStop (first operation) and GroupEndApiStart (group end) | none |
//! | CollApi / P2pApi | each operation call, stopped when the call returns | GroupApi |
//! | Group | each communicator's share of a group that runs | none |
//! | Coll / P2p | each planned task (algorithm, protocol, channels) | CollApi / P2pApi; `parent_group` = Group |
//! | KernelLaunch | device work enqueued on its stream | GroupApi |
//! | KernelCh | each channel of a Coll / P2p: started when its work starts, KernelChStop (with the stop timer) and stop when it completed | Coll / P2p |
//! | ProxyOp | the proxy's share of one task on one network connection; a transfer without a network proxy (below) | Coll / P2p |
//! | ProxyStep | one slot of a proxy op: SendWait or RecvWait when posted, RecvGPUWait when a receive lands | ProxyOp |
//!
//! Every way an operation runs gives these events: the planner's (host executor, shared
//! memory or network, and device launches), and the ways around it for single collectives
//! (the board of small collectives and its single copies, one-rank copies, the symmetric
//! paths), which report one channel ([`single_op`]); so a profiler that completes an
//! operation on its KernelCh stops (NCCL's Inspector, Google's CoMMA) sees every one complete.
//!
//! ProxyOp on paths without a network proxy (shared memory or device connections of the
//! planner's runs, the board and its single copies, one-rank copies, the symmetric paths):
//! a profiler may end an operation only when a ProxyOp under it stops (Google's CoMMA does,
//! and reclaims at a timeout an operation that got none), so every Coll / P2p that moves
//! data gets ProxyOps there too (`LocalOp`). On a planner's run one stands for one task's
//! slots on one connection (channel, peer, direction; nSteps its slots, chunkSize the
//! largest); on a way around the planner one send and one receive per peer (per the rank
//! itself on one rank) on channel 0, one step of the operation's bytes: the exchange of
//! data with that peer, whatever the path does in detail. They start when the work starts
//! on the host (when it completes for device work, which the host does not watch: the
//! watchdog starts and stops them, on one thread as NCCL's proxy does) and stop when it
//! completed, with the KernelCh events; their ProxySteps, one per slot (SendWait with its
//! bytes, or RecvWait then RecvGPUWait), are reported at completion, since no proxy thread
//! watches the slots one by one. They come only when ProxyOp or ProxyStep is asked for.
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
//! ([`super::profiler::any_active`]).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use abi_stable::std_types::RStr;
use rustccl_plugin_api::profiler::{event_type as ty, state, EventDescr, StateArgs};
use rustccl_plugin_api::PluginHandle;

use super::profiler::{any_active, ProfilerInstance};
use crate::coll::plan::{PlanRecord, TaskPlan};
use crate::coll::{CollKind, Task};
use crate::comm::Communicator;
use crate::exec::Links;
use crate::program::Link;
use crate::transport::{Connection, Dir, Kind};
use crate::types::DataType;
use crate::work::Work;

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

fn root_of(kind: &CollKind) -> i32 {
    match kind {
        CollKind::Broadcast { root } | CollKind::Reduce { root } => *root as i32,
        _ => -1,
    }
}

fn peer_of(kind: &CollKind) -> i32 {
    match kind {
        CollKind::Send { peer } | CollKind::Recv { peer } => *peer as i32,
        _ => -1,
    }
}

/// The communicator's profiler, if it has one.
fn profiler_of(comm: &Communicator) -> Option<Arc<ProfilerInstance>> {
    comm.plugins().ok()?.profiler.clone()
}

// ---------------------------------------------------------------------------------------
// API events: GroupApi (per thread), CollApi / P2pApi (per call).

/// The API events a task was called under (handles; 0 = none), kept with the task until it
/// is planned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApiParents {
    pub api: u64,
    pub group_api: u64,
}

#[derive(Default)]
struct GroupApiState {
    event: Option<Event>,
    start_api_stopped: bool,
    end_api_started: bool,
}

thread_local! {
    static GROUP_API: RefCell<GroupApiState> = RefCell::default();
}

/// One operation call's API event; stopped when dropped, and for a call outside a group the
/// group-of-one's GroupApi event with it.
pub struct ApiCall {
    event: Option<Event>,
    implicit_group: bool,
}

impl Drop for ApiCall {
    fn drop(&mut self) {
        self.event.take();
        if self.implicit_group {
            end_group_api();
        }
    }
}

/// An operation call begins (`group_depth` tells the caller's group depth; 0 = outside a
/// group): starts the GroupApi event if the thread has none, and the CollApi / P2pApi event;
/// records their handles in `task`.
#[inline]
pub fn api_call(comm: &Communicator, task: &mut Task, group_depth: impl FnOnce() -> u32) -> Option<ApiCall> {
    if !any_active() {
        return None;
    }
    api_call_profiled(comm, task, group_depth())
}

#[cold]
fn api_call_profiled(comm: &Communicator, task: &mut Task, group_depth: u32) -> Option<ApiCall> {
    let prof = profiler_of(comm)?;
    let group_api = GROUP_API
        .try_with(|g| {
            let mut guard = g.borrow_mut();
            let g = &mut *guard;
            if g.event.is_none() {
                let d = EventDescr { group_depth: group_depth.max(1) as i32, ..EventDescr::new(ty::GROUP_API, NONE, prof.rank) };
                g.event = Event::start(&prof, &d, None);
                g.start_api_stopped = false;
                g.end_api_started = false;
            }
            let Some(e) = g.event.as_ref() else { return NONE };
            if !g.start_api_stopped {
                e.record(state::GROUP_START_API_STOP, &StateArgs::default());
                g.start_api_stopped = true;
            }
            // Another communicator's profiler started it: no parent for this one's events.
            if Arc::ptr_eq(&e.prof, &prof) {
                e.handle
            } else {
                NONE
            }
        })
        .unwrap_or(NONE);
    let event_type = if task.kind.is_p2p() { ty::P2P_API } else { ty::COLL_API };
    let d = EventDescr {
        func: RStr::from_str(task.kind.name()),
        count: task.count,
        datatype: RStr::from_str(nccl_type_name(task.dtype)),
        root: root_of(&task.kind),
        stream: task.stream.0 as usize,
        ..EventDescr::new(event_type, group_api, prof.rank)
    };
    let event = Event::start(&prof, &d, None);
    task.profile = ApiParents { api: handle_of(event.as_ref()).id, group_api: group_api.id };
    Some(ApiCall { event, implicit_group: group_depth == 0 })
}

/// The outermost group ends (its operations are about to run): GroupEndApiStart.
#[inline]
pub fn group_end_api_start() {
    if !any_active() {
        return;
    }
    let _ = GROUP_API.try_with(|g| {
        let mut guard = g.borrow_mut();
        let g = &mut *guard;
        if let Some(e) = g.event.as_ref() {
            if !g.end_api_started {
                e.record(state::GROUP_END_API_START, &StateArgs::default());
                g.end_api_started = true;
            }
        }
    });
}

/// A group call ended (`group_depth` tells the depth left): at the outermost level its
/// GroupApi event stops.
#[inline]
pub fn group_ended(group_depth: impl FnOnce() -> u32) {
    if any_active() && group_depth() == 0 {
        end_group_api();
    }
}

/// The outermost group has ended (run, queued or failed): its GroupApi event stops.
#[inline]
pub fn end_group_api() {
    if !any_active() {
        return;
    }
    group_end_api_start();
    let event = GROUP_API.try_with(|g| g.borrow_mut().event.take()).ok().flatten();
    drop(event);
}

// ---------------------------------------------------------------------------------------
// Execution events: Group, Coll / P2p, KernelLaunch, and the proxy's plans.

/// The events of one communicator's share of a running group; they stop when it is dropped
/// (the Coll / P2p events later if the proxy still moves their data).
pub struct RunEvents {
    prof: Arc<ProfilerInstance>,
    /// Per context of the work: the Coll / P2p event of its task.
    by_ctx: Vec<Option<Arc<Event>>>,
    /// Per task: its Coll / P2p event and how many channels it uses.
    by_task: Vec<(Option<Arc<Event>>, u32)>,
    group_api: PluginHandle,
    /// The ProxyOps of this share's transfers without a network proxy
    /// ([`RunEvents::queue_proxy_ops`]), started with its channels.
    local: Mutex<Vec<ProxyOpPlan>>,
    _group: Option<Arc<Event>>,
}

impl std::fmt::Debug for RunEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RunEvents({} tasks)", self.by_task.len())
    }
}

/// The planner should record what it chose for each task (a profiler is there to see it).
#[inline]
pub fn wants_plan_record() -> bool {
    any_active()
}

/// What a Coll / P2p event says of how its task runs: algorithm and protocol names (empty
/// where the way it takes has none of NCCL's; the event says "Unknown", as NCCL) and channels.
#[derive(Clone, Copy, Debug)]
pub struct OpPlan {
    pub algo: &'static str,
    pub proto: &'static str,
    pub channels: u32,
}

impl From<&TaskPlan> for OpPlan {
    fn from(p: &TaskPlan) -> OpPlan {
        OpPlan { algo: p.algo.map_or("", |a| a.name()), proto: p.proto.map_or("", |p| p.name()), channels: p.channels }
    }
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

/// Starts the Group event of a share of a group.
fn start_group(prof: &Arc<ProfilerInstance>) -> Option<Arc<Event>> {
    Event::start(prof, &EventDescr::new(ty::GROUP, NONE, prof.rank), None).map(Arc::new)
}

/// Starts the Coll / P2p event of `task` (parent: its CollApi / P2pApi event; `group` its
/// Group event).
fn start_task(prof: &Arc<ProfilerInstance>, task: &Task, plan: OpPlan, group: &Option<Arc<Event>>) -> Option<Arc<Event>> {
    let parent = PluginHandle { id: task.profile.api };
    let common = EventDescr {
        func: RStr::from_str(task.kind.name()),
        count: task.count,
        datatype: RStr::from_str(nccl_type_name(task.dtype)),
        n_channels: plan.channels as i32,
        parent_group: handle_of(group.as_ref()),
        ..EventDescr::new(ty::COLL, parent, prof.rank)
    };
    let d = match task.kind {
        CollKind::Send { .. } | CollKind::Recv { .. } => {
            let is_send = matches!(task.kind, CollKind::Send { .. });
            EventDescr {
                event_type: ty::P2P,
                peer: peer_of(&task.kind),
                send_buff: if is_send { task.send.0 as usize } else { 0 },
                recv_buff: if is_send { 0 } else { task.recv.0 as usize },
                ..common
            }
        }
        _ => EventDescr {
            seq_number: prof.seq[coll_index(&task.kind)].fetch_add(1, Ordering::Relaxed),
            root: root_of(&task.kind),
            send_buff: task.send.0 as usize,
            recv_buff: task.recv.0 as usize,
            algo: RStr::from_str(nccl_name_or_unknown(plan.algo)),
            proto: RStr::from_str(nccl_name_or_unknown(plan.proto)),
            ..common
        },
    };
    Event::start(prof, &d, group.clone()).map(Arc::new)
}

/// Starts the Group event and the Coll / P2p events of a planned share of a group.
pub fn start_run(comm: &Communicator, tasks: &[Task], record: Option<&PlanRecord>) -> Option<RunEvents> {
    if !any_active() {
        return None;
    }
    let record = record?;
    let prof = profiler_of(comm)?;
    if !prof.wants(activated_by(ty::GROUP) | ty::KERNEL_LAUNCH) {
        return None;
    }
    let group = start_group(&prof);
    let mut by_task: Vec<(Option<Arc<Event>>, u32)> = Vec::with_capacity(tasks.len());
    for (i, task) in tasks.iter().enumerate() {
        match record.tasks.get(i).copied().flatten() {
            Some(planned) => by_task.push((start_task(&prof, task, OpPlan::from(&planned), &group), planned.channels)),
            None => by_task.push((None, 0)),
        }
    }
    let by_ctx = record.ctx_task.iter().map(|&t| by_task.get(t).and_then(|(e, _)| e.clone())).collect();
    let group_api = PluginHandle { id: tasks.first().map_or(0, |t| t.profile.group_api) };
    Some(RunEvents { prof, by_ctx, by_task, group_api, local: Mutex::default(), _group: group })
}

/// The KernelCh events of operations whose work has started: each channel's start timer was
/// taken when it started; [`Channels::complete`] records KernelChStop with the stop timer
/// and stops them. Dropped without it (the work failed), they stop with no KernelChStop.
/// With them, the ProxyOps of the transfers no network proxy moves (`LocalOp`), which
/// complete at the same moment.
#[derive(Default)]
pub struct Channels {
    events: Vec<(Event, u64)>,
    local: Vec<LocalOp>,
}

impl std::fmt::Debug for Channels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Channels({}, {} local ops)", self.events.len(), self.local.len())
    }
}

impl Channels {
    /// Starts channels `0..n` of the Coll / P2p event `task` (now).
    fn start(&mut self, prof: &Arc<ProfilerInstance>, task: &Arc<Event>, n: u32) {
        if !prof.wants(ty::KERNEL_CH) {
            return;
        }
        for c in 0..n {
            let at = host_timer_ns();
            let d = EventDescr { channel_id: c as i32, seq_number: at, ..EventDescr::new(ty::KERNEL_CH, task.handle, prof.rank) };
            if let Some(e) = Event::start(prof, &d, Some(Arc::clone(task))) {
                self.events.push((e, at));
            }
        }
    }

    /// Adds the ProxyOps of transfers without a network proxy: started now if `now` (host
    /// work), else when they complete (device work: see the module doc).
    fn add_local(&mut self, plans: Vec<ProxyOpPlan>, now: bool) {
        self.local.extend(plans.into_iter().map(|plan| LocalOp::new(plan, now)));
    }

    /// The work completed: the ProxyOps of its transfers without a network proxy report
    /// their steps and stop; each channel records KernelChStop with the host's time (after
    /// its start: a profiler divides by the difference) and stops.
    pub fn complete(self) {
        self.local.into_iter().for_each(LocalOp::complete);
        let now = host_timer_ns();
        for (e, started) in self.events {
            e.record(state::KERNEL_CH_STOP, &StateArgs { p_timer: now.max(started + 1), ..Default::default() });
        }
    }
}

fn coll_index(kind: &CollKind) -> usize {
    kind.spec().func.index()
}

fn channel_of(link: &Link) -> i32 {
    link.purpose.channel() as i32
}

impl Channels {
    /// Device work was launched: its channels complete when the communicator's watchdog
    /// sees the launch done (`Communicator::profiled_launch`).
    pub fn launched(self, comm: &Communicator) {
        if !self.events.is_empty() || !self.local.is_empty() {
            comm.profiled_launch(self);
        }
    }
}

/// The events of a single operation that took a way around the planner (the board of small
/// collectives, a single copy, a one-rank copy, a symmetric path): a Group, its Coll / P2p
/// under its API event, and its channels, started together.
#[derive(Debug)]
pub struct SingleOp {
    channels: Channels,
    _task: Option<Arc<Event>>,
}

/// `task` starts on a way around the planner (`plan`: what its Coll event says of it).
#[inline]
pub fn single_op(comm: &Communicator, task: &Task, plan: impl FnOnce() -> OpPlan) -> Option<SingleOp> {
    if !any_active() {
        return None;
    }
    single_op_profiled(comm, task, plan())
}

#[cold]
fn single_op_profiled(comm: &Communicator, task: &Task, plan: OpPlan) -> Option<SingleOp> {
    let prof = profiler_of(comm)?;
    if !prof.wants(activated_by(ty::GROUP)) {
        return None;
    }
    let group = start_group(&prof);
    let event = start_task(&prof, task, plan, &group);
    let mut channels = Channels::default();
    if let Some(e) = &event {
        channels.start(&prof, e, plan.channels);
    }
    if prof.wants(ty::PROXY_OP | ty::PROXY_STEP) {
        // Host work starts now; device work is launched, seen done by the watchdog.
        let on_host = comm.backend().capabilities().host_addressable;
        channels.add_local(single_op_transfers(comm, task, &prof, &event), on_host);
    }
    Some(SingleOp { channels, _task: event })
}

/// The ProxyOps of a single operation on a way around the planner: a send and a receive per
/// peer (the rank itself on one rank), channel 0, one step of the operation's bytes.
fn single_op_transfers(comm: &Communicator, task: &Task, prof: &Arc<ProfilerInstance>, event: &Option<Arc<Event>>) -> Vec<ProxyOpPlan> {
    let (n, me) = (comm.nranks_unchecked(), comm.rank_unchecked());
    let bytes = task.count * task.dtype.size();
    let peers = (0..n).filter(|&p| p != me || n == 1);
    peers
        .flat_map(|peer| [true, false].map(|is_send| (peer, is_send)))
        .map(|(peer, is_send)| ProxyOpPlan {
            prof: Arc::clone(prof),
            parent: event.clone(),
            ctx: 0,
            channel: 0,
            peer: peer as i32,
            is_send,
            n_steps: 1,
            chunk_size: bytes.min(i32::MAX as usize) as i32,
            step_bytes: vec![bytes],
        })
        .collect()
}

/// The operation of `op` ended with `r` on the host: on success its channels complete; then
/// its events stop.
pub fn end_single_op<T>(op: Option<SingleOp>, r: &crate::error::Result<T>) {
    if let Some(op) = op {
        if r.is_ok() {
            op.channels.complete();
        }
    }
}

/// The operation of `op` was launched on a device (`r`): its channels complete when the
/// launch does (see [`Channels::launched`]).
pub fn launched_single_op<T>(op: Option<SingleOp>, comm: &Communicator, r: &crate::error::Result<T>) {
    if let Some(op) = op {
        if r.is_ok() {
            op.channels.launched(comm);
        }
    }
}

impl RunEvents {
    /// The host work of this share starts: the KernelCh events of each task's channels, and
    /// the ProxyOps of its transfers without a network proxy.
    pub fn start_channels(&self) -> Channels {
        self.channels(true)
    }

    /// The device work of this share is launched: the KernelCh events of each task's
    /// channels start now, the ProxyOps of its transfers without a network proxy when the
    /// watchdog sees it done ([`Channels::launched`]).
    pub fn launch_channels(&self) -> Channels {
        self.channels(false)
    }

    fn channels(&self, on_host: bool) -> Channels {
        let mut out = Channels::default();
        for (event, n) in &self.by_task {
            if let Some(e) = event {
                out.start(&self.prof, e, *n);
            }
        }
        let local = std::mem::take(&mut *self.local.lock().unwrap_or_else(|p| p.into_inner()));
        out.add_local(local, on_host);
        out
    }

    /// The launch of this share's device work on `stream`; stops when dropped.
    pub fn kernel_launch(&self, stream: u64) -> Option<Event> {
        let d = EventDescr { stream: stream as usize, ..EventDescr::new(ty::KERNEL_LAUNCH, self.group_api, self.prof.rank) };
        Event::start(&self.prof, &d, None)
    }

    /// Tells the proxy of every network connection the work uses which task each run of its
    /// slots belongs to (a proxy op: consecutive steps of one task on one connection); the
    /// same runs on the other connections (shared memory, device) are kept for the channels
    /// ([`RunEvents::start_channels`]): no proxy moves them.
    pub fn queue_proxy_ops(&self, work: &Work, links: &Links) {
        if !self.prof.wants(ty::PROXY_OP | ty::PROXY_STEP) {
            return;
        }
        for item in &work.items {
            let mut ops: Vec<(Arc<Connection>, ProxyOpPlan)> = Vec::new();
            for (ci, step) in &item.steps {
                let ends = step.send.iter().map(|l| (l, Dir::Send)).chain(step.recv.iter().map(|l| (l, Dir::Recv)));
                for (link, dir) in ends {
                    let Some(conn) = links.get(&(*link, dir)) else { continue };
                    match ops.iter_mut().rev().find(|(c, _)| Arc::ptr_eq(c, conn)) {
                        Some((_, op)) if op.ctx == *ci => {
                            op.n_steps += 1;
                            op.chunk_size = op.chunk_size.max(step.bytes as i32);
                            op.step_bytes.push(step.bytes);
                        }
                        _ => ops.push((
                            Arc::clone(conn),
                            ProxyOpPlan {
                                prof: Arc::clone(&self.prof),
                                parent: self.by_ctx.get(*ci).cloned().flatten(),
                                ctx: *ci,
                                channel: channel_of(link),
                                peer: link.peer as i32,
                                is_send: dir == Dir::Send,
                                n_steps: 1,
                                chunk_size: step.bytes as i32,
                                step_bytes: vec![step.bytes],
                            },
                        )),
                    }
                }
            }
            let mut local = self.local.lock().unwrap_or_else(|p| p.into_inner());
            for (conn, op) in ops {
                if conn.kind == Kind::Net {
                    conn.proxy_ops.push(op);
                } else {
                    local.push(op);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The proxy: ProxyOp and ProxyStep events.

/// The proxy's share of one task on one connection, as the executor plans it.
pub struct ProxyOpPlan {
    prof: Arc<ProfilerInstance>,
    parent: Option<Arc<Event>>,
    ctx: usize,
    channel: i32,
    peer: i32,
    is_send: bool,
    n_steps: u32,
    chunk_size: i32,
    /// Bytes of each step.
    step_bytes: Vec<usize>,
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

    /// Its step `step` moved `bytes`: a receive records RecvGPUWait; then it stops.
    fn end_step(&self, step: Event, bytes: usize) {
        if !self.is_send {
            step.record(state::PROXY_STEP_RECV_GPU_WAIT, &StateArgs { trans_size: bytes, ..Default::default() });
        }
    }
}

/// A transfer that no network proxy moves, as a ProxyOp (see the module doc): started when
/// its work starts on the host, or at completion; completed with its work's channels.
struct LocalOp {
    plan: ProxyOpPlan,
    started: Option<Option<Arc<Event>>>,
}

impl LocalOp {
    fn new(plan: ProxyOpPlan, now: bool) -> LocalOp {
        let started = now.then(|| plan.start());
        LocalOp { plan, started }
    }

    /// Its data moved: each step reports and stops, then the op stops.
    fn complete(self) {
        let plan = &self.plan;
        let op = self.started.unwrap_or_else(|| plan.start());
        for (i, &bytes) in plan.step_bytes.iter().enumerate() {
            if let Some(step) = plan.start_step(&op, i as u64, bytes) {
                plan.end_step(step, bytes);
            }
        }
    }
}

/// Proxy ops planned for a connection, in the order its slots will carry them.
#[derive(Default)]
pub struct ProxyOpQueue {
    pending: AtomicBool,
    ops: Mutex<VecDeque<ProxyOpPlan>>,
}

impl ProxyOpQueue {
    fn push(&self, op: ProxyOpPlan) {
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        ops.push_back(op);
        self.pending.store(true, Ordering::Release);
    }

    #[inline]
    fn has_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    fn take(&self) -> VecDeque<ProxyOpPlan> {
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        self.pending.store(false, Ordering::Release);
        std::mem::take(&mut *ops)
    }

    /// Drops the plans not started yet (their parents may stop).
    pub fn clear(&self) {
        drop(self.take());
    }
}

impl std::fmt::Debug for ProxyOpQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProxyOpQueue")
    }
}

struct TrackedOp {
    plan: ProxyOpPlan,
    /// The connection's slot index of its first step.
    start: u64,
    begun: bool,
    event: Option<Arc<Event>>,
    steps: Vec<Option<Event>>,
}

impl TrackedOp {
    fn end(&self) -> u64 {
        self.start + u64::from(self.plan.n_steps)
    }

    fn begin(&mut self) {
        if self.begun {
            return;
        }
        self.begun = true;
        self.event = self.plan.start();
    }
}

/// The proxy's view of one connection's proxy ops: which op each slot belongs to, and the
/// events running. Dropping it stops them all.
#[derive(Default)]
pub struct ProxyTrack {
    ops: VecDeque<TrackedOp>,
    /// Slot index of the next planned op's first step.
    next_start: u64,
    /// Every slot below this index has completed.
    completed: u64,
}

impl ProxyTrack {
    /// The proxy posted slot `index` (a send of `bytes`, or a receive).
    #[inline]
    pub fn posted(&mut self, conn: &Connection, index: u64, bytes: usize) {
        if self.ops.is_empty() && !conn.proxy_ops.has_pending() {
            return;
        }
        self.pull(conn);
        let Some(op) = self.ops.iter_mut().find(|o| o.start <= index && index < o.end()) else { return };
        op.begin();
        let Some(step) = op.plan.start_step(&op.event, index - op.start, bytes) else { return };
        let at = (index - op.start) as usize;
        if op.steps.len() <= at {
            op.steps.resize_with(at + 1, || None);
        }
        op.steps[at] = Some(step);
    }

    /// Slot `index` completed (`bytes` moved).
    #[inline]
    pub fn completed(&mut self, conn: &Connection, index: u64, bytes: usize) {
        self.completed = self.completed.max(index + 1);
        if self.ops.is_empty() && !conn.proxy_ops.has_pending() {
            return;
        }
        self.pull(conn);
        if let Some(op) = self.ops.iter_mut().find(|o| o.start <= index && index < o.end()) {
            op.begin();
            if let Some(step) = op.steps.get_mut((index - op.start) as usize).and_then(Option::take) {
                op.plan.end_step(step, bytes);
            }
        }
        // Ops whose every slot completed stop (their steps first).
        while self.ops.front().is_some_and(|o| o.end() <= self.completed) {
            self.ops.pop_front();
        }
    }

    fn pull(&mut self, conn: &Connection) {
        if !conn.proxy_ops.has_pending() {
            return;
        }
        for plan in conn.proxy_ops.take() {
            let start = self.next_start;
            self.next_start += u64::from(plan.n_steps);
            let mut op = TrackedOp { plan, start, begun: false, event: None, steps: Vec::new() };
            if op.end() <= self.completed {
                // Its slots moved before the executor told the proxy (receives posted ahead):
                // started and stopped at once.
                op.begin();
                continue;
            }
            self.ops.push_back(op);
        }
    }
}
