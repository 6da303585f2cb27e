//! The CUDA backend: the driver API loaded at run time (cudarc's sys layer with dynamic
//! loading), so building needs no CUDA toolkit and a machine without a GPU runs everything
//! else; the device code of `rustccl-kernels` compiled at run time by NVRTC ([`module`]).
//!
//! Handles are the driver's own values: a [`DevicePtr`](super::DevicePtr) is a `CUdeviceptr`
//! (unified addressing: one space for every device and pinned host memory), a
//! [`Stream`](super::Stream) a `CUstream` cast to `u64` — the `cudaStream_t` a caller passes is
//! the same value — and an [`Event`](super::Event) a `CUevent`.
//! [`Stream::DEFAULT`](super::Stream::DEFAULT) (0) is the legacy NULL stream; the special
//! handles `cudaStreamLegacy` (1) and `cudaStreamPerThread` (2) are accepted too.
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
//! `cuIpcOpenMemHandle`): the [`ShareHandle`](super::ShareHandle) payload is the 64-byte
//! `CUipcMemHandle` and the envelope carries the size. Importing a handle this process
//! exported maps nothing (CUDA refuses that) and returns the exporter's address; the memory
//! then lives until both the export is freed and the import closed. NVLink multicast is never
//! used.
//!
//! Copies are `cuMemcpyAsync`, fills `cuMemsetD8Async`. The only kernels are the collective
//! interpreter (`kernels/src/device/exec.cu`, one compile per operator and type), which
//! [`Kernels::launch_exec`] (or, for a cached launch, [`Kernels::exec_kernel`] and
//! [`Kernels::launch_exec_kernel`]) starts for the device executor (`exec::gpu`), and the
//! symmetric kernels built into the same module; the interpreter reduces bit for bit as the
//! host reference [`crate::reduce`] does (`exec::gpu::ops` gives its operator and scalar).
//!
//! The CUDA backend has every group of the backend traits but host access. Each is implemented
//! in the module of its concern: `copy` ([`Memory`](crate::backend::Memory): copies and
//! fills, with the allocation bookkeeping both GPU backends share, `backend::gpu_memory`, over
//! the driver's calls in `memory`, which also gives [`Sharing`](crate::backend::Sharing)),
//! `streams` ([`Streams`](crate::backend::Streams): streams, events, stream capture, and where
//! work on a stream runs), `launch` ([`Kernels`], [`SymmetricKernels`]: the launches, peer
//! access, stream memory operations), `symmetric` ([`WindowMemory`], [`BufferSharing`]); this
//! file holds the devices and contexts, and the backend's identity.

mod copy;
pub mod driver;
mod launch;
mod memory;
pub mod module;
pub mod nvrtc;
pub mod ptxas;
mod streams;
mod symmetric;

use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use cudarc::driver::sys;

use super::{BackendKind, BufferSharing, DeviceBackend, ForeignEvents, HostAccess, Kernels, SymmetricKernels, WindowMemory};
use crate::error::{Error, Result};
use driver::{check, Ctx, CtxGuard};
use crate::backend::gpu_memory::Table;
pub use memory::IPC_HANDLE_BYTES;

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
    /// Address ranges reserved for windows (`reserve_space`): base → bytes.
    spaces: Mutex<std::collections::BTreeMap<u64, usize>>,
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
            spaces: Mutex::new(std::collections::BTreeMap::new()),
        })
    }

    /// The process's CUDA backend, made on first use; a failure is returned to every caller
    /// (the driver is not retried).
    pub fn shared() -> Result<Arc<CudaBackend>> {
        static SHARED: OnceLock<Result<Arc<CudaBackend>>> = OnceLock::new();
        SHARED.get_or_init(|| CudaBackend::new().map(Arc::new)).clone()
    }

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

    /// The driver version (`cuDriverGetVersion`, e.g. 13000).
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    /// The compute capability of `device` as `10 * major + minor`.
    pub fn compute_capability(&self, device: usize) -> Result<i32> {
        Ok(self.device(device, "compute_capability")?.cc)
    }

    /// The driver's handle of `device`.
    fn device_handle(&self, device: usize) -> Result<sys::CUdevice> {
        Ok(self.device(device, "device handle")?.handle)
    }

    fn devices_len(&self) -> usize {
        self.devices.len()
    }

    /// Whether kernels on `from` can reach memory of `to` (false if the driver says no or fails).
    fn can_access_peer(&self, from: usize, to: usize) -> bool {
        let (Some(a), Some(b)) = (self.devices.get(from), self.devices.get(to)) else { return false };
        let mut can = 0;
        // SAFETY: writes one int.
        let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.handle, b.handle) };
        r == sys::CUresult::CUDA_SUCCESS && can == 1
    }

    fn spaces(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, usize>> {
        self.spaces.lock().unwrap_or_else(|p| p.into_inner())
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
}

impl DeviceBackend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn capabilities(&self) -> &crate::backend::Capabilities {
        crate::backend::caps::gpu_static()
    }

    fn current_device(&self) -> Result<Option<i32>> {
        CudaBackend::current_device(self)
    }

    fn device_count(&self) -> Result<usize> {
        Ok(self.devices.len())
    }

    fn device_name(&self, device: usize) -> Result<String> {
        Ok(self.device(device, "device_name")?.name.clone())
    }

    fn kernels(&self) -> Option<&dyn Kernels> {
        Some(self)
    }

    fn symmetric_kernels(&self) -> Option<&dyn SymmetricKernels> {
        Some(self)
    }

    fn window_memory(&self) -> Option<&dyn WindowMemory> {
        Some(self)
    }

    fn buffer_sharing(&self) -> Option<&dyn BufferSharing> {
        Some(self)
    }

    fn host_access(&self) -> Option<&dyn HostAccess> {
        None
    }

    fn foreign_events(&self) -> Option<&dyn ForeignEvents> {
        Some(self)
    }
}

#[cfg(test)]
mod tests;
