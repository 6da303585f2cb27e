//! hipRTC, AMD's run-time compiler, loaded at run time (nothing of ROCm at build time): the
//! same kernel sources as NVRTC compiles, built into AMD code objects for `gfx*` targets.
//!
//! ROCm 6 and later ship it as `libhiprtc.so`; ROCm 5 (Debian bookworm's 5.2) inside
//! `libamdhip64.so`, its builtin headers in `libhiprtc-builtins.so`. It compiles for a target
//! named in the options (`--offload-arch=gfx90a`) without any GPU or driver.

use std::ffi::{c_char, c_int};
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The file (or directory) to load hipRTC from, before the usual places.
pub const HIPRTC_PATH_ENV: &str = "RUSTCCL_HIPRTC_PATH";

/// Library names, newest first: ROCm 6+ has hipRTC on its own, ROCm 5 inside the runtime.
const LIBRARY_NAMES: &[&str] = &["libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"];

use crate::backend::rtc::ProgramCalls;

/// hipRTC's functions: the program calls it shares with NVRTC, and its own.
struct Api {
    calls: ProgramCalls,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    code_size: unsafe extern "C" fn(crate::backend::rtc::Program, *mut usize) -> c_int,
    code: unsafe extern "C" fn(crate::backend::rtc::Program, *mut c_char) -> c_int,
}

/// A loaded hipRTC.
pub struct HipRtc {
    api: Api,
    /// Where it was loaded from, and its version (major, minor).
    pub path: PathBuf,
    pub version: (i32, i32),
    _lib: libloading::Library,
}

impl HipRtc {
    /// The process's hipRTC, loaded on first use; the error is kept and returned to every
    /// caller.
    pub fn get() -> Result<&'static HipRtc> {
        static RTC: OnceLock<Result<HipRtc>> = OnceLock::new();
        RTC.get_or_init(HipRtc::load).as_ref().map_err(Clone::clone)
    }

    fn load() -> Result<HipRtc> {
        let files = super::runtime::library_files(HIPRTC_PATH_ENV, LIBRARY_NAMES);
        super::runtime::open_first(&files, |f| HipRtc::open(f.clone())).map_err(|errors| {
            Error::system(format!(
                "hipRTC not found: none of {} in {HIPRTC_PATH_ENV}, $ROCM_PATH/lib, /opt/rocm/lib, \
                 /usr/lib/x86_64-linux-gnu or the dynamic loader's path could be loaded{}; install ROCm's HIP \
                 runtime (Debian: libamdhip64-dev and libhiprtc-builtins5) or set {HIPRTC_PATH_ENV}",
                LIBRARY_NAMES.join(", "),
                if errors.is_empty() { String::new() } else { format!(" ({})", errors.join("; ")) },
            ))
        })
    }

    fn open(path: PathBuf) -> Result<HipRtc> {
        // SAFETY: loading the library runs its initialisers, which are sound to run.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| Error::system(format!("loading {}: {e}", path.display())))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the type is the function's C signature (hiprtc.h).
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| Error::system(format!("{}: no {} (not a hipRTC): {e}", path.display(), $name)))?
            };
        }
        let api = Api {
            calls: ProgramCalls {
                prefix: "hiprtc",
                error: Error::system,
                error_string: sym!("hiprtcGetErrorString"),
                create: sym!("hiprtcCreateProgram"),
                destroy: sym!("hiprtcDestroyProgram"),
                compile: sym!("hiprtcCompileProgram"),
                log_size: sym!("hiprtcGetProgramLogSize"),
                log: sym!("hiprtcGetProgramLog"),
            },
            version: sym!("hiprtcVersion"),
            code_size: sym!("hiprtcGetCodeSize"),
            code: sym!("hiprtcGetCode"),
        };
        let mut rtc = HipRtc { api, path, version: (0, 0), _lib: lib };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        rtc.check(unsafe { (rtc.api.version)(&mut major, &mut minor) }, "hiprtcVersion")?;
        rtc.version = (major, minor);
        Ok(rtc)
    }

    fn check(&self, r: c_int, what: &str) -> Result<()> {
        self.api.calls.check(r, what)
    }

    /// Compiles `unit` (name, text) with the named `headers` and `options` (the target among
    /// them: `--offload-arch=gfx90a`), returning the code object and the program log.
    pub fn compile(&self, unit: (&str, &str), headers: &[(&str, &str)], options: &[String]) -> Result<(Vec<u8>, String)> {
        self.api.calls.compile(unit, headers, options, |prog| {
            let mut size = 0usize;
            // SAFETY: writes one size.
            self.check(unsafe { (self.api.code_size)(prog, &mut size) }, "hiprtcGetCodeSize")?;
            let mut code = vec![0u8; size];
            // SAFETY: `code` holds the `size` bytes hipRTC writes.
            self.check(unsafe { (self.api.code)(prog, code.as_mut_ptr() as *mut c_char) }, "hiprtcGetCode")?;
            Ok(code)
        })
    }
}
