//! Memory (`ncclMemAlloc`, registration), symmetric windows, one-sided operations and the
//! device API. Windows, and device communicators (`crate::devcomm`, made of windows), work
//! where the backend has symmetric memory (the host backend and CUDA; others refuse with a
//! message). What needs hardware rustccl does not drive answers as NCCL does without it: GIN
//! barriers `ncclInvalidUsage` (`devcomm::no_gin`), multicast pointers NULL. One-sided
//! operations run on the host backend and CUDA (`rustccl::coll::one_sided`; HIP refuses them
//! with a message); LL all-to-all buffers are resource requirements (`devcomm::lla2a_requirement`,
//! the sessions in nccl_device.h).

use std::os::raw::{c_int, c_void};
use std::sync::Mutex;

use rustccl::backend::{DeviceBackend, DevicePtr, Stream};
use rustccl::types::DataType;
use rustccl::window::signals::WaitSignalDesc;
use rustccl::Error;

use crate::devcomm::{self, DevComm, DevCommRequirements, DevResourceRequirements, LlA2aHandle, LsaBarrierHandle};
use crate::handles::{self, CommHandle};
use crate::windows;
use crate::{guard, guard_comm, nccl_api, NcclResult, NcclTeam};

/// Allocations made by `ncclMemAlloc`, with their backend, so `ncclMemFree` needs no comm.
static ALLOCS: Mutex<Vec<(u64, std::sync::Arc<dyn DeviceBackend>)>> = Mutex::new(Vec::new());

/// A registration made by `ncclCommRegister` (the handle points to one).
struct Registration {
    ptr: DevicePtr,
    /// Registered with the backend by this call (host memory it did not know yet).
    owned: bool,
    /// The communicator's id of it (zero-copy receives into it: `Communicator::register_buffer`).
    id: u64,
}

/// Whether every rank of `comm` reaches every other's windows (the backend has symmetric
/// memory, and its ranks share a host).
pub(crate) fn lsa_is_world(comm: &rustccl::Communicator) -> bool {
    let one_host = comm.host_hashes().is_ok_and(|h| h.iter().all(|x| *x == h[0]));
    // Backends with symmetric memory: every rank of one host maps every rank's windows.
    one_host && comm.backend().window_memory().is_some()
}

/// `*out` = where `rank` (of the LSA team, which is every rank where windows work) holds
/// `offset` bytes into window `win`.
fn peer_pointer(win: *mut c_void, offset: usize, rank: c_int, out: *mut *mut c_void, what: &str) -> Result<(), Error> {
    if out.is_null() {
        return Err(Error::invalid_argument("outPtr is NULL"));
    }
    // SAFETY: checked non-null.
    unsafe { *out = std::ptr::null_mut() };
    let r = usize::try_from(rank).map_err(|_| Error::invalid_argument(format!("rank {rank} is negative")))?;
    let p = windows::with(win, what, |w| w.peer_ptr(r, offset))??;
    // SAFETY: checked non-null.
    unsafe { *out = p.0 as *mut c_void };
    Ok(())
}

/// The one-sided calls' `flags`: reserved, 0 (as NCCL checks).
fn check_flags(what: &str, flags: u32) -> Result<(), Error> {
    if flags != 0 {
        return Err(Error::invalid_argument(format!("{what}: flags {flags:#x} are invalid: they are reserved and must be 0")));
    }
    Ok(())
}

/// NCCL's `ncclMultimemHandle` (by value: one pointer).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MultimemHandle {
    mc_base_ptr: *mut c_void,
}

/// What NCCL's multicast pointer calls give where the system has no multimem: a live window,
/// a non-NULL `outPtr`, and then `*outPtr` = NULL with success (rustccl drives no NVLS).
fn no_multicast_pointer(win: *mut c_void, out: *mut *mut c_void, what: &str) -> Result<(), Error> {
    if win.is_null() || out.is_null() {
        return Err(Error::invalid_argument(format!("{what}: window or outPtr is NULL")));
    }
    windows::with(win, what, |_| ())?;
    // SAFETY: checked non-null.
    unsafe { *out = std::ptr::null_mut() };
    Ok(())
}

nccl_api! {
    fn ncclMemAlloc / pncclMemAlloc(out: *mut *mut c_void, size: usize) -> NcclResult {
        guard("ncclMemAlloc", || {
            if out.is_null() {
                return Err(Error::invalid_argument("ptr is NULL"));
            }
            if size == 0 {
                return Err(Error::invalid_argument("size is 0"));
            }
            let backend = rustccl::backend::select_backend()?;
            // The caller's current device (cudaSetDevice), as NCCL.
            let device = match backend.current_device()? {
                Some(d) => usize::try_from(d).map_err(|_| Error::invalid_usage(format!("current device {d} is negative")))?,
                None => rustccl::params::env_str("RUSTCCL_DEVICE").and_then(|v| v.trim().parse().ok()).unwrap_or(0),
            };
            // Memory windows can be made of, where the backend has windows; shareable memory
            // elsewhere (what NCCL's allocator gives too).
            let p = match backend.window_memory() {
                Some(windows) => windows.alloc_symmetric(device, size)?,
                None => backend.alloc_shareable(device, size)?.0,
            };
            ALLOCS.lock().unwrap_or_else(|e| e.into_inner()).push((p.0, backend));
            // SAFETY: checked non-null.
            unsafe { *out = p.0 as *mut c_void };
            Ok(())
        })
    }

    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> NcclResult {
        guard("ncclMemFree", || {
            let mut allocs = ALLOCS.lock().unwrap_or_else(|e| e.into_inner());
            let i = allocs.iter().position(|(p, _)| *p == ptr as u64).ok_or_else(|| {
                Error::invalid_argument(format!("{ptr:p} was not allocated by ncclMemAlloc (or was freed already)"))
            })?;
            let (p, backend) = allocs.swap_remove(i);
            backend.free(DevicePtr(p))
        })
    }

    fn ncclCommRegister / pncclCommRegister(comm: CommHandle, buff: *mut c_void, size: usize, handle: *mut *mut c_void) -> NcclResult {
        guard_comm("ncclCommRegister", comm, || {
            let c = handles::get(comm, "ncclCommRegister")?;
            if buff.is_null() || handle.is_null() || size == 0 {
                return Err(Error::invalid_argument("buff or handle is NULL, or size is 0"));
            }
            let backend = c.comm.backend();
            // Device memory is known to the driver; host memory the host backend does not know
            // yet is registered for the time of the registration.
            let known = match backend.host_access() {
                None => true,
                Some(host) => host.host_address(DevicePtr(buff as u64), size).is_ok(),
            };
            let (ptr, owned) = if known {
                (DevicePtr(buff as u64), false)
            } else {
                // SAFETY: the caller registers memory it keeps valid until ncclCommDeregister.
                (unsafe { backend.register_host(buff as *mut u8, size)? }, true)
            };
            let id = match c.comm.register_buffer(ptr, size) {
                Ok(id) => id,
                Err(e) => {
                    if owned {
                        let _ = backend.unregister_host(ptr);
                    }
                    return Err(e);
                }
            };
            let reg = Registration { ptr, owned, id };
            // SAFETY: checked non-null.
            unsafe { *handle = Box::into_raw(Box::new(reg)) as *mut c_void };
            Ok(())
        })
    }

    fn ncclCommDeregister / pncclCommDeregister(comm: CommHandle, handle: *mut c_void) -> NcclResult {
        guard_comm("ncclCommDeregister", comm, || {
            let c = handles::get(comm, "ncclCommDeregister")?;
            if handle.is_null() {
                return Err(Error::invalid_argument("handle is NULL"));
            }
            // SAFETY: a handle from ncclCommRegister (the caller's contract, as with NCCL).
            let reg = unsafe { Box::from_raw(handle as *mut Registration) };
            let dereg = c.comm.deregister_buffer(reg.id);
            if reg.owned {
                c.comm.backend().unregister_host(reg.ptr)?;
            }
            dereg
        })
    }

    /// Collective (every rank, same order). As NCCL: a NULL buffer or a size of 0 succeeds
    /// and leaves `*win` as it is; inside a group it runs (and `*win` is written) when the
    /// outermost group ends. The buffer must lie in `ncclMemAlloc` memory, a multiple of 4096
    /// bytes into it.
    fn ncclCommWindowRegister / pncclCommWindowRegister(
        comm: CommHandle, buff: *mut c_void, size: usize, win: *mut *mut c_void, flags: c_int,
    ) -> NcclResult {
        guard_comm("ncclCommWindowRegister", comm, || {
            let c = handles::get(comm, "ncclCommWindowRegister")?;
            if win.is_null() {
                return Err(Error::invalid_argument("win is NULL"));
            }
            if buff.is_null() || size == 0 {
                return Ok(());
            }
            let flags = u32::try_from(flags).map_err(|_| Error::invalid_argument(format!("window flags {flags}")))?;
            if rustccl::coll::group_depth() > 0 {
                windows::defer(c, buff as u64, size, flags, win);
                return Ok(());
            }
            let w = c.comm.window_register(DevicePtr(buff as u64), size, flags)?;
            let h = windows::publish(&c.comm, w)?;
            // SAFETY: checked non-null.
            unsafe { *win = h };
            Ok(())
        })
    }

    /// Local, as NCCL. NULL succeeds.
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: CommHandle, win: *mut c_void) -> NcclResult {
        guard_comm("ncclCommWindowDeregister", comm, || {
            let c = handles::get(comm, "ncclCommWindowDeregister")?;
            if win.is_null() {
                return Ok(());
            }
            let w = windows::take(win, "ncclCommWindowDeregister")?;
            c.comm.window_deregister(&w)
        })
    }

    fn ncclWinGetUserPtr / pncclWinGetUserPtr(comm: CommHandle, win: *mut c_void, out: *mut *mut c_void) -> NcclResult {
        guard_comm("ncclWinGetUserPtr", comm, || {
            handles::get(comm, "ncclWinGetUserPtr")?;
            if out.is_null() {
                return Err(Error::invalid_argument("outUserPtr is NULL"));
            }
            // SAFETY: checked non-null.
            unsafe { *out = std::ptr::null_mut() };
            let user = windows::with(win, "ncclWinGetUserPtr", |w| w.user_ptr())?;
            // SAFETY: checked non-null.
            unsafe { *out = user.0 as *mut c_void };
            Ok(())
        })
    }

    /// Rank `lsa_rank` of the window's LSA team (every rank, on one host).
    fn ncclGetLsaDevicePointer / pncclGetLsaDevicePointer(win: *mut c_void, offset: usize, lsa_rank: c_int, out: *mut *mut c_void) -> NcclResult {
        guard("ncclGetLsaDevicePointer", || peer_pointer(win, offset, lsa_rank, out, "ncclGetLsaDevicePointer"))
    }

    /// World rank `peer` (in the LSA team wherever windows work).
    fn ncclGetPeerDevicePointer / pncclGetPeerDevicePointer(win: *mut c_void, offset: usize, peer: c_int, out: *mut *mut c_void) -> NcclResult {
        guard("ncclGetPeerDevicePointer", || peer_pointer(win, offset, peer, out, "ncclGetPeerDevicePointer"))
    }

    /// 2.29. NULL: the system has no multimem (NVLS), as NCCL answers then.
    fn ncclGetLsaMultimemDevicePointer / pncclGetLsaMultimemDevicePointer(win: *mut c_void, _offset: usize, out: *mut *mut c_void) -> NcclResult {
        guard("ncclGetLsaMultimemDevicePointer", || no_multicast_pointer(win, out, "ncclGetLsaMultimemDevicePointer"))
    }

    /// 2.29. A handle without a multicast base is invalid (as NCCL); rustccl never makes one
    /// with a base, so a live window gives NULL, as NCCL's does without multimem.
    fn ncclGetMultimemDevicePointer / pncclGetMultimemDevicePointer(
        win: *mut c_void, _offset: usize, multimem: MultimemHandle, out: *mut *mut c_void,
    ) -> NcclResult {
        guard("ncclGetMultimemDevicePointer", || {
            if !win.is_null() && !out.is_null() && multimem.mc_base_ptr.is_null() {
                return Err(Error::invalid_argument(
                    "multimem.mcBasePtr is NULL: multimem handles come from ncclDevCommCreate's team requirements, and \
                     rustccl makes none (no NVLink SHARP multicast, NVLS)",
                ));
            }
            no_multicast_pointer(win, out, "ncclGetMultimemDevicePointer")
        })
    }

    /// 2.29: `count` elements from `localbuff` (in an `NCCL_WIN_COLL_SYMMETRIC` window of
    /// `comm`) into rank `peer`'s part of `peerWin` at `peerWinOffset`, then a signal to
    /// `peer` (`Communicator::put_signal`). Host backend and CUDA; in groups too.
    fn ncclPutSignal / pncclPutSignal(
        localbuff: *const c_void, count: usize, datatype: c_int, peer: c_int, peer_win: *mut c_void, offset: usize,
        sig_idx: c_int, ctx: c_int, flags: u32, comm: CommHandle, stream: *mut c_void,
    ) -> NcclResult {
        guard_comm("ncclPutSignal", comm, || {
            let c = handles::get(comm, "ncclPutSignal")?;
            check_flags("ncclPutSignal", flags)?;
            if localbuff.is_null() || peer_win.is_null() {
                return Err(Error::invalid_argument("ncclPutSignal: localbuff or peerWin is NULL"));
            }
            let t = DataType::from_i32(datatype).ok_or_else(|| Error::invalid_argument(format!("ncclPutSignal: invalid data type {datatype}")))?;
            let w = windows::with(peer_win, "ncclPutSignal", |w| w.clone())?;
            c.comm.put_signal(DevicePtr(localbuff as u64), count, t, peer, &w, offset, sig_idx, ctx, Stream(stream as u64))
        })
    }

    /// 2.29: a signal to `peer` without data (`Communicator::signal`).
    fn ncclSignal / pncclSignal(peer: c_int, sig_idx: c_int, ctx: c_int, flags: u32, comm: CommHandle, stream: *mut c_void) -> NcclResult {
        guard_comm("ncclSignal", comm, || {
            let c = handles::get(comm, "ncclSignal")?;
            check_flags("ncclSignal", flags)?;
            c.comm.signal(peer, sig_idx, ctx, Stream(stream as u64))
        })
    }

    /// 2.29: waits, in stream order, for each descriptor's `opCnt` more signals from its peer
    /// (`Communicator::wait_signal`).
    fn ncclWaitSignal / pncclWaitSignal(n_desc: c_int, descs: *mut WaitSignalDesc, comm: CommHandle, stream: *mut c_void) -> NcclResult {
        guard_comm("ncclWaitSignal", comm, || {
            let c = handles::get(comm, "ncclWaitSignal")?;
            let n = usize::try_from(n_desc).ok().filter(|&n| n > 0);
            let (Some(n), false) = (n, descs.is_null()) else {
                return Err(Error::invalid_argument(format!("ncclWaitSignal: nDesc is {n_desc} and signalDescs {descs:p}: give at least one descriptor")));
            };
            // SAFETY: the caller's array of `nDesc` descriptors (NCCL's contract), checked
            // non-NULL; `WaitSignalDesc` has `ncclWaitSignalDesc_t`'s layout.
            let descs = unsafe { std::slice::from_raw_parts(descs, n) };
            c.comm.wait_signal(descs, Stream(stream as u64))
        })
    }

    /// Collective (every rank, same requirements): the LSA subset (see `crate::devcomm`).
    fn ncclDevCommCreate / pncclDevCommCreate(comm: CommHandle, reqs: *const DevCommRequirements, out: *mut DevComm) -> NcclResult {
        // SAFETY: the caller's pointers (NULL is checked), as NCCL's contract.
        guard_comm("ncclDevCommCreate", comm, || unsafe { devcomm::create(comm, reqs, out) })
    }

    /// 2.29: rank, size, device and the device API's features.
    fn ncclCommQueryProperties / pncclCommQueryProperties(comm: CommHandle, props: *mut devcomm::CommProperties) -> NcclResult {
        // SAFETY: the caller's pointer (NULL is checked).
        guard_comm("ncclCommQueryProperties", comm, || unsafe { devcomm::query_properties(comm, props) })
    }

    /// Local; a device communicator whose communicator is gone is an error (its memory freed).
    fn ncclDevCommDestroy / pncclDevCommDestroy(comm: CommHandle, dev: *const DevComm) -> NcclResult {
        // SAFETY: the caller's pointer (NULL is checked).
        guard_comm("ncclDevCommDestroy", comm, || unsafe { devcomm::destroy(comm, dev) })
    }

    fn ncclLsaBarrierCreateRequirement / pncclLsaBarrierCreateRequirement(
        team: NcclTeam, n: c_int, handle: *mut LsaBarrierHandle, req: *mut DevResourceRequirements,
    ) -> NcclResult {
        guard("ncclLsaBarrierCreateRequirement", || devcomm::lsa_barrier_requirement(team, n, handle, req))
    }

    /// GIN barriers need a GIN-capable network: refused as NCCL refuses GIN without one.
    fn ncclGinBarrierCreateRequirement / pncclGinBarrierCreateRequirement(
        comm: CommHandle, _team: NcclTeam, _n: c_int, _handle: *mut c_void, _req: *mut c_void,
    ) -> NcclResult {
        guard_comm("ncclGinBarrierCreateRequirement", comm, || Err(devcomm::no_gin("ncclGinBarrierCreateRequirement")))
    }

    /// 2.30: the resource memory of an LL all-to-all (`ncclLLA2ASession` in nccl_device.h).
    fn ncclLLA2ACreateRequirement / pncclLLA2ACreateRequirement(
        blocks: c_int, slots: c_int, handle: *mut LlA2aHandle, req: *mut DevResourceRequirements,
    ) -> NcclResult {
        guard("ncclLLA2ACreateRequirement", || devcomm::lla2a_requirement(blocks, slots, handle, req))
    }

    /// Slots an LL all-to-all needs for `max_elts` elements of `max_elt_size` bytes: one per
    /// 8 bytes of each (NCCL's arithmetic; overflow wraps).
    fn ncclLLA2ACalcSlots / pncclLLA2ACalcSlots(max_elts: c_int, max_elt_size: c_int) -> c_int {
        max_elts.wrapping_mul(max_elt_size.wrapping_add(7) / 8)
    }

    /// Every rank, stride 1.
    fn ncclTeamWorld / pncclTeamWorld(comm: CommHandle) -> NcclTeam {
        match handles::get(comm, "ncclTeamWorld") {
            Ok(c) => NcclTeam { n_ranks: c.comm.count().unwrap_or(0), rank: c.comm.user_rank().unwrap_or(0), stride: 1 },
            Err(_) => NcclTeam::default(),
        }
    }

    /// The ranks that can address each other's memory directly (through windows): every
    /// rank where the backend has symmetric memory (the host backend: one host), else each
    /// rank alone.
    fn ncclTeamLsa / pncclTeamLsa(comm: CommHandle) -> NcclTeam {
        match handles::get(comm, "ncclTeamLsa") {
            Ok(c) if lsa_is_world(&c.comm) => NcclTeam { n_ranks: c.comm.count().unwrap_or(0), rank: c.comm.user_rank().unwrap_or(0), stride: 1 },
            Ok(_) => NcclTeam { n_ranks: 1, rank: 0, stride: 1 },
            Err(_) => NcclTeam::default(),
        }
    }

    /// The ranks with the same LSA rank: this rank alone when the LSA team is every rank,
    /// every rank when LSA teams are single ranks.
    fn ncclTeamRail / pncclTeamRail(comm: CommHandle) -> NcclTeam {
        match handles::get(comm, "ncclTeamRail") {
            Ok(c) if lsa_is_world(&c.comm) => NcclTeam { n_ranks: 1, rank: 0, stride: c.comm.count().unwrap_or(1) },
            // SAFETY: same contract.
            Ok(_) => unsafe { ncclTeamWorld(comm) },
            Err(_) => NcclTeam::default(),
        }
    }

    fn ncclTeamRankToWorld / pncclTeamRankToWorld(comm: CommHandle, team: NcclTeam, rank: c_int) -> c_int {
        match handles::get(comm, "ncclTeamRankToWorld") {
            Ok(c) => c.comm.user_rank().unwrap_or(0) + (rank - team.rank) * team.stride,
            Err(_) => -1,
        }
    }

    fn ncclTeamRankToLsa / pncclTeamRankToLsa(comm: CommHandle, team: NcclTeam, rank: c_int) -> c_int {
        match handles::get(comm, "ncclTeamRankToLsa") {
            Ok(_) => (rank - team.rank) * team.stride,
            Err(_) => -1,
        }
    }
}
