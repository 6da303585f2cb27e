//! NCCL's C profiler plugins (`ncclProfiler_v1` … `ncclProfiler_v7`), seen through the core's
//! [`Profiler`] trait.
//!
//! Each version's table, event descriptor (a tagged union) and state arguments are declared
//! here with NCCL's layouts (`src/include/plugin/profiler/profiler_vN.h`). The core's flat
//! [`EventDescr`] is translated into the version's descriptor for the call (names as C
//! strings that outlive it); what a version does not know is not sent, as NCCL's own
//! adapters do (`src/plugin/profiler/profiler_vN.cc`):
//!
//! - v1, v2: Group, Coll, P2p, ProxyOp, ProxyStep, ProxyCtrl; v1 takes the function, data
//!   type, algorithm and protocol as numbers.
//! - v3, v4: also KernelCh and NetPlugin events; v4 also the states ProxyOpInProgress,
//!   ProxyStepSendPeerWait, NetPluginUpdate and KernelChStop.
//! - v5, v6: also the API events (GroupApi, CollApi, P2pApi, KernelLaunch) and the group API
//!   states. Before v5 a collective's parent is its group (`parent_group`); from v5 on it is
//!   its API event, with the group in `parentGroup`.
//! - v7: also the caller's profiler tag (`userTag`: `ncclCollConfig_t::userProfilerTag`, 0 when
//!   untagged) on CollApi, P2pApi, Coll and P2p (send and receive take no config: 0), and on
//!   Coll `kernelVariant` (an empty string: rustccl's kernels have no variants of NCCL's
//!   names) and `isSymColl` (false). v7's KernelPhase events (bit `1 << 15`) are never sent:
//!   rustccl's kernels report no barrier phases, and the mask is cut to the types up to
//!   KernelLaunch as for v5 and v6.
//!
//! The event mask a plugin asks for at `init` is cut to what its version knows. Event and
//! context handles are the plugin's pointers. Only `init` may fail (its code is checked);
//! `name` and `recordEventState` may be NULL, the other members may not. An `init` that
//! succeeds with a NULL context switches the profiler off for that communicator: the core
//! calls nothing else for it, not even `finalize` (see [`super::profiler::select`]).
//!
//! How long what the adapter hands the plugin stays valid (NCCL's rules, which plugins rely
//! on):
//!
//! - `commName` (init, v4 on): until after that context's `finalize`. NCCL passes
//!   `comm->config.commName`, alive as long as the communicator, and plugins keep the
//!   pointer (NCCL's example profiler prints it at finalize): see `CommNames`.
//! - The strings of event descriptors (function, data type, algorithm, protocol): for the
//!   life of the process. NCCL passes static strings, and plugins keep them in their events
//!   to read at stop or finalize: see `c_name`. The `name` of v1 … v3's Coll / P2p is NULL,
//!   as NCCL's adapters pass it.
//! - `parentObj` and `parentGroup`: handles the plugin returned from `startEvent`. As in
//!   NCCL, an API event may already be stopped when its Coll / P2p starts; the core keeps
//!   every other parent running until its children stop.
//! - The descriptor and the state arguments themselves, and the buffers and streams they
//!   name by address: for the call (as NCCL's, which are on its stack).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Arc, Mutex};

use abi_stable::std_types::RStr;
use rustccl_plugin_api::profiler::{event_type as ty, state, EventDescr, Profiler, StateArgs};
use rustccl_plugin_api::{Algorithm, CollType, LogFn, PluginError, PluginHandle, Protocol};

mod layout;

use layout::*;

use super::c_abi;
use super::library::PluginLibrary;
use super::profiler::ProfilerPlugin;
use super::Plugin;

// ---------------------------------------------------------------------------------------
// Names as C strings.

/// A C string for a name of the core's descriptors (functions, types, algorithms,
/// protocols: a small set, interned for the life of the process). NCCL passes static strings
/// there, and a plugin may keep the pointer past the call (to read at stop or finalize), so
/// no name may be a temporary.
fn c_name(s: RStr<'_>) -> *const c_char {
    static NAMES: Mutex<Option<HashMap<Box<str>, &'static CStr>>> = Mutex::new(None);
    let s = s.as_str();
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    let map = names.get_or_insert_with(HashMap::new);
    if let Some(c) = map.get(s) {
        return c.as_ptr();
    }
    let owned = CString::new(s.replace('\0', "")).unwrap_or_default();
    let leaked: &'static CStr = Box::leak(owned.into_boxed_c_str());
    map.insert(s.into(), leaked);
    leaked.as_ptr()
}

fn ptr(v: usize) -> *mut c_void {
    v as *mut c_void
}

fn handle_ptr(h: PluginHandle) -> *mut c_void {
    h.id as usize as *mut c_void
}

/// NCCL's numbers for v1's descriptors (unknown names as NCCL's adapter maps them).
fn func_number(s: &str) -> u8 {
    [CollType::AllGather, CollType::AllReduce, CollType::Broadcast, CollType::Recv, CollType::Reduce, CollType::ReduceScatter, CollType::SendRecv]
        .into_iter()
        .find(|c| c.name() == s)
        .unwrap_or(CollType::Send) as u8
}

fn algo_number(s: &str) -> u8 {
    Algorithm::ALL.iter().find(|a| a.name() == s).copied().unwrap_or(Algorithm::Pat) as u8
}

fn proto_number(s: &str) -> u8 {
    Protocol::ALL.iter().find(|p| p.name() == s).copied().unwrap_or(Protocol::Simple) as u8
}

fn datatype_number(s: &str) -> u8 {
    crate::types::DataType::ALL
        .iter()
        .find(|t| super::profiler_events::nccl_type_name(**t) == s)
        .map_or(crate::types::DataType::Float64 as u8, |t| *t as u8)
}

// ---------------------------------------------------------------------------------------
// Translation of the core's descriptor, per version.

fn proxy_op(d: &EventDescr<'_>) -> ProxyOpD {
    ProxyOpD {
        pid: std::process::id() as c_int,
        channel_id: d.channel_id.max(0) as u8,
        peer: d.peer,
        n_steps: d.n_steps,
        chunk_size: d.chunk_size,
        is_send: d.is_send as c_int,
    }
}

/// Before v5 a collective's or p2p's parent is its group.
fn parent_before_v5(d: &EventDescr<'_>) -> *mut c_void {
    match d.event_type {
        ty::COLL | ty::P2P => handle_ptr(d.parent_group),
        _ => handle_ptr(d.parent),
    }
}

fn descr_v1(d: &EventDescr<'_>) -> Option<DescrV1> {
    let u = match d.event_type {
        ty::GROUP | ty::PROXY_CTRL => UnionV1 { _room: [0; 16] },
        ty::COLL => UnionV1 {
            coll: CollV1 {
                name: std::ptr::null(),
                comm_hash: 0,
                seq_number: d.seq_number,
                func: func_number(d.func.as_str()),
                send_buff: ptr(d.send_buff),
                recv_buff: ptr(d.recv_buff),
                count: d.count,
                root: d.root,
                datatype: datatype_number(d.datatype.as_str()),
                op: 0,
                traffic_bytes: 0,
                n_max_channels: d.n_channels as u8,
                n_warps: d.n_warps as u8,
                algo: algo_number(d.algo.as_str()),
                proto: proto_number(d.proto.as_str()),
                is_collnet: 0,
                is_nvls: 0,
            },
        },
        ty::P2P => UnionV1 {
            p2p: P2pV1 {
                name: std::ptr::null(),
                comm_hash: 0,
                func: func_number(d.func.as_str()),
                buff: ptr(d.send_buff.max(d.recv_buff)),
                datatype: datatype_number(d.datatype.as_str()),
                count: d.count,
                peer: d.peer,
            },
        },
        ty::PROXY_OP => UnionV1 { proxy_op: proxy_op(d) },
        ty::PROXY_STEP => UnionV1 { proxy_step: ProxyStepD { step: d.step } },
        _ => return None,
    };
    Some(Descr { event_type: d.event_type as u8, parent_obj: parent_before_v5(d), rank: d.rank, u })
}

fn p2p_v2(d: &EventDescr<'_>) -> P2pV2 {
    P2pV2 {
        name: std::ptr::null(),
        comm_hash: 0,
        func: c_name(d.func),
        buff: ptr(d.send_buff.max(d.recv_buff)),
        datatype: c_name(d.datatype),
        count: d.count,
        peer: d.peer,
    }
}

fn descr_v2(d: &EventDescr<'_>) -> Option<DescrV2> {
    let u = match d.event_type {
        ty::GROUP | ty::PROXY_CTRL => UnionV2 { _room: [0; 16] },
        ty::COLL => UnionV2 {
            coll: CollV2 {
                name: std::ptr::null(),
                comm_hash: 0,
                seq_number: d.seq_number,
                func: c_name(d.func),
                send_buff: ptr(d.send_buff),
                recv_buff: ptr(d.recv_buff),
                count: d.count,
                root: d.root,
                datatype: c_name(d.datatype),
                traffic_bytes: 0,
                n_max_channels: d.n_channels as u8,
                n_warps: d.n_warps as u8,
                algo: c_name(d.algo),
                proto: c_name(d.proto),
            },
        },
        ty::P2P => UnionV2 { p2p: p2p_v2(d) },
        ty::PROXY_OP => UnionV2 { proxy_op: proxy_op(d) },
        ty::PROXY_STEP => UnionV2 { proxy_step: ProxyStepD { step: d.step } },
        _ => return None,
    };
    Some(Descr { event_type: d.event_type as u8, parent_obj: parent_before_v5(d), rank: d.rank, u })
}

fn descr_v3(d: &EventDescr<'_>) -> Option<DescrV3> {
    let u = match d.event_type {
        ty::GROUP | ty::PROXY_CTRL => UnionV3 { _room: [0; 16] },
        ty::COLL => UnionV3 {
            coll: CollV3 {
                name: std::ptr::null(),
                comm_hash: 0,
                seq_number: d.seq_number,
                func: c_name(d.func),
                send_buff: ptr(d.send_buff),
                recv_buff: ptr(d.recv_buff),
                count: d.count,
                root: d.root,
                datatype: c_name(d.datatype),
                n_max_channels: d.n_channels as u8,
                n_warps: d.n_warps as u8,
                algo: c_name(d.algo),
                proto: c_name(d.proto),
            },
        },
        ty::P2P => UnionV3 { p2p: p2p_v2(d) },
        ty::PROXY_OP => UnionV3 { proxy_op: proxy_op(d) },
        ty::PROXY_STEP => UnionV3 { proxy_step: ProxyStepD { step: d.step } },
        ty::KERNEL_CH => UnionV3 { kernel_ch: KernelChV3 { channel_id: d.channel_id.max(0) as u8 } },
        ty::NET_PLUGIN => UnionV3 { net_plugin: NetPluginD { id: d.net_plugin_id, data: ptr(d.net_data) } },
        _ => return None,
    };
    Some(Descr { event_type: d.event_type as u8, parent_obj: parent_before_v5(d), rank: d.rank, u })
}

fn coll_v4(d: &EventDescr<'_>) -> CollV4 {
    CollV4 {
        seq_number: d.seq_number,
        func: c_name(d.func),
        send_buff: ptr(d.send_buff),
        recv_buff: ptr(d.recv_buff),
        count: d.count,
        root: d.root,
        datatype: c_name(d.datatype),
        n_channels: d.n_channels as u8,
        n_warps: d.n_warps as u8,
        algo: c_name(d.algo),
        proto: c_name(d.proto),
    }
}

fn p2p_v4(d: &EventDescr<'_>) -> P2pV4 {
    P2pV4 {
        func: c_name(d.func),
        buff: ptr(d.send_buff.max(d.recv_buff)),
        datatype: c_name(d.datatype),
        count: d.count,
        peer: d.peer,
        n_channels: d.n_channels as u8,
    }
}

/// A KernelCh's channel and start timer (the core's descriptor carries the timer in
/// `seq_number`, see [`EventDescr`]).
fn kernel_ch_v4(d: &EventDescr<'_>) -> KernelChV4 {
    KernelChV4 { channel_id: d.channel_id.max(0) as u8, p_timer: d.seq_number }
}

fn descr_v4(d: &EventDescr<'_>) -> Option<DescrV4> {
    let u = match d.event_type {
        ty::GROUP | ty::PROXY_CTRL => UnionV4 { _room: [0; 16] },
        ty::COLL => UnionV4 { coll: coll_v4(d) },
        ty::P2P => UnionV4 { p2p: p2p_v4(d) },
        ty::PROXY_OP => UnionV4 { proxy_op: proxy_op(d) },
        ty::PROXY_STEP => UnionV4 { proxy_step: ProxyStepD { step: d.step } },
        ty::KERNEL_CH => UnionV4 { kernel_ch: kernel_ch_v4(d) },
        ty::NET_PLUGIN => UnionV4 { net_plugin: NetPluginD { id: d.net_plugin_id, data: ptr(d.net_data) } },
        _ => return None,
    };
    Some(Descr { event_type: d.event_type as u8, parent_obj: parent_before_v5(d), rank: d.rank, u })
}

fn coll_api_v5(d: &EventDescr<'_>) -> CollApiD {
    CollApiD {
        func: c_name(d.func),
        count: d.count,
        datatype: c_name(d.datatype),
        root: d.root,
        stream: ptr(d.stream),
        graph_captured: d.graph_captured,
    }
}

fn p2p_api_v5(d: &EventDescr<'_>) -> P2pApiD {
    P2pApiD {
        func: c_name(d.func),
        count: d.count,
        datatype: c_name(d.datatype),
        stream: ptr(d.stream),
        graph_captured: d.graph_captured,
    }
}

fn coll_v5(d: &EventDescr<'_>) -> CollV5 {
    CollV5 { v4: coll_v4(d), parent_group: handle_ptr(d.parent_group) }
}

fn p2p_v5(d: &EventDescr<'_>) -> P2pV5 {
    P2pV5 { v4: p2p_v4(d), parent_group: handle_ptr(d.parent_group) }
}

fn descr_v5(d: &EventDescr<'_>) -> Option<DescrV5> {
    let u = match d.event_type {
        ty::GROUP | ty::PROXY_CTRL => UnionV5 { _room: [0; 16] },
        ty::GROUP_API => UnionV5 { group_api: GroupApiD { graph_captured: d.graph_captured, group_depth: d.group_depth } },
        ty::COLL_API => UnionV5 { coll_api: coll_api_v5(d) },
        ty::P2P_API => UnionV5 { p2p_api: p2p_api_v5(d) },
        ty::KERNEL_LAUNCH => UnionV5 { kernel_launch: KernelLaunchD { stream: ptr(d.stream) } },
        ty::COLL => UnionV5 { coll: coll_v5(d) },
        ty::P2P => UnionV5 { p2p: p2p_v5(d) },
        ty::PROXY_OP => UnionV5 { proxy_op: proxy_op(d) },
        ty::PROXY_STEP => UnionV5 { proxy_step: ProxyStepD { step: d.step } },
        ty::KERNEL_CH => UnionV5 { kernel_ch: kernel_ch_v4(d) },
        ty::NET_PLUGIN => UnionV5 { net_plugin: NetPluginD { id: d.net_plugin_id, data: ptr(d.net_data) } },
        _ => return None,
    };
    Some(Descr { event_type: u64::from(d.event_type), parent_obj: handle_ptr(d.parent), rank: d.rank, u })
}

/// v7: v5's descriptor with the tag on the API, Coll and P2p events.
fn descr_v7(d: &EventDescr<'_>) -> Option<DescrV7> {
    let user_tag = d.user_tag;
    let u = match d.event_type {
        ty::GROUP | ty::PROXY_CTRL => UnionV7 { _room: [0; 16] },
        ty::GROUP_API => UnionV7 { group_api: GroupApiD { graph_captured: d.graph_captured, group_depth: d.group_depth } },
        ty::COLL_API => UnionV7 { coll_api: CollApiV7 { v5: coll_api_v5(d), user_tag } },
        ty::P2P_API => UnionV7 { p2p_api: P2pApiV7 { v5: p2p_api_v5(d), user_tag } },
        ty::KERNEL_LAUNCH => UnionV7 { kernel_launch: KernelLaunchD { stream: ptr(d.stream) } },
        ty::COLL => UnionV7 {
            coll: CollV7 { v5: coll_v5(d), kernel_variant: c_name(RStr::from_str("")), is_sym_coll: false, user_tag },
        },
        ty::P2P => UnionV7 { p2p: P2pV7 { v5: p2p_v5(d), user_tag } },
        ty::PROXY_OP => UnionV7 { proxy_op: proxy_op(d) },
        ty::PROXY_STEP => UnionV7 { proxy_step: ProxyStepD { step: d.step } },
        ty::KERNEL_CH => UnionV7 { kernel_ch: kernel_ch_v4(d) },
        ty::NET_PLUGIN => UnionV7 { net_plugin: NetPluginD { id: d.net_plugin_id, data: ptr(d.net_data) } },
        _ => return None,
    };
    Some(Descr { event_type: u64::from(d.event_type), parent_obj: handle_ptr(d.parent), rank: d.rank, u })
}

fn is_proxy_ctrl(st: u32) -> bool {
    (state::PROXY_CTRL_IDLE..=state::PROXY_CTRL_APPEND_END).contains(&st)
}

fn is_proxy_step(st: u32) -> bool {
    (state::PROXY_STEP_SEND_GPU_WAIT..=state::PROXY_STEP_RECV_GPU_WAIT).contains(&st)
}

/// v1 … v3: proxy-control states (with the appended ops) and the old proxy-step states.
fn args_v1(st: u32, a: &StateArgs) -> Option<ArgsV1> {
    if is_proxy_ctrl(st) {
        return Some(ArgsV1 { appended_proxy_ops: a.appended_proxy_ops });
    }
    is_proxy_step(st).then_some(ArgsV1 { proxy_op: ProxyOpArgsV1 { trans_size: 0, steps: 0 } })
}

/// v4 … v7 (`api_states`: v5 on, the group API states too).
fn args_v4(st: u32, a: &StateArgs, api_states: bool) -> Option<ArgsV4> {
    Some(match st {
        s if is_proxy_step(s) || s == state::PROXY_STEP_SEND_PEER_WAIT => ArgsV4 { trans_size: a.trans_size },
        s if is_proxy_ctrl(s) => ArgsV4 { appended_proxy_ops: a.appended_proxy_ops },
        state::PROXY_OP_IN_PROGRESS => ArgsV4 { p_timer: 0 },
        state::NET_PLUGIN_UPDATE => ArgsV4 { data: ptr(a.net_data) },
        state::KERNEL_CH_STOP => ArgsV4 { p_timer: a.p_timer },
        state::GROUP_START_API_STOP | state::GROUP_END_API_START if api_states => ArgsV4 { p_timer: 0 },
        _ => return None,
    })
}

/// The event types each version knows and the core sends (v7's KernelPhase, `1 << 15`,
/// never: cut from the mask).
fn known_types(version: u32) -> u32 {
    match version {
        1 | 2 => ty::GROUP | ty::COLL | ty::P2P | ty::PROXY_OP | ty::PROXY_STEP | ty::PROXY_CTRL,
        3 | 4 => 0xff,
        _ => ty::ALL,
    }
}

// ---------------------------------------------------------------------------------------
// The adapter.

enum Tables {
    V1(&'static ProfilerV1),
    V2(&'static ProfilerV2),
    V3(&'static ProfilerV3),
    V4(&'static ProfilerV4),
    V5(&'static ProfilerV5),
    V6(&'static ProfilerV6),
    V7(&'static ProfilerV7),
}

/// The communicator names given to a plugin's `init`, kept per context it returned until
/// after that context's `finalize` (NCCL's `commName` lives as long as the communicator, and
/// plugins keep the pointer).
///
/// A plugin may return the same context for several communicators: their names then stay
/// until the last of them is finalized. A name given to an `init` that fails or returns a
/// NULL context is freed when `init` returns: the core calls nothing else for that
/// communicator, so the plugin has no call left in which to read it.
#[derive(Default)]
struct CommNames(Mutex<HashMap<usize, (usize, Vec<CString>)>>);

impl CommNames {
    fn keep(&self, ctx: *mut c_void, name: CString) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (live, names) = map.entry(ctx as usize).or_default();
        *live += 1;
        names.push(name);
    }

    /// `ctx` was finalized: its names, once no other communicator holds that context (for
    /// the caller to drop).
    fn release(&self, ctx: *mut c_void) -> Vec<CString> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let Some((live, _)) = map.get_mut(&(ctx as usize)) else { return Vec::new() };
        *live -= 1;
        if *live > 0 {
            return Vec::new();
        }
        map.remove(&(ctx as usize)).map(|(_, names)| names).unwrap_or_default()
    }
}

/// A C profiler of one of NCCL's versions.
pub struct CProfiler {
    version: u32,
    tables: Tables,
    names: CommNames,
}

// SAFETY: the tables are immutable data of a loaded library; NCCL calls a profiler from any
// thread, which a C profiler must allow.
unsafe impl Send for CProfiler {}
// SAFETY: as above.
unsafe impl Sync for CProfiler {}

fn start_with<D>(f: Option<StartFn<D>>, ctx: PluginHandle, descr: Option<D>) -> Result<PluginHandle, PluginError> {
    let (Some(f), Some(mut d)) = (f, descr) else { return Ok(PluginHandle { id: 0 }) };
    let mut handle: *mut c_void = std::ptr::null_mut();
    // SAFETY: `d` is the version's descriptor, alive (with the C strings it points at) for
    // the call; `handle` is a valid out pointer.
    let rc = unsafe { f(handle_ptr(ctx), &mut handle, &mut d) };
    c_abi::check(rc, "ncclProfiler.startEvent")?;
    Ok(PluginHandle { id: handle as usize as u64 })
}

fn record_with<A>(f: Option<RecordFn<A>>, event: PluginHandle, st: u32, args: Option<A>) -> Result<(), PluginError> {
    let (Some(f), Some(mut a)) = (f, args) else { return Ok(()) };
    // SAFETY: the handle is one the plugin returned from startEvent and not yet stopped; `a`
    // is the version's argument union, alive for the call.
    let rc = unsafe { f(handle_ptr(event), st as c_int, &mut a) };
    c_abi::check(rc, "ncclProfiler.recordEventState")
}

impl CProfiler {
    fn stop_fn(&self) -> Option<StopFn> {
        match self.tables {
            Tables::V1(t) => t.stop_event,
            Tables::V2(t) => t.stop_event,
            Tables::V3(t) => t.stop_event,
            Tables::V4(t) => t.stop_event,
            Tables::V5(t) => t.stop_event,
            Tables::V6(t) => t.stop_event,
            Tables::V7(t) => t.stop_event,
        }
    }

    fn finalize_fn(&self) -> Option<FinalizeFn> {
        match self.tables {
            Tables::V1(t) => t.finalize,
            Tables::V2(t) => t.finalize,
            Tables::V3(t) => t.finalize,
            Tables::V4(t) => t.finalize,
            Tables::V5(t) => t.finalize,
            Tables::V6(t) => t.finalize,
            Tables::V7(t) => t.finalize,
        }
    }
}

impl Profiler for CProfiler {
    fn init(
        &self,
        comm_id: u64,
        comm_name: &str,
        nnodes: usize,
        nranks: usize,
        rank: usize,
        _log: LogFn,
    ) -> Result<(PluginHandle, u32), PluginError> {
        let name = CString::new(comm_name.replace('\0', "")).unwrap_or_default();
        let mut ctx: *mut c_void = std::ptr::null_mut();
        let mut mask: c_int = 0;
        let (nn, nr, r) = (nnodes as c_int, nranks as c_int, rank as c_int);
        let what = format!("ncclProfiler_v{}.init", self.version);
        // SAFETY: every pointer is valid for the call, and `name` until after the context's
        // finalize (kept below); the logger is the shared C logger; the member was checked
        // non-NULL at load.
        let rc = unsafe {
            match self.tables {
                Tables::V1(t) => (t.init.unwrap())(&mut ctx, &mut mask),
                Tables::V2(t) => (t.init.unwrap())(&mut ctx, &mut mask),
                Tables::V3(t) => (t.init.unwrap())(&mut ctx, &mut mask),
                Tables::V4(t) => (t.init.unwrap())(&mut ctx, &mut mask, name.as_ptr(), comm_id, nn, nr, r, c_abi::logger()),
                Tables::V5(t) => (t.init.unwrap())(&mut ctx, comm_id, &mut mask, name.as_ptr(), nn, nr, r, c_abi::logger()),
                Tables::V6(t) => (t.init.unwrap())(&mut ctx, comm_id, &mut mask, name.as_ptr(), nn, nr, r, c_abi::logger()),
                Tables::V7(t) => (t.init.unwrap())(&mut ctx, comm_id, &mut mask, name.as_ptr(), nn, nr, r, c_abi::logger()),
            }
        };
        c_abi::check(rc, &what)?;
        if !ctx.is_null() {
            self.names.keep(ctx, name);
        }
        Ok((PluginHandle { id: ctx as usize as u64 }, (mask as u32) & known_types(self.version)))
    }

    fn start_event(&self, ctx: PluginHandle, d: &EventDescr<'_>) -> Result<PluginHandle, PluginError> {
        match self.tables {
            Tables::V1(t) => start_with(t.start_event, ctx, descr_v1(d)),
            Tables::V2(t) => start_with(t.start_event, ctx, descr_v2(d)),
            Tables::V3(t) => start_with(t.start_event, ctx, descr_v3(d)),
            Tables::V4(t) => start_with(t.start_event, ctx, descr_v4(d)),
            Tables::V5(t) => start_with(t.start_event, ctx, descr_v5(d)),
            Tables::V6(t) => start_with(t.start_event, ctx, descr_v5(d)),
            Tables::V7(t) => start_with(t.start_event, ctx, descr_v7(d)),
        }
    }

    fn stop_event(&self, event: PluginHandle) -> Result<(), PluginError> {
        let Some(f) = self.stop_fn() else { return Ok(()) };
        if event.id == 0 {
            return Ok(());
        }
        // SAFETY: a handle the plugin returned from startEvent, stopped once.
        c_abi::check(unsafe { f(handle_ptr(event)) }, "ncclProfiler.stopEvent")
    }

    fn record_event_state(&self, event: PluginHandle, st: u32, a: &StateArgs) -> Result<(), PluginError> {
        if event.id == 0 {
            return Ok(());
        }
        match self.tables {
            Tables::V1(t) => record_with(t.record_event_state, event, st, args_v1(st, a)),
            Tables::V2(t) => record_with(t.record_event_state, event, st, args_v1(st, a)),
            Tables::V3(t) => record_with(t.record_event_state, event, st, args_v1(st, a)),
            Tables::V4(t) => record_with(t.record_event_state, event, st, args_v4(st, a, false)),
            Tables::V5(t) => record_with(t.record_event_state, event, st, args_v4(st, a, true)),
            Tables::V6(t) => record_with(t.record_event_state, event, st, args_v4(st, a, true)),
            Tables::V7(t) => record_with(t.record_event_state, event, st, args_v4(st, a, true)),
        }
    }

    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        let Some(f) = self.finalize_fn() else { return Ok(()) };
        // SAFETY: the (non-NULL) context the plugin's init returned, finalized once; the
        // commName it was given is still alive (released after the call).
        let rc = unsafe { f(handle_ptr(ctx)) };
        drop(self.names.release(handle_ptr(ctx)));
        c_abi::check(rc, "ncclProfiler.finalize")
    }
}

/// The members NCCL requires that are NULL.
fn missing<I, D, A>(t: &Table<I, D, A>) -> Vec<&'static str> {
    let mut m = Vec::new();
    if t.init.is_none() {
        m.push("init");
    }
    if t.start_event.is_none() {
        m.push("startEvent");
    }
    if t.stop_event.is_none() {
        m.push("stopEvent");
    }
    if t.finalize.is_none() {
        m.push("finalize");
    }
    m
}

fn table_name<I, D, A>(t: &Table<I, D, A>) -> String {
    // SAFETY: `name` is NULL or a C string in the library's data.
    unsafe { c_abi::c_str_or(t.name, "unnamed") }
}

/// The newest of NCCL's C profiler tables the library exports, as a plugin; `Ok(None)` when
/// it exports none; `Err` when every one it exports lacks a member NCCL requires.
pub fn find(lib: &Arc<PluginLibrary>) -> Result<Option<ProfilerPlugin>, String> {
    let mut refused = Vec::new();
    macro_rules! try_version {
        ($v:literal, $t:ty, $variant:ident) => {
            let symbol = concat!("ncclProfiler_v", $v);
            // SAFETY: the symbol's layout is NCCL's `ncclProfiler_vN_t`, declared above.
            if let Some(t) = unsafe { c_abi::find_table::<$t>(lib, symbol) } {
                let name = table_name(t);
                let missing = missing(t);
                if missing.is_empty() {
                    let api = Arc::new(CProfiler { version: $v, tables: Tables::$variant(t), names: CommNames::default() });
                    if !refused.is_empty() {
                        tracing::info!(target: "PROFILE", "PROFILER/Plugin: {}: passed over {}", lib.path, refused.join("; "));
                    }
                    return Ok(Some(Plugin::loaded(api, &name, $v, lib)));
                }
                refused.push(format!("{symbol} ({name}) has NULL {}, which NCCL requires", missing.join(", ")));
            }
        };
    }
    try_version!(7, ProfilerV7, V7);
    try_version!(6, ProfilerV6, V6);
    try_version!(5, ProfilerV5, V5);
    try_version!(4, ProfilerV4, V4);
    try_version!(3, ProfilerV3, V3);
    try_version!(2, ProfilerV2, V2);
    try_version!(1, ProfilerV1, V1);
    if refused.is_empty() {
        Ok(None)
    } else {
        Err(refused.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_follow_nccls_headers() {
        // Header: type, parentObj at 8, rank at 16, union at 24 (8-byte aligned).
        assert_eq!(offset_of!(DescrV1, parent_obj), 8);
        assert_eq!(offset_of!(DescrV5, rank), 16);
        assert_eq!(offset_of!(DescrV5, u), 24);
        // v5's coll: seqNumber 0, func 8, sendBuff 16, recvBuff 24, count 32, root 40,
        // datatype 48, nChannels 56, nWarps 57, algo 64, proto 72, parentGroup 80.
        assert_eq!(offset_of!(CollV4, n_channels), 56);
        assert_eq!(offset_of!(CollV4, algo), 64);
        assert_eq!(offset_of!(CollV5, parent_group), 80);
        // p2p v5: func, buff, datatype, count, peer 32, nChannels 36, parentGroup 40.
        assert_eq!(offset_of!(P2pV4, n_channels), 36);
        assert_eq!(offset_of!(P2pV5, parent_group), 40);
        // proxyOp: pid 0, channelId 4, peer 8, nSteps 12, chunkSize 16, isSend 20.
        assert_eq!(offset_of!(ProxyOpD, peer), 8);
        assert_eq!(size_of::<ProxyOpD>(), 24);
        assert_eq!(offset_of!(CollApiD, stream), 32);
        assert_eq!(offset_of!(GroupApiD, group_depth), 4);
        // v1's coll: the numbers and flags.
        assert_eq!(offset_of!(CollV1, func), 24);
        assert_eq!(offset_of!(CollV1, n_max_channels), 80);
        assert_eq!(size_of::<CollV1>(), 96);
        assert_eq!(size_of::<ArgsV1>(), 16);
        assert_eq!(size_of::<ArgsV4>(), 8);
        assert_eq!(size_of::<Table<InitV5, DescrV5, ArgsV4>>(), 48);
        // v7 (NCCL 2.32's profiler_v7.h): collApi's userTag 48, p2pApi's 40; coll's
        // kernelVariant 88, isSymColl 96, userTag 104 (112 bytes); p2p's userTag 48.
        assert_eq!(offset_of!(CollApiV7, user_tag), 48);
        assert_eq!(offset_of!(P2pApiV7, user_tag), 40);
        assert_eq!(offset_of!(CollV7, kernel_variant), 88);
        assert_eq!(offset_of!(CollV7, is_sym_coll), 96);
        assert_eq!(offset_of!(CollV7, user_tag), 104);
        assert_eq!(size_of::<CollV7>(), 112);
        assert_eq!(offset_of!(P2pV7, user_tag), 48);
        assert_eq!(offset_of!(DescrV7, u), 24);
        assert!(size_of::<UnionV7>() >= size_of::<CollV7>());
        assert_eq!(size_of::<ProfilerV7>(), 48);
    }

    #[test]
    fn descriptors_are_translated_per_version() {
        let group = PluginHandle { id: 0x1000 };
        let api = PluginHandle { id: 0x2000 };
        let d = EventDescr {
            func: RStr::from_str("AllReduce"),
            count: 42,
            datatype: RStr::from_str("ncclFloat32"),
            algo: RStr::from_str("RING"),
            proto: RStr::from_str("LL"),
            n_channels: 3,
            parent_group: group,
            ..EventDescr::new(ty::COLL, api, 1)
        };
        let v5 = descr_v5(&d).unwrap();
        assert_eq!((v5.event_type, v5.parent_obj as usize, v5.rank), (2, 0x2000, 1));
        // SAFETY: the coll member was written.
        let c = unsafe { v5.u.coll };
        assert_eq!(c.parent_group as usize, 0x1000);
        // SAFETY: c_name returns NUL-terminated strings.
        assert_eq!(unsafe { CStr::from_ptr(c.v4.algo) }.to_str(), Ok("RING"));
        assert_eq!((c.v4.count, c.v4.n_channels), (42, 3));
        // Before v5 the parent is the group; v1 has numbers.
        assert_eq!(descr_v4(&d).unwrap().parent_obj as usize, 0x1000);
        // SAFETY: the coll member was written.
        let c1 = unsafe { descr_v1(&d).unwrap().u.coll };
        assert_eq!((c1.func, c1.datatype, c1.algo, c1.proto), (4, 7, 1, 0));
        // API events exist from v5 on only.
        let a = EventDescr::new(ty::COLL_API, PluginHandle { id: 0 }, 0);
        assert!(descr_v4(&a).is_none() && descr_v5(&a).is_some());
        assert!(descr_v2(&EventDescr::new(ty::KERNEL_CH, api, 0)).is_none());
        // v7 carries the tag on Coll and CollApi; v5 has no room for it.
        let tagged = EventDescr { user_tag: 42, ..d };
        let v7 = descr_v7(&tagged).unwrap();
        // SAFETY: the coll member was written.
        let c7 = unsafe { v7.u.coll };
        assert_eq!((c7.user_tag, c7.is_sym_coll, c7.v5.parent_group as usize, c7.v5.v4.count), (42, false, 0x1000, 42));
        // SAFETY: c_name returns NUL-terminated strings.
        assert_eq!(unsafe { CStr::from_ptr(c7.kernel_variant) }.to_str(), Ok(""));
        let api7 = EventDescr { user_tag: 7, ..EventDescr::new(ty::COLL_API, PluginHandle { id: 0 }, 0) };
        // SAFETY: the collApi member was written.
        assert_eq!(unsafe { descr_v7(&api7).unwrap().u.coll_api.user_tag }, 7);
        let p2p_api = EventDescr::new(ty::P2P_API, PluginHandle { id: 0 }, 0);
        // SAFETY: the p2pApi member was written.
        assert_eq!(unsafe { descr_v7(&p2p_api).unwrap().u.p2p_api.user_tag }, 0, "untagged");
        assert!(descr_v3(&EventDescr::new(ty::KERNEL_CH, api, 0)).is_some());
    }

    #[test]
    fn comm_names_live_until_the_last_finalize_of_their_context() {
        let names = CommNames::default();
        let (own, shared) = (0x10 as *mut c_void, 0x20 as *mut c_void);
        let name = |s: &str| CString::new(s).unwrap();
        names.keep(own, name("a"));
        names.keep(shared, name("b"));
        names.keep(shared, name("c"));
        assert!(names.release(shared).is_empty(), "another communicator still holds that context");
        assert_eq!(names.release(shared), [name("b"), name("c")]);
        assert_eq!(names.release(own), [name("a")]);
        assert!(names.release(own).is_empty(), "nothing is kept for a context already finalized");
    }

    #[test]
    fn states_are_sent_as_each_version_knows_them() {
        let a = StateArgs { trans_size: 77, appended_proxy_ops: 3, ..Default::default() };
        assert!(args_v1(state::PROXY_OP_IN_PROGRESS, &a).is_none());
        // SAFETY: the proxy-control member was written.
        assert_eq!(unsafe { args_v1(state::PROXY_CTRL_APPEND, &a).unwrap().appended_proxy_ops }, 3);
        assert!(args_v1(state::PROXY_STEP_SEND_WAIT, &a).is_some());
        // SAFETY: the proxy-step member was written.
        assert_eq!(unsafe { args_v4(state::PROXY_STEP_SEND_WAIT, &a, false).unwrap().trans_size }, 77);
        assert!(args_v4(state::GROUP_START_API_STOP, &a, false).is_none());
        assert!(args_v4(state::GROUP_START_API_STOP, &a, true).is_some());
        assert!(args_v4(state::PROXY_OP_SEND_POSTED, &a, true).is_none(), "deprecated in v4");
        assert_eq!(known_types(2), 0x3f);
        assert_eq!(known_types(5), ty::ALL);
        assert_eq!(known_types(7) & (1 << 15), 0, "v7's KernelPhase is never asked for");
    }
}
