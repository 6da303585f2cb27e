//! One-sided operations on symmetric windows (NCCL 2.29's `ncclPutSignal`, `ncclSignal`,
//! `ncclWaitSignal`) between the ranks of one host (the LSA team: every rank maps every
//! rank's windows). Stream-ordered as every call is on the host backend: it runs on the
//! calling thread when called (the host backend's streams are in order, done when a call
//! returns). A put copies the bytes into the peer's window, then adds 1 to the peer's signal
//! counter for this rank (release); a wait polls this rank's counters under the host driver,
//! whose checks turn a dead peer, an abort or `NCCL_OP_TIMEOUT_MS` into an error. Where the
//! signals live and how waits count: `window::signals`.
//!
//! NCCL's rules kept: signal index, context and flags 0; a put's source lies in an
//! `NCCL_WIN_COLL_SYMMETRIC` window of the communicator; a wait's `opCnt` at least 1.
//! Not yet: GPU backends (refused: "not yet on GPUs"), calls inside a group (refused: their
//! order against the group's collectives is not kept yet).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{DevicePtr, Stream};
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::exec::host::signal_wait::SignalWait;
use crate::types::DataType;
use crate::window::signals::{self, WaitSignalDesc};
use crate::window::Window;

impl Communicator {
    /// `ncclPutSignal`: copies `count` elements of `dtype` from `local` (in a
    /// `WIN_COLL_SYMMETRIC` window of this communicator) to `offset` bytes into rank `peer`'s
    /// part of `window`, then signals `peer` (index `sig_idx`, context `ctx`: 0).
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal(
        &self, local: DevicePtr, count: usize, dtype: DataType, peer: i32, window: &Window, offset: usize, sig_idx: i32, ctx: i32,
        stream: Stream,
    ) -> Result<()> {
        const WHAT: &str = "PutSignal";
        let peer = self.one_sided_ready(WHAT, Some(peer), sig_idx, ctx, stream)?.expect("a peer was given");
        let me = self.rank_unchecked() as usize;
        let places = self.with_windows(|w| -> Result<(u64, u64, u64, usize)> {
            let bytes = count.checked_mul(dtype.size()).ok_or_else(|| Error::invalid_argument(format!("{WHAT}: {count} elements of {dtype:?} overflow")))?;
            if !w.is_live(window) {
                return Err(Error::invalid_argument(format!(
                    "{WHAT}: the peer window is not a live window of this communicator (deregistered, or another communicator's)"
                )));
            }
            let src = w.symmetric_flat(local, bytes).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{WHAT}: the source {local} + {bytes} bytes does not lie in a NCCL_WIN_COLL_SYMMETRIC window of this \
                     communicator (as NCCL requires): register the local buffer as a symmetric window"
                ))
            })?;
            if offset.checked_add(bytes).is_none_or(|end| end > window.size()) {
                return Err(Error::invalid_argument(format!(
                    "{WHAT}: offset {offset} + {bytes} bytes runs past the end of the peer window ({} bytes)",
                    window.size()
                )));
            }
            let dst = window.peer_ptr(peer, offset)?.0;
            let counter = w.signal_counter(peer, me).ok_or_else(no_signals(WHAT))?;
            Ok((src, dst, counter, bytes))
        });
        let (src, dst, counter, bytes) = places.map_err(|e| self.refuse(e))?;
        if bytes > 0 {
            // SAFETY: `src` lies in this rank's symmetric window and `dst..dst+bytes` in the
            // peer's window (both checked above), mapped in this process while the windows
            // are registered; what the peer reads there before the signal is its business, as
            // with NCCL. `copy` allows the ranges to overlap (a put to itself).
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        }
        bump(counter);
        tracing::trace!(target: "COLL", "PutSignal: {bytes} bytes to rank {peer} at offset {offset}");
        Ok(())
    }

    /// `ncclSignal`: signals `peer` (index `sig_idx`, context `ctx`: 0) without data.
    pub fn signal(&self, peer: i32, sig_idx: i32, ctx: i32, stream: Stream) -> Result<()> {
        const WHAT: &str = "Signal";
        let peer = self.one_sided_ready(WHAT, Some(peer), sig_idx, ctx, stream)?.expect("a peer was given");
        let me = self.rank_unchecked() as usize;
        let counter = self.with_windows(|w| w.signal_counter(peer, me)).ok_or_else(no_signals(WHAT)).map_err(|e| self.refuse(e))?;
        bump(counter);
        Ok(())
    }

    /// `ncclWaitSignal`: waits until, for each descriptor, `op_cnt` more signals came from
    /// its peer than this rank waited for from it before (the same peer twice adds up).
    pub fn wait_signal(&self, descs: &[WaitSignalDesc], stream: Stream) -> Result<()> {
        const WHAT: &str = "WaitSignal";
        self.one_sided_ready(WHAT, None, 0, 0, stream)?;
        let n = self.nranks_unchecked() as usize;
        let me = self.rank_unchecked() as usize;
        let targets = self.with_windows(|w| -> Result<_> {
            let targets = w.expected().targets(descs, n)?;
            let counters = targets
                .iter()
                .map(|&(peer, t)| w.signal_counter(me, peer).map(|c| (peer, c, t)).ok_or_else(no_signals(WHAT)))
                .collect::<Result<Vec<_>>>()?;
            Ok((targets, counters))
        });
        let (targets, counters) = targets.map_err(|e| self.refuse(e))?;
        for &(peer, _) in &targets {
            self.check_same_host(WHAT, peer)?;
        }
        crate::exec::host::run_op(self, &mut SignalWait::new(counters))?;
        self.with_windows(|w| w.expected().reached(&targets));
        Ok(())
    }

    /// The checks every one-sided call makes: the communicator works, the call is outside a
    /// group, the executor is the host's, index and context are 0, the stream is live, and
    /// `peer` (when given) is a rank on this host. Returns the peer.
    fn one_sided_ready(&self, what: &str, peer: Option<i32>, sig_idx: i32, ctx: i32, stream: Stream) -> Result<Option<usize>> {
        self.check_collective_ready(what)?;
        let checks = || -> Result<()> {
            if super::group::depth() > 0 {
                return Err(Error::invalid_usage(format!(
                    "{what} inside a group: rustccl runs one-sided operations outside groups only (not yet written: \
                     their order against the group's collectives); call it after ncclGroupEnd"
                )));
            }
            if !self.engine().executor().runs_on_host() {
                return Err(Error::invalid_usage(format!(
                    "{what}: one-sided operations run on the host backend, not yet on GPUs (the {} backend)",
                    self.backend().kind()
                )));
            }
            signals::check_index(what, sig_idx, ctx)?;
            self.backend().query(stream).map(|_| ())
        };
        checks().map_err(|e| self.refuse(e))?;
        let Some(peer) = peer else { return Ok(None) };
        let peer = self.check_peer(peer, what)? as usize;
        self.check_same_host(what, peer)?;
        Ok(Some(peer))
    }

    /// `peer` shares this rank's host (its windows are mapped here: the LSA team).
    fn check_same_host(&self, what: &str, peer: usize) -> Result<()> {
        let hosts = self.host_hashes()?;
        if hosts[peer] != hosts[self.rank_unchecked() as usize] {
            return Err(self.refuse(Error::invalid_usage(format!(
                "{what}: rank {peer} is on another host: one-sided operations reach the ranks of this host only (the LSA team)"
            ))));
        }
        Ok(())
    }
}

/// Adds one signal to a counter (after the put's bytes: release).
fn bump(counter: u64) {
    // SAFETY: `counter` is an 8-aligned counter in a rank's resource memory
    // (`Windows::signal_counter`), mapped while the communicator's windows exist, only
    // accessed atomically.
    let c = unsafe { &*(counter as *const AtomicU64) };
    c.fetch_add(1, Ordering::Release);
}

fn no_signals(what: &str) -> impl FnOnce() -> Error + '_ {
    move || {
        Error::invalid_usage(format!(
            "{what}: this communicator has no signal counters yet: they come with its first NCCL_WIN_COLL_SYMMETRIC \
             window (register one on every rank first)"
        ))
    }
}
