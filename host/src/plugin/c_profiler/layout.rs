//! The layouts of NCCL's C profiler tables, descriptors and state arguments, v1 … v7
//! (`src/include/plugin/profiler/profiler_vN.h`), as the adapter in [`super`] fills them.

use std::ffi::{c_char, c_int, c_void};

use crate::plugin::c_abi::NcclDebugLogger;

// ---------------------------------------------------------------------------------------
// Tables.

pub(super) type InitV1 = unsafe extern "C" fn(ctx: *mut *mut c_void, mask: *mut c_int) -> c_int;
pub(super) type InitV4 = unsafe extern "C" fn(
    ctx: *mut *mut c_void,
    mask: *mut c_int,
    comm_name: *const c_char,
    comm_hash: u64,
    nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    log: NcclDebugLogger,
) -> c_int;
pub(super) type InitV5 = unsafe extern "C" fn(
    ctx: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    comm_name: *const c_char,
    nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    log: NcclDebugLogger,
) -> c_int;
pub(super) type StartFn<D> = unsafe extern "C" fn(ctx: *mut c_void, handle: *mut *mut c_void, descr: *mut D) -> c_int;
pub(super) type StopFn = unsafe extern "C" fn(handle: *mut c_void) -> c_int;
pub(super) type RecordFn<A> = unsafe extern "C" fn(handle: *mut c_void, state: c_int, args: *mut A) -> c_int;
pub(super) type FinalizeFn = unsafe extern "C" fn(ctx: *mut c_void) -> c_int;

/// `ncclProfiler_vN_t`: every version has these members in this order; the types of `init`,
/// of the descriptor and of the state arguments differ.
#[repr(C)]
pub(super) struct Table<I, D, A> {
    pub(super) name: *const c_char,
    pub(super) init: Option<I>,
    pub(super) start_event: Option<StartFn<D>>,
    pub(super) stop_event: Option<StopFn>,
    pub(super) record_event_state: Option<RecordFn<A>>,
    pub(super) finalize: Option<FinalizeFn>,
}

// ---------------------------------------------------------------------------------------
// Descriptors.

/// The header every descriptor starts with; `T` is `u8` before v5, `u64` from v5 on.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Descr<T, U> {
    pub(super) event_type: T,
    pub(super) parent_obj: *mut c_void,
    pub(super) rank: c_int,
    pub(super) u: U,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ProxyOpD {
    pub(super) pid: c_int,
    pub(super) channel_id: u8,
    pub(super) peer: c_int,
    pub(super) n_steps: c_int,
    pub(super) chunk_size: c_int,
    pub(super) is_send: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ProxyStepD {
    pub(super) step: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct KernelChV3 {
    pub(super) channel_id: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct KernelChV4 {
    pub(super) channel_id: u8,
    pub(super) p_timer: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct NetPluginD {
    pub(super) id: i64,
    pub(super) data: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CollV1 {
    pub(super) name: *const c_char,
    pub(super) comm_hash: u64,
    pub(super) seq_number: u64,
    pub(super) func: u8,
    pub(super) send_buff: *const c_void,
    pub(super) recv_buff: *mut c_void,
    pub(super) count: usize,
    pub(super) root: c_int,
    pub(super) datatype: u8,
    pub(super) op: u32,
    pub(super) traffic_bytes: usize,
    pub(super) n_max_channels: u8,
    pub(super) n_warps: u8,
    pub(super) algo: u8,
    pub(super) proto: u8,
    pub(super) is_collnet: c_int,
    pub(super) is_nvls: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct P2pV1 {
    pub(super) name: *const c_char,
    pub(super) comm_hash: u64,
    pub(super) func: u8,
    pub(super) buff: *mut c_void,
    pub(super) datatype: u8,
    pub(super) count: usize,
    pub(super) peer: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CollV2 {
    pub(super) name: *const c_char,
    pub(super) comm_hash: u64,
    pub(super) seq_number: u64,
    pub(super) func: *const c_char,
    pub(super) send_buff: *const c_void,
    pub(super) recv_buff: *mut c_void,
    pub(super) count: usize,
    pub(super) root: c_int,
    pub(super) datatype: *const c_char,
    pub(super) traffic_bytes: usize,
    pub(super) n_max_channels: u8,
    pub(super) n_warps: u8,
    pub(super) algo: *const c_char,
    pub(super) proto: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CollV3 {
    pub(super) name: *const c_char,
    pub(super) comm_hash: u64,
    pub(super) seq_number: u64,
    pub(super) func: *const c_char,
    pub(super) send_buff: *const c_void,
    pub(super) recv_buff: *mut c_void,
    pub(super) count: usize,
    pub(super) root: c_int,
    pub(super) datatype: *const c_char,
    pub(super) n_max_channels: u8,
    pub(super) n_warps: u8,
    pub(super) algo: *const c_char,
    pub(super) proto: *const c_char,
}

/// v2 and v3.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct P2pV2 {
    pub(super) name: *const c_char,
    pub(super) comm_hash: u64,
    pub(super) func: *const c_char,
    pub(super) buff: *mut c_void,
    pub(super) datatype: *const c_char,
    pub(super) count: usize,
    pub(super) peer: c_int,
}

/// v4; from v5 on followed by `parent_group`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CollV4 {
    pub(super) seq_number: u64,
    pub(super) func: *const c_char,
    pub(super) send_buff: *const c_void,
    pub(super) recv_buff: *mut c_void,
    pub(super) count: usize,
    pub(super) root: c_int,
    pub(super) datatype: *const c_char,
    pub(super) n_channels: u8,
    pub(super) n_warps: u8,
    pub(super) algo: *const c_char,
    pub(super) proto: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CollV5 {
    pub(super) v4: CollV4,
    pub(super) parent_group: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct P2pV4 {
    pub(super) func: *const c_char,
    pub(super) buff: *mut c_void,
    pub(super) datatype: *const c_char,
    pub(super) count: usize,
    pub(super) peer: c_int,
    pub(super) n_channels: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct P2pV5 {
    pub(super) v4: P2pV4,
    pub(super) parent_group: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct GroupApiD {
    pub(super) graph_captured: bool,
    pub(super) group_depth: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CollApiD {
    pub(super) func: *const c_char,
    pub(super) count: usize,
    pub(super) datatype: *const c_char,
    pub(super) root: c_int,
    pub(super) stream: *mut c_void,
    pub(super) graph_captured: bool,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct P2pApiD {
    pub(super) func: *const c_char,
    pub(super) count: usize,
    pub(super) datatype: *const c_char,
    pub(super) stream: *mut c_void,
    pub(super) graph_captured: bool,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct KernelLaunchD {
    pub(super) stream: *mut c_void,
}

/// v7's CollApi: v5's, then the caller's profiler tag (0: untagged).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CollApiV7 {
    pub(super) v5: CollApiD,
    pub(super) user_tag: u64,
}

/// v7's P2pApi: v5's, then the tag.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct P2pApiV7 {
    pub(super) v5: P2pApiD,
    pub(super) user_tag: u64,
}

/// v7's Coll: v5's, then the kernel variant's name, whether it ran as a symmetric
/// collective, and the tag.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CollV7 {
    pub(super) v5: CollV5,
    pub(super) kernel_variant: *const c_char,
    pub(super) is_sym_coll: bool,
    pub(super) user_tag: u64,
}

/// v7's P2p: v5's, then the tag.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct P2pV7 {
    pub(super) v5: P2pV5,
    pub(super) user_tag: u64,
}

/// Room for the largest member of any version's union (v7's collective is 112 bytes), so
/// that every descriptor is at least as large as NCCL's.
pub(super) type UnionRoom = [u64; 16];

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) union UnionV1 {
    pub(super) coll: CollV1,
    pub(super) p2p: P2pV1,
    pub(super) proxy_op: ProxyOpD,
    pub(super) proxy_step: ProxyStepD,
    pub(super) _room: UnionRoom,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) union UnionV2 {
    pub(super) coll: CollV2,
    pub(super) p2p: P2pV2,
    pub(super) proxy_op: ProxyOpD,
    pub(super) proxy_step: ProxyStepD,
    pub(super) _room: UnionRoom,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) union UnionV3 {
    pub(super) coll: CollV3,
    pub(super) p2p: P2pV2,
    pub(super) proxy_op: ProxyOpD,
    pub(super) proxy_step: ProxyStepD,
    pub(super) kernel_ch: KernelChV3,
    pub(super) net_plugin: NetPluginD,
    pub(super) _room: UnionRoom,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) union UnionV4 {
    pub(super) coll: CollV4,
    pub(super) p2p: P2pV4,
    pub(super) proxy_op: ProxyOpD,
    pub(super) proxy_step: ProxyStepD,
    pub(super) kernel_ch: KernelChV4,
    pub(super) net_plugin: NetPluginD,
    pub(super) _room: UnionRoom,
}

/// v5 and v6 (v6 adds copy-engine members, which the core never sends; [`UnionRoom`] keeps
/// the size).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) union UnionV5 {
    pub(super) group_api: GroupApiD,
    pub(super) coll_api: CollApiD,
    pub(super) p2p_api: P2pApiD,
    pub(super) kernel_launch: KernelLaunchD,
    pub(super) coll: CollV5,
    pub(super) p2p: P2pV5,
    pub(super) proxy_op: ProxyOpD,
    pub(super) proxy_step: ProxyStepD,
    pub(super) kernel_ch: KernelChV4,
    pub(super) net_plugin: NetPluginD,
    pub(super) _room: UnionRoom,
}

/// v7: v6's members, the tag on the API, Coll and P2p members (and on the copy-engine
/// collective, which the core never sends, nor v7's KernelPhase sub-event).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) union UnionV7 {
    pub(super) group_api: GroupApiD,
    pub(super) coll_api: CollApiV7,
    pub(super) p2p_api: P2pApiV7,
    pub(super) kernel_launch: KernelLaunchD,
    pub(super) coll: CollV7,
    pub(super) p2p: P2pV7,
    pub(super) proxy_op: ProxyOpD,
    pub(super) proxy_step: ProxyStepD,
    pub(super) kernel_ch: KernelChV4,
    pub(super) net_plugin: NetPluginD,
    pub(super) _room: UnionRoom,
}

pub(super) type DescrV1 = Descr<u8, UnionV1>;
pub(super) type DescrV2 = Descr<u8, UnionV2>;
pub(super) type DescrV3 = Descr<u8, UnionV3>;
pub(super) type DescrV4 = Descr<u8, UnionV4>;
pub(super) type DescrV5 = Descr<u64, UnionV5>;
pub(super) type DescrV7 = Descr<u64, UnionV7>;

// ---------------------------------------------------------------------------------------
// State arguments.

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ProxyOpArgsV1 {
    pub(super) trans_size: usize,
    pub(super) steps: c_int,
}

/// v1 … v3.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) union ArgsV1 {
    pub(super) proxy_op: ProxyOpArgsV1,
    pub(super) appended_proxy_ops: c_int,
}

/// v4 … v7: `proxyStep.transSize`, `proxyCtrl.appendedProxyOps`, `netPlugin.data`,
/// `kernelCh.pTimer`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) union ArgsV4 {
    pub(super) trans_size: usize,
    pub(super) appended_proxy_ops: c_int,
    pub(super) data: *mut c_void,
    pub(super) p_timer: u64,
}

pub(super) type ProfilerV1 = Table<InitV1, DescrV1, ArgsV1>;
pub(super) type ProfilerV2 = Table<InitV1, DescrV2, ArgsV1>;
pub(super) type ProfilerV3 = Table<InitV1, DescrV3, ArgsV1>;
pub(super) type ProfilerV4 = Table<InitV4, DescrV4, ArgsV4>;
pub(super) type ProfilerV5 = Table<InitV5, DescrV5, ArgsV4>;
/// v6 differs from v5 only in the union's copy-engine members.
pub(super) type ProfilerV6 = Table<InitV5, DescrV5, ArgsV4>;
/// v7: the tags, and the Coll's kernel variant and symmetric flag, in the descriptor; its
/// state arguments name KernelPhase's stop timer too, in the same member as KernelCh's.
pub(super) type ProfilerV7 = Table<InitV5, DescrV7, ArgsV4>;

