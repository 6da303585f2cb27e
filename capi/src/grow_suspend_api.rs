//! NCCL 2.29's lifecycle calls: growing a communicator (`ncclCommGetUniqueId`,
//! `ncclCommGrow`), suspending its memory (`ncclCommSuspend`, `ncclCommResume`) and its
//! memory statistics (`ncclCommMemStats`). The semantics are the core's
//! (`rustccl::comm::grow`, `rustccl::comm::suspend`); here the C arguments are checked.

use std::os::raw::c_int;

use rustccl::config::CommConfig;
use rustccl::{Communicator, Error, MemStat};

use crate::comm_api::{current_device, hand_out, out_ptr, read_config, unique_id};
use crate::handles::{self, CommHandle};
use crate::{guard, guard_comm, nccl_api, NcclConfig, NcclResult, NcclUniqueId};

/// Writes `id` to the caller's `ncclUniqueId`.
///
/// # Safety
/// `out` must be non-null and point to an `ncclUniqueId`.
unsafe fn write_id(out: *mut NcclUniqueId, id: &rustccl::UniqueId) {
    // SAFETY: the caller's contract; 128 bytes.
    unsafe { std::ptr::copy_nonoverlapping(id.as_bytes().as_ptr(), (*out).internal.as_mut_ptr() as *mut u8, 128) };
}

nccl_api! {
    fn ncclCommGetUniqueId / pncclCommGetUniqueId(comm: CommHandle, out: *mut NcclUniqueId) -> NcclResult {
        guard_comm("ncclCommGetUniqueId", comm, || {
            let c = handles::get(comm, "ncclCommGetUniqueId")?;
            out_ptr(out, "ncclCommGetUniqueId", "uniqueId")?;
            let id = c.comm.grow_unique_id()?;
            // SAFETY: checked non-null.
            unsafe { write_id(out, &id) };
            Ok(())
        })
    }

    /// Existing ranks: `comm`, `rank` -1, the id from the coordinator only (others NULL).
    /// New ranks: `comm` NULL, the id, their rank in the grown communicator.
    fn ncclCommGrow / pncclCommGrow(
        comm: CommHandle, nranks: c_int, id: *const NcclUniqueId, rank: c_int, newcomm: *mut CommHandle, config: *const NcclConfig,
    ) -> NcclResult {
        const WHAT: &str = "ncclCommGrow";
        if !newcomm.is_null() {
            // SAFETY: checked non-null.
            unsafe { *newcomm = std::ptr::null_mut() };
        }
        let read_id = || -> Result<Option<rustccl::UniqueId>, Error> {
            if id.is_null() {
                return Ok(None);
            }
            // SAFETY: a non-null id points to an ncclUniqueId (the caller's contract).
            unique_id(unsafe { &*id }).map(Some).map_err(|e| e.context("uniqueId"))
        };
        if comm.is_null() {
            return guard(WHAT, || {
                out_ptr(newcomm, WHAT, "newcomm")?;
                let Some(id) = read_id()? else {
                    return Err(Error::invalid_argument(
                        "uniqueId is NULL: a new rank (comm NULL) passes the id the coordinator got from ncclCommGetUniqueId",
                    ));
                };
                if nranks < 1 || rank < 0 || rank >= nranks {
                    return Err(Error::invalid_argument(format!(
                        "a new rank (comm NULL) passes its rank in the grown communicator: rank {rank} is out of range for nRanks {nranks}"
                    )));
                }
                // SAFETY: the caller's config pointer, read within its declared size.
                let config = unsafe { read_config(config, WHAT)? }.unwrap_or_default();
                hand_out(Communicator::join_grow(nranks, &id, rank, current_device(), &config)?, newcomm)
            });
        }
        guard_comm(WHAT, comm, || {
            let c = handles::get(comm, WHAT)?;
            out_ptr(newcomm, WHAT, "newcomm")?;
            if rank != -1 {
                return Err(Error::invalid_argument(format!(
                    "rank {rank}: an existing rank (comm not NULL) passes rank -1 and keeps its rank in the grown communicator"
                )));
            }
            let id = read_id()?;
            // SAFETY: as above.
            let config: Option<CommConfig> = unsafe { read_config(config, WHAT)? };
            hand_out(c.comm.grow(nranks, id.as_ref(), config.as_ref())?, newcomm)
        })
    }

    fn ncclCommSuspend / pncclCommSuspend(comm: CommHandle, flags: c_int) -> NcclResult {
        guard_comm("ncclCommSuspend", comm, || handles::get(comm, "ncclCommSuspend")?.comm.suspend(flags))
    }

    fn ncclCommResume / pncclCommResume(comm: CommHandle) -> NcclResult {
        guard_comm("ncclCommResume", comm, || handles::get(comm, "ncclCommResume")?.comm.resume())
    }

    fn ncclCommMemStats / pncclCommMemStats(comm: CommHandle, stat: c_int, value: *mut u64) -> NcclResult {
        guard_comm("ncclCommMemStats", comm, || {
            let c = handles::get(comm, "ncclCommMemStats")?;
            out_ptr(value, "ncclCommMemStats", "value")?;
            let stat = MemStat::from_i32(stat)?;
            let v = c.comm.mem_stats()?.get(stat);
            // SAFETY: checked non-null.
            unsafe { *value = v };
            Ok(())
        })
    }
}
