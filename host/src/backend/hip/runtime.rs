//! ROCm's HIP runtime (`libamdhip64`), found and asked for its devices at run time. The
//! backend's operations on it (memory, streams, events, IPC, launches) are not written yet:
//! this is what `RUSTCCL_BACKEND=hip` and the automatic choice look at, so that both say
//! plainly what is there and what is missing.

use std::ffi::c_int;
use std::path::PathBuf;

use crate::error::{Error, Result};

/// The file (or directory) to load the HIP runtime from, before the usual places.
pub const HIP_PATH_ENV: &str = "RUSTCCL_HIP_PATH";

const LIBRARY_NAMES: &[&str] = &["libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"];

/// What the HIP runtime reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HipProbe {
    /// The library loaded, its runtime version (`hipRuntimeGetVersion`), and the number of
    /// AMD GPUs it sees.
    pub path: PathBuf,
    pub version: i32,
    pub devices: usize,
}

/// Loads the HIP runtime (`RUSTCCL_HIP_PATH`, `$ROCM_PATH/lib`, `/opt/rocm/lib`, the dynamic
/// loader's path) and counts its devices: an error that says what to install when the
/// library is missing; `devices == 0` when it is there but sees no GPU (hipInit's error, as
/// on a machine without an AMD GPU or its driver, counts as none).
pub fn probe() -> Result<HipProbe> {
    let mut files: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os(HIP_PATH_ENV).filter(|p| !p.is_empty()).map(PathBuf::from) {
        if p.is_dir() {
            files.extend(LIBRARY_NAMES.iter().map(|n| p.join(n)));
        } else {
            files.push(p);
        }
    } else {
        if let Some(root) = std::env::var_os("ROCM_PATH") {
            files.extend(LIBRARY_NAMES.iter().map(|n| PathBuf::from(&root).join("lib").join(n)));
        }
        files.extend(LIBRARY_NAMES.iter().map(|n| PathBuf::from("/opt/rocm/lib").join(n)));
        files.extend(LIBRARY_NAMES.iter().map(PathBuf::from));
    }
    let mut errors = Vec::new();
    for file in &files {
        // SAFETY: loading the HIP runtime runs its initialisers, which are sound to run.
        let lib = match unsafe { libloading::Library::new(file) } {
            Ok(l) => l,
            Err(e) => {
                if file.is_absolute() && file.exists() {
                    errors.push(format!("{}: {e}", file.display()));
                }
                continue;
            }
        };
        type InitFn = unsafe extern "C" fn(u32) -> c_int;
        type CountFn = unsafe extern "C" fn(*mut c_int) -> c_int;
        type VersionFn = unsafe extern "C" fn(*mut c_int) -> c_int;
        // SAFETY: the types are the functions' C signatures (hip_runtime_api.h).
        let (init, count, version) = unsafe {
            match (lib.get::<InitFn>(b"hipInit\0"), lib.get::<CountFn>(b"hipGetDeviceCount\0"), lib.get::<VersionFn>(b"hipRuntimeGetVersion\0")) {
                (Ok(i), Ok(c), Ok(v)) => (*i, *c, *v),
                _ => {
                    errors.push(format!("{}: not a HIP runtime (no hipInit/hipGetDeviceCount)", file.display()));
                    continue;
                }
            }
        };
        let mut v = 0;
        let mut n = 0;
        // SAFETY: plain calls into the runtime loaded above, which stays loaded (leaked
        // below); each writes one int.
        let devices = unsafe {
            let _ = version(&mut v);
            if init(0) != 0 || count(&mut n) != 0 {
                0
            } else {
                n.max(0) as usize
            }
        };
        // The runtime keeps threads and state: never unloaded.
        std::mem::forget(lib);
        return Ok(HipProbe { path: file.clone(), version: v, devices });
    }
    Err(Error::system(format!(
        "no HIP runtime: none of {} could be loaded from {HIP_PATH_ENV}, $ROCM_PATH/lib, /opt/rocm/lib \
         or the dynamic loader's path{}; install ROCm (its libamdhip64) for AMD GPUs, or use \
         RUSTCCL_BACKEND=host or cuda",
        LIBRARY_NAMES.join(", "),
        if errors.is_empty() { String::new() } else { format!(" ({})", errors.join("; ")) },
    )))
}

/// The error `RUSTCCL_BACKEND=hip` gives: what is missing (the runtime, a GPU), and in any
/// case that the backend's runtime operations are not written yet.
pub fn unavailable() -> Error {
    let found = match probe() {
        Err(e) => return e,
        Ok(p) if p.devices == 0 => format!(
            "the HIP runtime {} (version {}) sees no AMD GPU (hipInit or hipGetDeviceCount failed, or none there)",
            p.path.display(),
            p.version
        ),
        Ok(p) => format!("the HIP runtime {} (version {}) sees {} AMD GPU(s)", p.path.display(), p.version, p.devices),
    };
    Error::invalid_usage(format!(
        "RUSTCCL_BACKEND=hip: {found}, but the hip backend's device operations (memory, streams, \
         launches) are not written yet (its kernels compile for AMD targets: see docs/STATUS.md); \
         use RUSTCCL_BACKEND=host"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the runtime (a path that holds none), the probe says what is missing and what
    /// to install; so does `RUSTCCL_BACKEND=hip`. With one but no GPU (CI installs Debian's
    /// runtime and has no AMD GPU), it counts no devices.
    #[test]
    fn the_hip_runtime_is_found_or_said_missing() {
        let lib = probe();
        match &lib {
            Ok(p) => {
                assert!(p.path.to_string_lossy().contains("amdhip64"), "{p:?}");
                let e = unavailable();
                assert!(e.message.contains("not written yet") && e.message.contains("amdhip64"), "{}", e.message);
            }
            Err(e) => assert!(e.message.contains("no HIP runtime") && e.message.contains("install ROCm"), "{}", e.message),
        }
        if std::env::var("RUSTCCL_TEST_REQUIRE_HIPRTC").as_deref() == Ok("1") {
            assert!(lib.is_ok(), "the HIP runtime should be installed here: {:?}", lib.err().map(|e| e.message));
        }
    }
}
