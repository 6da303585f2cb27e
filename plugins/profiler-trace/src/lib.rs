//! rustccl's trace profiler plugin (`trace`): records communication events as a Chrome trace.
//!
//! Two layers:
//!
//! * [`Recorder`], a thread-safe recorder for the event hierarchy of NCCL's profiler v5
//!   ([`EventKind`]: group → collective / p2p → proxy op → proxy step → net, collective /
//!   p2p → kernel channel, and standalone proxy-control events). Events are started and
//!   stopped by id from any thread, parents are checked against the hierarchy, state changes
//!   are recorded as instant events, and the whole trace is written as Chrome trace-event
//!   JSON (`{"traceEvents":[...]}`, viewable in `chrome://tracing` or Perfetto).
//! * [`TraceProfiler`], the [`rustccl_plugin_api::profiler::Profiler`] on top of one
//!   process-wide recorder, exported from the `cdylib` (`librustccl_profiler_trace.so`) as
//!   `rustccl_profiler_v1` under the name [`PLUGIN_NAME`]. Every communicator's events go to
//!   the same trace (each event's `args` carry `rank` and `comm`); the trace is written to
//!   the file named by [`TRACE_FILE_ENV`] (`RUSTCCL_PROFILER_TRACE_FILE`) when the last
//!   live communicator is finalised (again, with everything so far, if more communicators
//!   come and go later). The events it asks for come from [`EVENT_MASK_ENV`]
//!   (`NCCL_PROFILE_EVENT_MASK`, decimal or `0x` hex; default [`DEFAULT_EVENT_MASK`] =
//!   Group | Coll | P2p | ProxyOp). An event whose parent was not tracked (its type is not in
//!   the mask) stands alone in the trace.
//!
//! Not yet: the API-level events (group API, collective API, kernel launch), a bounded
//! event buffer, and GPU timestamps for kernel-channel events.
//!
//! # Output format
//!
//! A stopped event is one complete event (`"ph":"X"`, `ts` and `dur` in
//! microseconds since the recorder was created). An event still running when
//! the trace is written is a begin event (`"ph":"B"`) without an end, which
//! trace viewers draw as lasting to the end of the trace. State changes are
//! thread-scoped instant events (`"ph":"i"`). Every event's `args` holds its
//! `id` and, if it has one, its `parent` id, so the hierarchy survives even when
//! parent and child ran on different threads. `pid` is the process id; `tid` is
//! a small per-thread number given by the recorder (the thread that *started*
//! the event).
//!
//! # Environment
//!
//! `RUSTCCL_PROFILER_TRACE_FILE=<path>`: where [`Recorder::write_to_env_file`]
//! writes the trace. `%p` in the path is replaced by the process id, so that
//! several ranks of one job do not overwrite each other's file. Unset or empty:
//! nothing is written.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use rustccl_plugin_api::profiler::{event_type, state, EventDescr, Profiler, ProfilerProvider, StateArgs};
use rustccl_plugin_api::{subsys, HandleRegistry, LogFn, PluginError, PluginHandle};
use serde::Serialize;
use serde_json::{Map, Value};

/// Environment variable naming the trace output file (`%p` = process id).
pub const TRACE_FILE_ENV: &str = "RUSTCCL_PROFILER_TRACE_FILE";

/// Environment variable with the event types to record (NCCL's example profiler's name).
pub const EVENT_MASK_ENV: &str = "NCCL_PROFILE_EVENT_MASK";

/// The event types recorded when [`EVENT_MASK_ENV`] is unset: Group | Coll | P2p | ProxyOp.
pub const DEFAULT_EVENT_MASK: u32 =
    event_type::GROUP | event_type::COLL | event_type::P2P | event_type::PROXY_OP;

/// Name of the exported profiler.
pub const PLUGIN_NAME: &str = "trace";

/// The kinds of events of NCCL's profiler v5 that this recorder knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum EventKind {
    /// A group of operations (between group start and end).
    Group,
    /// One collective operation.
    Coll,
    /// One point-to-point operation.
    P2p,
    /// The proxy thread's work for one operation on one channel and peer.
    ProxyOp,
    /// One step (chunk) of a proxy op.
    ProxyStep,
    /// One GPU channel's part of a kernel.
    KernelCh,
    /// The proxy thread's own activity (idle, active, sleep, ...); has no parent.
    ProxyCtrl,
    /// An event defined by the net plugin (e.g. one network request).
    Net,
}

impl EventKind {
    /// Every kind, outermost first.
    pub const ALL: [EventKind; 8] = [
        EventKind::Group,
        EventKind::Coll,
        EventKind::P2p,
        EventKind::ProxyOp,
        EventKind::ProxyStep,
        EventKind::ProxyCtrl,
        EventKind::KernelCh,
        EventKind::Net,
    ];

    /// The kind of a single NCCL event-type bit (see [`EventKind::mask_bit`]).
    pub fn from_mask_bit(bit: u64) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.mask_bit() == bit)
    }

    /// The bit of NCCL's profiler event-activation mask for this kind
    /// (`ncclProfileGroup` = 1<<0 … `ncclProfileNetPlugin` = 1<<7).
    pub fn mask_bit(self) -> u64 {
        match self {
            EventKind::Group => 1 << 0,
            EventKind::Coll => 1 << 1,
            EventKind::P2p => 1 << 2,
            EventKind::ProxyOp => 1 << 3,
            EventKind::ProxyStep => 1 << 4,
            EventKind::ProxyCtrl => 1 << 5,
            EventKind::KernelCh => 1 << 6,
            EventKind::Net => 1 << 7,
        }
    }

    /// The trace category (`cat`) written for this kind.
    pub fn category(self) -> &'static str {
        match self {
            EventKind::Group => "group",
            EventKind::Coll => "coll",
            EventKind::P2p => "p2p",
            EventKind::ProxyOp => "proxy_op",
            EventKind::ProxyStep => "proxy_step",
            EventKind::ProxyCtrl => "proxy_ctrl",
            EventKind::KernelCh => "kernel_ch",
            EventKind::Net => "net",
        }
    }

    /// Kinds allowed as this kind's parent.
    pub fn parent_kinds(self) -> &'static [EventKind] {
        match self {
            EventKind::Group | EventKind::ProxyCtrl => &[],
            EventKind::Coll | EventKind::P2p => &[EventKind::Group],
            EventKind::ProxyOp | EventKind::KernelCh => &[EventKind::Coll, EventKind::P2p],
            EventKind::ProxyStep => &[EventKind::ProxyOp],
            EventKind::Net => &[EventKind::ProxyStep],
        }
    }

    /// Whether an event of this kind must have a parent (in a strict recorder). Groups and
    /// proxy-control events never have one; collectives and p2p operations may stand alone
    /// (when not in a group).
    pub fn requires_parent(self) -> bool {
        !matches!(
            self,
            EventKind::Group | EventKind::ProxyCtrl | EventKind::Coll | EventKind::P2p
        )
    }
}

/// Identifies a recorded event within its [`Recorder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(u64);

impl EventId {
    /// The number written as `args.id` in the trace.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Why a recorder call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceError {
    /// The id was not issued by this recorder.
    UnknownEvent(EventId),
    /// The event was already stopped.
    AlreadyStopped(EventId),
    /// The parent id was not issued by this recorder.
    UnknownParent(EventId),
    /// The parent's kind cannot contain the child's kind.
    WrongParentKind {
        /// Kind of the event being started.
        child: EventKind,
        /// Kind of the given parent.
        parent: EventKind,
    },
    /// This kind needs a parent and none was given.
    MissingParent(EventKind),
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::UnknownEvent(id) => write!(f, "unknown event id {}", id.0),
            TraceError::AlreadyStopped(id) => write!(f, "event {} was already stopped", id.0),
            TraceError::UnknownParent(id) => write!(f, "unknown parent event id {}", id.0),
            TraceError::WrongParentKind { child, parent } => {
                write!(
                    f,
                    "a {child:?} event cannot be a child of a {parent:?} event"
                )
            }
            TraceError::MissingParent(kind) => write!(f, "a {kind:?} event needs a parent event"),
        }
    }
}

impl std::error::Error for TraceError {}

/// A small, stable number for the calling thread (1, 2, … in order of first use).
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NUMBER: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.with(|n| *n)
}

/// One started event.
#[derive(Debug)]
struct Span {
    kind: EventKind,
    name: String,
    parent: Option<EventId>,
    tid: u64,
    start_us: f64,
    end_us: Option<f64>,
    args: Map<String, Value>,
}

/// One state change of an event.
#[derive(Debug)]
struct StateMark {
    event: EventId,
    state: String,
    tid: u64,
    ts_us: f64,
    args: Map<String, Value>,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    spans: BTreeMap<EventId, Span>,
    marks: Vec<StateMark>,
}

/// One entry of `traceEvents`.
#[derive(Serialize)]
struct TraceEvent<'a> {
    name: &'a str,
    cat: &'static str,
    ph: &'static str,
    pid: u32,
    tid: u64,
    ts: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    /// Scope of an instant event ("t" = thread).
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    args: Map<String, Value>,
}

/// A thread-safe recorder of profiler events.
#[derive(Debug)]
pub struct Recorder {
    origin: Instant,
    pid: u32,
    /// Whether kinds that [require a parent](EventKind::requires_parent) may start without.
    allow_orphans: bool,
    inner: Mutex<Inner>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// An empty recorder; timestamps count from now.
    pub fn new() -> Self {
        Recorder {
            origin: Instant::now(),
            pid: std::process::id(),
            allow_orphans: false,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// An empty recorder that lets any event start without a parent (for when the parent's
    /// kind is not recorded); a parent, when given, is still checked.
    pub fn allowing_orphans() -> Self {
        Recorder {
            allow_orphans: true,
            ..Self::new()
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere must not stop profiling; the data stays consistent
        // because every update is a single insert or field write.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now_us(&self) -> f64 {
        self.origin.elapsed().as_nanos() as f64 / 1000.0
    }

    /// Starts an event of `kind` named `name` under `parent`, on the calling thread.
    pub fn start(
        &self,
        kind: EventKind,
        name: impl Into<String>,
        parent: Option<EventId>,
    ) -> Result<EventId, TraceError> {
        self.start_with_args(kind, name, parent, Map::new())
    }

    /// Like [`Recorder::start`], with extra `args` shown in the trace viewer
    /// (e.g. `count`, `datatype`, `peer`). The keys `id` and `parent` are reserved.
    pub fn start_with_args(
        &self,
        kind: EventKind,
        name: impl Into<String>,
        parent: Option<EventId>,
        args: Map<String, Value>,
    ) -> Result<EventId, TraceError> {
        let tid = thread_number();
        let mut inner = self.lock();
        match parent {
            Some(pid) => {
                let parent_kind = inner
                    .spans
                    .get(&pid)
                    .ok_or(TraceError::UnknownParent(pid))?
                    .kind;
                if !kind.parent_kinds().contains(&parent_kind) {
                    return Err(TraceError::WrongParentKind {
                        child: kind,
                        parent: parent_kind,
                    });
                }
            }
            None if kind.requires_parent() && !self.allow_orphans => {
                return Err(TraceError::MissingParent(kind))
            }
            None => {}
        }
        inner.next_id += 1;
        let id = EventId(inner.next_id);
        let span = Span {
            kind,
            name: name.into(),
            parent,
            tid,
            start_us: self.now_us(),
            end_us: None,
            args,
        };
        inner.spans.insert(id, span);
        Ok(id)
    }

    /// Stops a running event.
    pub fn stop(&self, id: EventId) -> Result<(), TraceError> {
        let now = self.now_us();
        let mut inner = self.lock();
        let span = inner
            .spans
            .get_mut(&id)
            .ok_or(TraceError::UnknownEvent(id))?;
        if span.end_us.is_some() {
            return Err(TraceError::AlreadyStopped(id));
        }
        span.end_us = Some(now);
        Ok(())
    }

    /// Records that event `id` entered `state` (NCCL's `recordEventState`, e.g.
    /// a proxy step's "SendWait"), with optional extra `args`.
    pub fn record_state(
        &self,
        id: EventId,
        state: impl Into<String>,
        args: Map<String, Value>,
    ) -> Result<(), TraceError> {
        let tid = thread_number();
        let ts_us = self.now_us();
        let mut inner = self.lock();
        let span = inner.spans.get(&id).ok_or(TraceError::UnknownEvent(id))?;
        if span.end_us.is_some() {
            return Err(TraceError::AlreadyStopped(id));
        }
        inner.marks.push(StateMark {
            event: id,
            state: state.into(),
            tid,
            ts_us,
            args,
        });
        Ok(())
    }

    /// Number of events started so far.
    pub fn len(&self) -> usize {
        self.lock().spans.len()
    }

    /// Whether no event was started.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole trace as a JSON value `{"traceEvents":[...]}`, sorted by time.
    pub fn to_json(&self) -> Value {
        let inner = self.lock();
        let mut events: Vec<TraceEvent<'_>> =
            Vec::with_capacity(inner.spans.len() + inner.marks.len());
        for (id, span) in &inner.spans {
            let mut args = span.args.clone();
            args.insert("id".into(), id.0.into());
            if let Some(parent) = span.parent {
                args.insert("parent".into(), parent.0.into());
            }
            events.push(TraceEvent {
                name: &span.name,
                cat: span.kind.category(),
                ph: if span.end_us.is_some() { "X" } else { "B" },
                pid: self.pid,
                tid: span.tid,
                ts: span.start_us,
                dur: span.end_us.map(|end| end - span.start_us),
                s: None,
                args,
            });
        }
        for mark in &inner.marks {
            let mut args = mark.args.clone();
            args.insert("id".into(), mark.event.0.into());
            let kind = inner
                .spans
                .get(&mark.event)
                .map_or(EventKind::Group, |s| s.kind);
            events.push(TraceEvent {
                name: &mark.state,
                cat: kind.category(),
                ph: "i",
                pid: self.pid,
                tid: mark.tid,
                ts: mark.ts_us,
                dur: None,
                s: Some("t"),
                args,
            });
        }
        // Stable sort: at equal times spans (in id order, parents first) precede marks.
        events.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ns" })
    }

    /// Writes the trace as JSON to `out`.
    pub fn write_json(&self, mut out: impl Write) -> io::Result<()> {
        serde_json::to_writer(&mut out, &self.to_json()).map_err(io::Error::other)?;
        out.flush()
    }

    /// Writes the trace to the file at `path` (replacing it).
    pub fn write_to_path(&self, path: &Path) -> io::Result<()> {
        let file = std::fs::File::create(path)?;
        self.write_json(io::BufWriter::new(file))
    }

    /// Writes the trace to the file named by [`TRACE_FILE_ENV`], if set and not
    /// empty; returns the path written.
    pub fn write_to_env_file(&self) -> io::Result<Option<PathBuf>> {
        match trace_file_from(std::env::var_os(TRACE_FILE_ENV), self.pid) {
            Some(path) => self.write_to_path(&path).map(|()| Some(path)),
            None => Ok(None),
        }
    }
}

/// The output path for a value of [`TRACE_FILE_ENV`]: `None` if unset or empty;
/// `%p` is replaced by `pid`.
pub fn trace_file_from(value: Option<std::ffi::OsString>, pid: u32) -> Option<PathBuf> {
    let value = value.filter(|v| !v.is_empty())?;
    let text = value.to_string_lossy();
    if text.contains("%p") {
        Some(PathBuf::from(text.replace("%p", &pid.to_string())))
    } else {
        Some(PathBuf::from(value))
    }
}

/// Parses a value of [`EVENT_MASK_ENV`]: decimal or `0x` hex; bits this ABI does not know
/// are dropped.
pub fn parse_event_mask(text: &str) -> Result<u32, String> {
    let t = text.trim();
    let value = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse::<u64>(),
    };
    value
        .map(|v| (v & u64::from(event_type::ALL)) as u32)
        .map_err(|_| format!("{EVENT_MASK_ENV}={text} is not a number (decimal or 0x hex)"))
}

/// One communicator using the profiler.
#[derive(Debug, Clone)]
struct Context {
    /// `comm` in the events' args: the name, or the id in hex.
    comm: String,
    mask: u32,
    log: LogFn,
}

/// The profiler: one recorder for the whole process, and the live communicators.
#[derive(Debug)]
pub struct TraceProfiler {
    recorder: Recorder,
    contexts: HandleRegistry<Context>,
    /// Serialises finalize (remove + "was it the last?" + write).
    finalizing: Mutex<()>,
}

impl Default for TraceProfiler {
    fn default() -> Self {
        Self::new()
    }
}

fn args_of(pairs: impl IntoIterator<Item = (&'static str, Value)>) -> Map<String, Value> {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

impl TraceProfiler {
    /// A profiler with an empty trace (its recorder accepts events whose parent is not
    /// tracked).
    pub fn new() -> Self {
        TraceProfiler {
            recorder: Recorder::allowing_orphans(),
            contexts: HandleRegistry::new(),
            finalizing: Mutex::new(()),
        }
    }

    /// The recorder holding the trace.
    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    fn event_name(kind: EventKind, d: &EventDescr<'_>) -> String {
        let func = d.func.as_str();
        match kind {
            EventKind::Coll | EventKind::P2p if !func.is_empty() => func.to_string(),
            _ => event_type::name(d.event_type).unwrap_or("Event").to_string(),
        }
    }

    fn event_args(ctx: &Context, kind: EventKind, d: &EventDescr<'_>) -> Map<String, Value> {
        let mut args = args_of([("rank", d.rank.into()), ("comm", ctx.comm.clone().into())]);
        let s = |r: abi_stable::std_types::RStr<'_>| Value::from(r.as_str());
        let more: Vec<(&'static str, Value)> = match kind {
            EventKind::Coll => vec![
                ("seq", d.seq_number.into()),
                ("count", d.count.into()),
                ("datatype", s(d.datatype)),
                ("root", d.root.into()),
                ("algo", s(d.algo)),
                ("proto", s(d.proto)),
                ("nChannels", d.n_channels.into()),
                ("nWarps", d.n_warps.into()),
            ],
            EventKind::P2p => vec![
                ("count", d.count.into()),
                ("datatype", s(d.datatype)),
                ("peer", d.peer.into()),
                ("nChannels", d.n_channels.into()),
            ],
            EventKind::ProxyOp => vec![
                ("channel", d.channel_id.into()),
                ("peer", d.peer.into()),
                ("nSteps", d.n_steps.into()),
                ("chunkSize", d.chunk_size.into()),
                ("isSend", d.is_send.into()),
            ],
            EventKind::ProxyStep => vec![("step", d.step.into())],
            EventKind::KernelCh => vec![("channel", d.channel_id.into())],
            EventKind::Net => vec![("pluginId", d.net_plugin_id.into())],
            EventKind::Group | EventKind::ProxyCtrl => vec![],
        };
        args.extend(more.into_iter().map(|(k, v)| (k.to_string(), v)));
        args
    }

    fn trace_error(e: TraceError) -> PluginError {
        PluginError::invalid_usage(format!("{PLUGIN_NAME} profiler: {e}"))
    }
}

impl Profiler for TraceProfiler {
    fn init(
        &self,
        comm_id: u64,
        comm_name: &str,
        _nnodes: usize,
        _nranks: usize,
        rank: usize,
        log: LogFn,
    ) -> Result<(PluginHandle, u32), PluginError> {
        let mask = match std::env::var(EVENT_MASK_ENV) {
            Ok(text) if !text.trim().is_empty() => parse_event_mask(&text).unwrap_or_else(|e| {
                log.warn(
                    subsys::PROFILE,
                    &format!("{PLUGIN_NAME} profiler: {e}; using {DEFAULT_EVENT_MASK:#x}"),
                );
                DEFAULT_EVENT_MASK
            }),
            _ => DEFAULT_EVENT_MASK,
        };
        let comm = if comm_name.is_empty() {
            format!("{comm_id:#x}")
        } else {
            comm_name.to_string()
        };
        log.info(
            subsys::PROFILE,
            &format!("{PLUGIN_NAME} profiler: rank {rank} of {comm}, event mask {mask:#x}"),
        );
        let ctx = self.contexts.insert(Context { comm, mask, log });
        Ok((ctx, mask))
    }

    fn start_event(&self, ctx: PluginHandle, d: &EventDescr<'_>) -> Result<PluginHandle, PluginError> {
        let context = self
            .contexts
            .with(ctx, |c| c.clone())
            .ok_or_else(|| PluginError::invalid_argument(format!("{PLUGIN_NAME} profiler: unknown context {}", ctx.id)))?;
        let kind = match EventKind::from_mask_bit(u64::from(d.event_type)) {
            Some(kind) if d.event_type & context.mask != 0 => kind,
            _ => return Ok(PluginHandle { id: 0 }),
        };
        let parent = d.parent().map(|p| EventId(p.id));
        let id = self
            .recorder
            .start_with_args(kind, Self::event_name(kind, d), parent, Self::event_args(&context, kind, d))
            .map_err(Self::trace_error)?;
        Ok(PluginHandle { id: id.get() })
    }

    fn stop_event(&self, event: PluginHandle) -> Result<(), PluginError> {
        if event.id == 0 {
            return Ok(());
        }
        self.recorder.stop(EventId(event.id)).map_err(Self::trace_error)
    }

    fn record_event_state(&self, event: PluginHandle, st: u32, args: &StateArgs) -> Result<(), PluginError> {
        if event.id == 0 {
            return Ok(());
        }
        let name = state::name(st).map_or_else(|| format!("State{st}"), str::to_string);
        let mut extra = Map::new();
        if args.trans_size != 0 {
            extra.insert("transSize".into(), args.trans_size.into());
        }
        if args.appended_proxy_ops != 0 {
            extra.insert("appendedProxyOps".into(), args.appended_proxy_ops.into());
        }
        if args.p_timer != 0 {
            extra.insert("pTimer".into(), args.p_timer.into());
        }
        self.recorder
            .record_state(EventId(event.id), name, extra)
            .map_err(Self::trace_error)
    }

    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        let _serial = self.finalizing.lock().unwrap_or_else(|p| p.into_inner());
        let context = self
            .contexts
            .remove(ctx)
            .ok_or_else(|| PluginError::invalid_argument(format!("{PLUGIN_NAME} profiler: unknown context {}", ctx.id)))?;
        if !self.contexts.is_empty() {
            return Ok(());
        }
        match self.recorder.write_to_env_file() {
            Ok(Some(path)) => {
                context.log.info(
                    subsys::PROFILE,
                    &format!("{PLUGIN_NAME} profiler: wrote {} events to {}", self.recorder.len(), path.display()),
                );
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(PluginError::system(format!(
                "{PLUGIN_NAME} profiler: cannot write the trace ({TRACE_FILE_ENV}): {e}"
            ))),
        }
    }
}

/// The instance the exported table uses.
pub fn instance() -> &'static TraceProfiler {
    static INSTANCE: std::sync::OnceLock<TraceProfiler> = std::sync::OnceLock::new();
    INSTANCE.get_or_init(TraceProfiler::new)
}

/// Gives the exported table [`instance`].
pub struct Provider;

impl ProfilerProvider for Provider {
    fn get() -> &'static dyn Profiler {
        instance()
    }
}

rustccl_plugin_api::export_profiler_v1!("trace", provider = Provider);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashMap;

    /// Parses the recorder's output text back and indexes the spans by id.
    fn parse(rec: &Recorder) -> (Vec<Value>, HashMap<u64, Value>) {
        let mut text = Vec::new();
        rec.write_json(&mut text).unwrap();
        let doc: Value = serde_json::from_slice(&text).expect("valid JSON");
        let events = doc["traceEvents"]
            .as_array()
            .expect("traceEvents array")
            .clone();
        let spans = events
            .iter()
            .filter(|e| e["ph"] != "i")
            .map(|e| (e["args"]["id"].as_u64().unwrap(), e.clone()))
            .collect();
        (events, spans)
    }

    fn interval(e: &Value) -> (f64, f64) {
        let ts = e["ts"].as_f64().unwrap();
        (ts, ts + e["dur"].as_f64().unwrap())
    }

    /// Whether child interval `c` lies inside parent interval `p` (ts + dur is
    /// recomputed in floating point, so allow a rounding error far below 1 ns).
    fn inside(p: (f64, f64), c: (f64, f64)) -> bool {
        p.0 <= c.0 && c.1 <= p.1 + 1e-6
    }

    #[test]
    fn nested_events_give_matching_intervals() {
        let rec = Recorder::new();
        let group = rec.start(EventKind::Group, "Group", None).unwrap();
        let mut args = Map::new();
        args.insert("count".into(), json!(1024));
        let coll = rec
            .start_with_args(EventKind::Coll, "AllReduce", Some(group), args)
            .unwrap();
        let kch = rec
            .start(EventKind::KernelCh, "KernelCh", Some(coll))
            .unwrap();
        let op = rec
            .start(EventKind::ProxyOp, "ProxyOp", Some(coll))
            .unwrap();
        let step = rec
            .start(EventKind::ProxyStep, "ProxyStep", Some(op))
            .unwrap();
        rec.record_state(step, "SendWait", Map::new()).unwrap();
        let net = rec.start(EventKind::Net, "isend", Some(step)).unwrap();
        for id in [net, step, op, kch, coll, group] {
            rec.stop(id).unwrap();
        }
        assert_eq!(rec.len(), 6);

        let (events, spans) = parse(&rec);
        assert_eq!(events.len(), 7);
        let pid = std::process::id() as u64;
        for e in spans.values() {
            assert_eq!(e["ph"], "X");
            assert_eq!(e["pid"].as_u64(), Some(pid));
            assert!(e["tid"].as_u64().unwrap() >= 1);
            assert!(e["dur"].as_f64().unwrap() >= 0.0);
            // Each child lies inside its parent.
            if let Some(parent) = e["args"]["parent"].as_u64() {
                assert!(
                    inside(interval(&spans[&parent]), interval(e)),
                    "{e} not inside {}",
                    spans[&parent]
                );
            }
        }
        let c = &spans[&coll.get()];
        assert_eq!(
            (c["name"].as_str(), c["cat"].as_str()),
            (Some("AllReduce"), Some("coll"))
        );
        assert_eq!(c["args"]["count"], 1024);
        assert_eq!(c["args"]["parent"].as_u64(), Some(group.get()));
        assert!(spans[&group.get()]["args"].get("parent").is_none());
        assert_eq!(
            spans[&net.get()]["args"]["parent"].as_u64(),
            Some(step.get())
        );
        let mark = events.iter().find(|e| e["ph"] == "i").unwrap();
        assert_eq!(
            (
                mark["name"].as_str(),
                mark["s"].as_str(),
                mark["cat"].as_str()
            ),
            (Some("SendWait"), Some("t"), Some("proxy_step"))
        );
        assert_eq!(mark["args"]["id"].as_u64(), Some(step.get()));
        // Sorted by time.
        let ts: Vec<f64> = events.iter().map(|e| e["ts"].as_f64().unwrap()).collect();
        assert!(ts.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn running_events_are_begin_only() {
        let rec = Recorder::new();
        let p2p = rec.start(EventKind::P2p, "Send", None).unwrap();
        let op = rec.start(EventKind::ProxyOp, "ProxyOp", Some(p2p)).unwrap();
        rec.stop(op).unwrap();
        let (_, spans) = parse(&rec);
        assert_eq!(spans[&p2p.get()]["ph"], "B");
        assert!(spans[&p2p.get()].get("dur").is_none());
        assert_eq!(spans[&op.get()]["ph"], "X");
        rec.stop(p2p).unwrap();
        assert_eq!(parse(&rec).1[&p2p.get()]["ph"], "X");
    }

    #[test]
    fn hierarchy_and_misuse_are_rejected() {
        let rec = Recorder::new();
        let group = rec.start(EventKind::Group, "Group", None).unwrap();
        assert_eq!(
            rec.start(EventKind::ProxyStep, "s", Some(group)),
            Err(TraceError::WrongParentKind {
                child: EventKind::ProxyStep,
                parent: EventKind::Group
            })
        );
        assert_eq!(
            rec.start(EventKind::Net, "n", None),
            Err(TraceError::MissingParent(EventKind::Net))
        );
        assert_eq!(
            rec.start(EventKind::Coll, "c", Some(EventId(99))),
            Err(TraceError::UnknownParent(EventId(99)))
        );
        assert!(rec.start(EventKind::Coll, "standalone", None).is_ok());
        assert_eq!(
            rec.stop(EventId(42)),
            Err(TraceError::UnknownEvent(EventId(42)))
        );
        rec.stop(group).unwrap();
        assert_eq!(rec.stop(group), Err(TraceError::AlreadyStopped(group)));
        assert_eq!(
            rec.record_state(group, "x", Map::new()),
            Err(TraceError::AlreadyStopped(group))
        );
        assert_eq!(rec.len(), 2);
        for kind in EventKind::ALL {
            for parent in kind.parent_kinds() {
                assert!(
                    EventKind::ALL.iter().position(|k| k == parent)
                        < EventKind::ALL.iter().position(|k| *k == kind)
                );
            }
        }
        let bits: u64 = EventKind::ALL.iter().map(|k| k.mask_bit()).sum();
        assert_eq!(bits, 0b1111_1111);
        for kind in EventKind::ALL {
            assert_eq!(EventKind::from_mask_bit(kind.mask_bit()), Some(kind));
        }
        assert_eq!(EventKind::from_mask_bit(3), None);
        // Proxy-control events stand alone; a lenient recorder accepts orphans.
        assert!(rec.start(EventKind::ProxyCtrl, "ProxyCtrl", None).is_ok());
        let lenient = Recorder::allowing_orphans();
        assert!(lenient.start(EventKind::ProxyStep, "s", None).is_ok());
        assert!(lenient.start(EventKind::ProxyStep, "s", Some(EventId(99))).is_err());
    }

    #[test]
    fn many_threads_record_consistently() {
        let rec = Recorder::new();
        let group = rec.start(EventKind::Group, "Group", None).unwrap();
        std::thread::scope(|s| {
            for t in 0..4 {
                let rec = &rec;
                s.spawn(move || {
                    for i in 0..50 {
                        let coll = rec
                            .start(EventKind::Coll, format!("AllReduce{t}.{i}"), Some(group))
                            .unwrap();
                        let op = rec
                            .start(EventKind::ProxyOp, "ProxyOp", Some(coll))
                            .unwrap();
                        rec.stop(op).unwrap();
                        rec.stop(coll).unwrap();
                    }
                });
            }
        });
        rec.stop(group).unwrap();
        let (events, spans) = parse(&rec);
        assert_eq!(events.len(), 1 + 4 * 50 * 2);
        assert_eq!(spans.len(), events.len(), "ids are unique");
        let tids: std::collections::HashSet<u64> = spans
            .values()
            .filter(|e| e["cat"] == "coll")
            .map(|e| e["tid"].as_u64().unwrap())
            .collect();
        assert_eq!(tids.len(), 4);
        for e in spans.values().filter(|e| e["cat"] == "proxy_op") {
            let parent = &spans[&e["args"]["parent"].as_u64().unwrap()];
            assert_eq!(parent["tid"], e["tid"]);
            assert!(inside(interval(parent), interval(e)));
        }
    }

    #[test]
    fn trace_file_path_and_write() {
        assert_eq!(trace_file_from(None, 7), None);
        assert_eq!(trace_file_from(Some("".into()), 7), None);
        assert_eq!(
            trace_file_from(Some("/tmp/t-%p.json".into()), 77),
            Some(PathBuf::from("/tmp/t-77.json"))
        );
        assert_eq!(
            trace_file_from(Some("/tmp/t.json".into()), 77),
            Some(PathBuf::from("/tmp/t.json"))
        );

        let rec = Recorder::new();
        let g = rec.start(EventKind::Group, "Group", None).unwrap();
        rec.stop(g).unwrap();
        let path = std::env::temp_dir().join(format!("rustccl-trace-{}.json", std::process::id()));
        rec.write_to_path(&path).unwrap();
        let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(doc["traceEvents"][0]["name"], "Group");
        assert_eq!(doc["traceEvents"][0]["cat"], "group");
    }

    extern "C" fn quiet(_level: i32, _subsys: u64, _message: abi_stable::std_types::RStr<'_>) {}

    #[test]
    fn event_mask_parsing() {
        assert_eq!(parse_event_mask("15"), Ok(15));
        assert_eq!(parse_event_mask(" 0xFF "), Ok(0xff));
        assert_eq!(parse_event_mask("0x1ff"), Ok(0xff), "unknown bits dropped");
        assert!(parse_event_mask("all").unwrap_err().contains("NCCL_PROFILE_EVENT_MASK=all"));
        assert_eq!(DEFAULT_EVENT_MASK, 0b1111);
    }

    #[test]
    fn profiler_records_masked_events_with_args() {
        use abi_stable::std_types::RStr;
        let p = TraceProfiler::new();
        let log = LogFn { log: quiet };
        // (Reads NCCL_PROFILE_EVENT_MASK, which no unit test sets: the default mask.)
        let (ctx, mask) = p.init(0x42, "", 1, 2, 1, log).unwrap();
        assert_eq!(mask, DEFAULT_EVENT_MASK);
        let none = PluginHandle { id: 0 };
        let group = p.start_event(ctx, &EventDescr::new(event_type::GROUP, none, 1)).unwrap();
        let coll = p
            .start_event(
                ctx,
                &EventDescr {
                    func: RStr::from_str("AllReduce"),
                    seq_number: 3,
                    count: 256,
                    datatype: RStr::from_str("ncclFloat32"),
                    algo: RStr::from_str("RING"),
                    proto: RStr::from_str("LL"),
                    n_channels: 2,
                    ..EventDescr::new(event_type::COLL, group, 1)
                },
            )
            .unwrap();
        let op = p
            .start_event(
                ctx,
                &EventDescr {
                    channel_id: 1,
                    peer: 0,
                    n_steps: 4,
                    chunk_size: 1024,
                    is_send: true,
                    ..EventDescr::new(event_type::PROXY_OP, coll, 1)
                },
            )
            .unwrap();
        // Not in the mask: not tracked, and calls on handle 0 are accepted.
        let step = p.start_event(ctx, &EventDescr::new(event_type::PROXY_STEP, op, 1)).unwrap();
        assert_eq!(step.id, 0);
        p.record_event_state(step, state::PROXY_STEP_SEND_WAIT, &StateArgs::default()).unwrap();
        p.stop_event(step).unwrap();
        p.record_event_state(op, state::PROXY_OP_IN_PROGRESS, &StateArgs { trans_size: 64, ..Default::default() })
            .unwrap();
        // A wrong parent kind is refused.
        let wrong = EventDescr::new(event_type::PROXY_OP, group, 1);
        assert_eq!(p.start_event(ctx, &wrong).unwrap_err().code, PluginError::INVALID_USAGE);
        for h in [op, coll, group] {
            p.stop_event(h).unwrap();
        }
        assert_eq!(p.stop_event(op).unwrap_err().code, PluginError::INVALID_USAGE);
        assert!(p.start_event(PluginHandle { id: 999 }, &EventDescr::new(event_type::GROUP, none, 1)).is_err());

        let (events, spans) = parse(p.recorder());
        let c = &spans[&coll.id];
        assert_eq!(c["name"], "AllReduce");
        assert_eq!(c["args"]["parent"].as_u64(), Some(group.id));
        assert_eq!(
            (&c["args"]["count"], &c["args"]["algo"], &c["args"]["comm"], &c["args"]["seq"], &c["args"]["rank"]),
            (&json!(256), &json!("RING"), &json!("0x42"), &json!(3), &json!(1))
        );
        let o = &spans[&op.id];
        assert_eq!((o["name"].as_str(), o["cat"].as_str()), (Some("ProxyOp"), Some("proxy_op")));
        assert_eq!((&o["args"]["isSend"], &o["args"]["chunkSize"]), (&json!(true), &json!(1024)));
        let mark = events.iter().find(|e| e["ph"] == "i").unwrap();
        assert_eq!(mark["name"], "ProxyOpInProgress");
        assert_eq!(mark["args"]["transSize"], 64);
        p.finalize(ctx).unwrap();
        assert!(p.finalize(ctx).is_err());
    }
}
