//! The C structures of `<infiniband/verbs.h>` (rdma-core) that the plugin reads or fills,
//! `#[repr(C)]` with the header's field names so that `tests/struct_offsets.rs` can compare
//! every offset and size with the C compiler's.
//!
//! Only what the transport uses is typed; the rest of a structure is kept as opaque bytes or
//! untyped pointers of the right size, so that the layout stays the library's. Enums are C
//! `enum`s, i.e. 32-bit integers here; their values are the constants below.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// An opaque function or object pointer that the plugin never calls or reads.
pub type opaque = *mut c_void;

/// `struct ibv_device`: one RDMA device of `ibv_get_device_list`.
#[repr(C)]
pub struct ibv_device {
    pub _ops: [opaque; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    /// Kernel device name, e.g. `mlx5_0` (NUL-terminated).
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

/// `struct ibv_context_ops`: the provider's table. The inline verbs of verbs.h
/// (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`) are calls through
/// it; the `_compat_*` entries are obsolete slots kept for the layout.
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: opaque,
    pub _compat_query_port: opaque,
    pub _compat_alloc_pd: opaque,
    pub _compat_dealloc_pd: opaque,
    pub _compat_reg_mr: opaque,
    pub _compat_rereg_mr: opaque,
    pub _compat_dereg_mr: opaque,
    pub alloc_mw: opaque,
    pub bind_mw: opaque,
    pub dealloc_mw: opaque,
    pub _compat_create_cq: opaque,
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    pub _compat_cq_event: opaque,
    pub _compat_resize_cq: opaque,
    pub _compat_destroy_cq: opaque,
    pub _compat_create_srq: opaque,
    pub _compat_modify_srq: opaque,
    pub _compat_query_srq: opaque,
    pub _compat_destroy_srq: opaque,
    pub post_srq_recv: opaque,
    pub _compat_create_qp: opaque,
    pub _compat_query_qp: opaque,
    pub _compat_modify_qp: opaque,
    pub _compat_destroy_qp: opaque,
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub _compat_create_ah: opaque,
    pub _compat_destroy_ah: opaque,
    pub _compat_attach_mcast: opaque,
    pub _compat_detach_mcast: opaque,
    pub _compat_async_event: opaque,
}

/// `struct ibv_context`: an open device.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    /// [`VERBS_ABI_IS_EXTENDED`] when the context is the last field of a [`verbs_context`].
    pub abi_compat: opaque,
}

/// `abi_compat` of a context that lives inside a [`verbs_context`] (`__VERBS_ABI_IS_EXTENDED`).
pub const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

/// `struct verbs_context` as rdma-core v44 declares it: the extended verbs, placed *before*
/// the [`ibv_context`] it ends with ("grows up": newer libraries add fields in front, so a
/// field's distance to `context` never changes, and `sz` says how far the library's own
/// structure reaches). verbs.h's inline extended verbs find it with `verbs_get_ctx`; see
/// [`super::inline::verbs_context_op`].
#[repr(C)]
pub struct verbs_context {
    pub query_port:
        Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int>,
    pub advise_mr: opaque,
    pub alloc_null_mr: opaque,
    pub read_counters: opaque,
    pub attach_counters_point_flow: opaque,
    pub create_counters: opaque,
    pub destroy_counters: opaque,
    pub reg_dm_mr: opaque,
    pub alloc_dm: opaque,
    pub free_dm: opaque,
    pub modify_flow_action_esp: opaque,
    pub destroy_flow_action: opaque,
    pub create_flow_action_esp: opaque,
    pub modify_qp_rate_limit: opaque,
    pub alloc_parent_domain: opaque,
    pub dealloc_td: opaque,
    pub alloc_td: opaque,
    pub modify_cq: opaque,
    pub post_srq_ops: opaque,
    pub destroy_rwq_ind_table: opaque,
    pub create_rwq_ind_table: opaque,
    pub destroy_wq: opaque,
    pub modify_wq: opaque,
    pub create_wq: opaque,
    pub query_rt_values: opaque,
    pub create_cq_ex: opaque,
    pub priv_: opaque,
    pub query_device_ex: opaque,
    pub ibv_destroy_flow: opaque,
    pub ABI_placeholder2: opaque,
    pub ibv_create_flow: opaque,
    pub ABI_placeholder1: opaque,
    pub open_qp: opaque,
    pub create_qp_ex: opaque,
    pub get_srq_num: opaque,
    pub create_srq_ex: opaque,
    pub open_xrcd: opaque,
    pub close_xrcd: opaque,
    pub _ABI_placeholder3: u64,
    /// Size of the library's `verbs_context`, up to and including `context`.
    pub sz: usize,
    pub context: ibv_context,
}

/// `struct ibv_device_attr` (`ibv_query_device`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    /// Network byte order.
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr` (`ibv_query_port`). The exported (compat) `ibv_query_port` fills
/// it up to `flags` only; `port_cap_flags2` stays as the caller zeroed it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `enum ibv_port_state`: the value of an up port.
pub const IBV_PORT_ACTIVE: c_uint = 4;
/// `IBV_LINK_LAYER_*`.
pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// `union ibv_gid`: 16 bytes, 8-aligned (the union's other member is two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `enum ibv_gid_type` (`gid_type` of [`ibv_gid_entry`]).
pub const IBV_GID_TYPE_IB: u32 = 0;
pub const IBV_GID_TYPE_ROCE_V1: u32 = 1;
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;

/// `struct ibv_gid_entry` (`_ibv_query_gid_ex`, rdma-core 32+).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct ibv_pd`: a protection domain.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`: a registered memory region and its keys.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `enum ibv_access_flags`.
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
pub const IBV_ACCESS_REMOTE_ATOMIC: c_int = 1 << 3;
/// `IBV_ACCESS_OPTIONAL_FIRST`: needs `ibv_reg_mr_iova2` (the plain export rejects it).
pub const IBV_ACCESS_RELAXED_ORDERING: c_int = 1 << 20;

/// `struct ibv_comp_channel` (never created by the plugin; a pointer type for `ibv_create_cq`).
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`: a completion queue.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_qp`: a queue pair.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: opaque,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (`ibv_create_qp`).
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: opaque,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `IBV_QPT_RC`: reliable connected, the only type the transport uses.
pub const IBV_QPT_RC: c_uint = 2;

/// `struct ibv_global_route`: the GRH part of an address (RoCE, routed IB).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`: where a connected QP sends.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr` (`ibv_modify_qp`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `enum ibv_qp_state`.
pub const IBV_QPS_RESET: c_uint = 0;
pub const IBV_QPS_INIT: c_uint = 1;
pub const IBV_QPS_RTR: c_uint = 2;
pub const IBV_QPS_RTS: c_uint = 3;
pub const IBV_QPS_ERR: c_uint = 6;

/// `enum ibv_qp_attr_mask`.
pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

/// `struct ibv_sge`: one scatter/gather element.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// The `rdma` member of `ibv_send_wr.wr` (RDMA write and read).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// The `atomic` member of `ibv_send_wr.wr`, the union's largest.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `ibv_send_wr.wr`: the operation's remote side.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
}

/// `struct ibv_send_wr` (`ibv_post_send`).
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// Immediate data, network byte order (the C anonymous union with `invalidate_rkey`).
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub qp_type: u32,
    /// The anonymous `bind_mw` / `tso` union, unused.
    pub _bind_mw_tso: [u64; 6],
}

/// `enum ibv_wr_opcode`.
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_WR_RDMA_READ: c_uint = 4;

/// `enum ibv_send_flags`.
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub const IBV_SEND_INLINE: c_uint = 1 << 3;

/// `struct ibv_recv_wr` (`ibv_post_recv`).
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`: one work completion (`ibv_poll_cq`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Immediate data, network byte order (the C anonymous union with `invalidated_rkey`).
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `IBV_WC_SUCCESS` (`enum ibv_wc_status`).
pub const IBV_WC_SUCCESS: c_uint = 0;
/// `IBV_WC_RECV_RDMA_WITH_IMM` (`enum ibv_wc_opcode`).
pub const IBV_WC_RECV_RDMA_WITH_IMM: c_uint = (1 << 7) + 1;

/// `struct ibv_async_event` (`ibv_get_async_event`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_async_event {
    /// The C union `element` (`cq`, `qp`, `srq`, `wq` pointer or `port_num`).
    pub element: ibv_async_event_element,
    pub event_type: c_uint,
}

/// `ibv_async_event.element`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_async_event_element {
    pub cq: *mut ibv_cq,
    pub qp: *mut ibv_qp,
    pub port_num: c_int,
}

/// `enum ibv_event_type` values that end a device or a port's use.
pub const IBV_EVENT_CQ_ERR: c_uint = 0;
pub const IBV_EVENT_QP_FATAL: c_uint = 1;
pub const IBV_EVENT_QP_REQ_ERR: c_uint = 2;
pub const IBV_EVENT_QP_ACCESS_ERR: c_uint = 3;
pub const IBV_EVENT_DEVICE_FATAL: c_uint = 8;
pub const IBV_EVENT_PORT_ACTIVE: c_uint = 9;
pub const IBV_EVENT_PORT_ERR: c_uint = 10;
