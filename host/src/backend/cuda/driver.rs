//! The CUDA driver library, loaded at run time through cudarc's sys layer, and the helpers
//! every driver call goes through: the result check, the current-context guard.
//!
//! cudarc's dynamic loading panics when the library or a symbol is missing (on the first
//! call of a function). `load` makes that impossible afterwards: it first opens the library
//! itself with `libloading` under the names cudarc tries, then has cudarc load it (inside
//! `catch_unwind`), then checks that every symbol this backend calls is there. Only then is
//! any driver function called, starting with `cuInit`.

use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

use cudarc::driver::sys;

use crate::error::{Error, Result};

/// Every driver entry point the backend calls, as cudarc's sys layer looks them up. [`load`]
/// checks them all, so no later call can panic on a missing symbol.
const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceCanAccessPeer",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxGetDevice",
    "cuCtxEnablePeerAccess",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemcpyAsync",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemsetD8Async",
    "cuPointerGetAttributes",
    "cuPointerSetAttribute",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamGetCtx",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventRecordWithFlags",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuLaunchKernel",
    "cuLaunchHostFunc",
    "cuMemGetInfo_v2",
    "cuStreamWriteValue32_v2",
    "cuStreamWaitValue32_v2",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemGetAllocationGranularity",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemGetAddressRange_v2",
];

/// The names cudarc tries, in its order (`libcuda.so`, ..., `libcuda.so.1`).
pub(crate) fn library_candidates() -> Vec<String> {
    ["cuda", "nvcuda"].iter().flat_map(|l| cudarc::get_lib_name_candidates(l)).collect()
}

/// Loads the driver library and checks its symbols, once per process; the error (no driver,
/// a driver without a symbol) is kept and returned to every caller. Does not call `cuInit`.
pub(crate) fn load() -> Result<()> {
    static LOADED: OnceLock<Result<()>> = OnceLock::new();
    LOADED.get_or_init(load_once).clone()
}

fn load_once() -> Result<()> {
    let candidates = library_candidates();
    // SAFETY: opening the CUDA driver runs its initialisers, which are sound to run; the
    // handle is dropped at once (cudarc keeps its own).
    let found = candidates.iter().any(|name| unsafe { libloading::Library::new(name) }.is_ok());
    if !found {
        return Err(Error::cuda(format!(
            "no CUDA driver: libcuda.so.1 not found (nor libcuda.so or {} other names); install \
             the NVIDIA driver or add the directory holding libcuda.so.1 to LD_LIBRARY_PATH",
            candidates.len().saturating_sub(2)
        )));
    }
    // The library opens, so cudarc's own search (the same names, in the same order) cannot
    // panic; catch it anyway rather than unwind through the caller.
    // SAFETY: culib only opens the library (see above).
    let lib = std::panic::catch_unwind(|| unsafe { sys::culib() })
        .map_err(|_| Error::cuda("no CUDA driver: cudarc could not load libcuda.so.1"))?;
    for name in SYMBOLS {
        // SAFETY: only the symbol's presence is checked; the pointer is not used.
        if unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err() {
            return Err(Error::cuda(format!(
                "the CUDA driver lacks {name}: it is older than the CUDA 12/13 driver API rustccl \
                 needs; update the NVIDIA driver"
            )));
        }
    }
    Ok(())
}

/// The driver's name and description of `r` (`cuGetErrorName`, `cuGetErrorString`).
pub(crate) fn error_text(r: sys::CUresult) -> (String, String) {
    let text = |f: unsafe fn(sys::CUresult, *mut *const c_char) -> sys::CUresult| {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: the driver is loaded (callers have a CUresult from it); `p` receives a
        // pointer to a static string, or stays null for an unknown code.
        let ok = unsafe { f(r, &mut p) } == sys::CUresult::CUDA_SUCCESS && !p.is_null();
        // SAFETY: on success `p` is a NUL-terminated static string.
        ok.then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let name = text(sys::cuGetErrorName).unwrap_or_else(|| "CUDA_ERROR_UNKNOWN".to_string());
    let desc = text(sys::cuGetErrorString).unwrap_or_else(|| "unrecognized error code".to_string());
    (name, desc)
}

/// `UnhandledCudaError` for CUDA function `what` having returned `r`.
pub(crate) fn cuda_error(r: sys::CUresult, what: &str) -> Error {
    let (name, desc) = error_text(r);
    Error::cuda(format!("{what} failed: {name} ({}): {desc}", r as u32))
}

/// `Ok` when `r` is `CUDA_SUCCESS`, else [`cuda_error`].
#[inline]
pub(crate) fn check(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(cuda_error(r, what))
    }
}

/// A `CUcontext` that can be kept in shared structures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Ctx(pub sys::CUcontext);
// SAFETY: a CUcontext is a driver handle, usable from any thread.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

impl Ctx {
    pub(crate) fn key(self) -> usize {
        self.0 as usize
    }
}

/// The calling thread's current context (null when none).
pub(crate) fn current() -> Result<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle.
    check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    Ok(ctx)
}

/// Makes a context current on this thread for as long as it lives, then puts the caller's
/// back: the runtime API follows the driver's current context, so a caller's CUDA code must
/// not find it changed after a rustccl call.
pub(crate) struct CtxGuard {
    prev: sys::CUcontext,
    switched: bool,
}

impl CtxGuard {
    pub(crate) fn enter(ctx: Ctx) -> Result<CtxGuard> {
        let prev = current()?;
        if prev == ctx.0 {
            return Ok(CtxGuard { prev, switched: false });
        }
        // SAFETY: `ctx` is a live context (a retained primary context or a stream's).
        check(unsafe { sys::cuCtxSetCurrent(ctx.0) }, "cuCtxSetCurrent")?;
        Ok(CtxGuard { prev, switched: true })
    }
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if self.switched {
            // SAFETY: restores the context that was current (possibly none) when we entered.
            let _ = unsafe { sys::cuCtxSetCurrent(self.prev) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_include_the_soname() {
        let c = library_candidates();
        assert!(c.iter().any(|n| n == "libcuda.so.1"), "{c:?}");
        assert_eq!(c[0], "libcuda.so");
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        // On a machine with a driver this succeeds; without one it is a clear error.
        match load() {
            Ok(()) => {}
            Err(e) => {
                assert_eq!(e.code, crate::error::ResultCode::UnhandledCudaError);
                assert!(e.message.contains("CUDA driver"), "{}", e.message);
            }
        }
    }
}
