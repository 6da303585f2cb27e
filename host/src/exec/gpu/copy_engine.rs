//! The copy-engine collectives (no kernel, no SM): broadcast, all_gather and all_to_all on
//! symmetric windows copy into the peers' windows with the backend's stream copies
//! (`cuMemcpyAsync`), between two barriers of stream memory operations: each rank writes its
//! epoch into every peer's flag (`cuStreamWriteValue32`), then waits until its own flags hold
//! every peer's (`cuStreamWaitValue32`). The entry barrier says every peer's buffers are free
//! (its stream reached this call); the exit barrier that every copy into this rank's buffer
//! has landed and nobody reads this rank's any more. When they run is the caller's choice
//! (`coll::symmetric`).
//!
//! The epoch is counted by the host, one per collective (the caller's, from `window`, which
//! also releases the waits after a failure), so a copy-engine collective cannot be replayed
//! from a graph: it never runs in a capture. The caller asks `ready` before it commits to
//! the copy engines (a capturing stream takes the kernels or the usual way instead), and the
//! launch sequence takes that answer (`Engine::CopyEngines`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::sequence::Engine;
use super::symmetric::{SymPlace, LAUNCHES};
use super::ExecState;
use crate::backend::{DeviceBackend, DevicePtr, Stream};
use crate::error::Result;

/// Proof that a stream may take the copy engines now: it is not capturing a graph (made only
/// by `ready`).
#[derive(Debug)]
pub(crate) struct Ready {
    stream: Stream,
}

impl Ready {
    /// The stream found not capturing.
    pub(crate) fn stream(&self) -> Stream {
        self.stream
    }
}

/// Whether the copy engines may run on `stream` now: `None` while it captures a graph. The
/// capture check of the launch sequence, made before the caller commits to the copy engines.
pub(crate) fn ready(backend: &Arc<dyn DeviceBackend>, stream: Stream) -> Result<Option<Ready>> {
    Ok((!super::sequence::is_capturing(backend, stream)?).then_some(Ready { stream }))
}

/// Which collective the copy engines run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CeCollective {
    /// Each rank's part into block `rank` of every rank's receive buffer.
    AllGather,
    /// The root's send buffer into every rank's receive buffer (the others copy nothing).
    Broadcast { root: usize },
    /// Block p of each rank's send buffer into block `rank` of rank p's receive buffer.
    AllToAll,
}

/// One copy-engine collective of this rank.
#[derive(Clone, Copy, Debug)]
pub struct CopyEngineRun {
    pub collective: CeCollective,
    pub place: SymPlace,
    pub nranks: usize,
    /// The bytes of one copy (all_gather, all_to_all: one rank's part; broadcast: the buffer).
    pub bytes: u64,
    /// This collective's epoch on the communicator (from 1, one per copy-engine collective,
    /// the same on every rank).
    pub epoch: u32,
}

impl CopyEngineRun {
    /// The copies this rank makes: (peer, offset into this rank's send buffer, offset into the
    /// peer's receive buffer). In place, this rank's own copy has the same source and
    /// destination (the backend's copy then copies nothing).
    pub fn copies(&self) -> Vec<(usize, u64, u64)> {
        let (n, me, part) = (self.nranks, self.place.rank, self.bytes);
        match self.collective {
            CeCollective::AllGather => (0..n).map(|p| (p, 0, me as u64 * part)).collect(),
            CeCollective::Broadcast { root } if root == me => (0..n).map(|p| (p, 0, 0)).collect(),
            CeCollective::Broadcast { .. } => Vec::new(),
            CeCollective::AllToAll => (0..n).map(|p| (p, p as u64 * part, me as u64 * part)).collect(),
        }
    }

    /// The values of the entry and exit barriers (they only grow, with wrap-around, from one
    /// collective to the next).
    pub fn barrier_values(&self) -> (u32, u32) {
        (self.epoch.wrapping_mul(2).wrapping_sub(1), self.epoch.wrapping_mul(2))
    }
}

/// Enqueues the copy-engine collective `run` on the stream `ready` found not capturing
/// (`state`: the communicator's); returns once it is enqueued.
pub(crate) fn run_copy_engine(backend: &Arc<dyn DeviceBackend>, device: usize, state: &mut ExecState, ready: Ready, run: &CopyEngineRun) -> Result<()> {
    let (n, me, place) = (run.nranks, run.place.rank, run.place);
    let flags = place.res + rustccl_kernels::exec::SYM_RES_CE;
    let copies = run.copies();
    let (entry, exit) = run.barrier_values();
    state.launch(backend, device, Engine::CopyEngines(ready), |_, at| {
        let barrier = |value: u32| -> Result<()> {
            for p in (0..n).filter(|&p| p != me) {
                backend.kernels_or_err("copy-engine barrier")?.stream_write_u32(DevicePtr(place.peer(flags + 4 * me as u64, p)), value, at.stream)?;
            }
            for p in (0..n).filter(|&p| p != me) {
                backend.kernels_or_err("copy-engine barrier")?.stream_wait_u32(DevicePtr(flags + 4 * p as u64), value, at.stream)?;
            }
            Ok(())
        };
        barrier(entry)?;
        for &(p, from, to) in &copies {
            backend.copy(DevicePtr(place.peer(place.recv + to, p)), DevicePtr(place.send + from), run.bytes as usize, at.stream)?;
        }
        barrier(exit)
    })?;
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
