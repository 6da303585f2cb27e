//! One-sided operations on symmetric windows (NCCL 2.29's `ncclPutSignal`, `ncclSignal`,
//! `ncclWaitSignal`) between the ranks of one host (the LSA team: every rank maps every
//! rank's windows), stream-ordered on the caller's stream. A put copies the bytes into the
//! peer's window, then adds 1 to the peer's signal counter for this rank (release); a wait
//! waits until this rank's counters reach NCCL's running expected values, then acquires.
//! Where the signals live and how waits count: `window::signals`.
//!
//! - Host backend: the call runs on the calling thread (the host backend's streams are in
//!   order, done when a call returns); a wait polls the counters under the host driver, whose
//!   checks turn a dead peer, an abort or `NCCL_OP_TIMEOUT_MS` into an error.
//! - GPUs (CUDA; HIP would take the same path, but has no symmetric windows yet): enqueued on
//!   the stream through the launch sequence (`exec::gpu::one_sided`): a put is a copy-engine
//!   copy then a one-thread signal kernel (release add at system scope); a wait is a kernel
//!   polling the counters and the abort flag, so a dead peer or an abort ends it (the failure
//!   is the communicator's asynchronous error). The expected values are counted on the
//!   device, so the calls work under CUDA graph capture (as NCCL's do) and a replayed wait
//!   waits for the next signals.
//! - Inside a group (`ncclGroupStart`/`End`) a call is checked when made and runs at the
//!   group's end, in call order with the group's other one-sided calls and before its
//!   collectives and point-to-point operations, as NCCL schedules a group's RMA tasks first.
//!
//! NCCL's rules kept: signal index, context and flags 0; a put's source lies in an
//! `NCCL_WIN_COLL_SYMMETRIC` window of the communicator; a wait's `opCnt` at least 1.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{DevicePtr, Stream};
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::exec::gpu::one_sided::PutCopy;
use crate::exec::host::signal_wait::SignalWait;
use crate::types::DataType;
use crate::window::signals::{self, WaitSignalDesc};
use crate::window::Window;

/// A one-sided operation, checked and resolved (addresses in the communicator's flat window
/// range), ready to run.
#[derive(Clone, Debug)]
enum OneSided {
    /// A signal to `peer` (its counter for this rank at `counter`), after `put`'s bytes.
    Signal { peer: usize, put: Option<PutCopy>, counter: u64 },
    /// A wait for (peer, signals) of distinct peers.
    Wait { waits: Vec<(usize, u64)> },
}

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
        let places = self.with_windows(|w| -> Result<(PutCopy, u64)> {
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
            Ok((PutCopy { src, dst, bytes }, counter))
        });
        let (put, counter) = places.map_err(|e| self.refuse(e))?;
        self.run_or_defer(OneSided::Signal { peer, put: Some(put), counter }, stream)
    }

    /// `ncclSignal`: signals `peer` (index `sig_idx`, context `ctx`: 0) without data.
    pub fn signal(&self, peer: i32, sig_idx: i32, ctx: i32, stream: Stream) -> Result<()> {
        const WHAT: &str = "Signal";
        let peer = self.one_sided_ready(WHAT, Some(peer), sig_idx, ctx, stream)?.expect("a peer was given");
        let me = self.rank_unchecked() as usize;
        let counter = self.with_windows(|w| w.signal_counter(peer, me)).ok_or_else(no_signals(WHAT)).map_err(|e| self.refuse(e))?;
        self.run_or_defer(OneSided::Signal { peer, put: None, counter }, stream)
    }

    /// `ncclWaitSignal`: waits until, for each descriptor, `op_cnt` more signals came from
    /// its peer than this rank waited for from it before (the same peer twice adds up).
    pub fn wait_signal(&self, descs: &[WaitSignalDesc], stream: Stream) -> Result<()> {
        const WHAT: &str = "WaitSignal";
        self.one_sided_ready(WHAT, None, 0, 0, stream)?;
        let n = self.nranks_unchecked() as usize;
        let me = self.rank_unchecked() as usize;
        let waits = self
            .with_windows(|w| -> Result<_> {
                let waits = signals::merge(descs, n)?;
                w.signal_counter(me, 0).ok_or_else(no_signals(WHAT))?;
                Ok(waits)
            })
            .map_err(|e| self.refuse(e))?;
        for &(peer, _) in &waits {
            self.check_same_host(WHAT, peer)?;
        }
        self.run_or_defer(OneSided::Wait { waits }, stream)
    }

    /// Runs `op` now, or at the end of the calling thread's group.
    fn run_or_defer(&self, op: OneSided, stream: Stream) -> Result<()> {
        let run: super::group::DeferredRun = Box::new(move |c: &Communicator| c.run_one_sided(op, stream));
        match super::group::defer(self, run) {
            Some(run) => run(self),
            None => Ok(()),
        }
    }

    /// Runs a checked one-sided operation on this communicator's executor.
    fn run_one_sided(&self, op: OneSided, stream: Stream) -> Result<()> {
        // A group may end after the communicator failed: nothing then starts.
        self.check_collective_ready("one-sided operation")?;
        if self.engine().executor().runs_on_host() {
            return self.run_one_sided_on_host(op);
        }
        let r = match &op {
            OneSided::Signal { put, counter, .. } => {
                self.engine().with_device(|b, device, state| crate::exec::gpu::one_sided::run_signal(b, device, state, *put, *counter, stream))
            }
            OneSided::Wait { waits } => {
                let me = self.rank_unchecked() as usize;
                let places = self.with_windows(|w| w.signal_counter(me, 0).zip(w.signals_seen()));
                let Some((counters, seen)) = places else {
                    return Err(self.refuse(no_signals("WaitSignal")()));
                };
                self.engine().with_device(|b, device, state| crate::exec::gpu::one_sided::run_wait(b, device, state, counters, seen, waits, stream))
            }
        };
        // A launch that failed may leave a peer waiting for its signal: the call guard breaks
        // the communicator and tells the peers, so that their waits end too.
        let guard = super::call::Call::start_shapes(self, true, &[]);
        guard.end(r.map_err(|e| e.context(describe(&op))))
    }

    /// The host backend's way: the copy and the signal, or the wait, on the calling thread.
    fn run_one_sided_on_host(&self, op: OneSided) -> Result<()> {
        match op {
            OneSided::Signal { peer, put, counter } => {
                if let Some(PutCopy { src, dst, bytes }) = put.filter(|p| p.bytes > 0) {
                    // SAFETY: `src` lies in this rank's symmetric window and `dst..dst+bytes`
                    // in the peer's window (both checked when called), mapped in this process
                    // while the windows are registered; what the peer reads there before the
                    // signal is its business, as with NCCL. `copy` allows the ranges to overlap
                    // (a put to itself).
                    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
                }
                bump(counter);
                tracing::trace!(target: "COLL", "PutSignal: {} bytes to rank {peer}", put.map_or(0, |p| p.bytes));
                Ok(())
            }
            OneSided::Wait { waits } => {
                let me = self.rank_unchecked() as usize;
                let targets = self.with_windows(|w| -> Result<_> {
                    let targets = w.expected().targets(&waits);
                    let counters = targets
                        .iter()
                        .map(|&(peer, t)| w.signal_counter(me, peer).map(|c| (peer, c, t)).ok_or_else(no_signals("WaitSignal")))
                        .collect::<Result<Vec<_>>>()?;
                    Ok((targets, counters))
                });
                let (targets, counters) = targets.map_err(|e| self.refuse(e))?;
                crate::exec::host::run_op(self, &mut SignalWait::new(counters))?;
                self.with_windows(|w| w.expected().reached(&targets));
                Ok(())
            }
        }
    }

    /// The checks every one-sided call makes: the communicator works, the executor can run
    /// one-sided operations (the host's, or a device backend with symmetric kernels, for
    /// communicators whose counters fit its layout), index and context are 0, the stream is
    /// live (host backend: on GPUs the launch checks it, and a query would end a capture), and
    /// `peer` (when given) is a rank on this host. Returns the peer.
    fn one_sided_ready(&self, what: &str, peer: Option<i32>, sig_idx: i32, ctx: i32, stream: Stream) -> Result<Option<usize>> {
        self.check_collective_ready(what)?;
        let checks = || -> Result<()> {
            signals::check_index(what, sig_idx, ctx)?;
            if self.engine().executor().runs_on_host() {
                return self.backend().query(stream).map(|_| ());
            }
            self.backend().symmetric_kernels_or_err(what)?;
            let n = self.nranks_unchecked() as usize;
            if n > signals::DEVICE_MAX_RANKS {
                return Err(Error::invalid_usage(format!(
                    "{what}: {n} ranks: one-sided operations on GPUs take at most {} ranks (their signal counters' place)",
                    signals::DEVICE_MAX_RANKS
                )));
            }
            Ok(())
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

/// What an operation is, for errors.
fn describe(op: &OneSided) -> String {
    match op {
        OneSided::Signal { peer, put: Some(p), .. } => format!("PutSignal of {} bytes to rank {peer}", p.bytes),
        OneSided::Signal { peer, put: None, .. } => format!("Signal to rank {peer}"),
        OneSided::Wait { waits } => format!("WaitSignal on {} peers", waits.len()),
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
