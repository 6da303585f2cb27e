//! The communicator's side of symmetric memory windows (`crate::window`): registration runs
//! the window exchange over this communicator's bootstrap.

use super::Communicator;
use std::sync::atomic::Ordering;

use crate::backend::DevicePtr;
use crate::error::Result;
use crate::window::{Exchange, Window};

impl Communicator {
    /// This communicator's windows.
    pub(super) fn windows(&self) -> std::sync::MutexGuard<'_, crate::window::Windows> {
        self.inner.windows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `ncclCommWindowRegister`: registers `bytes` at `ptr` (in memory from
    /// [`alloc_symmetric`](crate::backend::WindowMemory::alloc_symmetric), as `ncclMemAlloc`
    /// makes it, starting a multiple of 4096 bytes into its allocation) as a window every rank
    /// reaches. Collective: every rank calls it, and every rank registers and deregisters its
    /// windows in the same order. `flags`: [`crate::window::WIN_DEFAULT`] or
    /// [`crate::window::WIN_COLL_SYMMETRIC`], with [`crate::window::WIN_STRICT_ORDERING`] or not.
    pub fn window_register(&self, ptr: DevicePtr, bytes: usize, flags: u32) -> Result<Window> {
        let device = self.device()? as usize;
        let (rank, nranks) = (self.inner.rank as usize, self.inner.nranks as usize);
        self.run("window_register", |bs| {
            let allgather = |m: &[u8]| bs.allgather(m);
            let x = Exchange { rank, nranks, device, backend: self.backend(), allgather: &allgather };
            let mut windows = self.windows();
            let w = windows.register(&x, ptr, bytes, flags)?;
            // Every rank registered with the same flags (checked), so every rank makes the
            // symmetric kernels' memory here, or none does.
            if flags & crate::window::WIN_COLL_SYMMETRIC != 0 && self.backend().capabilities().symmetric_kernels {
                if let Err(e) = windows.ensure_resources(&x) {
                    tracing::warn!(target: "INIT", "rank {rank}: collectives on symmetric windows will take the usual kernels: {}", e.message);
                }
                if windows.resource_base().is_some() {
                    self.inner.sym_resources.store(true, Ordering::Release);
                }
            }
            Ok(w)
        })
    }

    /// A collective starts: it is counted (every rank counts alike; its number keys the
    /// route ring, [`Communicator::publish_route`]).
    pub(crate) fn note_collective(&self) {
        self.inner.coll_seq.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the symmetric collectives' memory exists (a symmetric window was registered):
    /// without it no buffer lies in a symmetric window, and a call need not look.
    pub(crate) fn has_symmetric_resources(&self) -> bool {
        self.inner.sym_resources.load(Ordering::Relaxed)
    }

    /// The number of the current collective (`note_collective`).
    pub(crate) fn collective_number(&self) -> u64 {
        self.inner.coll_seq.load(Ordering::Relaxed)
    }

    /// Publishes, before it runs, that the current collective takes `way` with signature `sig`
    /// (0 where it has none), in this rank's route ring on the board, where the communicator
    /// has one (ranks on one host, any backend: `exec::host::board::Board::publish_route`;
    /// peers waiting for this rank find out when it took another way: the host backend's
    /// waits, the watchdog on GPUs). Returns the collective's number.
    pub(crate) fn publish_route(&self, way: crate::work::Way, sig: crate::work::OpSig) -> u64 {
        let seq = self.collective_number();
        self.publish_route_at(seq, way, sig);
        seq
    }

    /// [`Communicator::publish_route`] for collective number `seq` (a group publishes its
    /// collectives' routes at its end, each under the number it got when called).
    pub(crate) fn publish_route_at(&self, seq: u64, way: crate::work::Way, sig: crate::work::OpSig) {
        if let Some(b) = self.board() {
            b.publish_route(seq, way, sig);
        }
    }

    /// The way this rank published for collective number `seq` in its route ring (for tests
    /// and logs): `None` without a route ring, or where the entry now holds another
    /// collective's (1024 collectives later).
    pub fn route_taken(&self, seq: u64) -> Option<crate::work::Way> {
        let b = self.board()?;
        b.route_of(self.inner.rank as usize, seq).filter(|r| r.seq == seq).map(|r| r.way)
    }

    /// How many collectives this communicator has been called for so far (the number of the
    /// last one; for tests and logs, with [`Communicator::route_taken`]).
    pub fn collectives_called(&self) -> u64 {
        self.collective_number()
    }

    /// After a failure or an abort: lets streams blocked in a copy-engine collective go on
    /// (`Windows::release_copy_engine_waits`).
    pub(crate) fn release_copy_engine_waits(&self) {
        if !self.engine().executor().uses_copy_engines() {
            return;
        }
        let Ok(device) = self.device() else { return };
        let nranks = self.inner.nranks as usize;
        let backend = std::sync::Arc::clone(self.backend());
        self.windows().release_copy_engine_waits(&*backend, device as usize, nranks);
    }

    /// The epoch of this communicator's next copy-engine collective.
    pub(crate) fn next_ce_epoch(&self) -> u32 {
        self.windows().next_ce_epoch()
    }

    /// Where a collective on `send` and `recv` finds them for the symmetric kernels: both
    /// in `WIN_COLL_SYMMETRIC` windows of this communicator (`None` otherwise).
    pub(crate) fn symmetric_place(&self, send: DevicePtr, send_bytes: usize, recv: DevicePtr, recv_bytes: usize) -> Option<crate::window::SymmetricPlace> {
        self.windows().symmetric_place(send, send_bytes, recv, recv_bytes)
    }

    /// `ncclCommWindowDeregister`: this rank stops using `window` (local, as NCCL; the memory
    /// stays with its owner, and peers keep their own mappings until they deregister). The
    /// communicator's device work enqueued before it completes first, so a collective still
    /// running on the window keeps its mappings until it ends.
    pub fn window_deregister(&self, window: &Window) -> Result<()> {
        self.ready("window_deregister")?;
        self.wait_device_idle().map_err(|e| e.context("window_deregister: waiting for the communicator's device work"))?;
        let r = self.windows().deregister(window.id());
        r.or_else(|e| self.fail(e.context("window_deregister")))
    }

    /// Windows registered with this communicator and not yet deregistered.
    pub fn window_count(&self) -> usize {
        self.windows().count()
    }
}

impl Communicator {
    /// Runs `f` on this communicator's windows (the one-sided operations look up windows,
    /// signal counters and expected counts there; `f` must not wait on peers).
    pub(crate) fn with_windows<T>(&self, f: impl FnOnce(&mut crate::window::Windows) -> T) -> T {
        f(&mut self.windows())
    }
}
