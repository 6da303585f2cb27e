//! Device backends behind one trait, [`DeviceBackend`] (the shape of wgpu-hal's `Api`): the
//! rest of rustccl allocates, copies, fills, synchronises and shares memory between processes
//! only through it, so nothing of one backend leaks into another.
//!
//! Collectives are not backend operations: they run through the collective executors, which
//! use the backend for memory, streams and launches. On the host backend the host polling
//! executor (`coll/exec.rs`) runs the planner's programs on CPU threads, reducing with
//! [`crate::reduce`] on the addresses [`DeviceBackend::host_address`] gives; on a device
//! backend the device executor (`exec::gpu`) turns them into a program for the collective
//! interpreter (`kernels/src/device/exec.cu`) and starts it with
//! [`DeviceBackend::launch_exec`] — or, for a repeated collective whose program is cached,
//! with [`DeviceBackend::launch_exec_kernel`] on a kernel looked up once
//! ([`DeviceBackend::exec_kernel`]), checking only its buffers per call
//! ([`DeviceBackend::check_exec_buffer`]).
//!
//! Backends: [`host::HostBackend`] (host memory and CPU threads; CI and CPU tensors) and
//! [`cuda::CudaBackend`] (the driver API loaded at run time: addresses are `CUdeviceptr`s,
//! streams `CUstream`s, events `CUevent`s; kernels compiled by NVRTC) and [`hip::HipBackend`]
//! (ROCm's runtime loaded at run time, the same kernels compiled by hipRTC; not yet run on an
//! AMD GPU). The two GPU backends share their memory bookkeeping (`gpu_memory`) and the
//! device executor; the handle types here are plain 64-bit values that fit either.
//! [`select_backend`] picks one from `RUSTCCL_BACKEND`.

pub mod caps;
pub mod cuda;
pub mod fdpass;
pub mod handle;
pub mod hip;
pub mod host;
pub(crate) mod gpu_memory;
pub(crate) mod rtc;
pub mod share;

use std::sync::Arc;

pub use caps::{Capabilities, ProtocolCost};
pub use handle::{DevicePtr, Event, HostMapped, Stream};
pub use cuda::CudaBackend;
pub use hip::HipBackend;
pub use host::HostBackend;
pub use share::ShareHandle;

/// Host work a device stream runs in its order ([`DeviceBackend::launch_host_callback`]).
pub struct HostCallback(pub Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for HostCallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostCallback")
    }
}

impl HostCallback {
    /// The C entry point the drivers call with a `*const HostCallback` as user data.
    ///
    /// # Safety
    /// `user` must point to a live `HostCallback` (see `launch_host_callback`).
    pub(crate) unsafe extern "C" fn trampoline(user: *mut std::ffi::c_void) {
        // SAFETY: the caller of `launch_host_callback` keeps the callback alive while the
        // stream may run it.
        let callback = unsafe { &*(user as *const HostCallback) };
        // A panic must not unwind into the driver's thread.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (callback.0)()));
    }
}

/// One launch of the collective interpreter: its parameter, its grid, the kernel's operator
/// and element type, and the memory it touches (checked, and made reachable, before launch).
#[derive(Clone, Debug)]
pub struct ExecLaunch {
    pub device: usize,
    pub op: rustccl_kernels::DeviceOp,
    pub dtype: crate::types::DataType,
    /// The kernel entry point for the protocols of the launch's steps.
    pub entry: rustccl_kernels::exec::ExecEntry,
    pub args: rustccl_kernels::exec::ExecArgs,
    pub blocks: u32,
    /// The user buffers (address, bytes): each must be memory the backend or driver knows.
    pub buffers: Vec<(DevicePtr, usize)>,
    /// An address in each connection's slot memory (another device's memory is made
    /// reachable from `device`).
    pub slots: Vec<DevicePtr>,
}

/// The collective interpreter for one operator and element type, loaded for launches on one
/// device ([`DeviceBackend::exec_kernel`]): a handle to launch it with
/// [`DeviceBackend::launch_exec_kernel`] without looking it up again. `handle` and `context`
/// are the backend's own values (a `CUfunction` and the `CUcontext` it was loaded in on
/// CUDA), opaque to the rest of rustccl; only backends make one (the fields are not public,
/// so a handle from elsewhere cannot reach the driver).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecKernel {
    pub(crate) device: usize,
    pub(crate) op: rustccl_kernels::DeviceOp,
    pub(crate) dtype: crate::types::DataType,
    pub(crate) entry: rustccl_kernels::exec::ExecEntry,
    pub(crate) handle: u64,
    pub(crate) context: u64,
}

use crate::error::{Error, Result};

/// The error of the launch methods on a backend without device kernels.
/// A shareable allocation a window can be made of.
#[derive(Clone, Debug)]
pub struct SymmetricMemory {
    /// Where the allocation starts, and its size.
    pub base: DevicePtr,
    pub bytes: usize,
    /// What peers map it with.
    pub handle: ShareHandle,
}

fn no_symmetric_memory(kind: BackendKind) -> Error {
    Error::invalid_usage(format!(
        "symmetric memory windows are not supported on the {kind} backend yet (the host backend has them)"
    ))
}

fn no_kernels(what: &str) -> Error {
    Error::invalid_usage(format!("{what}: this backend runs collectives on the CPU; it has no device kernels"))
}

/// Which implementation a backend is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Host,
    Cuda,
    Hip,
}

impl BackendKind {
    pub const ALL: [BackendKind; 3] = [BackendKind::Host, BackendKind::Cuda, BackendKind::Hip];

    /// The name `RUSTCCL_BACKEND` uses ("host", "cuda", "hip").
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
            BackendKind::Hip => "hip",
        }
    }

    /// The kind named `name`, ignoring case and surrounding spaces.
    pub fn from_name(name: &str) -> Option<BackendKind> {
        let name = name.trim();
        BackendKind::ALL.into_iter().find(|k| k.name().eq_ignore_ascii_case(name))
    }

    /// The byte that identifies this kind in a serialised [`ShareHandle`].
    pub fn code(self) -> u8 {
        match self {
            BackendKind::Host => 1,
            BackendKind::Cuda => 2,
            BackendKind::Hip => 3,
        }
    }

    pub fn from_code(code: u8) -> Option<BackendKind> {
        BackendKind::ALL.into_iter().find(|k| k.code() == code)
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A device backend. Devices are numbered `0..device_count()`.
///
/// Work taking a [`Stream`] is enqueued on it and runs in stream order; a backend may run it
/// before returning (the host backend does) or later (CUDA does), so results are only
/// guaranteed after [`synchronize`](DeviceBackend::synchronize) or an event. The exceptions
/// are [`copy_to_device`](DeviceBackend::copy_to_device) and
/// [`copy_from_device`](DeviceBackend::copy_from_device), which borrow host slices and so
/// return only when the copy is complete.
///
/// Every pointer range a backend is given must lie inside memory it allocated, imported or
/// registered; backends that can check this (the host backend) report a bad range as
/// `InvalidArgument` instead of touching memory.
pub trait DeviceBackend: Send + Sync + std::fmt::Debug {
    // ---- identity ----

    fn kind(&self) -> BackendKind;

    /// What the backend offers the planner and the transports (they ask this, never
    /// [`kind`](DeviceBackend::kind)).
    fn capabilities(&self) -> &Capabilities;

    /// The device the calling thread has made current (CUDA's `cudaSetDevice`), if the backend
    /// has such a notion; `None` otherwise.
    fn current_device(&self) -> Result<Option<i32>> {
        Ok(None)
    }

    /// The number of devices this process can use.
    fn device_count(&self) -> Result<usize>;

    /// A human-readable name of `device` (for logs).
    fn device_name(&self, device: usize) -> Result<String>;

    // ---- memory ----

    /// Allocates `bytes` of device memory on `device`, zero-filled on the host backend (not
    /// guaranteed elsewhere).
    fn alloc(&self, device: usize, bytes: usize) -> Result<DevicePtr>;

    /// Frees memory from [`alloc`](DeviceBackend::alloc) or
    /// [`alloc_shareable`](DeviceBackend::alloc_shareable). Unknown pointers and double frees
    /// are `InvalidArgument`.
    fn free(&self, ptr: DevicePtr) -> Result<()>;

    /// Allocates pinned host memory that every device can access (see [`HostMapped`]).
    fn alloc_host_mapped(&self, bytes: usize) -> Result<HostMapped>;

    /// Frees memory from [`alloc_host_mapped`](DeviceBackend::alloc_host_mapped).
    fn free_host_mapped(&self, mem: HostMapped) -> Result<()>;

    /// Makes caller-owned host memory usable by devices and the backend's copies and fills
    /// (`cuMemHostRegister` with `DEVICEMAP`), returning its device address. This is how
    /// buffers a C caller allocated itself reach a backend.
    ///
    /// # Safety
    /// `ptr..ptr+bytes` must be valid for reads and writes until
    /// [`unregister_host`](DeviceBackend::unregister_host) is called.
    unsafe fn register_host(&self, ptr: *mut u8, bytes: usize) -> Result<DevicePtr>;

    /// Ends a [`register_host`](DeviceBackend::register_host) registration (the memory stays
    /// the caller's).
    fn unregister_host(&self, ptr: DevicePtr) -> Result<()>;

    /// Sets `bytes` bytes at `dst` to `value`, in stream order.
    fn memset(&self, dst: DevicePtr, value: u8, bytes: usize, stream: Stream) -> Result<()>;

    // ---- copies ----

    /// Copies `bytes` bytes from `src` to `dst` in stream order, in any direction (device,
    /// host-mapped, imported or registered memory on either side). The ranges must not
    /// overlap.
    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize, stream: Stream) -> Result<()>;

    /// Copies `src` from the host to `dst`; returns when the copy is complete.
    fn copy_to_device(&self, dst: DevicePtr, src: &[u8], stream: Stream) -> Result<()>;

    /// Copies `dst.len()` bytes from `src` to the host; returns when the copy is complete.
    fn copy_from_device(&self, dst: &mut [u8], src: DevicePtr, stream: Stream) -> Result<()>;

    // ---- streams ----

    /// Creates a stream on `device`.
    fn create_stream(&self, device: usize) -> Result<Stream>;

    /// Destroys a stream from [`create_stream`](DeviceBackend::create_stream) (never the
    /// default stream).
    fn destroy_stream(&self, stream: Stream) -> Result<()>;

    /// Waits until all work enqueued on `stream` is complete.
    fn synchronize(&self, stream: Stream) -> Result<()>;

    /// Whether all work enqueued on `stream` is complete.
    fn query(&self, stream: Stream) -> Result<bool>;

    // ---- events ----

    /// Creates an event on `device`.
    fn create_event(&self, device: usize) -> Result<Event>;

    /// Records `event` at the current end of `stream`.
    fn record_event(&self, event: Event, stream: Stream) -> Result<()>;

    /// Makes work enqueued on `stream` from now on wait until `event` is complete.
    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()>;

    /// Whether the work before the last record of `event` is complete (true if never recorded).
    fn query_event(&self, event: Event) -> Result<bool>;

    /// Waits until the work before the last record of `event` is complete.
    fn synchronize_event(&self, event: Event) -> Result<()>;

    fn destroy_event(&self, event: Event) -> Result<()>;

    // ---- sharing memory between processes ----

    /// Allocates `bytes` of device memory on `device` that other processes can map, with the
    /// handle to send them. [`free`](DeviceBackend::free) it like any allocation; importers
    /// keep their mappings.
    fn alloc_shareable(&self, device: usize, bytes: usize) -> Result<(DevicePtr, ShareHandle)>;

    /// Maps memory another process (or this one) exported, for use on `device`; its size is
    /// [`ShareHandle::bytes`]. A handle made by another backend kind is `InvalidArgument`.
    fn import(&self, device: usize, handle: &ShareHandle) -> Result<DevicePtr>;

    /// As [`import`](DeviceBackend::import), by the last process that will import `handle`:
    /// the backend may then withdraw what names the memory, so that it goes away with the
    /// last mapping however the processes end (the host backend unlinks its /dev/shm file;
    /// others need nothing more).
    fn import_last(&self, device: usize, handle: &ShareHandle) -> Result<DevicePtr> {
        self.import(device, handle)
    }

    /// Unmaps memory from [`import`](DeviceBackend::import).
    fn close_import(&self, ptr: DevicePtr) -> Result<()>;

    // ---- symmetric memory (windows, `crate::window`) ----

    /// Free and total bytes of `device`'s memory (`cuMemGetInfo`), where the backend knows
    /// them; `None` on the host backend.
    fn memory_info(&self, device: usize) -> Result<Option<(usize, usize)>> {
        let _ = device;
        Ok(None)
    }

    /// Allocates `bytes` of memory on `device` that windows can be made of (`ncclMemAlloc`):
    /// shareable, and mappable at a fixed address of a reserved space by every process of the
    /// host. [`free`](DeviceBackend::free) it like any allocation.
    fn alloc_symmetric(&self, device: usize, bytes: usize) -> Result<DevicePtr> {
        self.alloc_shareable(device, bytes).map(|(p, _)| p)
    }

    /// The allocation from [`alloc_symmetric`](DeviceBackend::alloc_symmetric) (which
    /// `ncclMemAlloc` uses) that holds `ptr`, with the handle peers map it with; other memory
    /// is `InvalidArgument`.
    fn symmetric_memory(&self, ptr: DevicePtr) -> Result<SymmetricMemory> {
        let _ = ptr;
        Err(no_symmetric_memory(self.kind()))
    }

    /// Reserves `bytes` of address space (no memory behind it) for window mappings.
    fn reserve_space(&self, bytes: usize) -> Result<DevicePtr> {
        let _ = bytes;
        Err(no_symmetric_memory(self.kind()))
    }

    /// Gives back a space from [`reserve_space`](DeviceBackend::reserve_space) (its mappings
    /// unmapped first).
    fn release_space(&self, base: DevicePtr, bytes: usize) -> Result<()> {
        let _ = (base, bytes);
        Err(no_symmetric_memory(self.kind()))
    }

    /// Maps the allocation `handle` names (this process's or a peer's) at `at`, inside a
    /// reserved space, for `device`.
    fn map_shared_at(&self, device: usize, handle: &ShareHandle, at: DevicePtr) -> Result<()> {
        let _ = (device, handle, at);
        Err(no_symmetric_memory(self.kind()))
    }

    /// Unmaps what [`map_shared_at`](DeviceBackend::map_shared_at) mapped at `at` (the space
    /// stays reserved).
    fn unmap_at(&self, at: DevicePtr) -> Result<()> {
        let _ = at;
        Err(no_symmetric_memory(self.kind()))
    }

    // ---- registered buffers (zero-copy point-to-point) ----

    /// The allocation holding the `bytes` at `ptr` (a buffer registered with
    /// `ncclCommRegister`), with a handle a peer process maps it with
    /// ([`import_buffer`](DeviceBackend::import_buffer)) to write into it directly. Backends
    /// without device kernels have no use for it and refuse.
    fn export_buffer(&self, device: usize, ptr: DevicePtr, bytes: usize) -> Result<SymmetricMemory> {
        let _ = (device, ptr, bytes);
        Err(Error::invalid_usage(format!("zero-copy point-to-point is not supported on the {} backend", self.kind())))
    }

    /// Maps a peer's allocation from [`export_buffer`](DeviceBackend::export_buffer) into this
    /// process for `device`: where it starts here. Undone by
    /// [`close_buffer`](DeviceBackend::close_buffer).
    fn import_buffer(&self, device: usize, handle: &ShareHandle) -> Result<DevicePtr> {
        let _ = (device, handle);
        Err(Error::invalid_usage(format!("zero-copy point-to-point is not supported on the {} backend", self.kind())))
    }

    /// Unmaps what [`import_buffer`](DeviceBackend::import_buffer) mapped at `at`.
    fn close_buffer(&self, at: DevicePtr) -> Result<()> {
        let _ = at;
        Err(Error::invalid_usage(format!("zero-copy point-to-point is not supported on the {} backend", self.kind())))
    }

    // ---- collectives ----

    /// Launches the collective interpreter (`kernels/exec.cu`) on `stream`: the program of
    /// `launch.args` must stay in device memory until the launch completes. Device backends
    /// only; the host backend runs collectives on the CPU and refuses. It does what
    /// [`check_exec_buffer`](DeviceBackend::check_exec_buffer) (each buffer),
    /// [`reach_exec_memory`](DeviceBackend::reach_exec_memory) (the slots),
    /// [`exec_kernel`](DeviceBackend::exec_kernel) and
    /// [`launch_exec_kernel`](DeviceBackend::launch_exec_kernel) do one by one; a repeated
    /// collective (`exec::gpu::cached`) does the first and the last per call only.
    fn launch_exec(&self, launch: &ExecLaunch, stream: Stream) -> Result<()>;

    /// The collective interpreter for `op` on `dtype`, loaded on `device` (compiled, or read
    /// from the kernel cache, on first use), to launch with
    /// [`launch_exec_kernel`](DeviceBackend::launch_exec_kernel). Device backends only.
    fn exec_kernel(
        &self,
        _device: usize,
        _op: rustccl_kernels::DeviceOp,
        _dtype: crate::types::DataType,
        _entry: rustccl_kernels::exec::ExecEntry,
    ) -> Result<ExecKernel> {
        Err(no_kernels("exec_kernel"))
    }

    /// Writes `value` to the 4 bytes at `addr` (device memory, a peer's window included) in
    /// stream order, after the work before it is done and visible (`cuStreamWriteValue32`).
    /// Device backends only.
    fn stream_write_u32(&self, addr: DevicePtr, value: u32, stream: Stream) -> Result<()> {
        let _ = (addr, value, stream);
        Err(no_kernels("stream_write_u32"))
    }

    /// Makes the work enqueued on `stream` from now on wait until the 4 bytes at `addr` hold
    /// at least `value`, compared with wrap-around as the driver does (`(int32_t)(word -
    /// value) >= 0`; `cuStreamWaitValue32` with GEQ). Device backends only.
    fn stream_wait_u32(&self, addr: DevicePtr, value: u32, stream: Stream) -> Result<()> {
        let _ = (addr, value, stream);
        Err(no_kernels("stream_wait_u32"))
    }

    /// Launches symmetric kernel `kernel` (`kernels/src/device/symmetric.h`) for `op` on
    /// `dtype` with `blocks` blocks on `stream`. Device backends only.
    #[allow(clippy::too_many_arguments)]
    fn launch_symmetric(
        &self,
        _device: usize,
        _op: rustccl_kernels::DeviceOp,
        _dtype: crate::types::DataType,
        _kernel: rustccl_kernels::symmetric::SymKernel,
        _args: &rustccl_kernels::exec::SymArgs,
        _blocks: u32,
        _stream: Stream,
    ) -> Result<()> {
        Err(no_kernels("launch_symmetric"))
    }

    /// Makes the memory at each of `ptrs` (an address in a connection's slots) reachable from
    /// kernels on `device` (peer access to the device that owns it). Done once per
    /// connection: what it enables stays. Device backends only.
    fn reach_exec_memory(&self, _device: usize, _ptrs: &[DevicePtr]) -> Result<()> {
        Err(no_kernels("reach_exec_memory"))
    }

    /// Checks that the user buffer `ptr..ptr+bytes` is memory the backend or its driver knows
    /// (`InvalidArgument` if not), and makes it reachable from kernels on `device`; an empty
    /// range passes. What a launch does for each buffer it touches, call by call (a buffer
    /// may be freed and its address reused). Device backends only.
    fn check_exec_buffer(&self, _device: usize, _ptr: DevicePtr, _bytes: usize) -> Result<()> {
        Err(no_kernels("check_exec_buffer"))
    }

    /// Launches `kernel` with the parameter `args` on `blocks` blocks on `stream`, which must
    /// run on the kernel's device; the buffers must have passed
    /// [`check_exec_buffer`](DeviceBackend::check_exec_buffer) and the program `args` points
    /// to must stay in device memory until the launch completes. Device backends only.
    fn launch_exec_kernel(&self, _kernel: &ExecKernel, _args: &rustccl_kernels::exec::ExecArgs, _blocks: u32, _stream: Stream) -> Result<()> {
        Err(no_kernels("launch_exec_kernel"))
    }

    /// Runs `f` with this thread's stream-capture mode relaxed, so that the allocations and
    /// registrations an operation makes while a graph is being captured (programs, and
    /// connections made on first use) are allowed, as NCCL does.
    fn with_relaxed_capture(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<()>;

    /// Whether work enqueued on `stream` is being captured into a graph (then it is recorded,
    /// not run, and may be replayed any number of times later).
    fn is_capturing(&self, stream: Stream) -> Result<bool>;

    /// Enqueues `callback` on `stream`: a driver thread runs it once the work enqueued before
    /// it is done, and the work enqueued after it waits for it (`cuLaunchHostFunc`). On a
    /// captured stream it becomes a host node of the graph and runs at every replay. The
    /// callback must not call the backend. Device backends only.
    ///
    /// # Safety
    /// `callback` must stay alive (the caller keeps a clone of the `Arc`) as long as the
    /// stream may run it: until it ran, or, captured, as long as the graph may be replayed.
    unsafe fn launch_host_callback(&self, callback: &Arc<HostCallback>, stream: Stream) -> Result<()> {
        let _ = (callback, stream);
        Err(no_kernels("launch_host_callback"))
    }

    /// Enqueues a copy of `bytes` from pinned host memory at `src` to `dst` on `stream`.
    ///
    /// # Safety
    /// `src` must be page-locked memory of this backend ([`DeviceBackend::alloc_host_mapped`])
    /// that stays allocated and unchanged until the copy has run (for a captured stream: as
    /// long as the graph may be replayed).
    unsafe fn copy_from_pinned_async(&self, dst: DevicePtr, src: *const u8, bytes: usize, stream: Stream) -> Result<()>;

    /// The host address of device memory `ptr..ptr+bytes`, for backends whose memory the CPU
    /// can address (the host backend, whose collectives CPU threads run); the range must lie
    /// in one live allocation. Other backends refuse with `InvalidUsage`.
    fn host_address(&self, ptr: DevicePtr, bytes: usize) -> Result<usize>;
}

/// The environment variable that picks the backend.
pub const BACKEND_ENV: &str = "RUSTCCL_BACKEND";

/// The backend `RUSTCCL_BACKEND` names. Without it: the CUDA backend when a CUDA driver with
/// at least one device is present, else the HIP backend when the HIP runtime sees an AMD GPU,
/// else the host backend (said once in the log).
pub fn select_backend() -> Result<Arc<dyn DeviceBackend>> {
    let name = crate::params::env_str(BACKEND_ENV);
    if name.is_some() {
        return backend_from_name(name.as_deref());
    }
    static DEFAULT: std::sync::OnceLock<Arc<dyn DeviceBackend>> = std::sync::OnceLock::new();
    if let Some(b) = DEFAULT.get() {
        return Ok(Arc::clone(b));
    }
    let (kind, why) = automatic_kind(
        || CudaBackend::shared().and_then(|c| c.device_count()),
        || std::path::Path::new("/dev/kfd").exists(),
        || HipBackend::shared().and_then(|h| h.device_count()),
    );
    let chosen: Arc<dyn DeviceBackend> = match kind {
        BackendKind::Cuda => CudaBackend::shared()?,
        BackendKind::Hip => HipBackend::shared()?,
        BackendKind::Host => HostBackend::shared()?,
    };
    tracing::info!(target: "INIT", "{BACKEND_ENV} unset: using the {} backend ({why})", chosen.kind());
    Ok(Arc::clone(DEFAULT.get_or_init(|| chosen)))
}

/// The automatic choice (no `RUSTCCL_BACKEND`) and why: CUDA when its driver sees a device,
/// else HIP when the amdgpu driver's `/dev/kfd` exists and ROCm's runtime sees an AMD GPU,
/// else host. The probes are asked in that order and only as far as needed: a machine with an
/// NVIDIA GPU never loads ROCm, one without `/dev/kfd` never loads its runtime.
fn automatic_kind(cuda_devices: impl FnOnce() -> Result<usize>, kfd: impl FnOnce() -> bool, amd_devices: impl FnOnce() -> Result<usize>) -> (BackendKind, String) {
    let no_cuda = match cuda_devices() {
        Ok(n) if n > 0 => return (BackendKind::Cuda, format!("{n} CUDA device(s)")),
        Ok(_) => "no CUDA device".to_string(),
        Err(e) => e.message,
    };
    if !kfd() {
        return (BackendKind::Host, format!("{no_cuda}; no AMD GPU driver (/dev/kfd)"));
    }
    match amd_devices() {
        Ok(n) if n > 0 => (BackendKind::Hip, format!("{n} AMD GPU(s); {no_cuda}")),
        Ok(_) => (BackendKind::Host, format!("{no_cuda}; the HIP runtime sees no AMD GPU")),
        Err(e) => (BackendKind::Host, format!("{no_cuda}; {}", e.message)),
    }
}

/// The backend kind `name` (a `RUSTCCL_BACKEND` value) asks for: host when `None` or blank,
/// `InvalidArgument` naming the value and the accepted ones when it is none of them.
pub fn backend_kind_from_name(name: Option<&str>) -> Result<BackendKind> {
    match name.map(str::trim).filter(|n| !n.is_empty()) {
        None => Ok(BackendKind::Host),
        Some(n) => BackendKind::from_name(n).ok_or_else(|| {
            let accepted: Vec<&str> = BackendKind::ALL.iter().map(|k| k.name()).collect();
            Error::invalid_argument(format!(
                "{BACKEND_ENV}={n:?} is not a backend; accepted values are {} (case-insensitive)",
                accepted.join(", ")
            ))
        }),
    }
}

/// The backend `name` (a `RUSTCCL_BACKEND` value) asks for; see [`backend_kind_from_name`].
/// The host and CUDA backends are one per process ([`HostBackend::shared`],
/// [`CudaBackend::shared`]), so memory allocated through one handle is valid in every other.
/// Without a CUDA driver, "cuda" is an `UnhandledCudaError` that says so ("no CUDA driver:
/// libcuda.so.1 not found ...", or `cuInit`'s error), never a panic.
pub fn backend_from_name(name: Option<&str>) -> Result<Arc<dyn DeviceBackend>> {
    match backend_kind_from_name(name)? {
        BackendKind::Host => Ok(HostBackend::shared()?),
        BackendKind::Cuda => Ok(CudaBackend::shared()?),
        BackendKind::Hip => Ok(HipBackend::shared()?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ResultCode;

    #[test]
    fn kind_names_and_codes_round_trip() {
        for k in BackendKind::ALL {
            assert_eq!(BackendKind::from_name(k.name()), Some(k));
            assert_eq!(BackendKind::from_code(k.code()), Some(k));
        }
        assert_eq!(BackendKind::from_name(" CuDa "), Some(BackendKind::Cuda));
        assert_eq!(BackendKind::from_code(0), None);
    }

    #[test]
    fn backend_selection_by_name() {
        assert_eq!(backend_from_name(None).unwrap().kind(), BackendKind::Host);
        assert_eq!(backend_from_name(Some("")).unwrap().kind(), BackendKind::Host);
        assert_eq!(backend_from_name(Some("HOST")).unwrap().kind(), BackendKind::Host);
        assert_eq!(backend_from_name(Some("host")).unwrap().kind(), BackendKind::Host);

        // CUDA: the backend on a machine with a driver, else a clear error (never a panic).
        match backend_from_name(Some("cuda")) {
            Ok(b) => assert_eq!(b.kind(), BackendKind::Cuda),
            Err(e) => {
                assert_eq!(e.code, ResultCode::UnhandledCudaError);
                assert!(e.message.contains("CUDA driver") || e.message.contains("cuInit"), "{}", e.message);
            }
        }
        // HIP: the backend on a machine with an AMD GPU, else a clear error.
        match backend_from_name(Some("Hip")) {
            Ok(b) => assert_eq!(b.kind(), BackendKind::Hip),
            Err(e) => assert!(e.message.contains("no AMD GPU") || e.message.contains("no HIP runtime"), "{}", e.message),
        }

        let e = backend_from_name(Some("opencl")).unwrap_err();
        assert_eq!(e.code, ResultCode::InvalidArgument);
        assert!(e.message.contains("\"opencl\""), "{}", e.message);
        assert!(e.message.contains("host, cuda, hip"), "{}", e.message);
    }

    #[test]
    fn the_automatic_choice_is_cuda_then_hip_then_host_and_probes_no_further_than_needed() {
        let never_usize = || -> Result<usize> { panic!("probed after the choice was made") };
        let never_bool = || -> bool { panic!("probed after the choice was made") };
        let none = || Err(Error::cuda("no CUDA driver: libcuda.so.1 not found"));
        assert_eq!(automatic_kind(|| Ok(2), never_bool, never_usize).0, BackendKind::Cuda);
        let (kind, why) = automatic_kind(none, || false, never_usize);
        assert_eq!(kind, BackendKind::Host);
        assert!(why.contains("libcuda.so.1") && why.contains("/dev/kfd"), "{why}");
        let (kind, why) = automatic_kind(|| Ok(0), || true, || Ok(4));
        assert_eq!(kind, BackendKind::Hip);
        assert!(why.contains("4 AMD GPU(s)") && why.contains("no CUDA device"), "{why}");
        assert_eq!(automatic_kind(none, || true, || Ok(0)).0, BackendKind::Host);
        let (kind, why) = automatic_kind(none, || true, || Err(Error::system("no HIP runtime: install ROCm")));
        assert_eq!(kind, BackendKind::Host);
        assert!(why.contains("install ROCm"), "{why}");
    }

    #[test]
    fn host_backend_is_one_per_process() {
        let a = backend_from_name(Some("host")).unwrap();
        let b = backend_from_name(None).unwrap();
        let p = a.alloc(0, 64).unwrap();
        b.copy_to_device(p, &[7u8; 64], Stream::DEFAULT).unwrap();
        let mut out = [0u8; 64];
        a.copy_from_device(&mut out, p, Stream::DEFAULT).unwrap();
        assert_eq!(out, [7u8; 64]);
        b.free(p).unwrap();
    }
}
