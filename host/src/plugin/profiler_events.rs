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
//! | ProxyOp | the proxy's share of one task on one network connection | Coll / P2p |
//! | ProxyStep | one slot of a proxy op: SendWait or RecvWait when posted, RecvGPUWait when a receive lands | ProxyOp |
//!
//! Only event types in the profiler's mask are started. Every started event is an [`Event`],
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
use crate::coll::plan::PlanRecord;
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
    /// Starts an event if its type is in the mask and the plugin tracks it.
    fn start(prof: &Arc<ProfilerInstance>, descr: &EventDescr<'_>, parent: Option<Arc<Event>>) -> Option<Event> {
        if !prof.wants(descr.event_type) {
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
    group_api: PluginHandle,
    _group: Option<Arc<Event>>,
}

impl std::fmt::Debug for RunEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RunEvents({} tasks)", self.by_ctx.len())
    }
}

/// The planner should record what it chose for each task (a profiler is there to see it).
#[inline]
pub fn wants_plan_record() -> bool {
    any_active()
}

/// Starts the Group event and the Coll / P2p events of a planned share of a group.
pub fn start_run(comm: &Communicator, tasks: &[Task], record: Option<&PlanRecord>) -> Option<RunEvents> {
    if !any_active() {
        return None;
    }
    let record = record?;
    let prof = profiler_of(comm)?;
    let rank = prof.rank;
    let wanted = ty::GROUP | ty::COLL | ty::P2P | ty::PROXY_OP | ty::PROXY_STEP | ty::KERNEL_LAUNCH;
    if !prof.wants(wanted) {
        return None;
    }
    let group = Event::start(&prof, &EventDescr::new(ty::GROUP, NONE, rank), None).map(Arc::new);
    let group_handle = handle_of(group.as_ref());
    let mut by_task: Vec<Option<Arc<Event>>> = Vec::with_capacity(tasks.len());
    for (i, task) in tasks.iter().enumerate() {
        let Some(planned) = record.tasks.get(i).copied().flatten() else {
            by_task.push(None);
            continue;
        };
        let parent = PluginHandle { id: task.profile.api };
        let common = EventDescr {
            func: RStr::from_str(task.kind.name()),
            count: task.count,
            datatype: RStr::from_str(nccl_type_name(task.dtype)),
            n_channels: planned.channels as i32,
            parent_group: group_handle,
            ..EventDescr::new(ty::COLL, parent, rank)
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
                algo: RStr::from_str(planned.algo.map_or("", |a| a.name())),
                proto: RStr::from_str(planned.proto.map_or("", |p| p.name())),
                ..common
            },
        };
        by_task.push(Event::start(&prof, &d, group.clone()).map(Arc::new));
    }
    let by_ctx = record.ctx_task.iter().map(|&t| by_task.get(t).cloned().flatten()).collect();
    let group_api = PluginHandle { id: tasks.first().map_or(0, |t| t.profile.group_api) };
    Some(RunEvents { prof, by_ctx, group_api, _group: group })
}

fn coll_index(kind: &CollKind) -> usize {
    match kind {
        CollKind::Broadcast { .. } => 0,
        CollKind::Reduce { .. } => 1,
        CollKind::AllGather => 2,
        CollKind::ReduceScatter => 3,
        CollKind::AllReduce => 4,
        CollKind::Send { .. } => 6,
        CollKind::Recv { .. } => 7,
    }
}

fn channel_of(link: &Link) -> i32 {
    link.purpose.channel() as i32
}

impl RunEvents {
    /// The launch of this share's device work on `stream`; stops when dropped.
    pub fn kernel_launch(&self, stream: u64) -> Option<Event> {
        let d = EventDescr { stream: stream as usize, ..EventDescr::new(ty::KERNEL_LAUNCH, self.group_api, self.prof.rank) };
        Event::start(&self.prof, &d, None)
    }

    /// Tells the proxy of every network connection the work uses which task each run of its
    /// slots belongs to (a proxy op: consecutive steps of one task on one connection).
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
                    if conn.kind != Kind::Net {
                        continue;
                    }
                    match ops.iter_mut().rev().find(|(c, _)| Arc::ptr_eq(c, conn)) {
                        Some((_, op)) if op.ctx == *ci => {
                            op.n_steps += 1;
                            op.chunk_size = op.chunk_size.max(step.bytes as i32);
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
                            },
                        )),
                    }
                }
            }
            for (conn, op) in ops {
                conn.proxy_ops.push(op);
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
        let p = &self.plan;
        let d = EventDescr {
            channel_id: p.channel,
            peer: p.peer,
            n_steps: p.n_steps as i32,
            chunk_size: p.chunk_size,
            is_send: p.is_send,
            ..EventDescr::new(ty::PROXY_OP, handle_of(p.parent.as_ref()), p.prof.rank)
        };
        self.event = Event::start(&p.prof, &d, p.parent.clone()).map(Arc::new);
        if let Some(e) = &self.event {
            e.record(state::PROXY_OP_IN_PROGRESS, &StateArgs::default());
        }
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
        let p = &op.plan;
        let d = EventDescr { step: (index - op.start) as i32, ..EventDescr::new(ty::PROXY_STEP, handle_of(op.event.as_ref()), p.prof.rank) };
        let Some(step) = Event::start(&p.prof, &d, op.event.clone()) else { return };
        let (st, size) = if p.is_send { (state::PROXY_STEP_SEND_WAIT, bytes) } else { (state::PROXY_STEP_RECV_WAIT, 0) };
        step.record(st, &StateArgs { trans_size: size, ..Default::default() });
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
                if !op.plan.is_send {
                    step.record(state::PROXY_STEP_RECV_GPU_WAIT, &StateArgs { trans_size: bytes, ..Default::default() });
                }
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
