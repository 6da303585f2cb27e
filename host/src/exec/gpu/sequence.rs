//! The one launch sequence: every piece of device work a communicator enqueues — the
//! interpreter (`super::launch`), a cached launch ([`super::cached`]), a symmetric kernel
//! ([`super::symmetric`]) and a copy-engine collective ([`super::copy_engine`]) — goes through
//! `ExecState::launch`, which does, in this order:
//! 1. the capture check: whether the stream is capturing a graph (a captured launch is
//!    recorded, not run, and may be replayed at any time);
//! 2. the control block (made on first use), whose device address kernels poll for an abort
//!    and write their errors to;
//! 3. unless captured, waiting for the communicator's last launch when that came on another
//!    stream (launches of one communicator run in order, whatever streams they come on);
//! 4. the enqueue itself (the caller's closure: images, kernel, copies, stream operations);
//! 5. unless captured, recording the communicator's event after the launch (the next launch
//!    on another stream, the watchdog, `wait_device_idle` and a full image arena wait on it).
//!
//! A captured launch neither waits for nor becomes the last launch: the graph runs whenever
//! it is replayed, not in the order of the calls.
//!
//! The copy engines differ in two ways, both stated by `Engine::CopyEngines`: they never run
//! in a capture (their epochs are counted by the host, so a replay would reuse an old one), so
//! their capture check is made before the caller commits to them (`super::copy_engine::ready`,
//! whose answer the sequence takes instead of asking again); and they read no control block
//! (stream memory operations cannot poll one), so none is made for them.

use std::sync::Arc;

use super::copy_engine::Ready;
use super::ExecState;
use crate::backend::{DeviceBackend, DevicePtr, Stream};
use crate::error::Result;
use crate::profile::{self, Stage};

/// What is launched, and on which stream.
pub(crate) enum Engine {
    /// A kernel (the interpreter or a symmetric kernel) on this stream: it may be captured,
    /// and it reads the control block.
    Kernel(Stream),
    /// A copy-engine collective, on the stream `ready` found not capturing.
    CopyEngines(Ready),
}

/// What the enqueue step of a launch gets to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Launch {
    pub stream: Stream,
    /// Whether the stream is capturing a graph (always false for the copy engines).
    pub capturing: bool,
    /// The control block's device address for the kernel's parameter (`DevicePtr::NULL` for
    /// the copy engines, which read none).
    pub control: DevicePtr,
}

/// Step 1 for a stream: whether it is capturing a graph.
pub(crate) fn is_capturing(backend: &Arc<dyn DeviceBackend>, stream: Stream) -> Result<bool> {
    // Clock reads only when RUSTCCL_PROFILE_ENQUEUE=1.
    let t = profile::start();
    let capturing = backend.is_capturing(stream)?;
    profile::stage(Stage::Capture, t);
    Ok(capturing)
}

impl ExecState {
    /// Launches what `enqueue` enqueues as this communicator's next device work on `device`
    /// (see the module docs for the steps around it); returns what `enqueue` returns, once it
    /// is enqueued.
    pub(crate) fn launch<T>(
        &mut self,
        backend: &Arc<dyn DeviceBackend>,
        device: usize,
        engine: Engine,
        enqueue: impl FnOnce(&mut ExecState, Launch) -> Result<T>,
    ) -> Result<T> {
        let (stream, capturing, control) = match engine {
            Engine::Kernel(stream) => {
                let capturing = is_capturing(backend, stream)?;
                (stream, capturing, self.control(backend)?)
            }
            Engine::CopyEngines(ready) => (ready.stream(), false, DevicePtr::NULL),
        };
        if !capturing {
            self.follow_last(backend, stream)?;
        }
        let out = enqueue(self, Launch { stream, capturing, control })?;
        if !capturing {
            let t = profile::start();
            self.launched(backend, device, stream)?;
            profile::stage(Stage::Event, t);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use rustccl_kernels::exec::{SymArgs, SYM_RES_CE};
    use rustccl_kernels::symmetric::SymKernel;
    use rustccl_kernels::DeviceOp;

    use super::super::cached::tests::backend;
    use super::super::cached::CachedLaunch;
    use super::super::copy_engine::{ready, run_copy_engine, CeCollective, CopyEngineRun};
    use super::super::fake::{links_for, ring_sum, Call, FakeDevice};
    use super::super::state::CONTROL_BYTES;
    use super::super::symmetric::{blocks, run_symmetric, SymLaunch, SymPlace};
    use super::*;
    use crate::reduce::{DevOp, Reducer};
    use crate::types::DataType;

    const A: Stream = Stream(0xa);
    const B: Stream = Stream(0xb);
    const STRIDE: u64 = 0x1000_0000;
    /// Rank 1 of 3: the flat range starts at rank 0's copy, 0x4000_0000.
    const PLACE: SymPlace = SymPlace { send: 0x5000_0000, recv: 0x5010_0000, res: 0x5020_0000, stride: STRIDE, rank: 1 };

    fn sym(kernel: SymKernel, op: DevOp, stream: Stream) -> SymLaunch {
        SymLaunch { kernel, place: PLACE, bytes: 4096, nranks: 3, reducer: Reducer::new(DataType::Float32, op), scalar_at: 0, stream }
    }

    /// The calls logged since the last look, taken out of the log.
    fn calls(fake: &FakeDevice) -> Vec<Call> {
        std::mem::take(&mut fake.log().calls)
    }

    fn launched(l: &SymLaunch, op: DeviceOp, dtype: DataType, control: u64, stream: Stream) -> Call {
        let args = SymArgs {
            send: PLACE.send,
            recv: PLACE.recv,
            res: PLACE.res,
            stride: STRIDE,
            bytes: l.bytes,
            scalar: l.args(0).scalar,
            scalar_ptr: 0,
            divisor: l.args(0).divisor,
            control,
            rank: 1,
            nranks: 3,
        };
        Call::LaunchSymmetric { op, dtype, kernel: l.kernel, args, blocks: blocks(l.kernel, l.bytes), stream }
    }

    /// The kernel parameter's control block address, as launched.
    fn control_in(call: &Call) -> u64 {
        match call {
            Call::LaunchSymmetric { args, .. } => args.control,
            c => panic!("not a symmetric launch: {c:?}"),
        }
    }

    /// A symmetric kernel: capture check, control block (made once), the wait for the last
    /// launch when it was on another stream, the kernel, the event after it.
    #[test]
    fn a_symmetric_kernel_goes_through_the_launch_sequence_in_order() {
        let (fake, backend) = backend();
        let mut state = ExecState::default();
        let before = super::super::symmetric::launches();
        let l = sym(SymKernel::AllReduceRsAg, DevOp::Sum, A);
        run_symmetric(&backend, 0, &mut state, &l).unwrap();
        let got = calls(&fake);
        assert_eq!(state.held_bytes(), (0, CONTROL_BYTES), "the control block is made, nothing else");
        let control = control_in(&got[2]);
        assert_ne!(control, 0);
        assert_eq!(
            got,
            vec![
                Call::IsCapturing(A),
                Call::AllocHostMapped(CONTROL_BYTES),
                launched(&l, DeviceOp::Sum, DataType::Float32, control, A),
                Call::CreateEvent,
                Call::RecordEvent(A),
            ]
        );
        // On another stream: it waits for the first launch; the control block and the event
        // are made already.
        let l = sym(SymKernel::AllGather, DevOp::Sum, B);
        run_symmetric(&backend, 0, &mut state, &l).unwrap();
        assert_eq!(
            calls(&fake),
            vec![Call::IsCapturing(B), Call::WaitEvent(B), launched(&l, DeviceOp::Sum, DataType::Uint8, control, B), Call::RecordEvent(B)],
            "all_gather's kernel moves bytes"
        );
        // On the same stream: nothing to wait for.
        let l = sym(SymKernel::ReduceScatter, DevOp::PreMulSum { scalar: 0.5 }, B);
        run_symmetric(&backend, 0, &mut state, &l).unwrap();
        let got = calls(&fake);
        assert_eq!(got, vec![Call::IsCapturing(B), launched(&l, DeviceOp::PreMulSum, DataType::Float32, control, B), Call::RecordEvent(B)]);
        match &got[1] {
            Call::LaunchSymmetric { args, .. } => assert_eq!((args.scalar, args.divisor), (0.5f32.to_bits() as u64, 1)),
            c => panic!("{c:?}"),
        }
        assert!(super::super::symmetric::launches() >= before + 3, "each launch is counted");
    }

    /// The one-sided operations take the launch sequence like a kernel: a put (copy, signal)
    /// and a wait on another stream follow the last launch and record the event; captured,
    /// they are recorded into the graph (as NCCL's are), with no wait and no event.
    #[test]
    fn one_sided_operations_go_through_the_launch_sequence_and_may_be_captured() {
        use super::super::one_sided::{run_signal, run_wait, PutCopy};
        let (fake, backend) = backend();
        let mut state = ExecState::default();
        let put = PutCopy { src: 0x5000_0000, dst: 0x4000_0000, bytes: 64 };
        run_signal(&backend, 0, &mut state, Some(put), 0x4020_0000 + 8, A).unwrap();
        assert_eq!(kinds(&calls(&fake)), ["capture?", "control", "copy", "signal", "create-event", "record-event"]);
        run_wait(&backend, 0, &mut state, 0x5020_0000, 0x5030_0000, &[(0, 1)], B).unwrap();
        assert_eq!(kinds(&calls(&fake)), ["capture?", "wait-event", "wait-signal", "record-event"]);
        fake.capturing.store(true, Ordering::Relaxed);
        run_signal(&backend, 0, &mut state, None, 0x4020_0000 + 8, A).unwrap();
        run_wait(&backend, 0, &mut state, 0x5020_0000, 0x5030_0000, &[(0, 2), (2, 1)], A).unwrap();
        assert_eq!(kinds(&calls(&fake)), ["capture?", "signal", "capture?", "wait-signal"]);
        assert_eq!(state.last, Some(B), "captured launches do not become the last launch");
    }

    /// A captured symmetric kernel: the capture check, the control block, the kernel — no wait
    /// for the last launch, no event; and it does not become the last launch.
    #[test]
    fn a_captured_symmetric_kernel_neither_waits_nor_records() {
        let (fake, backend) = backend();
        let mut state = ExecState::default();
        fake.capturing.store(true, Ordering::Relaxed);
        let l = sym(SymKernel::AllReduceLl, DevOp::Max, A);
        run_symmetric(&backend, 0, &mut state, &l).unwrap();
        let got = calls(&fake);
        let control = control_in(&got[2]);
        assert_eq!(got, vec![Call::IsCapturing(A), Call::AllocHostMapped(CONTROL_BYTES), launched(&l, DeviceOp::Max, DataType::Float32, control, A)]);
        assert_eq!(state.last, None);
        // After a launch not captured on A, a captured one on B waits for nothing, and the
        // next launch on A still follows A's.
        fake.capturing.store(false, Ordering::Relaxed);
        run_symmetric(&backend, 0, &mut state, &sym(SymKernel::AllReduceLl, DevOp::Max, A)).unwrap();
        fake.capturing.store(true, Ordering::Relaxed);
        calls(&fake);
        let l = sym(SymKernel::AllReduceLl, DevOp::Max, B);
        run_symmetric(&backend, 0, &mut state, &l).unwrap();
        assert_eq!(calls(&fake), vec![Call::IsCapturing(B), launched(&l, DeviceOp::Max, DataType::Float32, control, B)]);
        assert_eq!(state.last, Some(A));
    }

    /// The peers' flags of rank 1 of 3 in the flat range: rank p's flag for rank `from`.
    fn flag(p: u64, from: u64) -> DevicePtr {
        DevicePtr(PLACE.res + SYM_RES_CE + 4 * from + p * STRIDE - STRIDE)
    }

    /// A copy-engine collective: the capture check (before the caller commits), then no control
    /// block; the wait for the last launch; the entry barrier (this rank's epoch into every
    /// peer's flag, then a wait on each peer's flag here), the copies, the exit barrier; the
    /// event after it.
    #[test]
    fn a_copy_engine_run_goes_through_the_launch_sequence_in_order() {
        let (fake, backend) = backend();
        let mut state = ExecState::default();
        // A launch on B before: the run on A waits for it.
        run_symmetric(&backend, 0, &mut state, &sym(SymKernel::AllGather, DevOp::Sum, B)).unwrap();
        calls(&fake);
        let before = super::super::symmetric::launches();
        let on_a = ready(&backend, A).unwrap().expect("not capturing");
        assert_eq!(calls(&fake), vec![Call::IsCapturing(A)], "the capture check comes first");
        let part = 1024u64;
        let run = CopyEngineRun { collective: CeCollective::AllGather, place: PLACE, nranks: 3, bytes: part, epoch: 5 };
        run_copy_engine(&backend, 0, &mut state, on_a, &run).unwrap();
        let (entry, exit) = (9, 10);
        let write = |p: u64, value: u32| Call::StreamWrite { addr: flag(p, 1), value, stream: A };
        let wait = |p: u64, value: u32| Call::StreamWait { addr: DevicePtr(PLACE.res + SYM_RES_CE + 4 * p), value, stream: A };
        let copy = |p: u64| Call::Copy { dst: DevicePtr(PLACE.recv + part + p * STRIDE - STRIDE), src: DevicePtr(PLACE.send), bytes: part as usize, stream: A };
        assert_eq!(
            calls(&fake),
            vec![
                Call::WaitEvent(A),
                write(0, entry),
                write(2, entry),
                wait(0, entry),
                wait(2, entry),
                copy(0),
                copy(1),
                copy(2),
                write(0, exit),
                write(2, exit),
                wait(0, exit),
                wait(2, exit),
                Call::RecordEvent(A),
            ]
        );
        assert_eq!(state.last, Some(A));
        assert!(super::super::symmetric::launches() > before, "the run is counted");
        // A fresh communicator's first run: no control block, an event made for it.
        let (fresh, fresh_backend) = super::super::cached::tests::backend();
        let mut state = ExecState::default();
        let run = CopyEngineRun { collective: CeCollective::Broadcast { root: 0 }, ..run };
        run_copy_engine(&fresh_backend, 0, &mut state, ready(&fresh_backend, A).unwrap().unwrap(), &run).unwrap();
        let got = calls(&fresh);
        assert_eq!(got[0], Call::IsCapturing(A));
        assert!(matches!(got[1], Call::StreamWrite { .. }), "no wait for an earlier launch, no control block: {got:?}");
        assert_eq!(got[got.len() - 2..], [Call::CreateEvent, Call::RecordEvent(A)]);
        assert!(!got.iter().any(|c| matches!(c, Call::Copy { .. })), "a broadcast's non-root copies nothing");
        assert_eq!(state.control_host(), None);
    }

    /// A stream capturing a graph does not take the copy engines: the capture check is the
    /// only call.
    #[test]
    fn a_capturing_stream_does_not_take_the_copy_engines() {
        let (fake, backend) = backend();
        fake.capturing.store(true, Ordering::Relaxed);
        assert!(ready(&backend, A).unwrap().is_none());
        assert_eq!(calls(&fake), vec![Call::IsCapturing(A)]);
    }

    /// The copies of each copy-engine collective (rank 1 of 3, parts of 16 bytes).
    #[test]
    fn copy_engine_collectives_copy_their_blocks() {
        let run = |collective| CopyEngineRun { collective, place: PLACE, nranks: 3, bytes: 16, epoch: 1 };
        assert_eq!(run(CeCollective::AllGather).copies(), [(0, 0, 16), (1, 0, 16), (2, 0, 16)]);
        assert_eq!(run(CeCollective::AllToAll).copies(), [(0, 0, 16), (1, 16, 16), (2, 32, 16)]);
        assert_eq!(run(CeCollective::Broadcast { root: 1 }).copies(), [(0, 0, 0), (1, 0, 0), (2, 0, 0)]);
        assert!(run(CeCollective::Broadcast { root: 2 }).copies().is_empty());
        assert_eq!(run(CeCollective::AllGather).barrier_values(), (1, 2));
        assert_eq!(CopyEngineRun { epoch: u32::MAX, ..run(CeCollective::AllToAll) }.barrier_values(), (u32::MAX - 2, u32::MAX - 1), "with wrap-around");
    }

    /// What kind of call each is, in order.
    fn kinds(calls: &[Call]) -> Vec<&'static str> {
        calls
            .iter()
            .map(|c| match c {
                Call::IsCapturing(_) => "capture?",
                Call::AllocHostMapped(n) if *n == CONTROL_BYTES => "control",
                Call::AllocHostMapped(_) => "pinned",
                Call::CreateEvent => "create-event",
                Call::RecordEvent(_) => "record-event",
                Call::WaitEvent(_) => "wait-event",
                Call::Copy { .. } => "copy",
                Call::StreamWrite { .. } => "write",
                Call::StreamWait { .. } => "wait",
                Call::LaunchSymmetric { .. } => "symmetric",
                Call::LaunchExec(_) => "exec",
                Call::LaunchExecKernel(_) => "exec-kernel",
                Call::Upload(..) => "upload",
                Call::HostCallback(_) => "host-callback",
                Call::LaunchSignal { .. } => "signal",
                Call::LaunchWaitSignal { .. } => "wait-signal",
            })
            .collect()
    }

    /// The interpreter's launch and a cached launch take the same sequence: capture check,
    /// control block, the wait for the last launch on another stream, the image and kernel,
    /// the event; captured, no wait and no event.
    #[test]
    fn interpreter_and_cached_launches_go_through_the_launch_sequence_in_order() {
        let work = ring_sum(1000);
        let links = links_for(&work);
        let (fake, backend) = backend();
        let mut state = ExecState::default();
        // A copy-engine run first (no control block), so that the first kernel shows the
        // control block made before the wait for the last launch.
        let run = CopyEngineRun { collective: CeCollective::AllToAll, place: PLACE, nranks: 3, bytes: 16, epoch: 1 };
        run_copy_engine(&backend, 0, &mut state, ready(&backend, A).unwrap().unwrap(), &run).unwrap();
        calls(&fake);
        assert_ne!(work.stream, A);
        super::super::launch(&backend, 0, &mut state, &work, &links).unwrap();
        assert_eq!(kinds(&calls(&fake)), ["capture?", "control", "wait-event", "pinned", "upload", "exec", "record-event"]);
        let mut cached = CachedLaunch::new(&backend, 0, &work, &links).unwrap().expect("one launch");
        let mut on_a = ring_sum(1000);
        on_a.stream = A;
        cached.launch(&backend, 0, &mut state, &on_a).unwrap();
        assert_eq!(kinds(&calls(&fake)), ["capture?", "wait-event", "exec-kernel", "record-event"], "its image is in the arena already");
        fake.capturing.store(true, Ordering::Relaxed);
        super::super::launch(&backend, 0, &mut state, &work, &links).unwrap();
        assert_eq!(kinds(&calls(&fake)), ["capture?", "pinned", "upload", "exec"]);
        cached.launch(&backend, 0, &mut state, &work).unwrap();
        assert_eq!(kinds(&calls(&fake)), ["capture?", "pinned", "upload", "exec-kernel"]);
        assert_eq!(state.last, Some(A), "captured launches do not become the last");
    }
}
