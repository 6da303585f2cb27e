//! The observer interface: how the core tells an observer — today a communicator's profiler
//! (`plugin::profiler_events` implements it) — what happens, in plain descriptors.
//!
//! The core describes what it does with the descriptors of this module ([`OpDescr`] for an
//! operation, [`OpPlan`] for how it runs, [`ProxyOpDescr`] for one transfer), never with its
//! own types, so that an observer needs nothing above this module: coll makes the
//! descriptors of its tasks (`coll::observe`), the executors those of their transfers
//! (`exec::observe`), the transports report the slots they move ([`ProxyTrack`]), and the
//! observer ([`Observer`] and the traits it returns) decides which events these are.
//!
//! What each call starts is a value that ends it when dropped ([`Span`], [`RunEvents`],
//! [`Channels`], the boxed event objects), so that errors and aborts end events too. The
//! order of events — the thread's group of API calls ([`api_call`], [`group_end_api_start`],
//! [`end_group_api`]), a running share of a group ([`Observer::run`]), its channels
//! ([`Channels`]) and transfers ([`ProxyOpQueue`], [`ProxyTrack`], the local transfers of
//! [`RunEvents::add_local`]) — is kept here, once, for every observer.
//!
//! With no observer in the process every hook is one load and one branch ([`any_active`]):
//! callers check it before they make a descriptor.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::spec::Collective;
use crate::types::DataType;

/// Observers alive in this process: while there are none, every hook is one load and one
/// branch.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// Whether any observer is alive in this process (the one check of the hot path).
#[inline]
pub fn any_active() -> bool {
    ACTIVE.load(Ordering::Relaxed) != 0
}

/// Held by each live observer: [`any_active`] is true while one is held.
#[derive(Debug)]
pub struct Active(());

impl Active {
    pub fn register() -> Active {
        ACTIVE.fetch_add(1, Ordering::Relaxed);
        Active(())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------
// Descriptors.

/// The API events an operation was called under, as the observer named them (0: none): kept
/// with the operation until it runs, as the parents of its events there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApiParents {
    pub api: u64,
    pub group_api: u64,
}

/// The communicator an operation runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommDescr {
    pub hash: u64,
    pub rank: u32,
    pub nranks: u32,
}

/// One operation (a collective, a send or a receive) of one rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpDescr {
    pub comm: CommDescr,
    /// Which collective: its [`crate::spec::CollSpec`] gives NCCL's name and `ncclFunc_t`.
    pub coll: Collective,
    /// Elements, as the API call gave them.
    pub count: usize,
    pub dtype: DataType,
    /// The root of a rooted collective.
    pub root: Option<u32>,
    /// The peer of a send or a receive.
    pub peer: Option<u32>,
    /// The reduction operator's name (`Sum`, ...), for collectives that reduce.
    pub op: Option<&'static str>,
    /// The buffers' addresses (0: none).
    pub send: usize,
    pub recv: usize,
    /// The caller's stream (0: the default stream, and every call of the host backend).
    pub stream: u64,
    /// The API events it was called under.
    pub parents: ApiParents,
    /// The caller's profiler tag (`ncclCollConfig_t::userProfilerTag`; 0: none), handed to
    /// profiler plugins on the API and Coll / P2p events: NCCL's C profiler v7 (`userTag`) and
    /// rustccl's profiler ABI v3 (`user_tag`); older versions have no field for it.
    pub user_tag: u64,
}

impl OpDescr {
    /// Bytes of one count's worth of elements (a send's or a receive's message).
    pub fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }
}

/// How an operation runs: algorithm and protocol names (empty where the way it takes has
/// none of NCCL's) and channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpPlan {
    pub algo: &'static str,
    pub proto: &'static str,
    pub channels: u32,
}

/// One transfer: consecutive slots of one operation on one connection (a proxy op).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyOpDescr {
    /// Which operation of its run (an index into the operations given to [`Observer::run`]).
    pub op: usize,
    pub channel: u32,
    pub peer: u32,
    pub is_send: bool,
    /// Bytes of each of its slots, in order.
    pub step_bytes: Vec<usize>,
}

impl ProxyOpDescr {
    pub fn n_steps(&self) -> u32 {
        self.step_bytes.len() as u32
    }

    /// Its largest slot.
    pub fn chunk_size(&self) -> usize {
        self.step_bytes.iter().copied().max().unwrap_or(0)
    }
}

// ---------------------------------------------------------------------------------------
// The interface an observer implements.

/// A communicator's observer.
pub trait Observer: Send + Sync {
    /// The calling thread's outermost group begins (a call outside a group is a group of
    /// one, `group_depth` 1); its events end when the returned value is dropped.
    fn group_api(&self, group_depth: u32) -> Option<Box<dyn GroupApiEvents>>;

    /// An operation call begins, under the thread's group event `group_api` (0: none, or
    /// another observer's); it ends when the span is dropped (the call returned).
    fn api_call(&self, op: &OpDescr, group_api: u64) -> Option<Span>;

    /// This communicator's share of a group is about to run: `ops` (one per operation that
    /// runs, in call order) and how each runs; `group_api`: the thread's group event of its
    /// first call. Its events end when the returned value is dropped (an event of an
    /// operation later, while its channels or transfers still run).
    fn run(&self, group_api: u64, ops: &[(OpDescr, OpPlan)]) -> Option<Box<dyn RunObserver>>;
}

/// The events of the thread's outermost group.
pub trait GroupApiEvents {
    /// How the observer names it (the parent of the API calls' events; 0: none).
    fn id(&self) -> u64;
    /// The group's first operation was called (NCCL's GroupStartApiStop).
    fn start_api_stopped(&self);
    /// The group ends: its operations are about to run (NCCL's GroupEndApiStart).
    fn end_api_started(&self);
}

/// The events of one share of a group that runs.
pub trait RunObserver: Send + Sync {
    /// Whether it wants to hear of the transfers ([`RunObserver::proxy_op`]).
    fn wants_proxy_ops(&self) -> bool;
    /// The events of one transfer of the run (nothing starts yet).
    fn proxy_op(&self, op: &ProxyOpDescr) -> Box<dyn ProxyOpEvents>;
    /// The share's device work is launched on `stream` (until the span is dropped).
    fn kernel_launch(&self, stream: u64) -> Option<Span>;
    /// The work of every operation's channels starts now.
    fn kernel_channels(&self) -> Option<Box<dyn KernelChannels>>;
}

/// The channels of a share's work, started.
pub trait KernelChannels: Send {
    /// The work completed (dropped without it: the work failed).
    fn complete(self: Box<Self>);
}

/// The events of one transfer; dropping it ends whatever still runs.
pub trait ProxyOpEvents: Send {
    /// Its first slot is in play (after the first call, nothing).
    fn begin(&mut self);
    /// Its slot `step` was posted: a send of `bytes`, or a receive (0).
    fn posted(&mut self, step: u64, bytes: usize);
    /// Its slot `step` completed, `bytes` moved.
    fn completed(&mut self, step: u64, bytes: usize);
}

/// An event an observer started; it ends when dropped.
pub struct Span {
    id: u64,
    _end: Box<dyn Send + Sync>,
}

impl Span {
    /// The event `id` (its observer's name for it), ended when `end` is dropped.
    pub fn new(id: u64, end: impl Send + Sync + 'static) -> Span {
        Span { id, _end: Box::new(end) }
    }

    pub fn id(&self) -> u64 {
        self.id
    }
}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Span({})", self.id)
    }
}

// ---------------------------------------------------------------------------------------
// API events: the thread's group (one per thread), each operation call.

struct GroupApi {
    observer: Arc<dyn Observer>,
    events: Box<dyn GroupApiEvents>,
    start_api_stopped: bool,
    end_api_started: bool,
}

thread_local! {
    static GROUP_API: RefCell<Option<GroupApi>> = const { RefCell::new(None) };
}

/// One operation call's events; they end when it is dropped, and for a call outside a group
/// the group-of-one's with them.
pub struct ApiCall {
    event: Option<Span>,
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

impl std::fmt::Debug for ApiCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiCall({:?})", self.event)
    }
}

/// An operation call `op` begins on `observer`'s communicator, at `group_depth` (0: outside
/// a group): the thread's group events start if it has none, then the call's. Returns the
/// parents its events at run time name, and the call's events.
pub fn api_call(observer: &Arc<dyn Observer>, op: &OpDescr, group_depth: u32) -> (ApiParents, ApiCall) {
    let group_api = GROUP_API
        .try_with(|g| {
            let mut g = g.borrow_mut();
            if g.is_none() {
                *g = observer.group_api(group_depth.max(1)).map(|events| GroupApi {
                    observer: Arc::clone(observer),
                    events,
                    start_api_stopped: false,
                    end_api_started: false,
                });
            }
            let Some(g) = g.as_mut() else { return 0 };
            if !g.start_api_stopped {
                g.events.start_api_stopped();
                g.start_api_stopped = true;
            }
            // Another communicator's observer started it: no parent for this one's events.
            if std::ptr::addr_eq(Arc::as_ptr(&g.observer), Arc::as_ptr(observer)) {
                g.events.id()
            } else {
                0
            }
        })
        .unwrap_or(0);
    let event = observer.api_call(op, group_api);
    let parents = ApiParents { api: event.as_ref().map_or(0, Span::id), group_api };
    (parents, ApiCall { event, implicit_group: group_depth == 0 })
}

/// The outermost group ends (its operations are about to run).
#[inline]
pub fn group_end_api_start() {
    if !any_active() {
        return;
    }
    let _ = GROUP_API.try_with(|g| {
        if let Some(g) = g.borrow_mut().as_mut() {
            if !g.end_api_started {
                g.events.end_api_started();
                g.end_api_started = true;
            }
        }
    });
}

/// A group call ended (`group_depth` tells the depth left): at the outermost level the
/// thread's group events end.
#[inline]
pub fn group_ended(group_depth: impl FnOnce() -> u32) {
    if any_active() && group_depth() == 0 {
        end_group_api();
    }
}

/// The outermost group has ended (run, queued or failed): the thread's group events end.
#[inline]
pub fn end_group_api() {
    if !any_active() {
        return;
    }
    group_end_api_start();
    let group = GROUP_API.try_with(|g| g.borrow_mut().take()).ok().flatten();
    drop(group);
}

// ---------------------------------------------------------------------------------------
// A running share of a group: its channels and its transfers.

/// The events of one communicator's share of a running group ([`Observer::run`]); they end
/// when it is dropped (an operation's later, while its channels or transfers still run).
pub struct RunEvents {
    observer: Box<dyn RunObserver>,
    /// The transfers that no network proxy moves: their events start with the channels
    /// ([`RunEvents::add_local`]).
    local: Mutex<Vec<LocalOp>>,
}

impl std::fmt::Debug for RunEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RunEvents")
    }
}

impl RunEvents {
    pub fn new(observer: Box<dyn RunObserver>) -> RunEvents {
        RunEvents { observer, local: Mutex::default() }
    }

    /// Whether the observer wants to hear of the transfers.
    pub fn wants_proxy_ops(&self) -> bool {
        self.observer.wants_proxy_ops()
    }

    /// A transfer on a network connection: queued on it for its proxy, which reports its
    /// slots ([`ProxyTrack`]).
    pub fn add_proxied(&self, op: &ProxyOpDescr, queue: &ProxyOpQueue) {
        queue.push(self.observer.proxy_op(op), op.n_steps());
    }

    /// A transfer no network proxy moves (shared memory, device connections, the ways
    /// around the planner): its events start with the channels (on the host) or at
    /// completion (device work, which the host does not watch), and it completes with them,
    /// every slot at once.
    pub fn add_local(&self, op: ProxyOpDescr) {
        let events = self.observer.proxy_op(&op);
        self.local.lock().unwrap_or_else(|p| p.into_inner()).push(LocalOp { events, step_bytes: op.step_bytes });
    }

    /// The launch of this share's device work on `stream`; ends when dropped.
    pub fn kernel_launch(&self, stream: u64) -> Option<Span> {
        self.observer.kernel_launch(stream)
    }

    /// The host work of this share starts: its channels, and its local transfers.
    pub fn start_channels(&self) -> Channels {
        self.channels(true)
    }

    /// The device work of this share is launched: its channels start now, its local
    /// transfers when the work is seen complete.
    pub fn launch_channels(&self) -> Channels {
        self.channels(false)
    }

    fn channels(&self, on_host: bool) -> Channels {
        let kernel = self.observer.kernel_channels();
        let mut local = std::mem::take(&mut *self.local.lock().unwrap_or_else(|p| p.into_inner()));
        if on_host {
            local.iter_mut().for_each(|op| op.events.begin());
        }
        Channels { kernel, local }
    }
}

/// The channels of work that has started, with its local transfers: [`Channels::complete`]
/// completes them; dropped without it (the work failed) they end as they are.
#[derive(Default)]
pub struct Channels {
    kernel: Option<Box<dyn KernelChannels>>,
    local: Vec<LocalOp>,
}

impl std::fmt::Debug for Channels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Channels({}, {} local ops)", self.kernel.is_some(), self.local.len())
    }
}

impl Channels {
    /// Nothing to complete.
    pub fn is_empty(&self) -> bool {
        self.kernel.is_none() && self.local.is_empty()
    }

    /// The work completed: the local transfers report every slot and end, then the channels
    /// complete.
    pub fn complete(self) {
        self.local.into_iter().for_each(LocalOp::complete);
        if let Some(k) = self.kernel {
            k.complete();
        }
    }
}

/// A transfer no network proxy moves, with the bytes of its slots: begun when its work
/// starts on the host, or at completion; every slot reported when its work completed.
struct LocalOp {
    events: Box<dyn ProxyOpEvents>,
    step_bytes: Vec<usize>,
}

impl LocalOp {
    fn complete(mut self) {
        self.events.begin();
        for (i, &bytes) in self.step_bytes.iter().enumerate() {
            self.events.posted(i as u64, bytes);
            self.events.completed(i as u64, bytes);
        }
    }
}

/// The transfers queued for a network connection, in the order its slots will carry them.
#[derive(Default)]
pub struct ProxyOpQueue {
    pending: AtomicBool,
    ops: Mutex<VecDeque<(Box<dyn ProxyOpEvents>, u32)>>,
}

impl ProxyOpQueue {
    /// Queues the events of a transfer of `n_steps` slots.
    pub fn push(&self, events: Box<dyn ProxyOpEvents>, n_steps: u32) {
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        ops.push_back((events, n_steps));
        self.pending.store(true, Ordering::Release);
    }

    #[inline]
    fn has_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    fn take(&self) -> VecDeque<(Box<dyn ProxyOpEvents>, u32)> {
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        self.pending.store(false, Ordering::Release);
        std::mem::take(&mut *ops)
    }

    /// Drops the transfers not started yet (their work will not run).
    pub fn clear(&self) {
        drop(self.take());
    }
}

impl std::fmt::Debug for ProxyOpQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProxyOpQueue")
    }
}

struct Tracked {
    events: Box<dyn ProxyOpEvents>,
    /// The connection's slot index of its first step.
    start: u64,
    n_steps: u32,
}

impl Tracked {
    fn end(&self) -> u64 {
        self.start + u64::from(self.n_steps)
    }
}

/// A proxy's view of one connection's queued transfers: which transfer each slot belongs
/// to, and their events. Dropping it ends them all.
#[derive(Default)]
pub struct ProxyTrack {
    ops: VecDeque<Tracked>,
    /// Slot index of the next queued transfer's first step.
    next_start: u64,
    /// Every slot below this index has completed.
    completed: u64,
}

impl ProxyTrack {
    /// The proxy posted slot `index` of the connection whose queue is `queue` (a send of
    /// `bytes`, or a receive).
    #[inline]
    pub fn posted(&mut self, queue: &ProxyOpQueue, index: u64, bytes: usize) {
        if self.ops.is_empty() && !queue.has_pending() {
            return;
        }
        self.pull(queue);
        let Some(op) = self.ops.iter_mut().find(|o| o.start <= index && index < o.end()) else { return };
        op.events.begin();
        op.events.posted(index - op.start, bytes);
    }

    /// Slot `index` completed (`bytes` moved).
    #[inline]
    pub fn completed(&mut self, queue: &ProxyOpQueue, index: u64, bytes: usize) {
        self.completed = self.completed.max(index + 1);
        if self.ops.is_empty() && !queue.has_pending() {
            return;
        }
        self.pull(queue);
        if let Some(op) = self.ops.iter_mut().find(|o| o.start <= index && index < o.end()) {
            op.events.begin();
            op.events.completed(index - op.start, bytes);
        }
        // Transfers whose every slot completed end.
        while self.ops.front().is_some_and(|o| o.end() <= self.completed) {
            self.ops.pop_front();
        }
    }

    fn pull(&mut self, queue: &ProxyOpQueue) {
        if !queue.has_pending() {
            return;
        }
        for (events, n_steps) in queue.take() {
            let start = self.next_start;
            self.next_start += u64::from(n_steps);
            let mut op = Tracked { events, start, n_steps };
            if op.end() <= self.completed {
                // Its slots moved before the executor queued it (receives posted ahead):
                // begun and ended at once.
                op.events.begin();
                continue;
            }
            self.ops.push_back(op);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what a transfer's events were told (a begin once: an observer's events start
    /// once).
    struct Log(Arc<Mutex<Vec<String>>>, &'static str, bool);

    fn log(to: &Arc<Mutex<Vec<String>>>, name: &'static str) -> Box<Log> {
        Box::new(Log(Arc::clone(to), name, false))
    }

    impl ProxyOpEvents for Log {
        fn begin(&mut self) {
            if !std::mem::replace(&mut self.2, true) {
                self.0.lock().unwrap().push(format!("{} begin", self.1));
            }
        }
        fn posted(&mut self, step: u64, bytes: usize) {
            self.0.lock().unwrap().push(format!("{} posted {step} {bytes}", self.1));
        }
        fn completed(&mut self, step: u64, bytes: usize) {
            self.0.lock().unwrap().push(format!("{} completed {step} {bytes}", self.1));
        }
    }

    impl Drop for Log {
        fn drop(&mut self) {
            self.0.lock().unwrap().push(format!("{} end", self.1));
        }
    }

    #[test]
    fn a_track_gives_each_slot_to_the_transfer_queued_for_it_in_order() {
        let events = Arc::new(Mutex::new(Vec::new()));
        let queue = ProxyOpQueue::default();
        let mut track = ProxyTrack::default();
        queue.push(log(&events, "a"), 2);
        queue.push(log(&events, "b"), 1);
        track.posted(&queue, 0, 8);
        track.posted(&queue, 1, 4);
        track.completed(&queue, 0, 8);
        track.posted(&queue, 2, 16);
        track.completed(&queue, 1, 4);
        track.completed(&queue, 2, 16);
        let got = events.lock().unwrap().clone();
        assert_eq!(
            got,
            [
                "a begin",
                "a posted 0 8",
                "a posted 1 4",
                "a completed 0 8",
                "b begin",
                "b posted 0 16",
                "a completed 1 4",
                "a end",
                "b completed 0 16",
                "b end"
            ]
        );
    }

    #[test]
    fn a_transfer_queued_after_its_slots_completed_begins_and_ends_at_once() {
        let events = Arc::new(Mutex::new(Vec::new()));
        let queue = ProxyOpQueue::default();
        let mut track = ProxyTrack::default();
        track.completed(&queue, 0, 8);
        queue.push(log(&events, "a"), 1);
        track.posted(&queue, 1, 8);
        assert_eq!(*events.lock().unwrap(), ["a begin", "a end"]);
    }

    #[test]
    fn local_transfers_report_every_slot_at_completion() {
        struct NoRun;
        impl RunObserver for NoRun {
            fn wants_proxy_ops(&self) -> bool {
                true
            }
            fn proxy_op(&self, _: &ProxyOpDescr) -> Box<dyn ProxyOpEvents> {
                unreachable!("replaced below")
            }
            fn kernel_launch(&self, _: u64) -> Option<Span> {
                None
            }
            fn kernel_channels(&self) -> Option<Box<dyn KernelChannels>> {
                None
            }
        }
        let events = Arc::new(Mutex::new(Vec::new()));
        for on_host in [true, false] {
            events.lock().unwrap().clear();
            let run = RunEvents::new(Box::new(NoRun));
            run.local.lock().unwrap().push(LocalOp { events: log(&events, "a"), step_bytes: vec![3, 5] });
            let channels = if on_host { run.start_channels() } else { run.launch_channels() };
            assert_eq!(events.lock().unwrap().len(), usize::from(on_host), "begun at the start on the host only");
            assert!(!channels.is_empty());
            channels.complete();
            let got = events.lock().unwrap().clone();
            assert_eq!(got[got.len() - 5..], ["a posted 0 3", "a completed 0 3", "a posted 1 5", "a completed 1 5", "a end"]);
        }
    }
}
