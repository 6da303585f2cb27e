//! Device backends behind a few small traits (the shape of wgpu-hal's): the rest of rustccl
//! allocates, copies, fills, synchronises and shares memory between processes only through
//! them, so nothing of one backend leaks into another. [`DeviceBackend`] is the handle
//! (`Arc<dyn DeviceBackend>`): what every backend has is its supertraits — [`Memory`],
//! [`Streams`] (events and stream capture included), [`Sharing`] (memory other processes map)
//! — and what only some have are optional groups it hands out (`None` where it lacks one):
//! [`Kernels`], [`SymmetricKernels`], [`WindowMemory`], [`BufferSharing`], [`HostAccess`], [`ForeignEvents`]
//! (see `traits.rs`). A backend implements what it can do; nothing in it refuses.
//!
//! Collectives are not backend operations: they run through the collective executors, which
//! use the backend for memory, streams and launches. On the host backend the host polling
//! executor (`coll/exec.rs`) runs the planner's programs on CPU threads, reducing with
//! [`crate::reduce`] on the addresses [`HostAccess::host_address`] gives; on a device
//! backend the device executor (`exec::gpu`) turns them into a program for the collective
//! interpreter (`kernels/src/device/exec.cu`) and starts it with [`Kernels::launch_exec`] —
//! or, for a repeated collective whose program is cached, with
//! [`Kernels::launch_exec_kernel`] on a kernel looked up once ([`Kernels::exec_kernel`]),
//! checking only its buffers per call ([`Kernels::check_exec_buffer`]).
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
mod traits;

use std::sync::Arc;

pub use caps::{Capabilities, ProtocolCost};
pub use handle::{DevicePtr, Event, HostMapped, Stream};
pub use cuda::CudaBackend;
pub use hip::HipBackend;
pub use host::HostBackend;
pub use share::ShareHandle;
pub use traits::{BufferSharing, DeviceBackend, ForeignEvents, HostAccess, Kernels, Memory, Sharing, Streams, SymmetricKernels, WindowMemory};

/// Host work a device stream runs in its order ([`Kernels::launch_host_callback`]).
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
/// device ([`Kernels::exec_kernel`]): a handle to launch it with
/// [`Kernels::launch_exec_kernel`] without looking it up again. `handle` and `context`
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

/// A shareable allocation a window can be made of.
#[derive(Clone, Debug)]
pub struct SymmetricMemory {
    /// Where the allocation starts, and its size.
    pub base: DevicePtr,
    pub bytes: usize,
    /// What peers map it with.
    pub handle: ShareHandle,
}

/// Which implementation a backend is (defined with the configuration, which names one per
/// communicator: `CommConfig::backend`).
pub use crate::config::BackendKind;

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
    backend_of_kind(backend_kind_from_name(name)?)
}

/// The process's backend of `kind` (one per process, as [`backend_from_name`]).
pub fn backend_of_kind(kind: BackendKind) -> Result<Arc<dyn DeviceBackend>> {
    match kind {
        BackendKind::Host => Ok(HostBackend::shared()?),
        BackendKind::Cuda => Ok(CudaBackend::shared()?),
        BackendKind::Hip => Ok(HipBackend::shared()?),
    }
}

/// The backend a communicator asks for ([`CommConfig::backend`](crate::config::CommConfig)):
/// that kind when given, else [`select_backend`]'s choice.
pub fn backend_for(kind: Option<BackendKind>) -> Result<Arc<dyn DeviceBackend>> {
    match kind {
        Some(k) => backend_of_kind(k),
        None => select_backend(),
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
