//! The profiler plugin ABI (rustccl profiler v3), with the semantics of NCCL's profiler v5
//! and the user tag of NCCL's v7:
//! the host starts and stops events of a hierarchy (group API → collective / p2p API →
//! collective / p2p → proxy op → proxy step → net plugin event, collective / p2p → kernel
//! channel, group API → kernel launch; a collective / p2p also names its group in
//! `parent_group`; proxy control events stand alone) and records state changes of running
//! events. A parent may stop before its children start (an API event stops when the call
//! returns, its collective runs later). At `init` the plugin says which
//! event types it wants (an activation mask of [`event_type`] bits); the host starts only
//! those.
//!
//! A plugin implements the safe trait [`Profiler`] and exports it with
//! [`export_profiler!`](crate::export_profiler)`(v3, ...)` (symbol `rustccl_profiler_v3`, table
//! [`ProfilerV3`]); the host sees a `&dyn Profiler` through [`ProfilerV3Client`].
//!
//! | version | symbol | differences |
//! |---|---|---|
//! | 1 | `rustccl_profiler_v1` | event types up to `NetPlugin` (mask `0xff`); the descriptor ends at `net_data`; a Coll / P2p's parent is its Group |
//! | 2 | `rustccl_profiler_v2` | GroupApi, CollApi, P2pApi, KernelLaunch; the descriptor gains `parent_group` .. `group_depth` |
//! | 3 | `rustccl_profiler_v3` | the descriptor gains `user_tag` (the caller's profiler tag, NCCL's profiler v7 `userTag`) |
//!
//! A plugin built for v1 or v2 still loads: [`ProfilerV1Client`](crate::profiler_v1::ProfilerV1Client)
//! cuts the mask to what v1 knew and hands it v1's descriptor,
//! [`ProfilerV2Client`](crate::profiler_v2::ProfilerV2Client) hands it v2's (no tag); a plugin
//! may export several versions (`export_profiler!(v2, ...)` and `(v1, ...)` as well) to stay
//! loadable by older hosts. A new field is a new version: the host checks a table's layout at
//! load, so a field appended to a version's descriptor would refuse every plugin built before.
//!
//! Rules (as NCCL's): only `init` may fail in a way that matters (it disables the profiler
//! for that communicator, and the host does not call `finalize` for it); the host ignores
//! errors of the other calls, so a plugin should return `Ok` whenever it can. `init` may
//! succeed with the context handle `0` (NCCL's NULL context): the profiler has switched
//! itself off for that communicator, and the host calls nothing else for it, not even
//! `finalize` (so a plugin must not hand out `0` as a live context; [`HandleRegistry`](crate::HandleRegistry)
//! never does). `comm_name` and the descriptor's strings are borrowed for the call: copy
//! what you keep. `start_event` may return the handle `0`: "not tracked"; the
//! host then passes `0` as the parent of the event's children and does not call
//! `stop_event` / `record_event_state` for it (a plugin must still accept and ignore `0`).
//! Events may be started, stopped and updated from any thread (the proxy thread, the
//! application's threads).

use abi_stable::std_types::RStr;
use abi_stable::StableAbi;

use crate::{call_guarded, LogFn, PResult, PluginError, PluginHandle};

/// Event type bits (NCCL's `ncclProfile*` values): an event's [`EventDescr::event_type`]
/// is one of them, and the activation mask is an OR of them.
pub mod event_type {
    /// A group of operations (between group start and end).
    pub const GROUP: u32 = 1 << 0;
    /// One collective operation.
    pub const COLL: u32 = 1 << 1;
    /// One point-to-point operation.
    pub const P2P: u32 = 1 << 2;
    /// The proxy's work for one operation on one channel and peer.
    pub const PROXY_OP: u32 = 1 << 3;
    /// One step (chunk) of a proxy op.
    pub const PROXY_STEP: u32 = 1 << 4;
    /// The proxy thread's own activity (idle, active, sleep, ...); has no parent.
    pub const PROXY_CTRL: u32 = 1 << 5;
    /// One GPU channel's part of a kernel.
    pub const KERNEL_CH: u32 = 1 << 6;
    /// An event defined by the net plugin (e.g. one network request).
    pub const NET_PLUGIN: u32 = 1 << 7;
    /// The application's outermost group call (group start to group end; a call outside a
    /// group is a group of one).
    pub const GROUP_API: u32 = 1 << 8;
    /// One collective API call (its enqueue, not its execution).
    pub const COLL_API: u32 = 1 << 9;
    /// One send or receive API call.
    pub const P2P_API: u32 = 1 << 10;
    /// One launch of device work on a stream.
    pub const KERNEL_LAUNCH: u32 = 1 << 11;
    /// Every type this ABI version knows.
    pub const ALL: u32 = 0xfff;

    /// NCCL's name of a single type bit (`"Group"`, `"Coll"`, ..., `"NetPlugin"`).
    pub fn name(event_type: u32) -> Option<&'static str> {
        Some(match event_type {
            GROUP => "Group",
            COLL => "Coll",
            P2P => "P2p",
            PROXY_OP => "ProxyOp",
            PROXY_STEP => "ProxyStep",
            PROXY_CTRL => "ProxyCtrl",
            KERNEL_CH => "KernelCh",
            NET_PLUGIN => "NetPlugin",
            GROUP_API => "GroupApi",
            COLL_API => "CollApi",
            P2P_API => "P2pApi",
            KERNEL_LAUNCH => "KernelLaunch",
            _ => return None,
        })
    }
}

/// Event states passed to `record_event_state`, numbered as NCCL's
/// `ncclProfilerEventState_t`.
pub mod state {
    // Proxy op states (deprecated by NCCL since profiler v4, still numbered).
    pub const PROXY_OP_SEND_POSTED: u32 = 0;
    pub const PROXY_OP_SEND_REM_FIFO_WAIT: u32 = 1;
    pub const PROXY_OP_SEND_TRANSMITTED: u32 = 2;
    pub const PROXY_OP_SEND_DONE: u32 = 3;
    pub const PROXY_OP_RECV_POSTED: u32 = 4;
    pub const PROXY_OP_RECV_RECEIVED: u32 = 5;
    pub const PROXY_OP_RECV_TRANSMITTED: u32 = 6;
    pub const PROXY_OP_RECV_DONE: u32 = 7;
    // Proxy step states; args: `trans_size`.
    pub const PROXY_STEP_SEND_GPU_WAIT: u32 = 8;
    pub const PROXY_STEP_SEND_WAIT: u32 = 9;
    pub const PROXY_STEP_RECV_WAIT: u32 = 10;
    pub const PROXY_STEP_RECV_FLUSH_WAIT: u32 = 11;
    pub const PROXY_STEP_RECV_GPU_WAIT: u32 = 12;
    // Proxy control states; args of Append / AppendEnd: `appended_proxy_ops`.
    pub const PROXY_CTRL_IDLE: u32 = 13;
    pub const PROXY_CTRL_ACTIVE: u32 = 14;
    pub const PROXY_CTRL_SLEEP: u32 = 15;
    pub const PROXY_CTRL_WAKEUP: u32 = 16;
    pub const PROXY_CTRL_APPEND: u32 = 17;
    pub const PROXY_CTRL_APPEND_END: u32 = 18;
    /// A proxy op is in progress (v4+).
    pub const PROXY_OP_IN_PROGRESS: u32 = 19;
    /// A proxy step waits for the peer (v4+).
    pub const PROXY_STEP_SEND_PEER_WAIT: u32 = 20;
    /// The net plugin updates its event; args: `net_data`.
    pub const NET_PLUGIN_UPDATE: u32 = 21;
    /// A kernel channel stopped; args: `p_timer` (GPU timer at the stop).
    pub const KERNEL_CH_STOP: u32 = 22;
    pub const GROUP_START_API_STOP: u32 = 23;
    pub const GROUP_END_API_START: u32 = 24;

    /// NCCL's name of a state without its `ncclProfiler` prefix (e.g. `"ProxyStepSendWait"`).
    pub fn name(state: u32) -> Option<&'static str> {
        const NAMES: [&str; 25] = [
            "ProxyOpSendPosted",
            "ProxyOpSendRemFifoWait",
            "ProxyOpSendTransmitted",
            "ProxyOpSendDone",
            "ProxyOpRecvPosted",
            "ProxyOpRecvReceived",
            "ProxyOpRecvTransmitted",
            "ProxyOpRecvDone",
            "ProxyStepSendGPUWait",
            "ProxyStepSendWait",
            "ProxyStepRecvWait",
            "ProxyStepRecvFlushWait",
            "ProxyStepRecvGPUWait",
            "ProxyCtrlIdle",
            "ProxyCtrlActive",
            "ProxyCtrlSleep",
            "ProxyCtrlWakeup",
            "ProxyCtrlAppend",
            "ProxyCtrlAppendEnd",
            "ProxyOpInProgress",
            "ProxyStepSendPeerWait",
            "NetPluginUpdate",
            "KernelChStop",
            "GroupStartApiStop",
            "GroupEndApiStart",
        ];
        NAMES.get(state as usize).copied()
    }
}

/// Net plugin ids (`(type << 16) | version`) for [`EventDescr::net_plugin_id`] (NCCL's).
pub mod net_plugin_type {
    pub const IB: i64 = 1 << 16;
    pub const SOCKET: i64 = 2 << 16;
}

/// What is starting: one flat struct for every [`event_type`] (NCCL's descriptor is a
/// union). Fields that do not apply to an event's type hold the values of
/// [`EventDescr::new`] (empty strings, 0, -1 for ranks and ids).
///
/// | field | applies to |
/// |---|---|
/// | `event_type`, `parent`, `rank` | all (`parent`: the handle `start_event` gave the parent event; 0 = none or not tracked) |
/// | `parent_group` | Coll, P2p: the Group event (their `parent` is the CollApi / P2pApi event, as in NCCL's v5) |
/// | `func` | Coll, P2p, CollApi, P2pApi (`"AllReduce"`, `"Send"`, `"Recv"`, ...) |
/// | `seq_number` | Coll (the communicator's sequence number of that function); KernelCh: its start timer in nanoseconds (NCCL's `kernelCh.pTimer`; carried here so that v2's layout stays) |
/// | `count`, `datatype` | Coll, P2p, CollApi, P2pApi (elements, NCCL's type name, e.g. `"ncclFloat32"`) |
/// | `root` | Coll, CollApi (root rank of Broadcast / Reduce, else -1) |
/// | `send_buff`, `recv_buff` | Coll (addresses); P2p: the one buffer in `send_buff` (Send) or `recv_buff` (Recv) |
/// | `stream` | CollApi, P2pApi, KernelLaunch (the stream handle) |
/// | `graph_captured` | GroupApi, CollApi, P2pApi |
/// | `group_depth` | GroupApi (the group depth when it started) |
/// | `peer` | P2p, ProxyOp |
/// | `algo`, `proto` | Coll (`"RING"`, `"SIMPLE"`, ...) |
/// | `n_channels` | Coll, P2p |
/// | `n_warps` | Coll |
/// | `channel_id` | ProxyOp, KernelCh |
/// | `n_steps`, `chunk_size`, `is_send` | ProxyOp |
/// | `step` | ProxyStep |
/// | `net_plugin_id`, `net_data` | NetPlugin (`net_plugin_id`: see [`net_plugin_type`]; `net_data`: the net plugin's own data, an address) |
/// | `user_tag` | CollApi, Coll (the call's `ncclCollConfig_t::userProfilerTag` / typed `CollConfig::profiler_tag`); P2pApi, P2p (0: send and receive take no config); 0 = untagged (v3 on) |
///
/// The strings are borrowed for the duration of the call only; a plugin copies what it keeps.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct EventDescr<'a> {
    /// One [`event_type`] bit.
    pub event_type: u32,
    pub rank: i32,
    pub parent: PluginHandle,
    pub func: RStr<'a>,
    pub seq_number: u64,
    pub count: usize,
    pub datatype: RStr<'a>,
    pub root: i32,
    pub peer: i32,
    pub algo: RStr<'a>,
    pub proto: RStr<'a>,
    pub n_channels: i32,
    pub n_warps: i32,
    pub channel_id: i32,
    pub n_steps: i32,
    pub chunk_size: i32,
    pub step: i32,
    pub is_send: bool,
    pub net_plugin_id: i64,
    pub net_data: usize,
    pub parent_group: PluginHandle,
    pub send_buff: usize,
    pub recv_buff: usize,
    pub stream: usize,
    pub graph_captured: bool,
    pub group_depth: i32,
    /// The caller's profiler tag (0: untagged). NCCL reserves the values with the top bit set.
    pub user_tag: u64,
}

impl<'a> EventDescr<'a> {
    /// An event of `event_type` under `parent` (0 = none) on `rank`, every other field
    /// "does not apply". Fill the fields of the type with struct update syntax:
    /// `EventDescr { func: RStr::from_str("AllReduce"), ..EventDescr::new(COLL, parent, 0) }`.
    pub const fn new(event_type: u32, parent: PluginHandle, rank: i32) -> EventDescr<'a> {
        EventDescr {
            event_type,
            rank,
            parent,
            func: RStr::from_str(""),
            seq_number: 0,
            count: 0,
            datatype: RStr::from_str(""),
            root: -1,
            peer: -1,
            algo: RStr::from_str(""),
            proto: RStr::from_str(""),
            n_channels: 0,
            n_warps: 0,
            channel_id: -1,
            n_steps: 0,
            chunk_size: 0,
            step: -1,
            is_send: false,
            net_plugin_id: 0,
            net_data: 0,
            parent_group: PluginHandle { id: 0 },
            send_buff: 0,
            recv_buff: 0,
            stream: 0,
            graph_captured: false,
            group_depth: 0,
            user_tag: 0,
        }
    }

    /// The parent handle, `None` for 0.
    pub fn parent(&self) -> Option<PluginHandle> {
        (self.parent.id != 0).then_some(self.parent)
    }
}

/// Extra data of a state change (NCCL's `ncclProfilerEventStateArgs`); fields that do not
/// apply are 0.
///
/// | field | applies to states |
/// |---|---|
/// | `trans_size` | ProxyStep (bytes moved so far) |
/// | `appended_proxy_ops` | ProxyCtrlAppend, ProxyCtrlAppendEnd |
/// | `net_data` | NetPluginUpdate (the net plugin's data, an address) |
/// | `p_timer` | KernelChStop (the channel's stop timer, nanoseconds, as its start's `seq_number`) |
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateArgs {
    pub trans_size: usize,
    pub appended_proxy_ops: i32,
    pub net_data: usize,
    pub p_timer: u64,
}

/// The profiler plugin interface.
pub trait Profiler: Send + Sync {
    /// Starts the profiler for one communicator (`comm_name` may be empty); returns its
    /// context and the [`event_type`] mask of the events it wants. Context `0`: switched off
    /// for this communicator (no event, no `finalize`).
    fn init(
        &self,
        comm_id: u64,
        comm_name: &str,
        nnodes: usize,
        nranks: usize,
        rank: usize,
        log: LogFn,
    ) -> Result<(PluginHandle, u32), PluginError>;
    /// Starts an event; returns its handle, or handle 0 when the plugin does not track it.
    fn start_event(&self, ctx: PluginHandle, descr: &EventDescr<'_>) -> Result<PluginHandle, PluginError>;
    /// Stops a started event.
    fn stop_event(&self, event: PluginHandle) -> Result<(), PluginError>;
    /// Records that a running event entered `state` (a [`state`] number).
    fn record_event_state(&self, event: PluginHandle, state: u32, args: &StateArgs) -> Result<(), PluginError>;
    /// Ends the communicator's context.
    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError>;
}

/// The exported table of profiler ABI v3 (`rustccl_profiler_v3`).
#[repr(C)]
#[derive(StableAbi)]
pub struct ProfilerV3 {
    /// The plugin's name, for log lines.
    pub name: RStr<'static>,
    /// Writes the wanted [`event_type`] mask to `event_mask`.
    pub init: extern "C" fn(
        comm_id: u64,
        comm_name: RStr<'_>,
        nnodes: usize,
        nranks: usize,
        rank: usize,
        log: LogFn,
        event_mask: &mut u32,
    ) -> PResult<PluginHandle>,
    /// Handle id 0: not tracked.
    pub start_event: extern "C" fn(ctx: PluginHandle, descr: &EventDescr<'_>) -> PResult<PluginHandle>,
    pub stop_event: extern "C" fn(event: PluginHandle) -> PResult<()>,
    pub record_event_state: extern "C" fn(event: PluginHandle, state: u32, args: &StateArgs) -> PResult<()>,
    pub finalize: extern "C" fn(ctx: PluginHandle) -> PResult<()>,
}

/// Where the exported shims find the plugin's instance.
pub trait ProfilerProvider: 'static {
    fn get() -> &'static dyn Profiler;
}

pub(crate) extern "C" fn init_shim<P: ProfilerProvider>(
    comm_id: u64,
    comm_name: RStr<'_>,
    nnodes: usize,
    nranks: usize,
    rank: usize,
    log: LogFn,
    event_mask: &mut u32,
) -> PResult<PluginHandle> {
    call_guarded(|| {
        let (ctx, mask) = P::get().init(comm_id, comm_name.as_str(), nnodes, nranks, rank, log)?;
        *event_mask = mask;
        Ok(ctx)
    })
}
extern "C" fn start_event_shim<P: ProfilerProvider>(ctx: PluginHandle, descr: &EventDescr<'_>) -> PResult<PluginHandle> {
    call_guarded(|| P::get().start_event(ctx, descr))
}
pub(crate) extern "C" fn stop_event_shim<P: ProfilerProvider>(event: PluginHandle) -> PResult<()> {
    call_guarded(|| P::get().stop_event(event))
}
pub(crate) extern "C" fn record_event_state_shim<P: ProfilerProvider>(event: PluginHandle, state: u32, args: &StateArgs) -> PResult<()> {
    call_guarded(|| P::get().record_event_state(event, state, args))
}
pub(crate) extern "C" fn finalize_shim<P: ProfilerProvider>(ctx: PluginHandle) -> PResult<()> {
    call_guarded(|| P::get().finalize(ctx))
}

impl ProfilerV3 {
    /// The table whose functions call `P::get()`.
    pub const fn table<P: ProfilerProvider>(name: &'static str) -> ProfilerV3 {
        ProfilerV3 {
            name: RStr::from_str(name),
            init: init_shim::<P>,
            start_event: start_event_shim::<P>,
            stop_event: stop_event_shim::<P>,
            record_event_state: record_event_state_shim::<P>,
            finalize: finalize_shim::<P>,
        }
    }
}

/// Exports a profiler from a cdylib at ABI version `v1` (symbol `rustccl_profiler_v1`, table
/// [`ProfilerV1`](crate::profiler_v1::ProfilerV1)), `v2` (`rustccl_profiler_v2`,
/// [`ProfilerV2`](crate::profiler_v2::ProfilerV2)) or `v3` (`rustccl_profiler_v3`, [`ProfilerV3`]):
/// `export_profiler!(v3, "name", Type, constructor_expr);` (an instance of its own, built on
/// first use) or `export_profiler!(v3, "name", provider = MyProvider);` (share one
/// [`ProfilerProvider`] between the exports of several versions). `export_profiler_v1!`,
/// `export_profiler_v2!` and `export_profiler_v3!` are the same without the version argument.
#[macro_export]
macro_rules! export_profiler {
    (v1, $($rest:tt)*) => {
        $crate::export_profiler!(@table profiler_v1::ProfilerV1, rustccl_profiler_v1, $($rest)*);
    };
    (v2, $($rest:tt)*) => {
        $crate::export_profiler!(@table profiler_v2::ProfilerV2, rustccl_profiler_v2, $($rest)*);
    };
    (v3, $($rest:tt)*) => {
        $crate::export_profiler!(@table profiler::ProfilerV3, rustccl_profiler_v3, $($rest)*);
    };
    (@table $module:ident :: $table:ident, $symbol:ident, $name:expr, provider = $provider:path) => {
        const _: () = {
            static TABLE: $crate::$module::$table = $crate::$module::$table::table::<$provider>($name);
            #[no_mangle]
            #[used]
            #[allow(non_upper_case_globals)]
            pub static $symbol: $crate::export::PluginExport<$crate::$module::$table> =
                $crate::export::PluginExport::new(&TABLE);
        };
    };
    (@table $module:ident :: $table:ident, $symbol:ident, $name:expr, $ty:ty, $ctor:expr) => {
        const _: () = {
            static INSTANCE: ::std::sync::OnceLock<$ty> = ::std::sync::OnceLock::new();
            struct Provider;
            impl $crate::profiler::ProfilerProvider for Provider {
                fn get() -> &'static dyn $crate::profiler::Profiler {
                    INSTANCE.get_or_init(|| $ctor)
                }
            }
            $crate::export_profiler!(@table $module :: $table, $symbol, $name, provider = Provider);
        };
    };
}

/// [`export_profiler!`](crate::export_profiler)`(v1, ...)`.
#[macro_export]
macro_rules! export_profiler_v1 {
    ($($args:tt)*) => { $crate::export_profiler!(v1, $($args)*); };
}

/// [`export_profiler!`](crate::export_profiler)`(v2, ...)`.
#[macro_export]
macro_rules! export_profiler_v2 {
    ($($args:tt)*) => { $crate::export_profiler!(v2, $($args)*); };
}

/// [`export_profiler!`](crate::export_profiler)`(v3, ...)`.
#[macro_export]
macro_rules! export_profiler_v3 {
    ($($args:tt)*) => { $crate::export_profiler!(v3, $($args)*); };
}

/// A loaded library's v3 table, seen through the [`Profiler`] trait.
pub struct ProfilerV3Client {
    pub table: &'static ProfilerV3,
}

impl ProfilerV3Client {
    pub fn name(&self) -> &'static str {
        self.table.name.as_str()
    }
}

pub(crate) fn into<T>(r: PResult<T>) -> Result<T, PluginError> {
    r.into_result()
}

impl Profiler for ProfilerV3Client {
    fn init(
        &self,
        comm_id: u64,
        comm_name: &str,
        nnodes: usize,
        nranks: usize,
        rank: usize,
        log: LogFn,
    ) -> Result<(PluginHandle, u32), PluginError> {
        let mut mask = 0;
        let ctx = into((self.table.init)(comm_id, RStr::from_str(comm_name), nnodes, nranks, rank, log, &mut mask))?;
        Ok((ctx, mask))
    }
    fn start_event(&self, ctx: PluginHandle, descr: &EventDescr<'_>) -> Result<PluginHandle, PluginError> {
        into((self.table.start_event)(ctx, descr))
    }
    fn stop_event(&self, event: PluginHandle) -> Result<(), PluginError> {
        into((self.table.stop_event)(event))
    }
    fn record_event_state(&self, event: PluginHandle, state: u32, args: &StateArgs) -> Result<(), PluginError> {
        into((self.table.record_event_state)(event, state, args))
    }
    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        into((self.table.finalize)(ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HandleRegistry;
    use std::sync::Mutex;

    /// Tracks Coll and ProxyStep events; logs what it sees.
    struct TestProfiler {
        ctxs: HandleRegistry<String>,
        events: HandleRegistry<String>,
        log: Mutex<Vec<String>>,
    }

    impl Profiler for TestProfiler {
        fn init(&self, comm_id: u64, comm_name: &str, nnodes: usize, nranks: usize, rank: usize, _log: LogFn) -> Result<(PluginHandle, u32), PluginError> {
            if comm_name == "fail" {
                return Err(PluginError::invalid_usage("no"));
            }
            let ctx = self.ctxs.insert(format!("{comm_id}/{comm_name}/{nnodes}/{nranks}/{rank}"));
            Ok((ctx, event_type::COLL | event_type::PROXY_STEP))
        }
        fn start_event(&self, ctx: PluginHandle, d: &EventDescr<'_>) -> Result<PluginHandle, PluginError> {
            let comm = self.ctxs.with(ctx, |c| c.clone()).ok_or_else(|| PluginError::invalid_argument("ctx"))?;
            if d.event_type == event_type::GROUP {
                return Ok(PluginHandle { id: 0 });
            }
            let what = format!(
                "{comm} {} {} parent={:?} {} {} {} {} step={} tag={}",
                event_type::name(d.event_type).unwrap(),
                d.func,
                d.parent(),
                d.count,
                d.datatype,
                d.algo,
                d.proto,
                d.step,
                d.user_tag
            );
            Ok(self.events.insert(what))
        }
        fn stop_event(&self, event: PluginHandle) -> Result<(), PluginError> {
            let e = self.events.remove(event).ok_or_else(|| PluginError::invalid_argument("event"))?;
            self.log.lock().unwrap().push(e);
            Ok(())
        }
        fn record_event_state(&self, event: PluginHandle, st: u32, args: &StateArgs) -> Result<(), PluginError> {
            let e = self.events.with(event, |e| e.clone()).ok_or_else(|| PluginError::invalid_argument("event"))?;
            self.log.lock().unwrap().push(format!("{e}: {} {}", state::name(st).unwrap_or("?"), args.trans_size));
            Ok(())
        }
        fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
            self.ctxs.remove(ctx).map(drop).ok_or_else(|| PluginError::invalid_argument("ctx"))
        }
    }

    static PROFILER: TestProfiler =
        TestProfiler { ctxs: HandleRegistry::new(), events: HandleRegistry::new(), log: Mutex::new(Vec::new()) };
    struct Provider;
    impl ProfilerProvider for Provider {
        fn get() -> &'static dyn Profiler {
            &PROFILER
        }
    }
    static TABLE: ProfilerV3 = ProfilerV3::table::<Provider>("test-prof");
    crate::export_profiler!(v3, "macro-test", provider = Provider);

    extern "C" fn quiet(_level: i32, _subsys: u64, _message: RStr<'_>) {}

    #[test]
    fn round_trip_through_table() {
        let client = ProfilerV3Client { table: &TABLE };
        assert_eq!(client.name(), "test-prof");
        let log = LogFn { log: quiet };
        let err = client.init(1, "fail", 1, 2, 0, log).unwrap_err();
        assert_eq!(err.code, PluginError::INVALID_USAGE);
        let (ctx, mask) = client.init(9, "world", 1, 2, 1, log).unwrap();
        assert_eq!(mask, event_type::COLL | event_type::PROXY_STEP);
        let group = client.start_event(ctx, &EventDescr::new(event_type::GROUP, PluginHandle { id: 0 }, 1)).unwrap();
        assert_eq!(group.id, 0, "not tracked");
        let func = String::from("AllReduce"); // a borrowed, non-'static string
        let coll = client
            .start_event(
                ctx,
                &EventDescr {
                    func: RStr::from_str(&func),
                    count: 1024,
                    datatype: RStr::from_str("ncclFloat32"),
                    algo: RStr::from_str("RING"),
                    proto: RStr::from_str("SIMPLE"),
                    user_tag: 42,
                    ..EventDescr::new(event_type::COLL, group, 1)
                },
            )
            .unwrap();
        let step = client
            .start_event(ctx, &EventDescr { step: 4, ..EventDescr::new(event_type::PROXY_STEP, coll, 1) })
            .unwrap();
        client
            .record_event_state(step, state::PROXY_STEP_SEND_WAIT, &StateArgs { trans_size: 512, ..Default::default() })
            .unwrap();
        client.stop_event(step).unwrap();
        client.stop_event(coll).unwrap();
        assert_eq!(client.stop_event(coll).unwrap_err().code, PluginError::INVALID_ARGUMENT);
        client.finalize(ctx).unwrap();
        let log = PROFILER.log.lock().unwrap().clone();
        assert_eq!(
            log,
            vec![
                format!("9/world/1/2/1 ProxyStep  parent={:?} 0    step=4 tag=0: ProxyStepSendWait 512", Some(coll)),
                format!("9/world/1/2/1 ProxyStep  parent={:?} 0    step=4 tag=0", Some(coll)),
                "9/world/1/2/1 Coll AllReduce parent=None 1024 ncclFloat32 RING SIMPLE step=-1 tag=42".to_string(),
            ]
        );
    }

    #[test]
    fn a_v2_plugin_is_refused_as_v3_and_the_other_way_round() {
        use crate::export::PluginExport;
        use crate::profiler_v2::ProfilerV2;
        use abi_stable::abi_stability::abi_checking::check_layout_compatibility;
        static V2: ProfilerV2 = ProfilerV2::table::<Provider>("test-prof");
        static E2: PluginExport<ProfilerV2> = PluginExport::new(&V2);
        static E3: PluginExport<ProfilerV3> = PluginExport::new(&TABLE);
        check_layout_compatibility(<ProfilerV3 as StableAbi>::LAYOUT, E3.layout).unwrap();
        check_layout_compatibility(<ProfilerV2 as StableAbi>::LAYOUT, E2.layout).unwrap();
        // The tag changed the descriptor: the host must never read a v2 table as v3.
        assert!(check_layout_compatibility(<ProfilerV3 as StableAbi>::LAYOUT, E2.layout).is_err());
        assert!(check_layout_compatibility(<ProfilerV2 as StableAbi>::LAYOUT, E3.layout).is_err());
    }

    #[test]
    fn names_follow_nccl() {
        assert_eq!(state::name(state::PROXY_OP_SEND_POSTED), Some("ProxyOpSendPosted"));
        assert_eq!(state::name(state::PROXY_STEP_SEND_GPU_WAIT), Some("ProxyStepSendGPUWait"));
        assert_eq!(state::name(state::PROXY_CTRL_APPEND_END), Some("ProxyCtrlAppendEnd"));
        assert_eq!(state::name(state::KERNEL_CH_STOP), Some("KernelChStop"));
        assert_eq!(state::name(state::GROUP_END_API_START), Some("GroupEndApiStart"));
        assert_eq!(state::name(25), None);
        let all: u32 = (0..8).map(|b| 1u32 << b).filter(|t| event_type::name(*t).is_some()).sum();
        assert_eq!(all | 0xf00, event_type::ALL);
        assert_eq!(event_type::name(event_type::COLL_API), Some("CollApi"));
        assert_eq!(event_type::name(event_type::NET_PLUGIN), Some("NetPlugin"));
        assert_eq!(event_type::name(3), None);
    }
}
