//! The HIP backend, for AMD GPUs: ROCm's runtime (`libamdhip64`, [`runtime`]) and run-time
//! compiler (hipRTC, [`rtc`]) loaded at run time, so nothing of ROCm is needed to build
//! rustccl. It runs the same collective interpreter as the CUDA backend — the same sources,
//! compiled by hipRTC for the GPU's `gfx*` target and cached on disk the same way
//! ([`module`]) — through the same device executor (`exec::gpu`: programs, images, the
//! watchdog), and keeps its memory with the same bookkeeping (`backend::gpu_memory`).
//!
//! Handles are the runtime's own values: a [`DevicePtr`](super::DevicePtr) is a device
//! address (unified addressing, as on CUDA), a [`Stream`](super::Stream) a `hipStream_t` (0
//! the NULL stream, 2 `hipStreamPerThread`), an [`Event`](super::Event) a `hipEvent_t`. There are no contexts to manage: each
//! call makes the device it needs current (`hipSetDevice`) and puts the caller's back.
//!
//! Differences from CUDA, by design: device memory is fine-grained
//! (`hipExtMallocWithFlags(hipDeviceMallocFinegrained)`: FIFO slots and flags that a peer GPU
//! or the host polls while a kernel runs must be coherent, which AMD's default coarse-grained
//! memory is not), host memory is allocated coherent, no symmetric memory (windows), symmetric
//! kernels or zero-copy registered buffers yet (the backend offers none of these groups, so a
//! caller that needs one gets the one error of `backend`'s `_or_err` helpers), no fp8 kernels,
//! and LL128 is left out of the automatic choice (`Capabilities::gpu_amd`). `stream_wait_u32`
//! compares without wrap-around (HIP's `>=`).
//!
//! Nothing of this backend has run on an AMD GPU (none is lent to this project): CI compiles
//! every kernel for gfx90a, and checks the load path and the memory bookkeeping (against a
//! fake driver); docs/STATUS.md lists what is unverified and the steps to run the GPU checks
//! on an MI-series machine.

mod launch;
mod memory;
pub mod module;
pub mod rtc;
pub mod runtime;
mod streams;

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, CStr};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use super::gpu_memory::Table;
use super::{BackendKind, BufferSharing, DeviceBackend, ForeignEvents, HostAccess, Kernels, SymmetricKernels, WindowMemory};
use crate::error::{Error, Result};
use runtime::Runtime;

/// Names the GPU target kernels are compiled for (`gfx90a`), instead of the one the runtime
/// reports; for a runtime whose device properties rustccl cannot read.
pub const HIP_ARCH_ENV: &str = "RUSTCCL_HIP_ARCH";

/// One device, as found at start.
#[derive(Debug)]
struct Device {
    name: String,
    /// The target kernels are compiled for (`gfx90a`; the features after a `:` dropped, so
    /// the code object runs with either xnack or sramecc setting).
    arch: String,
}

/// The HIP backend (see the module docs).
pub struct HipBackend {
    rt: &'static Runtime,
    devices: Vec<Device>,
    memory: RwLock<Table>,
    /// Streams this backend created, and their devices.
    streams: Mutex<HashMap<u64, usize>>,
    /// Events this backend created, and their devices.
    events: Mutex<HashMap<u64, usize>>,
    /// (from, to) device pairs with peer access enabled.
    peers: Mutex<HashSet<(usize, usize)>>,
    kernels: launch::Kernels,
}

impl std::fmt::Debug for HipBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipBackend").field("devices", &self.devices).field("runtime", &self.rt.path).finish()
    }
}

/// The `gfx*` target named in a `hipDeviceProp_t` (its `gcnArchName`, e.g.
/// `gfx90a:sramecc+:xnack-`), found by content: the struct's layout differs between ROCm 5
/// and 6, and both hold exactly one such name (the marketing name comes first and, should
/// it also read `gfx…`, names the same target).
fn arch_in_properties(props: &[u8]) -> Option<String> {
    let mut at = 0;
    while let Some(i) = props[at..].windows(3).position(|w| w == b"gfx").map(|i| i + at) {
        let end = props[i..].iter().position(|&b| b == 0).map_or(props.len(), |n| i + n);
        let name = std::str::from_utf8(&props[i..end]).ok().and_then(|s| s.split(':').next());
        if let Some(name) = name.filter(|n| n.len() > 3 && n[3..].bytes().all(|b| b.is_ascii_hexdigit())) {
            if i == 0 || props[i - 1] == 0 {
                return Some(name.to_string());
            }
        }
        at = i + 3;
    }
    None
}

/// The current device while it lives, then the caller's again (HIP's runtime API follows
/// the calling thread's current device; a caller's HIP code must not find it changed).
pub(crate) struct DeviceGuard {
    rt: &'static Runtime,
    prev: c_int,
    switched: bool,
}

impl DeviceGuard {
    pub(crate) fn enter(rt: &'static Runtime, device: usize) -> Result<DeviceGuard> {
        let mut prev = 0;
        // SAFETY: writes one int.
        rt.check(unsafe { (rt.calls.get_device)(&mut prev) }, "hipGetDevice")?;
        if prev as usize == device {
            return Ok(DeviceGuard { rt, prev, switched: false });
        }
        // SAFETY: `device` is one of the runtime's devices (callers checked it).
        rt.check(unsafe { (rt.calls.set_device)(device as c_int) }, "hipSetDevice")?;
        Ok(DeviceGuard { rt, prev, switched: true })
    }
}

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        if self.switched {
            // SAFETY: restores the device that was current when we entered.
            let _ = unsafe { (self.rt.calls.set_device)(self.prev) };
        }
    }
}

impl HipBackend {
    /// Loads the runtime, initialises it and lists the devices with their targets.
    ///
    /// Errors: no runtime (`SystemError`, what to install), `hipInit` failing or no AMD GPU
    /// (`UnhandledCudaError`, saying so).
    pub fn new() -> Result<HipBackend> {
        let rt = Runtime::get()?;
        // SAFETY: plain runtime call.
        let r = unsafe { (rt.calls.init)(0) };
        let mut count = 0;
        // SAFETY: writes one int.
        let r = if r == runtime::HIP_SUCCESS { unsafe { (rt.calls.device_count)(&mut count) } } else { r };
        if r != runtime::HIP_SUCCESS || count <= 0 {
            let why = if r != runtime::HIP_SUCCESS { rt.error_text(r).0 } else { "0 devices".into() };
            return Err(Error::cuda(format!(
                "no AMD GPU: the HIP runtime {} (version {}) found none ({why}); on a machine with one, check the \
                 amdgpu driver and that this user may open /dev/kfd and /dev/dri (groups video and render)",
                rt.path.display(),
                rt.version
            )));
        }
        let override_arch = crate::params::env_str(HIP_ARCH_ENV);
        let mut devices = Vec::new();
        for ordinal in 0..count {
            let mut name = [0 as c_char; 256];
            // SAFETY: the buffer holds 256 bytes; the runtime NUL-terminates.
            rt.check(unsafe { (rt.calls.device_name)(name.as_mut_ptr(), 256, ordinal) }, "hipDeviceGetName")?;
            // SAFETY: NUL-terminated by the runtime.
            let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
            // Room for any ROCm's hipDeviceProp_t (ROCm 6's is ~1.5 KiB).
            let mut props = vec![0u64; 1024];
            let get = rt.device_properties_r0600.unwrap_or(rt.calls.device_properties);
            // SAFETY: the buffer is 8 KiB, more than either layout of the struct.
            rt.check(unsafe { get(props.as_mut_ptr().cast(), ordinal) }, "hipGetDeviceProperties")?;
            let bytes: Vec<u8> = props.iter().flat_map(|w| w.to_ne_bytes()).collect();
            let arch = match (&override_arch, arch_in_properties(&bytes)) {
                (Some(a), _) => a.trim().to_string(),
                (None, Some(a)) => a,
                (None, None) => {
                    return Err(Error::cuda(format!(
                        "device {ordinal} ({name}): its GPU target (gcnArchName) could not be read from the HIP runtime \
                         {} (version {}); set {HIP_ARCH_ENV} (e.g. gfx90a for MI200, gfx942 for MI300)",
                        rt.path.display(),
                        rt.version
                    )))
                }
            };
            devices.push(Device { name, arch });
        }
        tracing::info!(
            target: "INIT",
            "HIP backend: runtime {} (version {}), {} device(s): {}",
            rt.path.display(),
            rt.version,
            devices.len(),
            devices.iter().map(|d| format!("{} ({})", d.name, d.arch)).collect::<Vec<_>>().join(", ")
        );
        Ok(HipBackend {
            rt,
            devices,
            memory: RwLock::new(Table::default()),
            streams: Mutex::new(HashMap::new()),
            events: Mutex::new(HashMap::new()),
            peers: Mutex::new(HashSet::new()),
            kernels: launch::Kernels::default(),
        })
    }

    /// The process's HIP backend, made on first use; a failure is returned to every caller.
    pub fn shared() -> Result<Arc<HipBackend>> {
        static SHARED: OnceLock<Result<Arc<HipBackend>>> = OnceLock::new();
        SHARED.get_or_init(|| HipBackend::new().map(Arc::new)).clone()
    }

    /// The GPU target of `device` (`gfx90a`).
    pub fn arch(&self, device: usize) -> Result<&str> {
        Ok(&self.device(device, "arch")?.arch)
    }

    fn device(&self, device: usize, op: &str) -> Result<&Device> {
        self.devices.get(device).ok_or_else(|| {
            Error::invalid_argument(format!("{op}: device {device} does not exist; the HIP backend sees {}", self.devices.len()))
        })
    }

    /// The calling thread's current device.
    fn current(&self) -> Result<usize> {
        let mut d = 0;
        // SAFETY: writes one int.
        self.rt.check(unsafe { (self.rt.calls.get_device)(&mut d) }, "hipGetDevice")?;
        Ok(d.max(0) as usize)
    }

    /// Makes `device` current until the guard drops.
    fn enter(&self, device: usize) -> Result<DeviceGuard> {
        self.device(device, "hipSetDevice")?;
        DeviceGuard::enter(self.rt, device)
    }
}

impl DeviceBackend for HipBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Hip
    }

    fn capabilities(&self) -> &crate::backend::Capabilities {
        crate::backend::caps::gpu_amd_static()
    }

    fn current_device(&self) -> Result<Option<i32>> {
        Ok(Some(self.current()? as i32))
    }

    fn device_count(&self) -> Result<usize> {
        Ok(self.devices.len())
    }

    fn device_name(&self, device: usize) -> Result<String> {
        let d = self.device(device, "device_name")?;
        Ok(format!("{} ({})", d.name, d.arch))
    }

    fn kernels(&self) -> Option<&dyn Kernels> {
        Some(self)
    }

    /// None yet: they run on windows, which this backend does not have yet.
    fn symmetric_kernels(&self) -> Option<&dyn SymmetricKernels> {
        None
    }

    /// None yet (no cuMem-like mapping of shareable memory at fixed addresses written).
    fn window_memory(&self) -> Option<&dyn WindowMemory> {
        None
    }

    /// None yet (registered buffers are received through the connections' slots).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_found_in_either_properties_layout() {
        // ROCm 5's layout: the name first, gcnArchName ~400 bytes in; ROCm 6's: further on.
        for (name, at) in [("AMD Instinct MI210", 396usize), ("", 1160), ("gfx90a", 396)] {
            let mut p = vec![0u8; 2048];
            p[..name.len()].copy_from_slice(name.as_bytes());
            let arch = b"gfx90a:sramecc+:xnack-";
            p[at..at + arch.len()].copy_from_slice(arch);
            assert_eq!(arch_in_properties(&p).as_deref(), Some("gfx90a"), "{name:?} at {at}");
        }
        let mut p = vec![0u8; 1024];
        p[100..107].copy_from_slice(b"gfx1030");
        assert_eq!(arch_in_properties(&p).as_deref(), Some("gfx1030"));
        // Not a target: inside another word, or not followed by a hexadecimal number.
        let mut p = vec![0u8; 1024];
        p[10..20].copy_from_slice(b"xgfx90a\0\0\0");
        p[40..45].copy_from_slice(b"gfxzz");
        assert_eq!(arch_in_properties(&p), None);
        assert_eq!(arch_in_properties(&[]), None);
    }

    /// Without the runtime, or with it but no AMD GPU (CI: Debian's ROCm packages, no GPU),
    /// the backend is a clear error that says what is missing; never a panic.
    #[test]
    fn the_hip_backend_without_a_gpu_is_a_clear_error() {
        match HipBackend::new() {
            Ok(b) => assert!(b.device_count().unwrap() > 0),
            Err(e) => assert!(
                (e.message.contains("no AMD GPU") && e.message.contains("amdhip64")) || e.message.contains("no HIP runtime"),
                "{}",
                e.message
            ),
        }
    }
}
