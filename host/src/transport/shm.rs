//! Shared-memory transports between ranks of one host, unless `NCCL_SHM_DISABLE=1`.
//!
//! - [`Shm`] (host backend): the whole FIFO in the backend's shareable memory, exported by the
//!   receiver and mapped by the sender.
//! - [`PinnedShm`] (device backends with `NCCL_P2P_DISABLE=1`): header and Simple slots in
//!   host shareable memory, registered with the device backend on both sides so that both
//!   devices reach it.
//!
//! The message to the sender is the memory's share handle. The sender is its only importer:
//! the file goes once mapped (`import_last`), so a killed rank leaves nothing in /dev/shm.

use std::sync::Arc;

use super::fifo::{self, fifo_bytes, Fifo};
use super::{Connection, Context, Dir, Kind, Memory, Progress, Reach, Transport, SLOT_BYTES};
use super::gpu_simple_fifo;
use crate::backend::ShareHandle;
use crate::error::{Error, Result};
use crate::program::Link;

/// Host backend: a FIFO in host memory both ranks map.
pub struct Shm;

impl Transport for Shm {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn kind(&self) -> Kind {
        Kind::Shm
    }

    fn can_connect(&self, reach: &Reach) -> bool {
        !reach.device && reach.same_host && !reach.shm_disabled
    }

    fn setup_recv(&self, cx: &Context, link: Link) -> Result<(Progress, Vec<u8>)> {
        let bytes = fifo_bytes(SLOT_BYTES);
        let (ptr, handle) = cx.backend.alloc_shareable(cx.device, bytes)?;
        let base = cx.backend.host_access_or_err("shm transport")?.host_address(ptr, bytes)?;
        let memory = Memory::Exported { backend: Arc::clone(cx.backend), ptr, bytes };
        // SAFETY: the region is fifo_bytes(SLOT_BYTES) of zeroed shared memory that
        // `memory` keeps mapped as long as the connection lives.
        let fifo = unsafe { Fifo::new(base as *mut u8, SLOT_BYTES) };
        let conn = Connection::new(link, Dir::Recv, Kind::Shm, fifo, vec![memory]);
        Ok((Progress::Made(Arc::new(conn)), handle.to_bytes().to_vec()))
    }

    fn connect_send(&self, cx: &Context, link: Link, message: &[u8]) -> Result<Progress> {
        let handle = ShareHandle::from_bytes(message)?;
        // The only importer: the file goes once mapped, so a killed rank
        // leaves nothing in /dev/shm.
        let ptr = cx.backend.import_last(cx.device, &handle)?;
        let base = cx.backend.host_access_or_err("shm transport")?.host_address(ptr, fifo_bytes(SLOT_BYTES))?;
        let memory = Memory::Imported { backend: Arc::clone(cx.backend), ptr };
        // SAFETY: the receiver's zeroed FIFO region, mapped while `memory` lives.
        let fifo = unsafe { Fifo::new(base as *mut u8, SLOT_BYTES) };
        Ok(Progress::Made(Arc::new(Connection::new(link, Dir::Send, Kind::Shm, fifo, vec![memory]))))
    }
}

/// Device backends without P2P: header and Simple slots in pinned host memory.
pub struct PinnedShm;

impl Transport for PinnedShm {
    fn name(&self) -> &'static str {
        "shm-pinned"
    }

    fn kind(&self) -> Kind {
        Kind::ShmPinned
    }

    fn can_connect(&self, reach: &Reach) -> bool {
        reach.device && reach.same_host && !reach.shm_disabled
    }

    fn setup_recv(&self, cx: &Context, link: Link) -> Result<(Progress, Vec<u8>)> {
        let host = Context::host()?;
        let (hptr, hhandle) = host.alloc_shareable(0, pinned_bytes())?;
        let msg = hhandle.to_bytes().to_vec();
        let (fifo, mem) = pinned_fifo(cx, Memory::Exported { backend: host, ptr: hptr, bytes: pinned_bytes() })?;
        Ok((Progress::Made(Arc::new(Connection::new(link, Dir::Recv, Kind::ShmPinned, fifo, mem))), msg))
    }

    fn connect_send(&self, cx: &Context, link: Link, message: &[u8]) -> Result<Progress> {
        let host = Context::host()?;
        let handle_len = ShareHandle::SIZE;
        let hhandle =
            ShareHandle::from_bytes(message.get(..handle_len).ok_or_else(|| Error::internal("short handle"))?)?;
        // The only importer: the file goes once mapped (nothing left if a rank is killed).
        let hptr = host.import_last(0, &hhandle)?;
        let (fifo, mem) = pinned_fifo(cx, Memory::Imported { backend: host, ptr: hptr })?;
        Ok(Progress::Made(Arc::new(Connection::new(link, Dir::Send, Kind::ShmPinned, fifo, mem))))
    }
}

/// Bytes of a pinned FIFO: the header and the Simple slots.
fn pinned_bytes() -> usize {
    fifo::header_bytes() + gpu_simple_fifo().bytes()
}

/// A pinned FIFO over shared host memory `host_mem` (exported here or imported), registered
/// with the device backend too; the memory to keep, the registration first (it is released
/// before the mapping).
fn pinned_fifo(cx: &Context, host_mem: Memory) -> Result<(Fifo, Vec<Memory>)> {
    let (host, hptr) = match &host_mem {
        Memory::Exported { backend, ptr, .. } | Memory::Imported { backend, ptr } => (backend, *ptr),
        _ => return Err(Error::internal("a pinned FIFO needs shared host memory")),
    };
    let (hb, bytes, f) = (fifo::header_bytes(), pinned_bytes(), gpu_simple_fifo());
    let haddr = host.host_access_or_err("pinned FIFO")?.host_address(hptr, bytes)?;
    // SAFETY: the shared mapping outlives the registration (`host_mem` is released after it).
    let dptr = unsafe { cx.backend.register_host(haddr as *mut u8, bytes)? };
    let mem = vec![Memory::Registered { backend: Arc::clone(cx.backend), ptr: dptr }, host_mem];
    // SAFETY: as above; the slots follow the header in the registered mapping.
    let fifo = unsafe { Fifo::with_device_slots(haddr as *mut u8, dptr.0, dptr.0 + hb as u64, f.slot_bytes, f.steps) };
    Ok((fifo, mem))
}
