//! Lifecycle, queries and errors.

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int};

use rustccl::config::CommConfig;
use rustccl::{Communicator, Error, ResultCode, ShrinkFlags, UniqueId};

use crate::handles::{self, CommHandle};
use crate::{guard, guard_comm, nccl_api, NcclConfig, NcclResult, NcclUniqueId};

pub(crate) fn out_ptr<T>(p: *mut T, what: &str, name: &str) -> Result<(), Error> {
    if p.is_null() {
        Err(Error::invalid_argument(format!("{what}: {name} is NULL")))
    } else {
        Ok(())
    }
}

fn c_string(p: *const c_char) -> Option<String> {
    // SAFETY: a non-null string the caller put in its config, NUL-terminated as C requires.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Reads a caller's `ncclConfig_t`: only `size` bytes of it (older, smaller structs keep the
/// defaults for the fields they lack).
pub(crate) unsafe fn read_config(config: *const NcclConfig, what: &str) -> Result<Option<CommConfig>, Error> {
    if config.is_null() {
        return Ok(None);
    }
    // SAFETY: every config starts with its size.
    let size = unsafe { std::ptr::read_unaligned(config as *const usize) };
    let mut c = NcclConfig::default();
    let n = size.min(std::mem::size_of::<NcclConfig>());
    if n < std::mem::size_of::<usize>() + 8 {
        return Err(Error::invalid_argument(format!("{what}: config.size {size} is too small for an ncclConfig_t")));
    }
    // SAFETY: the caller's struct has `size` bytes; at most that many are copied.
    unsafe { std::ptr::copy_nonoverlapping(config as *const u8, &mut c as *mut NcclConfig as *mut u8, n) };
    Ok(Some(CommConfig {
        magic: c.magic,
        version: c.version,
        blocking: c.blocking,
        cga_cluster_size: c.cga_cluster_size,
        min_ctas: c.min_ctas,
        max_ctas: c.max_ctas,
        net_name: c_string(c.net_name),
        split_share: c.split_share,
        traffic_class: c.traffic_class,
        comm_name: c_string(c.comm_name),
        collnet_enable: c.collnet_enable,
        cta_policy: c.cta_policy,
        shrink_share: c.shrink_share,
        nvls_ctas: c.nvls_ctas,
        n_channels_per_net_peer: c.n_channels_per_net_peer,
        nvlink_centric_sched: c.nvlink_centric_sched,
        graph_usage_mode: c.graph_usage_mode,
        num_rma_ctx: c.num_rma_ctx,
        max_p2p_peers: c.max_p2p_peers,
        graph_stream_ordering: c.graph_stream_ordering,
        launch_order_implicit: c.launch_order_implicit,
        num_rma_sig: c.num_rma_sig,
        rma_eager_init: c.rma_eager_init,
        host_cft_mode: c.host_cft_mode,
        nvls_host_mode: c.nvls_host_mode,
        ..CommConfig::default()
    }))
}

pub(crate) fn unique_id(id: &NcclUniqueId) -> Result<UniqueId, Error> {
    // SAFETY: 128 plain bytes.
    let bytes: &[u8; 128] = unsafe { &*(id.internal.as_ptr() as *const [u8; 128]) };
    UniqueId::from_bytes(bytes)
}

/// The device this rank uses: the CUDA device current on the calling thread (what
/// `cudaSetDevice` chose, as NCCL uses), else `RUSTCCL_DEVICE`, else 0.
pub(crate) fn current_device() -> i32 {
    if let Ok(Some(d)) = rustccl::backend::select_backend().and_then(|b| b.current_device()) {
        return d;
    }
    rustccl::params::env_str("RUSTCCL_DEVICE").and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// Publishes a new communicator; a non-blocking one still initialising reports InProgress.
pub(crate) fn hand_out(comm: Communicator, out: *mut CommHandle) -> Result<(), Error> {
    let in_progress = comm.async_error() == ResultCode::InProgress;
    // SAFETY: checked non-null by the caller of this function.
    unsafe { *out = handles::publish(comm) };
    if in_progress {
        return Err(Error::in_progress("initialisation in progress"));
    }
    Ok(())
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

nccl_api! {
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> NcclResult {
        guard("ncclGetVersion", || {
            out_ptr(version, "ncclGetVersion", "version")?;
            // SAFETY: checked non-null.
            unsafe { *version = rustccl::version::NCCL_VERSION_CODE };
            Ok(())
        })
    }

    fn ncclGetUniqueId / pncclGetUniqueId(out: *mut NcclUniqueId) -> NcclResult {
        guard("ncclGetUniqueId", || {
            out_ptr(out, "ncclGetUniqueId", "uniqueId")?;
            let id = rustccl::get_unique_id()?;
            // SAFETY: checked non-null; 128 bytes.
            unsafe { std::ptr::copy_nonoverlapping(id.as_bytes().as_ptr(), (*out).internal.as_mut_ptr() as *mut u8, 128) };
            Ok(())
        })
    }

    fn ncclCommInitRank / pncclCommInitRank(newcomm: *mut CommHandle, nranks: c_int, id: NcclUniqueId, rank: c_int) -> NcclResult {
        guard("ncclCommInitRank", || {
            out_ptr(newcomm, "ncclCommInitRank", "newcomm")?;
            let id = unique_id(&id)?;
            hand_out(Communicator::init_rank_config(nranks, &id, rank, current_device(), &CommConfig::default())?, newcomm)
        })
    }

    fn ncclCommInitRankConfig / pncclCommInitRankConfig(
        newcomm: *mut CommHandle, nranks: c_int, id: NcclUniqueId, rank: c_int, config: *const NcclConfig,
    ) -> NcclResult {
        guard("ncclCommInitRankConfig", || {
            out_ptr(newcomm, "ncclCommInitRankConfig", "newcomm")?;
            // SAFETY: the caller's config pointer, read within its declared size.
            let config = unsafe { read_config(config, "ncclCommInitRankConfig")? }.unwrap_or_default();
            let id = unique_id(&id)?;
            hand_out(Communicator::init_rank_config(nranks, &id, rank, current_device(), &config)?, newcomm)
        })
    }

    fn ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: *mut CommHandle, nranks: c_int, rank: c_int, n_id: c_int, ids: *const NcclUniqueId, config: *const NcclConfig,
    ) -> NcclResult {
        guard("ncclCommInitRankScalable", || {
            out_ptr(newcomm, "ncclCommInitRankScalable", "newcomm")?;
            if ids.is_null() {
                return Err(Error::invalid_argument("commId is NULL"));
            }
            if n_id < 1 || n_id > nranks.max(1) {
                return Err(Error::invalid_argument(format!("nId {n_id} must be between 1 and nranks ({nranks})")));
            }
            // SAFETY: the caller gives `n_id` ids.
            let ids: Vec<UniqueId> = unsafe { std::slice::from_raw_parts(ids, n_id as usize) }
                .iter().map(unique_id).collect::<Result<_, _>>()?;
            // SAFETY: as for ncclCommInitRankConfig.
            let config = unsafe { read_config(config, "ncclCommInitRankScalable")? }.unwrap_or_default();
            hand_out(Communicator::init_rank_scalable(nranks, rank, &ids, current_device(), &config)?, newcomm)
        })
    }

    fn ncclCommInitAll / pncclCommInitAll(comms: *mut CommHandle, ndev: c_int, devlist: *const c_int) -> NcclResult {
        guard("ncclCommInitAll", || {
            out_ptr(comms, "ncclCommInitAll", "comms")?;
            if ndev < 1 {
                return Err(Error::invalid_argument(format!("ndev {ndev} must be at least 1")));
            }
            let devices: Vec<i32> = if devlist.is_null() {
                (0..ndev).collect()
            } else {
                // SAFETY: the caller gives `ndev` devices.
                unsafe { std::slice::from_raw_parts(devlist, ndev as usize) }.to_vec()
            };
            for (i, c) in Communicator::init_all(&devices)?.into_iter().enumerate() {
                // SAFETY: the caller gives room for `ndev` handles.
                unsafe { *comms.add(i) = handles::publish(c) };
            }
            Ok(())
        })
    }

    fn ncclCommFinalize / pncclCommFinalize(comm: CommHandle) -> NcclResult {
        guard_comm("ncclCommFinalize", comm, || handles::get(comm, "ncclCommFinalize")?.comm.finalize())
    }

    fn ncclCommDestroy / pncclCommDestroy(comm: CommHandle) -> NcclResult {
        guard("ncclCommDestroy", || {
            if comm.is_null() {
                return Ok(());
            }
            // Retired first: a call racing this one on another thread either holds the
            // communicator already (it is dropped when that call returns) or is refused.
            let c = handles::retire(comm, "ncclCommDestroy")?;
            c.comm.destroy()
        })
    }

    fn ncclCommAbort / pncclCommAbort(comm: CommHandle) -> NcclResult {
        guard("ncclCommAbort", || {
            if comm.is_null() {
                return Ok(());
            }
            let c = handles::retire(comm, "ncclCommAbort")?;
            c.comm.abort()
        })
    }

    fn ncclCommRevoke / pncclCommRevoke(comm: CommHandle, flags: c_int) -> NcclResult {
        guard_comm("ncclCommRevoke", comm, || handles::get(comm, "ncclCommRevoke")?.comm.revoke(flags))
    }

    fn ncclCommSplit / pncclCommSplit(comm: CommHandle, color: c_int, key: c_int, newcomm: *mut CommHandle, config: *const NcclConfig) -> NcclResult {
        guard_comm("ncclCommSplit", comm, || {
            let c = handles::get(comm, "ncclCommSplit")?;
            out_ptr(newcomm, "ncclCommSplit", "newcomm")?;
            // SAFETY: as for ncclCommInitRankConfig.
            let config = unsafe { read_config(config, "ncclCommSplit")? };
            match c.comm.split(color, key, config.as_ref())? {
                Some(child) => hand_out(child, newcomm),
                None => {
                    // SAFETY: checked non-null.
                    unsafe { *newcomm = std::ptr::null_mut() };
                    Ok(())
                }
            }
        })
    }

    fn ncclCommShrink / pncclCommShrink(
        comm: CommHandle, exclude: *const c_int, count: c_int, newcomm: *mut CommHandle, config: *const NcclConfig, flags: c_int,
    ) -> NcclResult {
        guard_comm("ncclCommShrink", comm, || {
            let c = handles::get(comm, "ncclCommShrink")?;
            out_ptr(newcomm, "ncclCommShrink", "newcomm")?;
            if count < 0 || (count > 0 && exclude.is_null()) {
                return Err(Error::invalid_argument(format!("excludeRanksList is NULL or excludeRanksCount {count} is negative")));
            }
            let list = if count == 0 {
                Vec::new()
            } else {
                // SAFETY: the caller gives `count` ranks.
                unsafe { std::slice::from_raw_parts(exclude, count as usize) }.to_vec()
            };
            // SAFETY: as for ncclCommInitRankConfig.
            let config = unsafe { read_config(config, "ncclCommShrink")? };
            hand_out(c.comm.shrink(&list, config.as_ref(), ShrinkFlags::from_i32(flags)?)?, newcomm)
        })
    }

    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: CommHandle, err: *mut NcclResult) -> NcclResult {
        guard_comm("ncclCommGetAsyncError", comm, || {
            let c = handles::get(comm, "ncclCommGetAsyncError")?;
            out_ptr(err, "ncclCommGetAsyncError", "asyncError")?;
            // SAFETY: checked non-null.
            unsafe { *err = c.comm.async_error() as NcclResult };
            Ok(())
        })
    }

    fn ncclCommCount / pncclCommCount(comm: CommHandle, count: *mut c_int) -> NcclResult {
        guard_comm("ncclCommCount", comm, || {
            let c = handles::get(comm, "ncclCommCount")?;
            out_ptr(count, "ncclCommCount", "count")?;
            let n = c.comm.count()?;
            // SAFETY: checked non-null.
            unsafe { *count = n };
            Ok(())
        })
    }

    fn ncclCommCuDevice / pncclCommCuDevice(comm: CommHandle, device: *mut c_int) -> NcclResult {
        guard_comm("ncclCommCuDevice", comm, || {
            let c = handles::get(comm, "ncclCommCuDevice")?;
            out_ptr(device, "ncclCommCuDevice", "device")?;
            let d = c.comm.device()?;
            // SAFETY: checked non-null.
            unsafe { *device = d };
            Ok(())
        })
    }

    fn ncclCommUserRank / pncclCommUserRank(comm: CommHandle, rank: *mut c_int) -> NcclResult {
        guard_comm("ncclCommUserRank", comm, || {
            let c = handles::get(comm, "ncclCommUserRank")?;
            out_ptr(rank, "ncclCommUserRank", "rank")?;
            let r = c.comm.user_rank()?;
            // SAFETY: checked non-null.
            unsafe { *rank = r };
            Ok(())
        })
    }

    fn ncclGetErrorString / pncclGetErrorString(result: NcclResult) -> *const c_char {
        error_string(result).as_ptr() as *const c_char
    }

    fn ncclGetLastError / pncclGetLastError(comm: CommHandle) -> *const c_char {
        let text = match handles::get(comm, "ncclGetLastError") {
            Ok(c) if !c.comm.last_error().is_empty() => c.comm.last_error(),
            _ => rustccl::error::last_error(),
        };
        LAST_ERROR.with(|s| {
            *s.borrow_mut() = CString::new(text.replace('\0', " ")).unwrap_or_default();
            s.borrow().as_ptr()
        })
    }

    fn ncclResetDebugInit / pncclResetDebugInit() -> () {
        rustccl::log::reload_from_env();
    }
}

/// `ncclGetErrorString`'s texts, NUL-terminated and static.
fn error_string(result: NcclResult) -> &'static str {
    match ResultCode::from_i32(result) {
        Some(ResultCode::Success) => "no error\0",
        Some(ResultCode::UnhandledCudaError) => "unhandled cuda error (run with NCCL_DEBUG=INFO for details)\0",
        Some(ResultCode::SystemError) => "unhandled system error (run with NCCL_DEBUG=INFO for details)\0",
        Some(ResultCode::InternalError) => "internal error - please report this issue to the rustccl developers\0",
        Some(ResultCode::InvalidArgument) => "invalid argument (run with NCCL_DEBUG=WARN for details)\0",
        Some(ResultCode::InvalidUsage) => "invalid usage (run with NCCL_DEBUG=WARN for details)\0",
        Some(ResultCode::RemoteError) => "remote process exited or there was a network error\0",
        Some(ResultCode::InProgress) => "NCCL operation in progress\0",
        Some(ResultCode::Timeout) => "operation timed out (see the hang report in the log)\0",
        None => "unknown result code\0",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_strings_match_the_codes() {
        for code in 0..9 {
            let s = error_string(code);
            assert!(s.ends_with('\0'));
            assert_eq!(s.trim_end_matches('\0'), ResultCode::from_i32(code).unwrap().description());
        }
        assert_eq!(error_string(42), "unknown result code\0");
    }
}
