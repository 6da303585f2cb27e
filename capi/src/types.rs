//! The C types of NCCL 2.32's ABI.

use std::os::raw::{c_char, c_int, c_uint};

pub type NcclResult = c_int;

/// `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    pub internal: [c_char; 128],
}

/// `ncclConfig_t` (`ncclConfig_v23100`, NCCL 2.32.3's; older callers pass a smaller `size`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclConfig {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cga_cluster_size: c_int,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
    pub net_name: *const c_char,
    pub split_share: c_int,
    pub traffic_class: c_int,
    pub comm_name: *const c_char,
    pub collnet_enable: c_int,
    pub cta_policy: c_int,
    pub shrink_share: c_int,
    pub nvls_ctas: c_int,
    pub n_channels_per_net_peer: c_int,
    pub nvlink_centric_sched: c_int,
    /// 2.29.
    pub graph_usage_mode: c_int,
    pub num_rma_ctx: c_int,
    /// 2.30.3.
    pub max_p2p_peers: c_int,
    /// 2.30.7.
    pub graph_stream_ordering: c_int,
    /// 2.31.
    pub launch_order_implicit: c_int,
    pub num_rma_sig: c_int,
    pub rma_eager_init: c_int,
    pub host_cft_mode: c_int,
    /// 2.32.
    pub nvls_host_mode: c_int,
}

/// NCCL 2.32.3's `sizeof(ncclConfig_t)`.
const _: () = assert!(std::mem::size_of::<NcclConfig>() == 120);

impl Default for NcclConfig {
    /// `NCCL_CONFIG_INITIALIZER`.
    fn default() -> Self {
        let u = rustccl::config::UNDEF_INT;
        NcclConfig {
            size: std::mem::size_of::<NcclConfig>(),
            magic: rustccl::config::CONFIG_MAGIC,
            version: rustccl::version::NCCL_VERSION_CODE as c_uint,
            blocking: u,
            cga_cluster_size: u,
            min_ctas: u,
            max_ctas: u,
            net_name: std::ptr::null(),
            split_share: u,
            traffic_class: u,
            comm_name: std::ptr::null(),
            collnet_enable: u,
            cta_policy: u,
            shrink_share: u,
            nvls_ctas: u,
            n_channels_per_net_peer: u,
            nvlink_centric_sched: u,
            graph_usage_mode: u,
            num_rma_ctx: u,
            max_p2p_peers: u,
            graph_stream_ordering: u,
            launch_order_implicit: u,
            num_rma_sig: u,
            rma_eager_init: u,
            host_cft_mode: u,
            nvls_host_mode: u,
        }
    }
}

/// `ncclSimInfo_t`.
#[repr(C)]
pub struct NcclSimInfo {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub estimated_time: f32,
}

pub const SIM_INFO_MAGIC: c_uint = 0x7468_5283;

/// `ncclTeam_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NcclTeam {
    pub n_ranks: c_int,
    pub rank: c_int,
    pub stride: c_int,
}

/// `ncclCollConfig_t` (`ncclCollConfig_v23200`, NCCL 2.32; 2.31's `v23100` is the same less
/// `launchCompletionEvent`, 64 bytes): the per-call options of the `nccl*Config` collectives.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclCollConfig {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    /// Vendor extension options (`ncclConfigExt_t*`, a list NCCL itself ignores).
    pub ext: *mut std::os::raw::c_void,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
    pub nvls_ctas: c_int,
    pub cga_cluster_size: c_int,
    pub alg_selection: *const c_char,
    pub force_alg_selection: c_int,
    pub cta_policy: c_int,
    pub user_profiler_tag: u64,
    /// 2.32: a `cudaEvent_t`.
    pub launch_completion_event: *mut std::os::raw::c_void,
}

/// The smallest `ncclCollConfig_t` a caller may pass: 2.31's, without `launchCompletionEvent`.
pub const COLL_CONFIG_MIN_SIZE: usize = std::mem::offset_of!(NcclCollConfig, launch_completion_event);

impl Default for NcclCollConfig {
    /// `NCCL_COLLCONFIG_INITIALIZER`.
    fn default() -> Self {
        let u = rustccl::config::UNDEF_INT;
        NcclCollConfig {
            size: std::mem::size_of::<NcclCollConfig>(),
            magic: rustccl::config::CONFIG_MAGIC,
            version: rustccl::version::NCCL_VERSION_CODE as c_uint,
            ext: std::ptr::null_mut(),
            min_ctas: u,
            max_ctas: u,
            nvls_ctas: u,
            cga_cluster_size: u,
            alg_selection: std::ptr::null(),
            force_alg_selection: 1,
            cta_policy: u,
            user_profiler_tag: 0,
            launch_completion_event: std::ptr::null_mut(),
        }
    }
}
