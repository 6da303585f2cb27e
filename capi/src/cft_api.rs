//! CFT (Compute Fabric Transport, NCCL 2.31/2.32): windows bound to CUDA logical endpoints,
//! which need CUDA 13.3 and GPUs with logical-endpoint support. rustccl drives no such
//! hardware, so these calls answer as NCCL's do on a GPU without CFT support: the CFT teams
//! are this rank alone (NCCL's CFT team sizes are 1 there), and the logical-endpoint queries
//! check their arguments, then refuse with `ncclInvalidArgument` and a message saying why.
//! The CFT barrier requirement is plain arithmetic on resource memory, computed as NCCL's.

use std::os::raw::{c_int, c_void};

use rustccl::Error;

use crate::devcomm::{self, DevResourceRequirements};
use crate::handles::{self, CommHandle};
use crate::mem_api::lsa_is_world;
use crate::windows;
use crate::{guard, nccl_api, NcclResult, NcclTeam};

/// `ncclCftTeamMode_t`.
const CFT_TEAM_FLAT: c_int = 0;
const CFT_TEAM_HIER_MULTIMEM: c_int = 1;
const CFT_TEAM_HIER_LSA: c_int = 2;

/// NCCL's `NCCL_CFT_BARRIER_ALIGN` (and `_GRAN`, the bytes of each barrier word).
const CFT_BARRIER_ALIGN: usize = 16;

/// `ncclCftBarrierHandle_t`.
#[repr(C)]
pub struct CftBarrierHandle {
    buf_handle: u32,
    n_barriers: c_int,
}

/// What a CFT call meets here: no logical endpoints, whatever `hostCftMode` says.
fn no_cft(what: &str) -> Error {
    Error::invalid_argument(format!(
        "{what}: CFT (Compute Fabric Transport) logical endpoints need CUDA 13.3 and a GPU with logical-endpoint \
         support, which rustccl does not drive (as NCCL answers on a GPU without CFT support); address peers' \
         windows with ncclGetPeerDevicePointer / ncclGetLsaDevicePointer instead"
    ))
}

/// A logical-endpoint query: NCCL checks the pointers, then the window, then CFT support.
fn le_query(what: &str, window: *mut c_void, le_id: *mut u32, le_offset: *mut usize) -> Result<(), Error> {
    for (p, name) in [(window as *const c_void, "window"), (le_id as *const c_void, "leId"), (le_offset as *const c_void, "leOffset")] {
        if p.is_null() {
            return Err(Error::invalid_argument(format!("{what}: {name} is NULL")));
        }
    }
    windows::with(window, what, |_| ())?;
    Err(no_cft(what))
}

/// NCCL's `ncclTeamOuterFactor`: the team of every `inner`-th rank of `parent`.
fn outer_factor(parent: NcclTeam, inner: c_int) -> NcclTeam {
    if inner <= 0 {
        return NcclTeam::default();
    }
    NcclTeam { n_ranks: parent.n_ranks / inner, rank: parent.rank / inner, stride: parent.stride * inner }
}

/// The CFT teams of `comm` for `mode` (`None`: a mode NCCL does not know). Without CFT support
/// NCCL's flat and multicast CFT teams are the rank alone; the hierarchical teams are the flat
/// team's outer factor by the multicast team (1 rank) or the LSA team.
fn cft_team(comm: CommHandle, mode: c_int, what: &str) -> NcclTeam {
    let Ok(c) = handles::get(comm, what) else { return NcclTeam::default() };
    let alone = NcclTeam { n_ranks: 1, rank: 0, stride: 1 };
    match mode {
        CFT_TEAM_FLAT | CFT_TEAM_HIER_MULTIMEM => alone,
        CFT_TEAM_HIER_LSA => {
            let lsa_size = if lsa_is_world(&c.comm) { c.comm.count().unwrap_or(1) } else { 1 };
            outer_factor(alone, lsa_size)
        }
        _ => NcclTeam::default(),
    }
}

/// `ncclDevCommCreate`'s check of the requirements' 2.31 fields `cftCaps` and `cftBarrierCount`
/// (0 where the caller's header predates them): CFT capabilities or CFT barriers cannot be had
/// here, and a device communicator without them would leave the caller's CFT kernels without
/// endpoints, so the call is refused (`ncclInvalidArgument`, as NCCL without CFT support, and
/// as the CFT queries) before anything is made.
pub(crate) fn refuse_cft_requirements(cft_caps: c_int, cft_barrier_count: c_int) -> Result<(), Error> {
    for (v, field) in [(cft_caps, "cftCaps"), (cft_barrier_count, "cftBarrierCount")] {
        if v != 0 {
            return Err(no_cft(&format!("ncclDevCommCreate (reqs->{field} = {v})")));
        }
    }
    Ok(())
}

nccl_api! {
    /// 2.31: the CFT team of `mode` (see [`cft_team`]); `{0, 0, 0}` for a bad communicator or
    /// mode, as NCCL.
    fn ncclTeamCft / pncclTeamCft(comm: CommHandle, mode: c_int) -> NcclTeam {
        cft_team(comm, mode, "ncclTeamCft")
    }

    /// 2.31: the CFT multicast team: this rank alone (no CFT multicast).
    fn ncclTeamCftMultimem / pncclTeamCftMultimem(comm: CommHandle) -> NcclTeam {
        cft_team(comm, CFT_TEAM_FLAT, "ncclTeamCftMultimem")
    }

    /// 2.31: refused (no CFT multicast logical endpoints).
    fn ncclGetMultimemDeviceLeInfo / pncclGetMultimemDeviceLeInfo(
        window: *mut c_void, _offset: usize, le_id: *mut u32, le_offset: *mut usize,
    ) -> NcclResult {
        guard("ncclGetMultimemDeviceLeInfo", || le_query("ncclGetMultimemDeviceLeInfo", window, le_id, le_offset))
    }

    /// 2.31: refused (no CFT logical endpoints).
    fn ncclGetCftDeviceLeInfo / pncclGetCftDeviceLeInfo(
        window: *mut c_void, _offset: usize, _peer_cft: c_int, _cft_team: NcclTeam, le_id: *mut u32, le_offset: *mut usize,
    ) -> NcclResult {
        guard("ncclGetCftDeviceLeInfo", || le_query("ncclGetCftDeviceLeInfo", window, le_id, le_offset))
    }

    /// 2.31: refused (no CFT logical endpoints).
    fn ncclGetPeerDeviceLeInfo / pncclGetPeerDeviceLeInfo(
        window: *mut c_void, _offset: usize, _peer_world: c_int, le_id: *mut u32, le_offset: *mut usize,
    ) -> NcclResult {
        guard("ncclGetPeerDeviceLeInfo", || le_query("ncclGetPeerDeviceLeInfo", window, le_id, le_offset))
    }

    /// 2.31: `nBarriers` CFT barriers over `team` need `(3 + team.nRanks) * nBarriers` words of
    /// 16 bytes, aligned to 16 (NCCL's arithmetic). Only memory: using the barriers needs a CFT
    /// device communicator, which `ncclDevCommCreate` cannot make here.
    fn ncclCftBarrierCreateRequirement / pncclCftBarrierCreateRequirement(
        team: NcclTeam, n: c_int, out_handle: *mut CftBarrierHandle, out_req: *mut DevResourceRequirements,
    ) -> NcclResult {
        guard("ncclCftBarrierCreateRequirement", || {
            if out_handle.is_null() || out_req.is_null() {
                return Err(Error::invalid_argument("ncclCftBarrierCreateRequirement: outHandle or outReq is NULL"));
            }
            let words = usize::try_from(n).ok().zip(usize::try_from(team.n_ranks).ok()).and_then(|(n, r)| n.checked_mul(r.checked_add(3)?));
            let bytes = words
                .and_then(|w| w.checked_mul(CFT_BARRIER_ALIGN))
                .filter(|b| *b <= u32::MAX as usize)
                .ok_or_else(|| Error::invalid_argument(format!(
                    "ncclCftBarrierCreateRequirement: {n} barriers over a team of {} ranks: both must be 0 or more, and the memory under 4 GiB",
                    team.n_ranks
                )))?;
            // SAFETY: both checked non-null; the caller's structs of these layouts.
            unsafe {
                (*out_handle).n_barriers = n;
                devcomm::write_memory_requirement(out_req, bytes, CFT_BARRIER_ALIGN, std::ptr::addr_of_mut!((*out_handle).buf_handle));
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outer_factor_is_nccls() {
        let t = outer_factor(NcclTeam { n_ranks: 8, rank: 5, stride: 1 }, 4);
        assert_eq!((t.n_ranks, t.rank, t.stride), (2, 1, 4));
        let t = outer_factor(NcclTeam { n_ranks: 1, rank: 0, stride: 1 }, 1);
        assert_eq!((t.n_ranks, t.rank, t.stride), (1, 0, 1));
    }

    #[test]
    fn a_bad_communicator_gets_the_empty_team() {
        // SAFETY: a NULL communicator is checked by the call.
        let t = unsafe { ncclTeamCft(std::ptr::null_mut(), CFT_TEAM_FLAT) };
        assert_eq!((t.n_ranks, t.rank, t.stride), (0, 0, 0));
    }
}
