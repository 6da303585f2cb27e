//! The one-sided operations on GPUs (NCCL 2.29's `ncclPutSignal`, `ncclSignal`,
//! `ncclWaitSignal`; the kernels in `kernels/src/device/one_sided.cu`), stream-ordered on the
//! caller's stream through the one launch sequence (`ExecState::launch`: capture check,
//! control block, the communicator's order of launches, its event after them):
//! - a put is a copy of its bytes into the peer's window (the copy engines, `Memory::copy`),
//!   then the signal kernel, which adds 1 to the peer's counter for this rank with release
//!   order at system scope once the copy is done; a signal is the kernel alone;
//! - a wait is the wait kernel, a thread per peer, which polls this rank's counters up to the
//!   expected values (counted on the device) and the control block's abort flag: the
//!   watchdog sets it when a peer dies or the communicator is aborted, so a wait for a dead
//!   peer ends, and the failure is the communicator's asynchronous error.
//!
//! Where the counters are (flat-range addresses) is the caller's business (`window::signals`,
//! above this layer); this module takes plain addresses.

use std::sync::Arc;

use rustccl_kernels::exec::{SignalArgs, WaitSignalArgs, SIGNAL_WAIT_MAX};

use super::sequence::Engine;
use super::ExecState;
use crate::backend::{DeviceBackend, DevicePtr, Stream};
use crate::error::{Error, Result};

/// A put's bytes: `bytes` from `src` to `dst` (flat-range addresses: this rank's window, the
/// peer's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PutCopy {
    pub src: u64,
    pub dst: u64,
    pub bytes: usize,
}

/// Enqueues a signal to the peer whose counter for this rank is at `counter` on `stream`,
/// after the copy of `put` when given (`ncclPutSignal`; `ncclSignal` without one).
pub(crate) fn run_signal(backend: &Arc<dyn DeviceBackend>, device: usize, state: &mut ExecState, put: Option<PutCopy>, counter: u64, stream: Stream) -> Result<()> {
    let kernels = backend.symmetric_kernels_or_err("one-sided signal")?;
    state.launch(backend, device, Engine::Kernel(stream), |_, at| {
        if let Some(p) = put.filter(|p| p.bytes > 0) {
            backend.copy(DevicePtr(p.dst), DevicePtr(p.src), p.bytes, at.stream)?;
        }
        kernels.launch_signal(device, &SignalArgs { counter, control: at.control.0 }, at.stream)
    })
}

/// Enqueues a wait on `stream` for `waits` (peer, signals; distinct peers): this rank's
/// counters start at `counters`, its device-side expected counts at `seen`. More peers than
/// one launch takes are waited for by consecutive launches (all must arrive anyway).
pub(crate) fn run_wait(backend: &Arc<dyn DeviceBackend>, device: usize, state: &mut ExecState, counters: u64, seen: u64, waits: &[(usize, u64)], stream: Stream) -> Result<()> {
    let kernels = backend.symmetric_kernels_or_err("one-sided wait")?;
    let args = wait_args(counters, seen, waits)?;
    state.launch(backend, device, Engine::Kernel(stream), |_, at| {
        args.iter().try_for_each(|a| kernels.launch_wait_signal(device, &WaitSignalArgs { control: at.control.0, ..*a }, at.stream))
    })
}

/// The wait kernels' parameters for `waits` (without the control block), SIGNAL_WAIT_MAX
/// peers each.
fn wait_args(counters: u64, seen: u64, waits: &[(usize, u64)]) -> Result<Vec<WaitSignalArgs>> {
    waits
        .chunks(SIGNAL_WAIT_MAX)
        .map(|chunk| {
            let mut a = WaitSignalArgs { counters, seen, n: chunk.len() as u32, ..Default::default() };
            for (i, &(peer, count)) in chunk.iter().enumerate() {
                a.peers[i] = peer as u32;
                a.counts[i] = u32::try_from(count).map_err(|_| {
                    Error::invalid_argument(format!("WaitSignal: {count} signals from rank {peer} in one wait: at most {} on GPUs", u32::MAX))
                })?;
            }
            Ok(a)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::cached::tests::backend;
    use super::super::fake::{Call, FakeDevice};
    use super::*;

    const S: Stream = Stream(0xa);

    fn calls(fake: &FakeDevice) -> Vec<Call> {
        std::mem::take(&mut fake.log().calls)
    }

    /// A put is the copy, then the signal on the same stream with the control block; a
    /// signal is the kernel alone.
    #[test]
    fn a_put_copies_then_signals_on_the_stream() {
        let (fake, b) = backend();
        let mut state = ExecState::default();
        let put = PutCopy { src: 0x5000_0000, dst: 0x6000_1000, bytes: 4096 };
        run_signal(&b, 0, &mut state, Some(put), 0x6020_0008, S).unwrap();
        let c = calls(&fake);
        let copy = c.iter().position(|c| matches!(c, Call::Copy { dst, src, bytes: 4096, stream: S } if dst.0 == 0x6000_1000 && src.0 == 0x5000_0000));
        let signal = c.iter().position(|c| matches!(c, Call::LaunchSignal { args, stream: S } if args.counter == 0x6020_0008 && args.control != 0));
        assert!(copy.is_some() && signal.is_some() && copy < signal, "{c:?}");
        run_signal(&b, 0, &mut state, None, 0x6020_0010, S).unwrap();
        let c = calls(&fake);
        assert!(!c.iter().any(|c| matches!(c, Call::Copy { .. })), "{c:?}");
        assert!(c.iter().any(|c| matches!(c, Call::LaunchSignal { args, .. } if args.counter == 0x6020_0010)), "{c:?}");
    }

    /// A wait names every peer once with its count; more peers than a launch takes go to
    /// consecutive launches.
    #[test]
    fn a_wait_launches_per_32_peers() {
        let (fake, b) = backend();
        let mut state = ExecState::default();
        let waits: Vec<(usize, u64)> = (0..40).map(|p| (p, p as u64 + 1)).collect();
        run_wait(&b, 0, &mut state, 0x100, 0x200, &waits, S).unwrap();
        let launched: Vec<WaitSignalArgs> = calls(&fake)
            .into_iter()
            .filter_map(|c| match c {
                Call::LaunchWaitSignal { args, stream: S } => Some(*args),
                _ => None,
            })
            .collect();
        assert_eq!(launched.iter().map(|a| a.n).collect::<Vec<_>>(), [32, 8]);
        assert!(launched.iter().all(|a| a.counters == 0x100 && a.seen == 0x200 && a.control != 0));
        assert_eq!((launched[1].peers[0], launched[1].counts[0]), (32, 33));
        assert!(wait_args(0, 0, &[(1, 1 << 32)]).is_err());
    }
}
