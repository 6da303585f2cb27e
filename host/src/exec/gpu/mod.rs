//! The device executor: a communicator's work in a group, on a device backend, becomes one
//! launch of the collective interpreter (`kernels/src/device/exec.cu`) on the caller's stream
//! — or a few in a row when its reductions differ in operator or element type, each launch
//! being compiled for one pair. The host encodes the planner's programs into a program image
//! ([`encode`]), puts it in device memory ([`state`]) and launches; it does not wait.
//! Completion is the stream's business, as with NCCL; failures found later (a dead peer, a
//! peer in another operation, an abort) reach the kernel through the control block and the
//! caller through the communicator's asynchronous error (its watchdog reads
//! `control_error`).
//!
//! An image holds the shape of the work, not the buffers: those of the first
//! `EXEC_ARG_CTXS` operations (and their PreMulSum scalars) travel in the kernel parameter
//! ([`encode`]). Images are cached per communicator by content, so a loop over the same shape
//! pays the upload once, whatever its buffers; a single collective repeated with one shape
//! outside a group (the planned route's memo, `exec::memo`) skips planning and encoding as well, and launches what
//! [`cached`] kept. A launch captured into a CUDA graph gets an image of its own that lives as
//! long as the communicator, since the graph may be replayed at any time.
//!
//! Each launch tells the network proxy how many slots it will consume from each receiving
//! network connection (`announce_receives`), so that the proxy posts a receive only for a
//! step some launch will take, as NCCL posts proxy operations per launched plan: at once for
//! a launch that runs now, and from a host node before the kernel, at every replay, for a
//! captured one (NCCL uploads a persistent plan's proxy operations from a host callback too).
//!
//! The symmetric kernels ([`symmetric`]) and the copy-engine collectives ([`copy_engine`]) on
//! symmetric windows are launched here too. Every launch — the interpreter's, a cached one, a
//! symmetric kernel, a copy-engine collective — goes through the one launch sequence
//! ([`sequence`]: capture check, control block, the wait for the communicator's last launch,
//! the enqueue, the event after it). The entry points, each given the backend, the device and
//! the communicator's [`ExecState`] (`engine::Engine::with_device` hands them out):
//! `launch`, `cached::CachedLaunch::launch`, `run_symmetric`,
//! `copy_engine_ready` then `run_copy_engine`, and the one-sided operations'
//! `one_sided::run_signal` and `one_sided::run_wait`. Everything here goes through the
//! `DeviceBackend` trait, so CUDA and a later HIP backend share it.

pub mod cached;
pub mod copy_engine;
pub mod encode;
#[cfg(test)]
pub(crate) mod fake;
pub mod one_sided;
pub mod ops;
pub mod sequence;
pub mod state;
pub mod symmetric;

use std::sync::Arc;

use rustccl_kernels::exec as k;

use super::{Links, NetReceives};
use crate::backend::{DeviceBackend, DevicePtr, ExecLaunch, HostCallback, Stream};
use crate::error::{Error, Result};
use crate::profile::{self, Stage};
use sequence::Engine;
use crate::work::{LocalCopy, Work};
pub(crate) use copy_engine::{ready as copy_engine_ready, run_copy_engine};
pub use state::ExecState;
pub(crate) use symmetric::run_symmetric;

/// Launches a communicator's work on its stream on `device`; returns once it is enqueued.
/// `state` is the communicator's (its watchdog starts when `state.watching` is first set).
pub(crate) fn launch(backend: &Arc<dyn DeviceBackend>, device: usize, state: &mut ExecState, run: &Work, links: &Links) -> Result<()> {
    if run.copies.is_empty() && run.items.is_empty() {
        // Nothing for the device (a one-rank operation in place, count 0): no launch, no event.
        return Ok(());
    }
    state.launch(backend, device, Engine::Kernel(run.stream), |state, at| {
        let (stream, capturing) = (at.stream, at.capturing);
        let t = std::time::Instant::now();
        announce_receives(backend, state, &NetReceives::of(run, links), capturing, stream)?;
        for c in &run.copies {
            backend.copy(DevicePtr(c.dst as u64), DevicePtr(c.src as u64), c.bytes, stream)?;
        }
        if !run.copies.is_empty() {
            profile::record(Stage::Copy, t);
        }
        let buffers: Vec<(DevicePtr, usize)> = run
            .ctxs
            .iter()
            .flat_map(|c| [(DevicePtr(c.src as u64), c.src_len), (DevicePtr(c.dst as u64), c.dst_len)])
            .filter(|(p, n)| *n > 0 && p.0 != 0)
            .collect();
        let calls = encode::calls(run);
        for seg in encode::segments(run) {
            let t = std::time::Instant::now();
            let Some(enc) = encode::encode(run, links, seg.ctxs.clone())? else { continue };
            profile::record(Stage::Encode, t);
            let t = std::time::Instant::now();
            let base = state.image(backend, device, &enc.bytes, capturing, stream)?;
            profile::record(Stage::Image, t);
            let args = enc.args(base, at.control, &calls);
            let l = ExecLaunch {
                device,
                op: seg.op,
                dtype: seg.dtype,
                entry: enc.entry,
                args,
                blocks: enc.blocks,
                buffers: buffers.clone(),
                slots: enc.slots,
            };
            let t = std::time::Instant::now();
            backend.kernels_or_err("launch")?.launch_exec(&l, stream)?;
            profile::record(Stage::Kernel, t);
        }
        Ok(())
    })
}

/// The one-rank route's copies (`exec::local_copies`), each on its stream, in order, as
/// NCCL's one-rank calls: they read and write only the caller's buffers and cannot hang, so
/// they go around the launch sequence — no event for the watchdog and teardown, no ordering
/// after the communicator's work on other streams, no capture check (copies are captured as
/// they are).
pub(crate) fn local_copies(backend: &dyn DeviceBackend, copies: &[(LocalCopy, Stream)]) -> Result<()> {
    let t = profile::start();
    let r = copies.iter().try_for_each(|&(c, stream)| backend.copy(DevicePtr(c.dst as u64), DevicePtr(c.src as u64), c.bytes, stream));
    profile::stage(Stage::Copy, t);
    r
}

/// Tells the proxy of the network receives a launch on `stream` will consume: at once when
/// the launch runs now (the count is a running total, so telling early is right), or, for a
/// captured launch, from a host callback enqueued before its kernel, which runs at every
/// replay of the graph. Nothing to do without receiving network connections.
pub(crate) fn announce_receives(
    backend: &Arc<dyn DeviceBackend>,
    state: &mut ExecState,
    receives: &NetReceives,
    capturing: bool,
    stream: Stream,
) -> Result<()> {
    if receives.is_empty() {
        return Ok(());
    }
    if !capturing {
        receives.expect();
        return Ok(());
    }
    let each_replay = receives.clone();
    let callback = Arc::new(HostCallback(Box::new(move || each_replay.expect())));
    // SAFETY: `state` keeps the callback as long as the communicator, as the captured
    // launch's image (replaying a graph after its communicator is gone is the caller's error,
    // as with NCCL).
    unsafe { backend.kernels_or_err("host callback")?.launch_host_callback(&callback, stream)? };
    state.keep_captured(callback);
    Ok(())
}

/// What the control block says went wrong, if anything.
pub(crate) fn control_error(host: usize, rank: u32) -> Option<Error> {
    // SAFETY: `host` is the live control block of a communicator (the caller keeps it); the
    // kernel writes the details before the code, with a system fence between.
    let c = unsafe { std::ptr::read_volatile(host as *const k::ExecControl) };
    match c.error {
        0 => None,
        k::EXEC_ERR_SIZE => Some(Error::invalid_usage(format!(
            "rank {rank}: a peer sent a step of {} bytes where this rank expected {} (connection {}): \
             the ranks' counts, types or operations do not match",
            c.got, c.expected, c.conn
        ))),
        k::EXEC_ERR_SIG => Some(Error::invalid_usage(format!(
            "rank {rank}: the ranks called different operations: a peer (connection {}) is in {} while rank {rank} is in {}; \
             every rank must call the same collectives in the same order with the same count, datatype, operator and root",
            c.conn,
            crate::work::OpSig(c.got),
            crate::work::OpSig(c.expected)
        ))),
        k::EXEC_ERR_PROTO => Some(Error::internal(format!(
            "rank {rank}: a step of protocol {} was launched with a kernel entry point built for the protocols {:#x} (a bug in rustccl: please report it)",
            c.got, c.expected
        ))),
        code => Some(Error::internal(format!("rank {rank}: the collective kernel stopped with error {code}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::encode::{encode, segments};
    use super::*;
    use crate::backend::Stream;
    use crate::program::Link;
    use crate::transport::{Connection, Dir, Kind};
    use crate::types::DataType;
    use crate::work::{OpCtx, Work, WorkItem};
    use rustccl_kernels::exec::{ExecConn, ExecCtx, ExecItem, ExecStep};
    use rustccl_kernels::DeviceOp;
    use rustccl_plugin_api::Protocol;
    use crate::program::{self, Purpose, Ring, Step};
    use crate::reduce::{DevOp, Reducer};
    use crate::transport::fifo::{header_bytes, Fifo, LocalMemory, STEPS};
    use crate::transport::{gpu_simple_fifo, gpu_slot_bytes, GPU_LL_SLOT_BYTES};

    /// A connection whose slots and header sit at made-up device addresses from `base`.
    fn conn(link: Link, dir: Dir, kind: Kind, base: u64) -> Arc<Connection> {
        let header = LocalMemory::new(header_bytes());
        // SAFETY: the header stand-in is zeroed and lives with the connection; the device
        // addresses are only encoded, never touched.
        let fifo = unsafe { Fifo::with_device_slots(header.ptr(), base, base + 4096, gpu_slot_bytes(), gpu_simple_fifo().steps) };
        Arc::new(Connection::for_test(link, dir, kind, fifo, header))
    }

    fn ctx(dtype: DataType, op: DevOp, proto: Protocol) -> OpCtx {
        OpCtx { src: 0x1000, dst: 0x2000, src_len: 64, dst_len: 64, reducer: Reducer::new(dtype, op), proto, sig: crate::work::OpSig(0), scalar_at: 0, dst_remote: 0 }
    }

    fn run(ctxs: Vec<OpCtx>, items: Vec<Vec<(usize, Step)>>) -> Work {
        Work { ctxs, items: items.into_iter().map(|steps| WorkItem { steps, pc: 0 }).collect(), copies: vec![], stream: Stream::DEFAULT }
    }

    fn decode<T: Copy + Default>(bytes: &[u8], at: usize, n: usize) -> Vec<T> {
        let size = std::mem::size_of::<T>();
        (0..n)
            .map(|i| {
                let mut v = T::default();
                // SAFETY: T is one of the plain #[repr(C)] image structs; the bytes were made
                // from values of it.
                unsafe { std::ptr::copy_nonoverlapping(bytes[at + i * size..].as_ptr(), &mut v as *mut T as *mut u8, size) };
                v
            })
            .collect()
    }

    /// A launch whose steps all use one protocol takes that protocol's kernel entry point; one
    /// that mixes protocols (here an LL ring and a Simple one in one group) takes the entry of
    /// every protocol.
    #[test]
    fn the_kernel_entry_point_follows_the_protocols_of_the_steps() {
        let ring = Ring { rank: 0, nranks: 2, channel: 0 };
        let prog = program::ring_all_reduce(ring, (0, 10), 4, 4);
        let link = Link { peer: 1, purpose: Purpose::Ring(0) };
        let mut links = Links::new();
        links.insert((link, Dir::Send), conn(link, Dir::Send, Kind::P2p, 0x10_0000_0000));
        links.insert((link, Dir::Recv), conn(link, Dir::Recv, Kind::P2p, 0x20_0000_0000));
        let entry_of = |protos: &[Protocol]| {
            let r = run(
                protos.iter().map(|&p| ctx(DataType::Float32, DevOp::Sum, p)).collect(),
                protos.iter().enumerate().map(|(ci, _)| prog.iter().cloned().map(|s| (ci, s)).collect()).collect(),
            );
            encode(&r, &links, 0..protos.len()).unwrap().expect("steps").entry
        };
        assert_eq!(entry_of(&[Protocol::Simple]), k::ExecEntry::Simple);
        assert_eq!(entry_of(&[Protocol::Ll]), k::ExecEntry::Ll);
        assert_eq!(entry_of(&[Protocol::Ll128]), k::ExecEntry::Ll128);
        assert_eq!(entry_of(&[Protocol::Ll, Protocol::Ll]), k::ExecEntry::Ll);
        assert_eq!(entry_of(&[Protocol::Ll, Protocol::Simple]), k::ExecEntry::Mixed);
    }

    #[test]
    fn ring_all_reduce_encodes_links_flags_and_p2p_regions() {
        let ring = Ring { rank: 0, nranks: 2, channel: 0 };
        let prog = program::ring_all_reduce(ring, (0, 10), 4, 4);
        let r = run(
            vec![ctx(DataType::Float32, DevOp::Sum, Protocol::Ll)],
            vec![prog.iter().cloned().map(|s| (0, s)).collect()],
        );
        let link = Link { peer: 1, purpose: Purpose::Ring(0) };
        let mut links = Links::new();
        links.insert((link, Dir::Send), conn(link, Dir::Send, Kind::P2p, 0x10_0000_0000));
        links.insert((link, Dir::Recv), conn(link, Dir::Recv, Kind::Net, 0x20_0000_0000));
        let enc = encode(&r, &links, 0..1).unwrap().expect("steps");
        assert_eq!((enc.nitems, enc.blocks), (1, 1));
        assert!(enc.offsets.iter().all(|o| o % 32 == 0), "{:?}", enc.offsets);
        let items: Vec<ExecItem> = decode(&enc.bytes, enc.offsets[0], 1);
        assert_eq!(items[0], ExecItem { first: 0, count: prog.len() as u32 });
        let conns: Vec<ExecConn> = decode(&enc.bytes, enc.offsets[2], enc.nconns as usize);
        let steps: Vec<ExecStep> = decode(&enc.bytes, enc.offsets[3], prog.len());
        for (s, e) in prog.iter().zip(&steps) {
            assert_eq!(e.bytes as usize, s.bytes);
            assert_eq!((e.nrecv as usize, e.nsend as usize), (s.recv.len(), s.send.len()));
            assert_eq!(e.proto, k::PROTO_LL);
            assert_eq!(e.flags & k::STEP_REDUCE != 0, s.reduce);
            assert_eq!(e.flags & k::STEP_POST != 0, s.post);
            assert_eq!(e.flags & k::STEP_SRC != 0, s.src.is_some());
            assert_eq!(e.flags & k::STEP_DST != 0, s.dst.is_some());
            assert_eq!(e.src, s.src.unwrap_or(0) as u64);
            assert_eq!(e.dst, s.dst.unwrap_or(0) as u64);
            if s.send.len() == 1 {
                let c = conns[e.send[0] as usize];
                assert_eq!(c.flags, k::CONN_SEND | k::CONN_LINES_WHOLE | k::CONN_DIRECT, "the P2P send end");
                assert_eq!(c.header, 0x10_0000_0000);
                assert_eq!(c.ll_slots, c.slots + gpu_simple_fifo().bytes() as u64);
                assert_eq!(c.simple_steps as usize, gpu_simple_fifo().steps);
                assert_eq!(c.ll128_slots, c.ll_slots + (STEPS * GPU_LL_SLOT_BYTES) as u64);
            }
            if s.recv.len() == 1 {
                let c = conns[e.recv[0] as usize];
                assert_eq!(c.flags, 0, "a network receive end waits on tail, one slot region");
                assert_eq!((c.ll_slots, c.ll128_slots), (0, 0));
                assert_eq!(c.slot_bytes as usize, gpu_slot_bytes());
            }
        }
        // The buffers are call values (the kernel parameter), not part of the image.
        let ctxs: Vec<ExecCtx> = decode(&enc.bytes, enc.offsets[1], 1);
        assert_eq!((ctxs[0].src, ctxs[0].dst), (0, 0));
        let (n, calls) = encode::calls(&r);
        assert_eq!((n, calls[0].src, calls[0].dst), (1, 0x1000, 0x2000));
    }

    #[test]
    fn local_steps_are_simple_and_premulsum_scalars_are_encoded() {
        let local = Step { recv: vec![], send: vec![], src: Some(0), dst: Some(0), bytes: 8, reduce: true, post: true, src_in_dst: false };
        let r = run(vec![ctx(DataType::Float32, DevOp::PreMulSum { scalar: 0.5 }, Protocol::Ll128)], vec![vec![(0, local)]]);
        let enc = encode(&r, &Links::new(), 0..1).unwrap().expect("steps");
        assert_eq!(enc.nconns, 0);
        let steps: Vec<ExecStep> = decode(&enc.bytes, enc.offsets[3], 1);
        assert_eq!(steps[0].proto, k::PROTO_SIMPLE, "no peer, no line format");
        let ctxs: Vec<ExecCtx> = decode(&enc.bytes, enc.offsets[1], 1);
        assert_eq!(ctxs[0].scalar, 0, "a call value");
        assert_eq!(encode::calls(&r).1[0].scalar, 0.5f32.to_bits() as u64);
    }

    #[test]
    fn contexts_past_the_parameter_keep_their_values_in_the_image() {
        let n = k::EXEC_ARG_CTXS + 2;
        let local = Step { recv: vec![], send: vec![], src: Some(0), dst: Some(0), bytes: 8, reduce: true, post: false, src_in_dst: false };
        let ctxs = (0..n)
            .map(|i| OpCtx { src: 0x1000 * (i + 1), dst: 0x10_0000 * (i + 1), ..ctx(DataType::Float32, DevOp::PreMulSum { scalar: i as f64 }, Protocol::Simple) })
            .collect();
        let r = run(ctxs, vec![(0..n).map(|i| (i, local.clone())).collect()]);
        let enc = encode(&r, &Links::new(), 0..n).unwrap().expect("steps");
        let image: Vec<ExecCtx> = decode(&enc.bytes, enc.offsets[1], n);
        let (count, calls) = encode::calls(&r);
        assert_eq!(count as usize, k::EXEC_ARG_CTXS);
        let scalar = |i: usize| (i as f32).to_bits() as u64;
        for (i, c) in image.iter().enumerate() {
            if i < k::EXEC_ARG_CTXS {
                assert_eq!((c.src, c.dst, c.scalar), (0, 0, 0), "context {i}: in the parameter");
                assert_eq!((calls[i].src, calls[i].dst, calls[i].scalar), (0x1000 * (i as u64 + 1), 0x10_0000 * (i as u64 + 1), scalar(i)));
            } else {
                assert_eq!((c.src, c.dst, c.scalar), (0x1000 * (i as u64 + 1), 0x10_0000 * (i as u64 + 1), scalar(i)), "context {i}: in the image");
            }
        }
    }

    /// Zero-copy receives: runs of plain point-to-point receives of one operation over P2P
    /// are marked for the kernel's post (the first step, with the run's length); receives over
    /// other transports, or mixed with other steps, are not candidates.
    #[test]
    fn point_to_point_receives_over_p2p_are_marked_in_runs_per_operation() {
        let p2p = Link { peer: 1, purpose: Purpose::P2p(0) };
        let shm = Link { peer: 2, purpose: Purpose::P2p(0) };
        let mut links = Links::new();
        links.insert((p2p, Dir::Recv), conn(p2p, Dir::Recv, Kind::P2p, 0x10_0000_0000));
        links.insert((p2p, Dir::Send), conn(p2p, Dir::Send, Kind::P2p, 0x20_0000_0000));
        links.insert((shm, Dir::Recv), conn(shm, Dir::Recv, Kind::Shm, 0x30_0000_0000));
        let simple = || ctx(DataType::Float32, DevOp::Sum, Protocol::Simple);
        // Contexts 0 and 1 receive from rank 1 (3 and 2 steps), 2 sends to it, 3 receives
        // from rank 2 over SHM, 4 receives from rank 1 as LL.
        const C: usize = encode::DIRECT_MIN_BYTES;
        let recv = |l: u32, n: usize| program::p2p_recv(l, 0, (0, n * C), C);
        let mut item: Vec<(usize, Step)> = recv(1, 3).into_iter().map(|s| (0, s)).collect();
        item.extend(recv(1, 2).into_iter().map(|s| (1, s)));
        let sends: Vec<(usize, Step)> = program::p2p_send(1, 0, (0, 2 * C), C).into_iter().map(|s| (2, s)).collect();
        let over_shm: Vec<(usize, Step)> = recv(2, 2).into_iter().map(|s| (3, s)).collect();
        let ll: Vec<(usize, Step)> = recv(1, 1).into_iter().map(|s| (4, s)).collect();
        let mut ctxs = vec![simple(), simple(), simple(), simple(), ctx(DataType::Float32, DevOp::Sum, Protocol::Ll)];
        ctxs[0].dst_remote = 0x7000;
        let r = run(ctxs, vec![item, sends, over_shm]);
        assert_eq!(encode::direct_receives(&r, &links), vec![(0, 1), (1, 1)]);
        let enc = encode(&r, &links, 0..5).unwrap().expect("steps");
        let steps: Vec<ExecStep> = decode(&enc.bytes, enc.offsets[3], 9);
        let marks: Vec<(bool, u16)> = steps.iter().map(|s| (s.flags & k::STEP_DIRECT_START != 0, s.run)).collect();
        assert_eq!(
            marks,
            vec![(true, 3), (false, 0), (false, 0), (true, 2), (false, 0), (false, 0), (false, 0), (false, 0), (false, 0)],
            "a run per receiving operation; sends and SHM receives unmarked"
        );
        let conns: Vec<ExecConn> = decode(&enc.bytes, enc.offsets[2], enc.nconns as usize);
        assert!(conns[steps[0].recv[0] as usize].flags & k::CONN_DIRECT != 0);
        assert!(conns[steps[7].recv[0] as usize].flags & k::CONN_DIRECT == 0, "SHM");
        // Where the peer maps the buffer is a call value.
        assert_eq!(encode::calls(&r).1[0].dst_remote, 0x7000);
        assert_eq!(encode::calls(&r).1[1].dst_remote, 0);
        // The kernel's threshold is this one; a run that starts below it is not posted.
        assert!(include_str!("../../../../kernels/src/device/exec.cu").contains("#define RUSTCCL_DIRECT_MIN_BYTES (64u << 10)"));
        assert_eq!(encode::DIRECT_MIN_BYTES, 64 << 10);
        let small = run(vec![simple()], vec![program::p2p_recv(1, 0, (0, 3 * 64), 64).into_iter().map(|s| (0, s)).collect()]);
        let enc = encode(&small, &links, 0..1).unwrap().expect("steps");
        let steps: Vec<ExecStep> = decode(&enc.bytes, enc.offsets[3], 3);
        assert!(steps.iter().all(|s| s.flags & k::STEP_DIRECT_START == 0), "64-byte steps are not posted");
        // An LL receive (ctx 4) is not a candidate either.
        let r = run(vec![simple(), simple(), simple(), simple(), ctx(DataType::Float32, DevOp::Sum, Protocol::Ll)], vec![ll]);
        assert_eq!(encode::direct_receives(&r, &links), vec![]);
    }

    #[test]
    fn launches_split_where_the_reduction_kernel_changes() {
        let step = |reduce| Step { recv: vec![], send: vec![], src: Some(0), dst: Some(0), bytes: 8, reduce, post: false, src_in_dst: false };
        let r = run(
            vec![
                ctx(DataType::Float32, DevOp::Sum, Protocol::Simple),
                ctx(DataType::Uint8, DevOp::Sum, Protocol::Simple),
                ctx(DataType::Float16, DevOp::Max, Protocol::Simple),
                ctx(DataType::Float16, DevOp::Max, Protocol::Simple),
                ctx(DataType::Int32, DevOp::Sum, Protocol::Simple),
            ],
            vec![vec![(0, step(true)), (1, step(false)), (2, step(true)), (3, step(true)), (4, step(false))]],
        );
        let segs = segments(&r);
        let got: Vec<_> = segs.iter().map(|s| (s.ctxs.clone(), s.op, s.dtype)).collect();
        assert_eq!(
            got,
            vec![(0..2, DeviceOp::Sum, DataType::Float32), (2..5, DeviceOp::Max, DataType::Float16)],
            "copies join the launch they fall in"
        );
        // Each launch carries only its tasks' steps.
        let enc = encode(&r, &Links::new(), segs[1].ctxs.clone()).unwrap().expect("steps");
        let steps: Vec<ExecStep> = decode(&enc.bytes, enc.offsets[3], 3);
        assert_eq!(steps.iter().map(|s| s.ctx).collect::<Vec<_>>(), vec![2, 3, 4]);
        assert!(encode(&r, &Links::new(), 5..5).unwrap().is_none());
    }
}
