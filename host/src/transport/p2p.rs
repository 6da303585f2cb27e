//! P2P transport: device backends, ranks of one host, unless `NCCL_P2P_DISABLE=1`. The
//! receiver allocates the FIFO header and slots (Simple, then LL and LL128) in its device's
//! shareable memory; the sender imports it (CUDA IPC) and its device writes the slots and
//! `tail` over NVLink or PCIe. The message to the sender is the memory's share handle.

use std::sync::Arc;

use super::fifo::{self, Fifo, LocalMemory};
use super::{Connection, Context, Dir, Kind, Memory, Progress, Reach, Transport};
use super::{gpu_simple_fifo, GPU_LL128_SLOT_BYTES, GPU_LL_SLOT_BYTES};
use crate::backend::{DevicePtr, ShareHandle};
use crate::error::Result;
use crate::program::Link;

/// Device memory of a P2P connection's slots.
pub fn p2p_slots_bytes() -> usize {
    gpu_simple_fifo().bytes() + fifo::STEPS * (GPU_LL_SLOT_BYTES + GPU_LL128_SLOT_BYTES)
}

/// Where a P2P connection's LL and LL128 slots start, given its first (Simple) slot.
pub fn p2p_protocol_slots(slots: u64) -> (u64, u64) {
    let ll = slots + gpu_simple_fifo().bytes() as u64;
    (ll, ll + (fifo::STEPS * GPU_LL_SLOT_BYTES) as u64)
}

/// Slots in the receiver's device memory.
pub struct P2p;

impl Transport for P2p {
    fn name(&self) -> &'static str {
        "p2p"
    }

    fn kind(&self) -> Kind {
        Kind::P2p
    }

    fn can_connect(&self, reach: &Reach) -> bool {
        reach.device && reach.same_host && !reach.p2p_disabled
    }

    fn setup_recv(&self, cx: &Context, link: Link) -> Result<(Progress, Vec<u8>)> {
        let hb = fifo::header_bytes();
        // Header and slots in this device's memory: this rank polls `tail` locally
        // and the sender writes it over NVLink (as NCCL keeps its P2P counters).
        let bytes = hb + p2p_slots_bytes();
        let (dptr, dhandle) = cx.backend.alloc_shareable(cx.device, bytes)?;
        let mem = vec![Memory::Exported { backend: Arc::clone(cx.backend), ptr: dptr, bytes }];
        // Zeroed before the sender learns of it, on a stream of this device that waits
        // for nothing else (kernels running on the default stream may wait on peers).
        let s = cx.backend.create_stream(cx.device)?;
        let zeroed = cx.backend.memset(dptr, 0, hb, s).and_then(|_| cx.backend.synchronize(s));
        let _ = cx.backend.destroy_stream(s);
        zeroed?;
        let msg = dhandle.to_bytes().to_vec();
        let (fifo, mem) = p2p_fifo(dptr, mem);
        Ok((Progress::Made(Arc::new(Connection::new(link, Dir::Recv, Kind::P2p, fifo, mem))), msg))
    }

    fn connect_send(&self, cx: &Context, link: Link, message: &[u8]) -> Result<Progress> {
        let dhandle = ShareHandle::from_bytes(message)?;
        let dptr = cx.backend.import(cx.device, &dhandle)?;
        let mem = vec![Memory::Imported { backend: Arc::clone(cx.backend), ptr: dptr }];
        let (fifo, mem) = p2p_fifo(dptr, mem);
        Ok(Progress::Made(Arc::new(Connection::new(link, Dir::Send, Kind::P2p, fifo, mem))))
    }
}

/// A P2P connection's FIFO over device memory at `dptr` (header, then the slots), kept mapped
/// by `mem`. The host never reads this header; the FIFO's host-side header is a zeroed stand-in
/// owned with the memory.
fn p2p_fifo(dptr: DevicePtr, mut mem: Vec<Memory>) -> (Fifo, Vec<Memory>) {
    let stand_in = LocalMemory::new(fifo::header_bytes());
    let (hb, f) = (fifo::header_bytes() as u64, gpu_simple_fifo());
    // SAFETY: `stand_in` is a zeroed header the Fifo may read, kept with the connection; the
    // device header and slots are the `mem` mapping, released with the connection.
    let fifo = unsafe { Fifo::with_device_slots(stand_in.ptr(), dptr.0, dptr.0 + hb, f.slot_bytes, f.steps) };
    mem.push(Memory::Local(stand_in));
    (fifo, mem)
}
