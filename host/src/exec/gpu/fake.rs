//! A stand-in device backend for the device executor's tests (no GPU here): device memory is
//! made-up addresses, pinned memory is host memory, and what the executor asks of it —
//! uploads, launches, buffer checks, kernel look-ups, events — is written down.

use std::sync::Mutex;

use rustccl_kernels::exec::{ExecArgs, ExecEntry, SymArgs};
use rustccl_kernels::symmetric::SymKernel;
use rustccl_kernels::DeviceOp;

use crate::backend::{
    BackendKind, BufferSharing, Capabilities, DeviceBackend, DevicePtr, Event, ExecKernel, ExecLaunch, ForeignEvents, HostAccess, HostCallback, HostMapped, Kernels, Memory,
    ShareHandle, Sharing, Stream, Streams, SymmetricKernels, WindowMemory,
};
use crate::error::{Error, Result};
use crate::types::DataType;

/// One launch as the backend saw it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Launched {
    pub op: DeviceOp,
    pub dtype: DataType,
    pub entry: ExecEntry,
    pub args: ExecArgs,
    pub blocks: u32,
    pub stream: Stream,
}

/// One call the executor made, in the order made ([`Log::calls`]): the launch sequence's
/// steps and what the symmetric kernels and copy engines enqueue.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Call {
    IsCapturing(Stream),
    /// Pinned host memory (the control block, images) of this many bytes.
    AllocHostMapped(usize),
    CreateEvent,
    RecordEvent(Stream),
    /// `stream_wait_event`: the stream waits for the communicator's last launch.
    WaitEvent(Stream),
    Copy { dst: DevicePtr, src: DevicePtr, bytes: usize, stream: Stream },
    StreamWrite { addr: DevicePtr, value: u32, stream: Stream },
    StreamWait { addr: DevicePtr, value: u32, stream: Stream },
    LaunchSymmetric { op: DeviceOp, dtype: DataType, kernel: SymKernel, args: SymArgs, blocks: u32, stream: Stream },
    LaunchExec(Stream),
    /// The one-sided signal (`one_sided.cu`).
    LaunchSignal { args: rustccl_kernels::exec::SignalArgs, stream: Stream },
    /// The one-sided wait.
    LaunchWaitSignal { args: Box<rustccl_kernels::exec::WaitSignalArgs>, stream: Stream },
    LaunchExecKernel(Stream),
    /// A copy from pinned memory (an image): its destination and bytes.
    Upload(DevicePtr, usize),
    HostCallback(Stream),
}

/// What the executor asked for.
#[derive(Default, Debug)]
pub(crate) struct Log {
    /// Every call of [`Call`]'s kinds, in order.
    pub calls: Vec<Call>,
    /// Copies from pinned memory: destination and bytes.
    pub uploads: Vec<(DevicePtr, Vec<u8>)>,
    pub launches: Vec<Launched>,
    /// Buffers checked (`check_exec_buffer` and `launch_exec`'s buffers).
    pub checked: Vec<(DevicePtr, usize)>,
    pub kernel_lookups: usize,
    pub reach_calls: usize,
    pub events_recorded: usize,
    pub waits: usize,
    pub relaxed: usize,
    /// Host callbacks enqueued, with how many launches the log held when each came.
    pub host_callbacks: Vec<(std::sync::Arc<HostCallback>, usize)>,
}

#[derive(Default, Debug)]
pub(crate) struct FakeDevice {
    pub log: Mutex<Log>,
    /// Whether streams are being captured.
    pub capturing: std::sync::atomic::AtomicBool,
    next: Mutex<u64>,
    /// The pinned allocations (kept until the backend goes).
    pinned: Mutex<Vec<Box<[u8]>>>,
}

fn fake(what: &str) -> Error {
    Error::internal(format!("{what}: not in the fake backend"))
}

impl FakeDevice {
    fn addr(&self, bytes: usize) -> DevicePtr {
        let mut n = self.next.lock().unwrap();
        let base = 0x7000_0000_0000 + *n;
        *n += bytes.next_multiple_of(4096) as u64;
        DevicePtr(base)
    }

    pub(crate) fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap()
    }
}

impl DeviceBackend for FakeDevice {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn capabilities(&self) -> &Capabilities {
        crate::backend::caps::gpu_static()
    }
    fn device_count(&self) -> Result<usize> {
        Ok(1)
    }
    fn device_name(&self, _device: usize) -> Result<String> {
        Ok("fake".into())
    }
    fn kernels(&self) -> Option<&dyn Kernels> {
        Some(self)
    }
    fn symmetric_kernels(&self) -> Option<&dyn SymmetricKernels> {
        Some(self)
    }
    fn window_memory(&self) -> Option<&dyn WindowMemory> {
        None
    }
    fn buffer_sharing(&self) -> Option<&dyn BufferSharing> {
        None
    }
    fn host_access(&self) -> Option<&dyn HostAccess> {
        None
    }

    fn foreign_events(&self) -> Option<&dyn ForeignEvents> {
        None
    }
}

/// Stand-ins where the executor needs them; the rest is an `Internal` error saying the test
/// asked the fake for something it does not model.
impl Memory for FakeDevice {
    fn alloc(&self, _device: usize, bytes: usize) -> Result<DevicePtr> {
        Ok(self.addr(bytes))
    }
    fn free(&self, _ptr: DevicePtr) -> Result<()> {
        Ok(())
    }
    fn alloc_host_mapped(&self, bytes: usize) -> Result<HostMapped> {
        self.log().calls.push(Call::AllocHostMapped(bytes));
        let mut mem = vec![0u8; bytes].into_boxed_slice();
        let host = mem.as_mut_ptr();
        self.pinned.lock().unwrap().push(mem);
        Ok(HostMapped { host, device: self.addr(bytes), bytes })
    }
    fn free_host_mapped(&self, _mem: HostMapped) -> Result<()> {
        Ok(())
    }
    unsafe fn register_host(&self, _ptr: *mut u8, _bytes: usize) -> Result<DevicePtr> {
        Err(fake("register_host"))
    }
    fn unregister_host(&self, _ptr: DevicePtr) -> Result<()> {
        Err(fake("unregister_host"))
    }
    fn memory_info(&self, _device: usize) -> Result<Option<(usize, usize)>> {
        Ok(None)
    }
    fn memset(&self, _dst: DevicePtr, _value: u8, _bytes: usize, _stream: Stream) -> Result<()> {
        Err(fake("memset"))
    }
    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize, stream: Stream) -> Result<()> {
        self.log().calls.push(Call::Copy { dst, src, bytes, stream });
        Ok(())
    }
    fn copy_to_device(&self, _dst: DevicePtr, _src: &[u8], _stream: Stream) -> Result<()> {
        Err(fake("copy_to_device"))
    }
    fn copy_from_device(&self, _dst: &mut [u8], _src: DevicePtr, _stream: Stream) -> Result<()> {
        Err(fake("copy_from_device"))
    }
    unsafe fn copy_from_pinned_async(&self, dst: DevicePtr, src: *const u8, bytes: usize, _stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract: `src` holds `bytes` bytes of pinned memory.
        let data = unsafe { std::slice::from_raw_parts(src, bytes) }.to_vec();
        let mut log = self.log();
        log.uploads.push((dst, data));
        log.calls.push(Call::Upload(dst, bytes));
        Ok(())
    }
}

impl Streams for FakeDevice {
    fn create_stream(&self, _device: usize) -> Result<Stream> {
        Err(fake("create_stream"))
    }
    fn destroy_stream(&self, _stream: Stream) -> Result<()> {
        Err(fake("destroy_stream"))
    }
    fn synchronize(&self, _stream: Stream) -> Result<()> {
        Ok(())
    }
    fn query(&self, _stream: Stream) -> Result<bool> {
        Ok(true)
    }
    fn create_event(&self, _device: usize) -> Result<Event> {
        self.log().calls.push(Call::CreateEvent);
        Ok(Event(self.addr(1).0))
    }
    fn record_event(&self, _event: Event, stream: Stream) -> Result<()> {
        let mut log = self.log();
        log.events_recorded += 1;
        log.calls.push(Call::RecordEvent(stream));
        Ok(())
    }
    fn stream_wait_event(&self, stream: Stream, _event: Event) -> Result<()> {
        let mut log = self.log();
        log.waits += 1;
        log.calls.push(Call::WaitEvent(stream));
        Ok(())
    }
    fn query_event(&self, _event: Event) -> Result<bool> {
        Ok(true)
    }
    fn synchronize_event(&self, _event: Event) -> Result<()> {
        Ok(())
    }
    fn destroy_event(&self, _event: Event) -> Result<()> {
        Ok(())
    }
    fn with_relaxed_capture(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.log().relaxed += 1;
        f()
    }
    fn is_capturing(&self, stream: Stream) -> Result<bool> {
        self.log().calls.push(Call::IsCapturing(stream));
        Ok(self.capturing.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl Sharing for FakeDevice {
    fn alloc_shareable(&self, _device: usize, _bytes: usize) -> Result<(DevicePtr, ShareHandle)> {
        Err(fake("alloc_shareable"))
    }
    fn import(&self, _device: usize, _handle: &ShareHandle) -> Result<DevicePtr> {
        Err(fake("import"))
    }
    fn close_import(&self, _ptr: DevicePtr) -> Result<()> {
        Err(fake("close_import"))
    }
}

impl Kernels for FakeDevice {
    fn launch_exec(&self, launch: &ExecLaunch, stream: Stream) -> Result<()> {
        let mut log = self.log();
        log.checked.extend(launch.buffers.iter().copied());
        log.kernel_lookups += 1;
        log.reach_calls += 1;
        log.launches.push(Launched { op: launch.op, dtype: launch.dtype, entry: launch.entry, args: launch.args, blocks: launch.blocks, stream });
        log.calls.push(Call::LaunchExec(stream));
        Ok(())
    }
    fn exec_kernel(&self, device: usize, op: DeviceOp, dtype: DataType, entry: ExecEntry) -> Result<ExecKernel> {
        self.log().kernel_lookups += 1;
        Ok(ExecKernel { device, op, dtype, entry, handle: 0xf00, context: 1 })
    }
    fn reach_exec_memory(&self, _device: usize, _ptrs: &[DevicePtr]) -> Result<()> {
        self.log().reach_calls += 1;
        Ok(())
    }
    fn check_exec_buffer(&self, _device: usize, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.log().checked.push((ptr, bytes));
        Ok(())
    }
    fn launch_exec_kernel(&self, kernel: &ExecKernel, args: &ExecArgs, blocks: u32, stream: Stream) -> Result<()> {
        let mut log = self.log();
        log.launches.push(Launched { op: kernel.op, dtype: kernel.dtype, entry: kernel.entry, args: *args, blocks, stream });
        log.calls.push(Call::LaunchExecKernel(stream));
        Ok(())
    }
    fn stream_write_u32(&self, addr: DevicePtr, value: u32, stream: Stream) -> Result<()> {
        self.log().calls.push(Call::StreamWrite { addr, value, stream });
        Ok(())
    }
    fn stream_wait_u32(&self, addr: DevicePtr, value: u32, stream: Stream) -> Result<()> {
        self.log().calls.push(Call::StreamWait { addr, value, stream });
        Ok(())
    }
    unsafe fn launch_host_callback(&self, callback: &std::sync::Arc<HostCallback>, stream: Stream) -> Result<()> {
        let mut log = self.log();
        let at = log.launches.len();
        log.host_callbacks.push((std::sync::Arc::clone(callback), at));
        log.calls.push(Call::HostCallback(stream));
        Ok(())
    }
}

impl SymmetricKernels for FakeDevice {
    fn launch_symmetric(&self, _device: usize, op: DeviceOp, dtype: DataType, kernel: SymKernel, args: &SymArgs, blocks: u32, stream: Stream) -> Result<()> {
        self.log().calls.push(Call::LaunchSymmetric { op, dtype, kernel, args: *args, blocks, stream });
        Ok(())
    }
    fn launch_signal(&self, _device: usize, args: &rustccl_kernels::exec::SignalArgs, stream: Stream) -> Result<()> {
        self.log().calls.push(Call::LaunchSignal { args: *args, stream });
        Ok(())
    }
    fn launch_wait_signal(&self, _device: usize, args: &rustccl_kernels::exec::WaitSignalArgs, stream: Stream) -> Result<()> {
        self.log().calls.push(Call::LaunchWaitSignal { args: Box::new(*args), stream });
        Ok(())
    }
}

/// Made-up P2P connections for every link `run`'s steps use, their slots and headers at
/// made-up device addresses.
pub(crate) fn links_for(run: &crate::work::Work) -> crate::exec::Links {
    links_of_kind(run, crate::transport::Kind::P2p)
}

/// As [`links_for`], connections of `kind`.
pub(crate) fn links_of_kind(run: &crate::work::Work, kind: crate::transport::Kind) -> crate::exec::Links {
    use crate::transport::fifo::{header_bytes, Fifo, LocalMemory};
    use crate::transport::{gpu_simple_fifo, gpu_slot_bytes, Connection, Dir};
    let mut wanted = Vec::new();
    for item in &run.items {
        for (_, s) in &item.steps {
            wanted.extend(s.recv.iter().map(|l| (*l, Dir::Recv)));
            wanted.extend(s.send.iter().map(|l| (*l, Dir::Send)));
        }
    }
    wanted.sort();
    wanted.dedup();
    let mut links = crate::exec::Links::new();
    for (i, (link, dir)) in wanted.into_iter().enumerate() {
        let base = 0x10_0000_0000 + (i as u64) * 0x100_0000;
        let header = LocalMemory::new(header_bytes());
        // SAFETY: the header stand-in is zeroed and lives with the connection; the device
        // addresses are only encoded, never touched.
        let fifo = unsafe { Fifo::with_device_slots(header.ptr(), base, base + 4096, gpu_slot_bytes(), gpu_simple_fifo().steps) };
        links.insert((link, dir), std::sync::Arc::new(Connection::for_test(link, dir, kind, fifo, header)));
    }
    links
}

/// One all_reduce call of the executor tests' work (their fixture, made by hand so that
/// exec's tests need nothing of coll): `count` floats reduced with `op` (a PreMulSum scalar
/// read at `scalar_at` when that is not 0), from `src` into `dst`, on rank 0 of 2.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingSum {
    pub count: usize,
    pub op: crate::reduce::DevOp,
    pub scalar_at: usize,
    pub src: u64,
    pub dst: u64,
}

impl RingSum {
    /// A sum of `count` floats from `src` into `dst`.
    pub(crate) fn new(count: usize, src: u64, dst: u64) -> RingSum {
        RingSum { count, op: crate::reduce::DevOp::Sum, scalar_at: 0, src, dst }
    }

    /// Its context with protocol `proto` (what the planner's `op_ctx` makes for it).
    fn ctx(&self, proto: rustccl_plugin_api::Protocol) -> crate::work::OpCtx {
        let bytes = self.count * DataType::Float32.size();
        // An all_reduce (kind 1) of floats (type 7 + 1) summed (operator 0 + 1), no root, as
        // `coll::check::OpSig::of` writes it.
        let sig = crate::work::OpSig(1 << 60 | 8 << 56 | 1 << 52 | crate::work::NO_ROOT << 32 | self.count as u64);
        crate::work::OpCtx {
            src: self.src as usize,
            dst: self.dst as usize,
            src_len: bytes,
            dst_len: bytes,
            reducer: crate::reduce::Reducer::new(DataType::Float32, self.op),
            proto,
            sig,
            scalar_at: self.scalar_at,
            dst_remote: 0,
        }
    }

    /// Its work: one ring channel of rank 0 of 2 (`program::ring_all_reduce`) in chunks of 256
    /// elements, protocol Simple, on stream 7 — the shape of work the planner makes for a
    /// small all_reduce on a GPU.
    pub(crate) fn work(&self) -> crate::work::Work {
        use crate::program::{ring_all_reduce, Ring};
        let ring = Ring { rank: 0, nranks: 2, channel: 0 };
        let steps = ring_all_reduce(ring, (0, self.count), 256, DataType::Float32.size());
        crate::work::Work {
            ctxs: vec![self.ctx(rustccl_plugin_api::Protocol::Simple)],
            items: vec![crate::work::WorkItem { steps: steps.into_iter().map(|s| (0, s)).collect(), pc: 0 }],
            copies: vec![],
            stream: Stream(7),
        }
    }

    /// `work` (made for another call of this shape) pointed at this call's buffers and
    /// scalar, keeping its protocol: what the planned route's memo does for a call.
    pub(crate) fn point(&self, mut work: crate::work::Work) -> crate::work::Work {
        work.ctxs[0] = self.ctx(work.ctxs[0].proto);
        work
    }
}

/// The work of a sum of `count` floats from 0xa000_0000 into 0xa100_0000 ([`RingSum`]):
/// what the executor's tests launch.
pub(crate) fn ring_sum(count: usize) -> crate::work::Work {
    RingSum::new(count, 0xa000_0000, 0xa100_0000).work()
}
