//! The CUDA backend: the driver API loaded at run time (cudarc's sys layer with dynamic
//! loading), so building needs no CUDA toolkit and a machine without a GPU runs everything
//! else; the device code of `rustccl-kernels` compiled at run time by NVRTC ([`module`]).
//!
//! Handles are the driver's own values: a [`DevicePtr`] is a `CUdeviceptr` (unified
//! addressing: one space for every device and pinned host memory), a [`Stream`] a `CUstream`
//! cast to `u64` — the `cudaStream_t` a caller passes is the same value — and an [`Event`] a
//! `CUevent`. [`Stream::DEFAULT`] (0) is the legacy NULL stream; the special handles
//! `cudaStreamLegacy` (1) and `cudaStreamPerThread` (2) are accepted too.
//!
//! Contexts: one primary context per device, retained on first use (so devices the process
//! never touches get no context). Each call makes the context it needs current on the calling
//! thread and puts the caller's current context back before it returns. Work on a stream
//! runs in the stream's context (`cuStreamGetCtx`); work on the default stream in the
//! caller's current context, or, when none is current, the primary context of the device
//! that owns the memory involved (device 0 when that says nothing).
//!
//! Memory the backend allocates, exports, imports, maps or registers is tracked, so frees
//! are checked (unknown pointers and double frees are `InvalidArgument`) and ranges in it are
//! checked without a driver call. Other memory (a caller's `cudaMalloc` buffers) is checked
//! with `cuPointerGetAttributes` before a copy, a fill or a launch uses it: a bad range is
//! `InvalidArgument`, not a fault that would poison the context.
//!
//! Sharing between processes uses legacy CUDA IPC (`cuIpcGetMemHandle`/
//! `cuIpcOpenMemHandle`): the [`ShareHandle`] payload is the 64-byte `CUipcMemHandle` and the
//! envelope carries the size. Importing a handle this process exported maps nothing (CUDA
//! refuses that) and returns the exporter's address; the memory then lives until both the
//! export is freed and the import closed. NVLink multicast is never used.
//!
//! Copies are `cuMemcpyAsync`, fills `cuMemsetD8Async`. The only kernel is the collective
//! interpreter (`kernels/src/device/exec.cu`, one compile per operator and type), which
//! [`DeviceBackend::launch_exec`] starts for `coll/device.rs`; it reduces bit for bit as the
//! host reference [`crate::reduce`] does ([`coll_device_op`] gives its operator and scalar).

pub mod driver;
pub mod module;
pub mod nvrtc;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cudarc::driver::sys;
use rustccl_kernels::DeviceOp;

use super::{BackendKind, DeviceBackend, DevicePtr, Event, HostMapped, ShareHandle, Stream};
use crate::error::{Error, Result};
use crate::reduce::DevOp;
use crate::types::DataType;
use driver::{check, Ctx, CtxGuard};

/// The size of a `CUipcMemHandle`.
pub const IPC_HANDLE_BYTES: usize = 64;

/// One device, as found at start.
#[derive(Debug)]
struct Device {
    handle: sys::CUdevice,
    name: String,
    /// Compute capability as `10 * major + minor` (90 for the H100/H200).
    cc: i32,
    /// Its primary context, retained on first use.
    ctx: OnceLock<Ctx>,
}

/// What a tracked address range is.
#[derive(Debug)]
enum Kind {
    /// `alloc`.
    Device,
    /// `alloc_shareable`: memory this process exported. `local_imports` counts imports of the
    /// handle in this process (which share the address); a free while they are open is
    /// deferred (`freed`) until the last closes.
    Exported { handle: [u8; IPC_HANDLE_BYTES], local_imports: usize, freed: bool },
    /// `alloc_host_mapped`: `host` is the host address.
    HostMapped { host: usize },
    /// `register_host`.
    /// Host memory registered (`refs` times: a process may register the same mapping for
    /// both ends of a connection).
    Registered { host: usize, refs: usize },
    /// `import` of another process's memory; `refs` imports of the same handle share it.
    Imported { handle: [u8; IPC_HANDLE_BYTES], refs: usize },
}

#[derive(Debug)]
struct Entry {
    bytes: usize,
    /// The device it belongs to (None for host memory).
    device: Option<usize>,
    kind: Kind,
}

impl Entry {
    fn live(&self) -> bool {
        !matches!(self.kind, Kind::Exported { freed: true, .. })
    }
}

/// Tracked memory by start address.
#[derive(Debug, Default)]
struct Table {
    entries: BTreeMap<u64, Entry>,
}

impl Table {
    /// The live entry whose range holds `ptr..ptr+bytes`.
    fn find(&self, ptr: DevicePtr, bytes: usize) -> Option<&Entry> {
        let (base, e) = self.entries.range(..=ptr.0).next_back()?;
        let end = ptr.0.checked_add(bytes as u64)?;
        (e.live() && end <= base + e.bytes as u64).then_some(e)
    }
}

/// The CUDA backend (see the module docs).
pub struct CudaBackend {
    devices: Vec<Device>,
    driver_version: i32,
    memory: RwLock<Table>,
    /// Streams this backend created, and their devices.
    streams: Mutex<HashMap<u64, usize>>,
    /// Events this backend created, and their devices.
    events: Mutex<HashMap<u64, usize>>,
    /// Contexts seen on streams, and their devices.
    ctx_devices: Mutex<HashMap<usize, usize>>,
    /// (from, to) device pairs with peer access enabled.
    peers: Mutex<HashSet<(usize, usize)>>,
    kernels: module::Kernels,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("devices", &self.devices.iter().map(|d| &d.name).collect::<Vec<_>>())
            .field("driver_version", &self.driver_version)
            .finish()
    }
}

/// Where a piece of work runs: a context and its device.
#[derive(Clone, Copy, Debug)]
struct Place {
    ctx: Ctx,
    device: usize,
}

fn raw_stream(stream: Stream) -> sys::CUstream {
    stream.0 as usize as sys::CUstream
}

/// NULL, `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`: streams of whatever context is
/// current.
fn is_default_like(stream: Stream) -> bool {
    stream.0 <= 2
}

/// The PreMulSum scalar converted to `dtype` as the host reference does (`Elem::scalar`),
/// as the bits the kernel reads (zero-extended).
pub fn scalar_bits(dtype: DataType, s: f64) -> u64 {
    use crate::reduce::{float, fp8};
    match dtype {
        DataType::Int8 => (s as i8) as u8 as u64,
        DataType::Uint8 => (s as u8) as u64,
        DataType::Int32 => (s as i32) as u32 as u64,
        DataType::Uint32 => (s as u32) as u64,
        DataType::Int64 => (s as i64) as u64,
        DataType::Uint64 => s as u64,
        DataType::Float16 => float::f64_to_f16(s) as u64,
        DataType::Float32 => (s as f32).to_bits() as u64,
        DataType::Float64 => s.to_bits(),
        DataType::Bfloat16 => float::f64_to_bf16(s) as u64,
        DataType::Float8e4m3 => fp8::f64_to_e4m3(s) as u64,
        DataType::Float8e5m2 => fp8::f64_to_e5m2(s) as u64,
    }
}

/// The kernel operator, scalar bits and divisor of a collective's device operator.
pub fn coll_device_op(op: DevOp, dtype: DataType) -> (DeviceOp, u64, u64) {
    match op {
        DevOp::Sum => (DeviceOp::Sum, 0, 1),
        DevOp::Prod => (DeviceOp::Prod, 0, 1),
        DevOp::Min => (DeviceOp::Min, 0, 1),
        DevOp::Max => (DeviceOp::Max, 0, 1),
        DevOp::PreMulSum { scalar } => (DeviceOp::PreMulSum, scalar_bits(dtype, scalar), 1),
        DevOp::SumPostDiv { n } => (DeviceOp::SumPostDiv, 0, n),
    }
}

impl CudaBackend {
    /// Loads the driver, initialises it and lists the devices. No context is created yet.
    ///
    /// Errors (`UnhandledCudaError`): no driver library ("no CUDA driver: libcuda.so.1 not
    /// found ..."), a driver without the entry points needed, `cuInit`'s error (e.g. no
    /// device).
    pub fn new() -> Result<CudaBackend> {
        driver::load()?;
        // SAFETY: the driver is loaded and has every symbol (driver::load).
        check(unsafe { sys::cuInit(0) }, "cuInit")?;
        let mut version = 0;
        // SAFETY: writes one int.
        check(unsafe { sys::cuDriverGetVersion(&mut version) }, "cuDriverGetVersion")?;
        let mut count = 0;
        // SAFETY: writes one int.
        check(unsafe { sys::cuDeviceGetCount(&mut count) }, "cuDeviceGetCount")?;
        let mut devices = Vec::new();
        for ordinal in 0..count {
            let mut handle: sys::CUdevice = 0;
            // SAFETY: writes one handle; `ordinal` < count.
            check(unsafe { sys::cuDeviceGet(&mut handle, ordinal) }, "cuDeviceGet")?;
            let mut name = [0 as std::ffi::c_char; 256];
            // SAFETY: the buffer holds 256 bytes; the driver NUL-terminates.
            check(unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 256, handle) }, "cuDeviceGetName")?;
            // SAFETY: NUL-terminated by the driver.
            let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
            let attr = |a: sys::CUdevice_attribute, what: &str| -> Result<i32> {
                let mut v = 0;
                // SAFETY: writes one int.
                check(unsafe { sys::cuDeviceGetAttribute(&mut v, a, handle) }, what)?;
                Ok(v)
            };
            use sys::CUdevice_attribute::*;
            let major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "cuDeviceGetAttribute(cc major)")?;
            let minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "cuDeviceGetAttribute(cc minor)")?;
            devices.push(Device { handle, name, cc: 10 * major + minor, ctx: OnceLock::new() });
        }
        tracing::info!(
            target: "INIT",
            "CUDA backend: driver {}.{}, {} device(s): {}",
            version / 1000,
            version % 1000 / 10,
            devices.len(),
            devices.iter().map(|d| format!("{} (sm_{})", d.name, d.cc)).collect::<Vec<_>>().join(", ")
        );
        Ok(CudaBackend {
            devices,
            driver_version: version,
            memory: RwLock::new(Table::default()),
            streams: Mutex::new(HashMap::new()),
            events: Mutex::new(HashMap::new()),
            ctx_devices: Mutex::new(HashMap::new()),
            peers: Mutex::new(HashSet::new()),
            kernels: module::Kernels::default(),
        })
    }

    /// The process's CUDA backend, made on first use; a failure is returned to every caller
    /// (the driver is not retried).
    pub fn shared() -> Result<Arc<CudaBackend>> {
        static SHARED: OnceLock<Result<Arc<CudaBackend>>> = OnceLock::new();
        SHARED.get_or_init(|| CudaBackend::new().map(Arc::new)).clone()
    }

    /// The driver version (`cuDriverGetVersion`, e.g. 13000).
    /// The device of the calling thread's current context (what `cudaGetDevice` reports once
    /// the runtime made its context current); `None` when no context is current.
    pub fn current_device(&self) -> Result<Option<i32>> {
        let ctx = driver::current()?;
        if ctx.is_null() {
            return Ok(None);
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: a context is current; writes one device handle.
        check(unsafe { sys::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice")?;
        Ok(self.devices.iter().position(|d| d.handle == dev).map(|i| i as i32))
    }

    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    /// The compute capability of `device` as `10 * major + minor`.
    pub fn compute_capability(&self, device: usize) -> Result<i32> {
        Ok(self.device(device, "compute_capability")?.cc)
    }

    /// Compiles (or reads from the cache) and loads the collective interpreter for every
    /// operator and type on `device`, several compiles at once; returns how many.
    pub fn preload_exec_kernels(&self, device: usize) -> Result<usize> {
        let ctx = self.primary(device)?;
        let cc = self.devices[device].cc;
        let pairs: Vec<(DeviceOp, DataType)> = DeviceOp::ALL
            .iter()
            .flat_map(|&op| DataType::ALL.iter().map(move |&dt| (op, dt)))
            .filter(|(op, dt)| rustccl_kernels::exec::exec_defines(*op, *dt as i32).is_some())
            .collect();
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(4).min(pairs.len());
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(op, dt)) = pairs.get(i) else { return Ok(()) };
                        self.kernels.exec(ctx, cc, self.driver_version, op, dt)?;
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap_or_else(|_| Err(Error::internal("compile thread panicked")))).collect()
        });
        results.into_iter().collect::<Result<Vec<()>>>()?;
        Ok(pairs.len())
    }

    fn device(&self, device: usize, op: &str) -> Result<&Device> {
        self.devices.get(device).ok_or_else(|| {
            Error::invalid_argument(format!(
                "{op}: device {device} does not exist; the CUDA backend sees {}",
                self.devices.len()
            ))
        })
    }

    /// The primary context of `device`, retained on first use.
    fn primary(&self, device: usize) -> Result<Ctx> {
        let d = self.device(device, "context")?;
        if let Some(c) = d.ctx.get() {
            return Ok(*c);
        }
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle. Two threads may both retain; the extra reference is
        // harmless (primary contexts are reference-counted and live for the process).
        check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, d.handle) }, "cuDevicePrimaryCtxRetain")?;
        let c = *d.ctx.get_or_init(|| Ctx(ctx));
        self.ctx_devices.lock().unwrap_or_else(|p| p.into_inner()).insert(c.key(), device);
        Ok(c)
    }

    fn read_memory(&self) -> RwLockReadGuard<'_, Table> {
        self.memory.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_memory(&self) -> RwLockWriteGuard<'_, Table> {
        self.memory.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The device of context `ctx` (made current by the caller's guard when unknown).
    fn ctx_device(&self, ctx: Ctx) -> Result<usize> {
        if let Some(d) = self.ctx_devices.lock().unwrap_or_else(|p| p.into_inner()).get(&ctx.key()) {
            return Ok(*d);
        }
        let _g = CtxGuard::enter(ctx)?;
        let mut dev: sys::CUdevice = 0;
        // SAFETY: writes one handle; `ctx` is current.
        check(unsafe { sys::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice")?;
        let device = self
            .devices
            .iter()
            .position(|d| d.handle == dev)
            .ok_or_else(|| Error::internal(format!("context {:?} is on an unknown device {dev}", ctx.0)))?;
        self.ctx_devices.lock().unwrap_or_else(|p| p.into_inner()).insert(ctx.key(), device);
        Ok(device)
    }

    /// The device owning tracked memory at `ptr`, if tracked and device memory.
    fn tracked_device(&self, ptr: DevicePtr) -> Option<usize> {
        self.read_memory().find(ptr, 0).and_then(|e| e.device)
    }

    /// Where work on `stream` runs; `hint` is the device of the memory involved (or the
    /// communicator's), which a default stream goes to; without it, the current context's.
    fn place(&self, stream: Stream, hint: Option<usize>) -> Result<Place> {
        if let Some(&device) = self.streams.lock().unwrap_or_else(|p| p.into_inner()).get(&stream.0) {
            return Ok(Place { ctx: self.primary(device)?, device });
        }
        let ctx = if is_default_like(stream) {
            // A default stream names no device: the memory's (the communicator's), as NCCL
            // sets the communicator's device before it enqueues; else the current one.
            if let Some(device) = hint {
                return Ok(Place { ctx: self.primary(device)?, device });
            }
            let cur = driver::current()?;
            if cur.is_null() {
                return self.primary(0).map(|ctx| Place { ctx, device: 0 });
            }
            Ctx(cur)
        } else {
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: writes one handle; an invalid stream is reported by the driver.
            check(unsafe { sys::cuStreamGetCtx(raw_stream(stream), &mut ctx) }, "cuStreamGetCtx").map_err(|e| {
                Error::invalid_argument(format!("stream {:#x} is not a live CUDA stream ({})", stream.0, e.message))
            })?;
            Ctx(ctx)
        };
        Ok(Place { ctx, device: self.ctx_device(ctx)? })
    }

    /// Checks that `ptr..ptr+bytes` is memory the backend or the driver knows; returns the
    /// device that owns it (None for host memory).
    fn check_range(&self, ptr: DevicePtr, bytes: usize, what: &str) -> Result<Option<usize>> {
        if bytes == 0 {
            return Ok(None);
        }
        if let Some(e) = self.read_memory().find(ptr, bytes) {
            return Ok(e.device);
        }
        let mut start: u64 = 0;
        let mut size: usize = 0;
        let mut mem_type: u32 = 0;
        let mut ordinal: i32 = -1;
        use sys::CUpointer_attribute::*;
        let mut attrs = [
            CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            CU_POINTER_ATTRIBUTE_RANGE_SIZE,
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        ];
        let mut data: [*mut c_void; 4] = [
            &mut start as *mut u64 as *mut c_void,
            &mut size as *mut usize as *mut c_void,
            &mut mem_type as *mut u32 as *mut c_void,
            &mut ordinal as *mut i32 as *mut c_void,
        ];
        // SAFETY: each data pointer has the size of its attribute (CUdeviceptr, size_t,
        // CUmemorytype, int).
        let r = unsafe { sys::cuPointerGetAttributes(4, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr.0) };
        let end = ptr.0.checked_add(bytes as u64);
        if r != sys::CUresult::CUDA_SUCCESS || start == 0 || size == 0 {
            return Err(Error::invalid_argument(format!(
                "{what} {ptr} ({bytes} bytes) is not memory the CUDA driver knows{}",
                if r == sys::CUresult::CUDA_SUCCESS {
                    String::new()
                } else {
                    format!(" ({})", driver::error_text(r).0)
                }
            )));
        }
        if end.is_none_or(|end| end > start + size as u64) {
            return Err(Error::invalid_argument(format!(
                "{what} {ptr} ({bytes} bytes) runs past the end of its allocation ({:#x}, {size} bytes)",
                start
            )));
        }
        let device_mem = mem_type == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
        Ok((device_mem && ordinal >= 0).then_some(ordinal as usize))
    }

    /// Lets kernels on device `from` read and write memory of device `to`.
    fn ensure_peer(&self, from: usize, to: usize) -> Result<()> {
        if from == to || self.peers.lock().unwrap_or_else(|p| p.into_inner()).contains(&(from, to)) {
            return Ok(());
        }
        let mut can = 0;
        // SAFETY: writes one int.
        check(
            unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.devices[from].handle, self.devices[to].handle) },
            "cuDeviceCanAccessPeer",
        )?;
        if can == 0 {
            return Err(Error::invalid_usage(format!(
                "device {from} cannot access memory of device {to} (no peer access between them)"
            )));
        }
        let peer = self.primary(to)?;
        let _g = CtxGuard::enter(self.primary(from)?)?;
        // SAFETY: both contexts are live primary contexts.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.0, 0) };
        if r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            check(r, "cuCtxEnablePeerAccess")?;
        }
        self.peers.lock().unwrap_or_else(|p| p.into_inner()).insert((from, to));
        Ok(())
    }

    /// Where a copy or fill with these pointers runs.
    fn place_for(&self, stream: Stream, ptrs: &[DevicePtr]) -> Result<Place> {
        let hint = if is_default_like(stream) { ptrs.iter().find_map(|p| self.tracked_device(*p)) } else { None };
        self.place(stream, hint)
    }

}

impl DeviceBackend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn device_count(&self) -> Result<usize> {
        Ok(self.devices.len())
    }

    fn device_name(&self, device: usize) -> Result<String> {
        Ok(self.device(device, "device_name")?.name.clone())
    }

    fn alloc(&self, device: usize, bytes: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Err(Error::invalid_argument("alloc: zero bytes"));
        }
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: writes one address.
        check(unsafe { sys::cuMemAlloc_v2(&mut p, bytes) }, &format!("cuMemAlloc({bytes} bytes on device {device})"))?;
        self.write_memory().entries.insert(p, Entry { bytes, device: Some(device), kind: Kind::Device });
        Ok(DevicePtr(p))
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        let mut mem = self.write_memory();
        let Some(e) = mem.entries.get_mut(&ptr.0) else {
            return Err(Error::invalid_argument(format!(
                "free: {ptr} is not a live allocation of the CUDA backend (never allocated, or already freed)"
            )));
        };
        let device = e.device;
        match &mut e.kind {
            Kind::Device => {}
            Kind::Exported { freed: true, .. } => {
                return Err(Error::invalid_argument(format!("free: {ptr} was already freed")));
            }
            Kind::Exported { local_imports, freed, .. } if *local_imports > 0 => {
                // Imported in this process at the same address: free when the last closes.
                *freed = true;
                return Ok(());
            }
            Kind::Exported { .. } => {}
            Kind::HostMapped { .. } => {
                return Err(Error::invalid_argument(format!("free: {ptr} is host-mapped memory; use free_host_mapped")))
            }
            Kind::Registered { .. } => {
                return Err(Error::invalid_argument(format!(
                    "free: {ptr} is registered host memory; use unregister_host"
                )))
            }
            Kind::Imported { .. } => {
                return Err(Error::invalid_argument(format!("free: {ptr} is imported memory; use close_import")))
            }
        }
        let _g = CtxGuard::enter(self.primary(device.unwrap_or(0))?)?;
        // SAFETY: a live allocation of ours, removed from the table below.
        check(unsafe { sys::cuMemFree_v2(ptr.0) }, "cuMemFree")?;
        mem.entries.remove(&ptr.0);
        Ok(())
    }

    fn alloc_host_mapped(&self, bytes: usize) -> Result<HostMapped> {
        if bytes == 0 {
            return Err(Error::invalid_argument("alloc_host_mapped: zero bytes"));
        }
        let device = match driver::current()? {
            c if c.is_null() => 0,
            c => self.ctx_device(Ctx(c))?,
        };
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: writes one pointer.
        check(unsafe { sys::cuMemHostAlloc(&mut host, bytes, flags) }, &format!("cuMemHostAlloc({bytes} bytes)"))?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `host` is mapped memory we just allocated.
        if let Err(e) =
            check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) }, "cuMemHostGetDevicePointer")
        {
            // SAFETY: ours, not handed out.
            unsafe { sys::cuMemFreeHost(host) };
            return Err(e);
        }
        self.write_memory()
            .entries
            .insert(dev, Entry { bytes, device: None, kind: Kind::HostMapped { host: host as usize } });
        Ok(HostMapped { host: host as *mut u8, device: DevicePtr(dev), bytes })
    }

    fn free_host_mapped(&self, mem: HostMapped) -> Result<()> {
        let mut table = self.write_memory();
        let host = match table.entries.get(&mem.device.0) {
            Some(Entry { kind: Kind::HostMapped { host }, .. }) => *host,
            Some(_) => {
                return Err(Error::invalid_argument(format!(
                    "free_host_mapped: {} is not host-mapped memory; use free, close_import or unregister_host",
                    mem.device
                )))
            }
            None => {
                return Err(Error::invalid_argument(format!(
                    "free_host_mapped: {} is not live host-mapped memory of the CUDA backend",
                    mem.device
                )))
            }
        };
        // SAFETY: memory cuMemHostAlloc gave us, removed from the table below.
        check(unsafe { sys::cuMemFreeHost(host as *mut c_void) }, "cuMemFreeHost")?;
        table.entries.remove(&mem.device.0);
        Ok(())
    }

    unsafe fn register_host(&self, ptr: *mut u8, bytes: usize) -> Result<DevicePtr> {
        if ptr.is_null() || bytes == 0 {
            return Err(Error::invalid_argument("register_host: null pointer or zero bytes"));
        }
        let device = match driver::current()? {
            c if c.is_null() => 0,
            c => self.ctx_device(Ctx(c))?,
        };
        {
            let mut table = self.write_memory();
            for e in table.entries.values_mut() {
                if let Kind::Registered { host, refs } = &mut e.kind {
                    if *host == ptr as usize && e.bytes == bytes {
                        *refs += 1;
                        drop(table);
                        let mut dev: sys::CUdeviceptr = 0;
                        // SAFETY: the range is registered with DEVICEMAP (PORTABLE: every context).
                        check(
                            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, ptr as *mut c_void, 0) },
                            "cuMemHostGetDevicePointer",
                        )?;
                        return Ok(DevicePtr(dev));
                    }
                }
            }
        }
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: the caller promises the range stays valid until unregister_host.
        check(
            unsafe { sys::cuMemHostRegister_v2(ptr as *mut c_void, bytes, flags) },
            &format!("cuMemHostRegister({bytes} bytes)"),
        )?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: the range is registered with DEVICEMAP.
        if let Err(e) = check(
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, ptr as *mut c_void, 0) },
            "cuMemHostGetDevicePointer",
        ) {
            // SAFETY: registered just above.
            unsafe { sys::cuMemHostUnregister(ptr as *mut c_void) };
            return Err(e);
        }
        self.write_memory()
            .entries
            .insert(dev, Entry { bytes, device: None, kind: Kind::Registered { host: ptr as usize, refs: 1 } });
        Ok(DevicePtr(dev))
    }

    fn unregister_host(&self, ptr: DevicePtr) -> Result<()> {
        let mut table = self.write_memory();
        let host = match table.entries.get_mut(&ptr.0) {
            Some(Entry { kind: Kind::Registered { refs, .. }, .. }) if *refs > 1 => {
                *refs -= 1;
                return Ok(());
            }
            Some(Entry { kind: Kind::Registered { host, .. }, .. }) => *host,
            _ => {
                return Err(Error::invalid_argument(format!(
                    "unregister_host: {ptr} is not host memory registered with the CUDA backend"
                )))
            }
        };
        // SAFETY: registered by register_host, removed from the table below.
        check(unsafe { sys::cuMemHostUnregister(host as *mut c_void) }, "cuMemHostUnregister")?;
        table.entries.remove(&ptr.0);
        Ok(())
    }

    fn memset(&self, dst: DevicePtr, value: u8, bytes: usize, stream: Stream) -> Result<()> {
        let in_op = |e: Error| e.context("memset");
        let place = self.place_for(stream, &[dst])?;
        let _g = CtxGuard::enter(place.ctx)?;
        self.check_range(dst, bytes, "destination").map_err(in_op)?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the range was checked above.
        check(unsafe { sys::cuMemsetD8Async(dst.0, value, bytes, raw_stream(stream)) }, "cuMemsetD8Async").map_err(in_op)
    }

    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize, stream: Stream) -> Result<()> {
        let in_op = |e: Error| e.context("copy");
        let (d, s, n) = (dst.0 as u128, src.0 as u128, bytes as u128);
        if dst != src && d < s + n && s < d + n {
            return Err(in_op(Error::invalid_argument(format!(
                "{bytes} bytes from {src} to {dst}: the ranges overlap"
            ))));
        }
        let place = self.place_for(stream, &[dst, src])?;
        let _g = CtxGuard::enter(place.ctx)?;
        self.check_range(dst, bytes, "destination").map_err(in_op)?;
        self.check_range(src, bytes, "source").map_err(in_op)?;
        if bytes == 0 || dst == src {
            return Ok(());
        }
        // SAFETY: both ranges were checked above.
        check(unsafe { sys::cuMemcpyAsync(dst.0, src.0, bytes, raw_stream(stream)) }, "cuMemcpyAsync").map_err(in_op)
    }

    fn copy_to_device(&self, dst: DevicePtr, src: &[u8], stream: Stream) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let place = self.place_for(stream, &[dst])?;
        let _g = CtxGuard::enter(place.ctx)?;
        self.check_range(dst, src.len(), "copy_to_device destination")?;
        let s = raw_stream(stream);
        // SAFETY: `src` is a live slice until the stream synchronisation below; `dst` checked.
        check(
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst.0, src.as_ptr() as *const c_void, src.len(), s) },
            "cuMemcpyHtoDAsync",
        )?;
        // SAFETY: a stream of the current context (or a default one).
        check(unsafe { sys::cuStreamSynchronize(s) }, "cuStreamSynchronize")
    }

    fn copy_from_device(&self, dst: &mut [u8], src: DevicePtr, stream: Stream) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let place = self.place_for(stream, &[src])?;
        let _g = CtxGuard::enter(place.ctx)?;
        self.check_range(src, dst.len(), "copy_from_device source")?;
        let s = raw_stream(stream);
        // SAFETY: `dst` is a live slice until the stream synchronisation below; `src` checked.
        check(
            unsafe { sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, src.0, dst.len(), s) },
            "cuMemcpyDtoHAsync",
        )?;
        // SAFETY: as above.
        check(unsafe { sys::cuStreamSynchronize(s) }, "cuStreamSynchronize")
    }

    fn create_stream(&self, device: usize) -> Result<Stream> {
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(
            unsafe { sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) },
            "cuStreamCreate",
        )?;
        let stream = Stream(s as usize as u64);
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).insert(stream.0, device);
        Ok(stream)
    }

    fn destroy_stream(&self, stream: Stream) -> Result<()> {
        if stream.is_default() {
            return Err(Error::invalid_argument("destroy_stream: the default stream cannot be destroyed"));
        }
        let device = self.streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream.0).ok_or_else(|| {
            Error::invalid_argument(format!(
                "destroy_stream: stream {:#x} is not a live stream of this backend",
                stream.0
            ))
        })?;
        let _g = CtxGuard::enter(self.primary(device)?)?;
        // SAFETY: a stream we created, forgotten above.
        check(unsafe { sys::cuStreamDestroy_v2(raw_stream(stream)) }, "cuStreamDestroy")
    }

    fn synchronize(&self, stream: Stream) -> Result<()> {
        let place = self.place(stream, None)?;
        let _g = CtxGuard::enter(place.ctx)?;
        // SAFETY: a stream of the current context.
        check(unsafe { sys::cuStreamSynchronize(raw_stream(stream)) }, "cuStreamSynchronize")
    }

    fn query(&self, stream: Stream) -> Result<bool> {
        let place = self.place(stream, None)?;
        let _g = CtxGuard::enter(place.ctx)?;
        // SAFETY: as above.
        match unsafe { sys::cuStreamQuery(raw_stream(stream)) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(driver::cuda_error(r, "cuStreamQuery")),
        }
    }

    fn create_event(&self, device: usize) -> Result<Event> {
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(
            unsafe { sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) },
            "cuEventCreate",
        )?;
        let event = Event(e as usize as u64);
        self.events.lock().unwrap_or_else(|p| p.into_inner()).insert(event.0, device);
        Ok(event)
    }

    fn record_event(&self, event: Event, stream: Stream) -> Result<()> {
        let device = self.event_device(event, "record_event")?;
        let place = self.place(stream, Some(device))?;
        let _g = CtxGuard::enter(place.ctx)?;
        // SAFETY: a live event of ours and a stream of the current context.
        check(unsafe { sys::cuEventRecord(event.0 as usize as sys::CUevent, raw_stream(stream)) }, "cuEventRecord")
    }

    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()> {
        let device = self.event_device(event, "stream_wait_event")?;
        let place = self.place(stream, Some(device))?;
        let _g = CtxGuard::enter(place.ctx)?;
        // SAFETY: as above; waiting on an event of another device is allowed.
        check(
            unsafe { sys::cuStreamWaitEvent(raw_stream(stream), event.0 as usize as sys::CUevent, 0) },
            "cuStreamWaitEvent",
        )
    }

    fn query_event(&self, event: Event) -> Result<bool> {
        let device = self.event_device(event, "query_event")?;
        let _g = CtxGuard::enter(self.primary(device)?)?;
        // SAFETY: a live event of ours.
        match unsafe { sys::cuEventQuery(event.0 as usize as sys::CUevent) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(driver::cuda_error(r, "cuEventQuery")),
        }
    }

    fn synchronize_event(&self, event: Event) -> Result<()> {
        let device = self.event_device(event, "synchronize_event")?;
        let _g = CtxGuard::enter(self.primary(device)?)?;
        // SAFETY: a live event of ours.
        check(unsafe { sys::cuEventSynchronize(event.0 as usize as sys::CUevent) }, "cuEventSynchronize")
    }

    fn destroy_event(&self, event: Event) -> Result<()> {
        let device = self.events.lock().unwrap_or_else(|p| p.into_inner()).remove(&event.0).ok_or_else(|| {
            Error::invalid_argument(format!("destroy_event: event {:#x} is not a live event of this backend", event.0))
        })?;
        let _g = CtxGuard::enter(self.primary(device)?)?;
        // SAFETY: a live event of ours, forgotten above.
        check(unsafe { sys::cuEventDestroy_v2(event.0 as usize as sys::CUevent) }, "cuEventDestroy")
    }

    fn alloc_shareable(&self, device: usize, bytes: usize) -> Result<(DevicePtr, ShareHandle)> {
        if bytes == 0 {
            return Err(Error::invalid_argument("alloc_shareable: zero bytes"));
        }
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: writes one address.
        check(unsafe { sys::cuMemAlloc_v2(&mut p, bytes) }, &format!("cuMemAlloc({bytes} bytes on device {device})"))?;
        let result = (|| {
            // Synchronous memory operations on shared memory are ordered across processes.
            let one: u32 = 1;
            // SAFETY: reads one unsigned int; `p` is our allocation.
            check(
                unsafe {
                    sys::cuPointerSetAttribute(
                        &one as *const u32 as *const c_void,
                        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                        p,
                    )
                },
                "cuPointerSetAttribute(SYNC_MEMOPS)",
            )?;
            let mut h = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
            // SAFETY: writes the 64-byte handle.
            check(unsafe { sys::cuIpcGetMemHandle(h.as_mut_ptr(), p) }, "cuIpcGetMemHandle")?;
            // SAFETY: written above.
            let h = unsafe { h.assume_init() };
            let mut raw = [0u8; IPC_HANDLE_BYTES];
            for (b, c) in raw.iter_mut().zip(h.reserved.iter()) {
                *b = *c as u8;
            }
            Ok(raw)
        })();
        let raw = match result {
            Ok(raw) => raw,
            Err(e) => {
                // SAFETY: ours, not handed out.
                unsafe { sys::cuMemFree_v2(p) };
                return Err(e);
            }
        };
        let handle = ShareHandle::new(BackendKind::Cuda, bytes as u64, &raw)?;
        self.write_memory().entries.insert(
            p,
            Entry { bytes, device: Some(device), kind: Kind::Exported { handle: raw, local_imports: 0, freed: false } },
        );
        Ok((DevicePtr(p), handle))
    }

    fn import(&self, device: usize, handle: &ShareHandle) -> Result<DevicePtr> {
        self.device(device, "import")?;
        if handle.kind() != BackendKind::Cuda {
            return Err(Error::invalid_argument(format!(
                "import: the share handle was made by the {} backend; the cuda backend imports only its own",
                handle.kind()
            )));
        }
        let raw: [u8; IPC_HANDLE_BYTES] = handle.payload().try_into().map_err(|_| {
            Error::invalid_argument(format!(
                "invalid share handle: a CUDA IPC handle is {IPC_HANDLE_BYTES} bytes, this payload {}",
                handle.payload().len()
            ))
        })?;
        let bytes = usize::try_from(handle.bytes())
            .map_err(|_| Error::invalid_argument(format!("invalid share handle: {} bytes", handle.bytes())))?;
        let mut mem = self.write_memory();
        // This process's own export, or an import already open: share it.
        for (base, e) in mem.entries.iter_mut() {
            match &mut e.kind {
                Kind::Exported { handle: h, local_imports, freed: false } if *h == raw => {
                    if bytes > e.bytes {
                        return Err(Error::invalid_argument(format!(
                            "invalid share handle: {bytes} bytes, but the allocation has {}",
                            e.bytes
                        )));
                    }
                    *local_imports += 1;
                    return Ok(DevicePtr(*base));
                }
                Kind::Imported { handle: h, refs } if *h == raw && e.device == Some(device) => {
                    *refs += 1;
                    return Ok(DevicePtr(*base));
                }
                _ => {}
            }
        }
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let mut h = sys::CUipcMemHandle { reserved: [0; IPC_HANDLE_BYTES] };
        for (c, b) in h.reserved.iter_mut().zip(raw.iter()) {
            *c = *b as std::ffi::c_char;
        }
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: writes one address; a bad handle is reported by the driver.
        check(
            unsafe {
                sys::cuIpcOpenMemHandle_v2(&mut p, h, sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32)
            },
            "cuIpcOpenMemHandle",
        )?;
        mem.entries.insert(p, Entry { bytes, device: Some(device), kind: Kind::Imported { handle: raw, refs: 1 } });
        Ok(DevicePtr(p))
    }

    fn close_import(&self, ptr: DevicePtr) -> Result<()> {
        let mut mem = self.write_memory();
        let Some(e) = mem.entries.get_mut(&ptr.0) else {
            return Err(Error::invalid_argument(format!("close_import: {ptr} is not an open import")));
        };
        let device = e.device;
        match &mut e.kind {
            Kind::Imported { refs, .. } => {
                *refs -= 1;
                if *refs > 0 {
                    return Ok(());
                }
            }
            Kind::Exported { local_imports, freed, .. } if *local_imports > 0 => {
                *local_imports -= 1;
                if *local_imports > 0 || !*freed {
                    return Ok(());
                }
                // The export was freed while imported here: free it now.
                let _g = CtxGuard::enter(self.primary(device.unwrap_or(0))?)?;
                // SAFETY: our allocation, no longer referenced.
                check(unsafe { sys::cuMemFree_v2(ptr.0) }, "cuMemFree")?;
                mem.entries.remove(&ptr.0);
                return Ok(());
            }
            _ => {
                return Err(Error::invalid_argument(format!(
                    "close_import: {ptr} is not imported memory; use free, free_host_mapped or unregister_host"
                )))
            }
        }
        let _g = CtxGuard::enter(self.primary(device.unwrap_or(0))?)?;
        // SAFETY: an address cuIpcOpenMemHandle gave us, removed from the table below.
        check(unsafe { sys::cuIpcCloseMemHandle(ptr.0) }, "cuIpcCloseMemHandle")?;
        mem.entries.remove(&ptr.0);
        Ok(())
    }

    fn host_address(&self, _ptr: DevicePtr, _bytes: usize) -> Result<usize> {
        Err(Error::invalid_usage("host_address: device memory is not host-addressable (cuda backend)"))
    }

    fn launch_exec(&self, launch: &crate::backend::ExecLaunch, stream: Stream) -> Result<()> {
        let place = self.place(stream, Some(launch.device))?;
        if place.device != launch.device {
            return Err(Error::invalid_usage(format!(
                "the stream belongs to device {} but the communicator to device {}",
                place.device, launch.device
            )));
        }
        for &(ptr, bytes) in &launch.buffers {
            if let Some(owner) = self.check_range(ptr, bytes, "buffer")? {
                self.ensure_peer(place.device, owner)?;
            }
        }
        for &ptr in &launch.slots {
            if let Some(owner) = self.tracked_device(ptr) {
                self.ensure_peer(place.device, owner)?;
            }
        }
        let cc = self.devices[place.device].cc;
        let f = self.kernels.exec(place.ctx, cc, self.driver_version, launch.op, launch.dtype)?;
        let _g = CtxGuard::enter(place.ctx)?;
        let mut args = launch.args;
        let mut params = [&mut args as *mut rustccl_kernels::exec::ExecArgs as *mut c_void];
        // SAFETY: the kernel takes one RustcclExecArgs by value (same layout, checked in
        // rustccl_kernels::exec); the driver copies it before returning; the program it points
        // to is device memory the caller keeps until the launch completes.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    f.func.0,
                    launch.blocks.max(1),
                    1,
                    1,
                    rustccl_kernels::exec::EXEC_THREADS,
                    1,
                    1,
                    0,
                    raw_stream(stream),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel(rustccl_exec)",
        )
    }

    fn with_relaxed_capture(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: swaps a thread-local setting; restored below.
        check(unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }, "cuThreadExchangeStreamCaptureMode")?;
        let r = f();
        // SAFETY: as above, putting the caller's mode back.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        r
    }

    fn is_capturing(&self, stream: Stream) -> Result<bool> {
        let place = self.place(stream, None)?;
        let _g = CtxGuard::enter(place.ctx)?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: writes one enum.
        check(unsafe { sys::cuStreamIsCapturing(raw_stream(stream), &mut status) }, "cuStreamIsCapturing")?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    unsafe fn copy_from_pinned_async(&self, dst: DevicePtr, src: *const u8, bytes: usize, stream: Stream) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let place = self.place_for(stream, &[dst])?;
        let _g = CtxGuard::enter(place.ctx)?;
        self.check_range(dst, bytes, "copy destination")?;
        // SAFETY: the caller keeps `src` pinned and valid until the copy runs; `dst` checked.
        check(
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst.0, src as *const c_void, bytes, raw_stream(stream)) },
            "cuMemcpyHtoDAsync",
        )
    }
}

impl CudaBackend {
    fn event_device(&self, event: Event, op: &str) -> Result<usize> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).get(&event.0).copied().ok_or_else(|| {
            Error::invalid_argument(format!("{op}: event {:#x} is not a live event of this backend", event.0))
        })
    }
}

#[cfg(test)]
mod tests;
