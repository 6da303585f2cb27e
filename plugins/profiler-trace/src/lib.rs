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
//!   `rustccl_profiler_v3` (and `_v2`, `_v1`) under the name [`PLUGIN_NAME`]. Every communicator's events go to
//!   the same trace (each event's `args` carry `rank` and `comm`); the trace is written to
//!   the file named by [`TRACE_FILE_ENV`] (`RUSTCCL_PROFILER_TRACE_FILE`) when the last
//!   live communicator is finalised (again, with everything so far, if more communicators
//!   come and go later). The events it asks for come from [`EVENT_MASK_ENV`]
//!   (`NCCL_PROFILE_EVENT_MASK`, decimal or `0x` hex; default [`DEFAULT_EVENT_MASK`] =
//!   Group | Coll | P2p | ProxyOp). An event whose parent was not tracked (its type is not in
//!   the mask) stands alone in the trace.
//!
//! The API-level events (group API, collective / p2p API, kernel launch) are recorded too
//! when the mask asks for them; a collective's parent is then its API event, else its group.
//! A collective or API event of a tagged call (`EventDescr::user_tag`, the caller's
//! `userProfilerTag`) has `userTag` in its `args`.
//! Not yet: a bounded event buffer, and GPU timestamps for kernel-channel events.
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
//!
//! # Modules
//!
//! * [`event`]: the event model — [`EventKind`] (the hierarchy), [`EventId`], [`TraceError`];
//! * [`recorder`]: [`Recorder`], which starts, stops and records the state of events;
//! * [`chrome_trace`]: the trace writer — the recorder's events as Chrome trace-event JSON,
//!   and the output file ([`TRACE_FILE_ENV`], [`trace_file_from`]);
//! * [`profiler`]: [`TraceProfiler`], the plugin interface on top of one recorder (event mask,
//!   per-communicator contexts, writing the trace at the last finalize);
//! * [`export`]: the plugin's exported tables (`rustccl_profiler_v3`, `_v2`, `_v1`) and its [`instance`].

pub mod chrome_trace;
pub mod event;
pub mod export;
pub mod profiler;
pub mod recorder;

#[cfg(test)]
mod test_support;

pub use chrome_trace::{trace_file_from, TRACE_FILE_ENV};
pub use event::{EventId, EventKind, TraceError};
pub use export::{instance, Provider, PLUGIN_NAME};
pub use profiler::{parse_event_mask, TraceProfiler, DEFAULT_EVENT_MASK, EVENT_MASK_ENV};
pub use recorder::Recorder;
