//! The device executor: a communicator's share of a group, on a device backend, becomes one
//! launch of the collective interpreter (`kernels/src/device/exec.cu`) on the caller's stream
//! — or a few in a row when its reductions differ in operator or element type, each launch
//! being compiled for one pair. The host encodes the planner's programs into a program image
//! (work items, steps, buffers, connections), puts it in device memory and launches; it does
//! not wait. Completion is the stream's business, as with NCCL; failures found later (a dead
//! peer, a peer whose counts differ, an abort) reach the kernel through the control block and
//! the caller through the communicator's asynchronous error.
//!
//! Images are cached per communicator by content, so a loop over the same buffers pays the
//! upload once. A launch captured into a CUDA graph gets an image of its own that lives as
//! long as the communicator, since the graph may be replayed at any time.

use std::collections::HashMap;
use std::sync::Arc;

use rustccl_kernels::exec::{self as k, ExecArgs, ExecConn, ExecCtx, ExecItem, ExecStep};
use rustccl_kernels::DeviceOp;
use rustccl_plugin_api::Protocol;

use super::plan::CommRun;
use super::profile::{self, Stage};
use crate::program::Link;
use crate::backend::{DeviceBackend, DevicePtr, Event, ExecLaunch, HostMapped, Stream};
use crate::error::{Error, Result};
use crate::transport::{p2p_protocol_slots, Connection, Dir, Kind, GPU_LL128_SLOT_BYTES, GPU_LL_SLOT_BYTES};
use crate::types::DataType;

type Links = HashMap<(Link, Dir), Arc<Connection>>;

/// Bytes of each communicator's image arena (pinned host memory and as much device memory).
const ARENA_BYTES: usize = 8 << 20;

/// A program image: pinned host memory (the copy's source) and device memory (what the kernel
/// reads).
struct Image {
    host: HostMapped,
    device: DevicePtr,
}

/// Where images of launches not captured live: one allocation made once, filled from the start
/// and emptied (with the cache) when full, after the device is idle. Allocating on the launch
/// path would be worse than slow: pinned and device allocations may wait for every running
/// kernel, and with several devices in one process a kernel may be waiting for the very thread
/// that allocates (to launch its peer's half).
struct Arena {
    mem: Image,
    used: usize,
}

/// The device executor's state of one communicator (kept in its device cache).
#[derive(Default)]
pub(crate) struct ExecState {
    /// Host memory the kernels poll and write (`ExecControl`).
    control: Option<HostMapped>,
    arena: Option<Arena>,
    /// Images in the arena by content: offset.
    cache: HashMap<Vec<u8>, usize>,
    /// Images of captured launches: kept until the communicator goes.
    captured: Vec<Image>,
    /// The stream of the last launch not captured, and an event recorded after that launch
    /// (recorded at once: the caller may destroy the stream before the communicator).
    last: Option<Stream>,
    event: Option<Event>,
    /// Whether the watchdog runs.
    pub watching: bool,
}

impl ExecState {
    /// The control block, made on first use.
    fn control(&mut self, backend: &Arc<dyn DeviceBackend>) -> Result<DevicePtr> {
        if let Some(c) = &self.control {
            return Ok(c.device);
        }
        let c = backend.alloc_host_mapped(std::mem::size_of::<k::ExecControl>().max(64))?;
        // SAFETY: fresh pinned memory of at least that size, not yet shared with any kernel.
        unsafe { std::ptr::write_bytes(c.host, 0, c.bytes) };
        let device = c.device;
        self.control = Some(c);
        Ok(device)
    }

    /// Host address of the control block, if made.
    pub(crate) fn control_host(&self) -> Option<usize> {
        self.control.as_ref().map(|c| c.host as usize)
    }

    /// Tells running and future kernels of this communicator to stop.
    pub(crate) fn abort(&self) {
        if let Some(c) = &self.control {
            // SAFETY: the control block is live pinned memory; `abort` is its first u32, which
            // kernels only read.
            unsafe { std::ptr::write_volatile(c.host as *mut u32, 1) };
        }
    }

    /// The event that completes after the last launch not captured, if there was one.
    pub(crate) fn last_event(&self) -> Option<Event> {
        self.last.and(self.event)
    }

    /// Records that a launch was enqueued on `stream`.
    fn launched(&mut self, backend: &Arc<dyn DeviceBackend>, device: usize, stream: Stream) -> Result<()> {
        let e = match self.event {
            Some(e) => e,
            None => *self.event.insert(backend.create_event(device)?),
        };
        backend.record_event(e, stream)?;
        self.last = Some(stream);
        Ok(())
    }

    /// Frees everything (the device must be idle).
    pub(crate) fn release(&mut self, backend: &Arc<dyn DeviceBackend>) {
        self.cache.clear();
        let images = self.arena.take().map(|a| a.mem).into_iter().chain(self.captured.drain(..)).collect::<Vec<_>>();
        for i in images {
            let _ = backend.free(i.device);
            let _ = backend.free_host_mapped(i.host);
        }
        self.last = None;
        if let Some(e) = self.event.take() {
            let _ = backend.destroy_event(e);
        }
        if let Some(c) = self.control.take() {
            let _ = backend.free_host_mapped(c);
        }
    }

    /// The device copy of `bytes`, uploaded on `stream` if it is new.
    fn image(&mut self, backend: &Arc<dyn DeviceBackend>, device: usize, bytes: &[u8], capturing: bool, stream: Stream) -> Result<DevicePtr> {
        let len = bytes.len().div_ceil(256) * 256;
        if capturing || len > ARENA_BYTES {
            // A graph may replay it at any time: memory of its own, kept until the end.
            let image = alloc_image(backend, device, bytes.len())?;
            // SAFETY: fresh pinned memory of `bytes.len()` bytes, kept (unchanged) with the
            // communicator, so the copy may run at any replay.
            unsafe { upload(backend, bytes, image.host.host, image.device, stream)? };
            let dev = image.device;
            self.captured.push(image);
            return Ok(dev);
        }
        if self.arena.is_none() {
            self.arena = Some(Arena { mem: alloc_image(backend, device, ARENA_BYTES)?, used: 0 });
        }
        if let Some(&off) = self.cache.get(bytes) {
            return Ok(self.arena.as_ref().expect("made above").mem.device.offset(off));
        }
        if self.arena.as_ref().expect("made above").used + len > ARENA_BYTES {
            // Full: once the device is done with every image, start again.
            if let Some(e) = self.last_event() {
                backend.synchronize_event(e)?;
            }
            self.cache.clear();
            self.arena.as_mut().expect("made above").used = 0;
        }
        let arena = self.arena.as_mut().expect("made above");
        let off = arena.used;
        arena.used += len;
        // SAFETY: `off + bytes.len()` lies in the arena; that range is not in use by any launch
        // (it was past `used`, or the device was idle when `used` went back to 0), and stays
        // unchanged until the copy has run (ranges are reused only after the device is idle).
        unsafe { upload(backend, bytes, arena.mem.host.host.add(off), arena.mem.device.offset(off), stream)? };
        self.cache.insert(bytes.to_vec(), off);
        Ok(arena.mem.device.offset(off))
    }
}

/// Writes `bytes` to pinned host memory at `host` and enqueues its copy to `device` on `stream`.
///
/// # Safety
/// `host` must be pinned memory of `backend` with room for `bytes`, left unchanged until the
/// copy has run (for a captured stream: as long as the graph may be replayed).
unsafe fn upload(backend: &Arc<dyn DeviceBackend>, bytes: &[u8], host: *mut u8, device: DevicePtr, stream: Stream) -> Result<()> {
    // SAFETY: the caller's contract: `host` has room for `bytes` and is not in use.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), host, bytes.len());
        backend.copy_from_pinned_async(device, host, bytes.len(), stream)
    }
}

/// Pinned host memory and device memory of `bytes` each.
fn alloc_image(backend: &Arc<dyn DeviceBackend>, device: usize, bytes: usize) -> Result<Image> {
    let host = backend.alloc_host_mapped(bytes)?;
    match backend.alloc(device, bytes) {
        Ok(device) => Ok(Image { host, device }),
        Err(e) => {
            let _ = backend.free_host_mapped(host);
            Err(e)
        }
    }
}

/// One launch's worth of a run: the tasks (contexts) it covers and the kernel it needs.
struct Segment {
    ctxs: std::ops::Range<usize>,
    op: DeviceOp,
    dtype: DataType,
}

/// Splits the run's tasks, in order, into launches whose reductions share one kernel.
fn segments(run: &CommRun) -> Vec<Segment> {
    let mut reduces = vec![false; run.ctxs.len()];
    for item in &run.items {
        for (ci, s) in &item.steps {
            reduces[*ci] |= s.reduce;
        }
    }
    let mut out: Vec<Segment> = Vec::new();
    let mut start = 0;
    let mut kernel: Option<(DeviceOp, DataType)> = None;
    for (ci, ctx) in run.ctxs.iter().enumerate() {
        if !reduces[ci] {
            continue;
        }
        let r = &ctx.reducer;
        let want = (crate::backend::cuda::coll_device_op(r.op, r.dtype).0, r.dtype);
        match kernel {
            None => kernel = Some(want),
            Some(have) if have == want => {}
            Some((op, dtype)) => {
                out.push(Segment { ctxs: start..ci, op, dtype });
                start = ci;
                kernel = Some(want);
            }
        }
    }
    let (op, dtype) = kernel.unwrap_or((DeviceOp::Sum, DataType::Uint8));
    out.push(Segment { ctxs: start..run.ctxs.len(), op, dtype });
    out
}

fn proto_code(p: Protocol) -> u8 {
    match p {
        Protocol::Ll => k::PROTO_LL,
        Protocol::Ll128 => k::PROTO_LL128,
        Protocol::Simple => k::PROTO_SIMPLE,
    }
}

/// A program image and what its launch needs besides.
pub(crate) struct Encoded {
    pub bytes: Vec<u8>,
    /// Offsets of items, contexts, connections and steps in `bytes`.
    pub offsets: [usize; 4],
    pub nitems: u32,
    pub nconns: u32,
    pub blocks: u32,
    pub slots: Vec<DevicePtr>,
}

fn append<T: Copy>(bytes: &mut Vec<u8>, items: &[T]) -> usize {
    while !bytes.len().is_multiple_of(32) {
        bytes.push(0);
    }
    let at = bytes.len();
    bytes.extend_from_slice(k::as_bytes(items));
    at
}

/// Encodes the steps of the tasks in `ctxs` (None when they have no step).
pub(crate) fn encode(run: &CommRun, links: &Links, ctxs: std::ops::Range<usize>) -> Result<Option<Encoded>> {
    let mut conns: Vec<ExecConn> = Vec::new();
    let mut slots = Vec::new();
    let mut index: HashMap<(Link, Dir), u8> = HashMap::new();
    let mut conn_of = |link: Link, dir: Dir| -> Result<u8> {
        if let Some(&i) = index.get(&(link, dir)) {
            return Ok(i);
        }
        if conns.len() >= k::EXEC_MAX_CONNS {
            return Err(Error::invalid_usage(format!(
                "this group needs more than {} connections on one device; split it into smaller groups",
                k::EXEC_MAX_CONNS
            )));
        }
        let c = links.get(&(link, dir)).ok_or_else(|| Error::internal("a link was not connected"))?;
        let mut conn = ExecConn {
            slots: c.fifo.slot_addr(0),
            header: c.fifo.device_header(),
            slot_bytes: c.fifo.slot_bytes() as u32,
            flags: if dir == Dir::Send { k::CONN_SEND } else { 0 },
            ..ExecConn::default()
        };
        if c.kind == Kind::P2p {
            conn.flags |= k::CONN_LINES_WHOLE;
            (conn.ll_slots, conn.ll128_slots) = p2p_protocol_slots(conn.slots);
            conn.ll_slot_bytes = GPU_LL_SLOT_BYTES as u32;
            conn.ll128_slot_bytes = GPU_LL128_SLOT_BYTES as u32;
        }
        if conn.header == 0 {
            return Err(Error::internal(format!("the connection with rank {} has no device mapping", link.peer)));
        }
        conns.push(conn);
        slots.push(DevicePtr(c.fifo.slot_addr(0)));
        let i = (conns.len() - 1) as u8;
        index.insert((link, dir), i);
        Ok(i)
    };
    let mut items: Vec<ExecItem> = Vec::new();
    let mut steps: Vec<ExecStep> = Vec::new();
    for item in &run.items {
        let first = steps.len();
        for (ci, s) in item.steps.iter().filter(|(ci, _)| ctxs.contains(ci)) {
            if s.recv.len() > k::EXEC_MAX_PEERS || s.send.len() > k::EXEC_MAX_PEERS {
                return Err(Error::internal("a step with more than two peers on one side"));
            }
            let ctx = &run.ctxs[*ci];
            let mut e = ExecStep {
                src: s.src.unwrap_or(0) as u64,
                dst: s.dst.unwrap_or(0) as u64,
                bytes: u32::try_from(s.bytes).map_err(|_| Error::internal("a step over 4 GiB"))?,
                ctx: u16::try_from(*ci).map_err(|_| Error::invalid_usage("more than 65535 operations in one group"))?,
                flags: 0,
                proto: if s.recv.is_empty() && s.send.is_empty() { k::PROTO_SIMPLE } else { proto_code(ctx.proto) },
                nrecv: s.recv.len() as u8,
                nsend: s.send.len() as u8,
                ..ExecStep::default()
            };
            for (flag, on) in [
                (k::STEP_SRC, s.src.is_some()),
                (k::STEP_DST, s.dst.is_some()),
                (k::STEP_REDUCE, s.reduce),
                (k::STEP_POST, s.post),
                (k::STEP_SRC_IN_DST, s.src_in_dst),
            ] {
                if on {
                    e.flags |= flag;
                }
            }
            for (j, l) in s.recv.iter().enumerate() {
                e.recv[j] = conn_of(*l, Dir::Recv)?;
            }
            for (j, l) in s.send.iter().enumerate() {
                e.send[j] = conn_of(*l, Dir::Send)?;
            }
            steps.push(e);
        }
        if steps.len() > first {
            items.push(ExecItem { first: first as u32, count: (steps.len() - first) as u32 });
        }
    }
    if items.is_empty() {
        return Ok(None);
    }
    if items.len() > k::EXEC_MAX_BLOCKS * k::EXEC_MAX_ITEMS_PER_BLOCK {
        return Err(Error::invalid_usage(format!(
            "this group has {} independent streams of work on one device (at most {}); split it into smaller groups",
            items.len(),
            k::EXEC_MAX_BLOCKS * k::EXEC_MAX_ITEMS_PER_BLOCK
        )));
    }
    let exec_ctxs: Vec<ExecCtx> = run
        .ctxs
        .iter()
        .map(|c| {
            let (_, scalar, divisor) = crate::backend::cuda::coll_device_op(c.reducer.op, c.reducer.dtype);
            ExecCtx { src: c.src as u64, dst: c.dst as u64, scalar, divisor, sig: c.sig.0 }
        })
        .collect();
    let mut bytes = Vec::new();
    let o_items = append(&mut bytes, &items);
    let o_ctxs = append(&mut bytes, &exec_ctxs);
    let o_conns = append(&mut bytes, &conns);
    let o_steps = append(&mut bytes, &steps);
    Ok(Some(Encoded {
        bytes,
        offsets: [o_items, o_ctxs, o_conns, o_steps],
        nitems: items.len() as u32,
        nconns: conns.len() as u32,
        blocks: items.len().min(k::EXEC_MAX_BLOCKS) as u32,
        slots,
    }))
}

/// Launches the run's work on its stream; returns once it is enqueued.
pub(crate) fn launch(run: &CommRun, links: &Links) -> Result<()> {
    let comm = &run.comm;
    let backend = Arc::clone(comm.backend());
    let device = comm.device()? as usize;
    let stream = run.stream;
    let t = std::time::Instant::now();
    let capturing = backend.is_capturing(stream)?;
    profile::record(Stage::Capture, t);
    let mut cache = comm.device_cache();
    let control = cache.exec.control(&backend)?;
    if !cache.exec.watching {
        cache.exec.watching = true;
        comm.start_watchdog();
    }
    // Launches of one communicator run in order, whatever streams they come on: each reads
    // where its connections stand when it starts.
    if cache.exec.last.is_some_and(|s| s != stream) && !capturing {
        if let Some(e) = cache.exec.last_event() {
            backend.stream_wait_event(stream, e)?;
        }
    }
    let buffers: Vec<(DevicePtr, usize)> = run
        .ctxs
        .iter()
        .flat_map(|c| [(DevicePtr(c.src as u64), c.src_len), (DevicePtr(c.dst as u64), c.dst_len)])
        .filter(|(p, n)| *n > 0 && p.0 != 0)
        .collect();
    for seg in segments(run) {
        let t = std::time::Instant::now();
        let Some(enc) = encode(run, links, seg.ctxs.clone())? else { continue };
        profile::record(Stage::Encode, t);
        let t = std::time::Instant::now();
        let base = cache.exec.image(&backend, device, &enc.bytes, capturing, stream)?;
        profile::record(Stage::Image, t);
        let at = |i: usize| base.0 + enc.offsets[i] as u64;
        let args = ExecArgs {
            items: at(0),
            ctxs: at(1),
            conns: at(2),
            steps: at(3),
            control: control.0,
            nitems: enc.nitems,
            nconns: enc.nconns,
        };
        let l = ExecLaunch {
            device,
            op: seg.op,
            dtype: seg.dtype,
            args,
            blocks: enc.blocks,
            buffers: buffers.clone(),
            slots: enc.slots,
        };
        let t = std::time::Instant::now();
        backend.launch_exec(&l, stream)?;
        profile::record(Stage::Kernel, t);
    }
    if !capturing {
        cache.exec.launched(&backend, device, stream)?;
    }
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
            super::check::OpSig(c.got),
            super::check::OpSig(c.expected)
        ))),
        code => Some(Error::internal(format!("rank {rank}: the collective kernel stopped with error {code}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::plan::{OpCtx, WorkItem};
    use crate::program::{self, Purpose, Ring, Step};
    use crate::reduce::{DevOp, Reducer};
    use crate::transport::fifo::{header_bytes, Fifo, LocalMemory, STEPS};
    use crate::transport::GPU_SLOT_BYTES;

    /// A communicator to hang runs on (host backend; only its handle is used).
    fn comm() -> crate::comm::Communicator {
        std::env::set_var("RUSTCCL_BACKEND", "host");
        crate::comm::Communicator::init_all(&[0, 1]).unwrap().remove(0)
    }

    /// A connection whose slots and header sit at made-up device addresses from `base`.
    fn conn(link: Link, dir: Dir, kind: Kind, base: u64) -> Arc<Connection> {
        let header = LocalMemory::new(header_bytes());
        // SAFETY: the header stand-in is zeroed and lives with the connection; the device
        // addresses are only encoded, never touched.
        let fifo = unsafe { Fifo::with_device_slots(header.ptr(), base, base + 4096, GPU_SLOT_BYTES) };
        Arc::new(Connection::for_test(link, dir, kind, fifo, header))
    }

    fn ctx(dtype: DataType, op: DevOp, proto: Protocol) -> OpCtx {
        OpCtx { src: 0x1000, dst: 0x2000, src_len: 64, dst_len: 64, reducer: Reducer::new(dtype, op), proto, sig: crate::coll::check::OpSig(0) }
    }

    fn run(ctxs: Vec<OpCtx>, items: Vec<Vec<(usize, Step)>>) -> CommRun {
        CommRun {
            comm: comm(),
            ctxs,
            items: items.into_iter().map(|steps| WorkItem { steps, pc: 0 }).collect(),
            device: true,
            stream: Stream::DEFAULT,
        }
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
                assert_eq!(c.flags, k::CONN_SEND | k::CONN_LINES_WHOLE, "the P2P send end");
                assert_eq!(c.header, 0x10_0000_0000);
                assert_eq!(c.ll_slots, c.slots + (STEPS * GPU_SLOT_BYTES) as u64);
                assert_eq!(c.ll128_slots, c.ll_slots + (STEPS * GPU_LL_SLOT_BYTES) as u64);
            }
            if s.recv.len() == 1 {
                let c = conns[e.recv[0] as usize];
                assert_eq!(c.flags, 0, "a network receive end waits on tail, one slot region");
                assert_eq!((c.ll_slots, c.ll128_slots), (0, 0));
                assert_eq!(c.slot_bytes as usize, GPU_SLOT_BYTES);
            }
        }
        let ctxs: Vec<ExecCtx> = decode(&enc.bytes, enc.offsets[1], 1);
        assert_eq!((ctxs[0].src, ctxs[0].dst), (0x1000, 0x2000));
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
        assert_eq!(ctxs[0].scalar, 0.5f32.to_bits() as u64);
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
