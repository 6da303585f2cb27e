//! ROCm's HIP runtime (`libamdhip64`), loaded at run time (nothing of ROCm at build time): the
//! library search the runtime and hipRTC share, the table of the runtime calls the backend
//! makes (every symbol checked once, at load, so no later call can miss) and the result
//! check.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The file (or directory) to load the HIP runtime from, before the usual places.
pub const HIP_PATH_ENV: &str = "RUSTCCL_HIP_PATH";

const LIBRARY_NAMES: &[&str] = &["libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"];

/// Where ROCm libraries are looked for, in order: the file or directory `env` names, then
/// `$ROCM_PATH/lib`, `/opt/rocm/lib`, Debian's multiarch directory, and the dynamic loader's
/// path (bare names). The runtime and hipRTC both search this way.
pub(crate) fn library_files(env: &str, names: &[&str]) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = Vec::new();
    if let Some(p) = crate::params::env_str(env).map(PathBuf::from) {
        if p.is_dir() {
            files.extend(names.iter().map(|n| p.join(n)));
        } else {
            files.push(p);
        }
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(root) = std::env::var_os("ROCM_PATH").filter(|p| !p.is_empty()) {
        dirs.push(PathBuf::from(root).join("lib"));
    }
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    dirs.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    for dir in dirs {
        files.extend(names.iter().map(|n| dir.join(n)));
    }
    files.extend(names.iter().map(PathBuf::from));
    files
}

/// Opens the first of `files` that loads with `open`: bare names through the dynamic loader,
/// paths only where they exist. The errors of the files that exist but did not load.
pub(crate) fn open_first<T>(files: &[PathBuf], open: impl Fn(&PathBuf) -> Result<T>) -> std::result::Result<T, Vec<String>> {
    let mut errors = Vec::new();
    for file in files {
        if file.is_absolute() && !file.exists() {
            continue;
        }
        match open(file) {
            Ok(t) => return Ok(t),
            Err(e) if file.is_absolute() => errors.push(e.message),
            Err(_) => {}
        }
    }
    Err(errors)
}

/// `hipIpcMemHandle_t`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct IpcMemHandle(pub [u8; 64]);

pub(crate) type HipError = c_int;
pub(crate) const HIP_SUCCESS: HipError = 0;
pub(crate) const HIP_ERROR_NOT_READY: HipError = 600;
pub(crate) const HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED: HipError = 704;
pub(crate) type Handle = *mut c_void;

macro_rules! runtime_calls {
    ($( $field:ident = $name:literal : fn($($arg:ty),*); )*) => {
        /// The runtime calls the backend makes (hip_runtime_api.h's signatures; every one
        /// returns a `hipError_t`).
        pub(crate) struct Calls {
            $( pub $field: unsafe extern "C" fn($($arg),*) -> HipError, )*
        }

        impl Calls {
            fn load(lib: &libloading::Library, path: &std::path::Path) -> Result<Calls> {
                Ok(Calls {
                    $( $field: {
                        // SAFETY: the type is the function's C signature (hip_runtime_api.h).
                        *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|_| Error::system(format!(
                            "{}: the HIP runtime lacks {} (it is older than the ROCm 5.2 rustccl needs); update ROCm",
                            path.display(), $name
                        )))?
                    }, )*
                })
            }
        }
    };
}

runtime_calls! {
    init = "hipInit": fn(c_uint);
    runtime_version = "hipRuntimeGetVersion": fn(*mut c_int);
    device_count = "hipGetDeviceCount": fn(*mut c_int);
    get_device = "hipGetDevice": fn(*mut c_int);
    set_device = "hipSetDevice": fn(c_int);
    device_name = "hipDeviceGetName": fn(*mut c_char, c_int, c_int);
    device_properties = "hipGetDeviceProperties": fn(*mut c_void, c_int);
    can_access_peer = "hipDeviceCanAccessPeer": fn(*mut c_int, c_int, c_int);
    enable_peer_access = "hipDeviceEnablePeerAccess": fn(c_int, c_uint);
    mem_get_info = "hipMemGetInfo": fn(*mut usize, *mut usize);
    malloc_with_flags = "hipExtMallocWithFlags": fn(*mut Handle, usize, c_uint);
    free = "hipFree": fn(Handle);
    host_malloc = "hipHostMalloc": fn(*mut Handle, usize, c_uint);
    host_free = "hipHostFree": fn(Handle);
    host_get_device_pointer = "hipHostGetDevicePointer": fn(*mut Handle, Handle, c_uint);
    host_register = "hipHostRegister": fn(Handle, usize, c_uint);
    host_unregister = "hipHostUnregister": fn(Handle);
    memcpy_async = "hipMemcpyAsync": fn(Handle, *const c_void, usize, c_int, Handle);
    memset_d8_async = "hipMemsetD8Async": fn(Handle, u8, usize, Handle);
    mem_get_address_range = "hipMemGetAddressRange": fn(*mut Handle, *mut usize, Handle);
    pointer_get_attributes = "hipPointerGetAttributes": fn(*mut c_void, *const c_void);
    stream_create = "hipStreamCreateWithFlags": fn(*mut Handle, c_uint);
    stream_destroy = "hipStreamDestroy": fn(Handle);
    stream_synchronize = "hipStreamSynchronize": fn(Handle);
    stream_query = "hipStreamQuery": fn(Handle);
    stream_wait_event = "hipStreamWaitEvent": fn(Handle, Handle, c_uint);
    stream_capture_info = "hipStreamGetCaptureInfo": fn(Handle, *mut c_int, *mut u64);
    exchange_capture_mode = "hipThreadExchangeStreamCaptureMode": fn(*mut c_int);
    stream_write_value32 = "hipStreamWriteValue32": fn(Handle, Handle, u32, c_uint);
    stream_wait_value32 = "hipStreamWaitValue32": fn(Handle, Handle, u32, c_uint, u32);
    event_create = "hipEventCreateWithFlags": fn(*mut Handle, c_uint);
    event_record = "hipEventRecord": fn(Handle, Handle);
    event_query = "hipEventQuery": fn(Handle);
    event_synchronize = "hipEventSynchronize": fn(Handle);
    event_destroy = "hipEventDestroy": fn(Handle);
    ipc_get_mem_handle = "hipIpcGetMemHandle": fn(*mut IpcMemHandle, Handle);
    ipc_open_mem_handle = "hipIpcOpenMemHandle": fn(*mut Handle, IpcMemHandle, c_uint);
    ipc_close_mem_handle = "hipIpcCloseMemHandle": fn(Handle);
    module_load_data = "hipModuleLoadData": fn(*mut Handle, *const c_void);
    module_get_function = "hipModuleGetFunction": fn(*mut Handle, Handle, *const c_char);
    module_launch_kernel = "hipModuleLaunchKernel": fn(Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle, *mut *mut c_void, *mut *mut c_void);
}

/// `hipLaunchHostFunc(stream, fn, userData)`.
pub(crate) type LaunchHostFunc = unsafe extern "C" fn(Handle, unsafe extern "C" fn(*mut c_void), *mut c_void) -> HipError;

/// A loaded HIP runtime: its calls, where it came from and its version.
pub(crate) struct Runtime {
    pub calls: Calls,
    /// ROCm 6's `hipGetDevicePropertiesR0600` (the properties struct grew; the old symbol
    /// keeps the old layout), and `hipStreamGetDevice` (ROCm 6; without it a caller's stream
    /// is taken to run on the current device).
    pub device_properties_r0600: Option<unsafe extern "C" fn(*mut c_void, c_int) -> HipError>,
    pub stream_get_device: Option<unsafe extern "C" fn(Handle, *mut c_int) -> HipError>,
    /// `hipLaunchHostFunc` (Debian's ROCm 5 runtime lacks it; only captured launches that
    /// receive over the network need it).
    pub launch_host_func: Option<LaunchHostFunc>,
    error_name: unsafe extern "C" fn(HipError) -> *const c_char,
    error_string: unsafe extern "C" fn(HipError) -> *const c_char,
    pub path: PathBuf,
    /// `hipRuntimeGetVersion`: `HIP_VERSION`, major * 10^7 + minor * 10^5 + patch.
    pub version: i32,
    _lib: libloading::Library,
}

impl Runtime {
    /// The process's HIP runtime, loaded on first use (never unloaded: it keeps threads); the
    /// error (what to install) is kept and returned to every caller. Does not call `hipInit`.
    pub(crate) fn get() -> Result<&'static Runtime> {
        static RT: OnceLock<Result<Runtime>> = OnceLock::new();
        RT.get_or_init(Runtime::load).as_ref().map_err(Clone::clone)
    }

    fn load() -> Result<Runtime> {
        let files = library_files(HIP_PATH_ENV, LIBRARY_NAMES);
        open_first(&files, |f| Runtime::open(f.clone())).map_err(|errors| {
            Error::system(format!(
                "no HIP runtime: none of {} could be loaded from {HIP_PATH_ENV}, $ROCM_PATH/lib, /opt/rocm/lib, \
                 /usr/lib/x86_64-linux-gnu or the dynamic loader's path{}; install ROCm (its libamdhip64) for AMD \
                 GPUs, or use RUSTCCL_BACKEND=host or cuda",
                LIBRARY_NAMES.join(", "),
                if errors.is_empty() { String::new() } else { format!(" ({})", errors.join("; ")) },
            ))
        })
    }

    fn open(path: PathBuf) -> Result<Runtime> {
        // SAFETY: loading the HIP runtime runs its initialisers, which are sound to run.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| Error::system(format!("loading {}: {e}", path.display())))?;
        let calls = Calls::load(&lib, &path)?;
        // SAFETY: the types are the functions' C signatures (hip_runtime_api.h).
        let (error_name, error_string, device_properties_r0600, stream_get_device, launch_host_func) = unsafe {
            let text = |name: &[u8]| lib.get::<unsafe extern "C" fn(HipError) -> *const c_char>(name).map(|s| *s);
            let (Ok(n), Ok(s)) = (text(b"hipGetErrorName\0"), text(b"hipGetErrorString\0")) else {
                return Err(Error::system(format!("{}: not a HIP runtime (no hipGetErrorName)", path.display())));
            };
            (
                n,
                s,
                lib.get(b"hipGetDevicePropertiesR0600\0").ok().map(|s| *s),
                lib.get(b"hipStreamGetDevice\0").ok().map(|s| *s),
                lib.get(b"hipLaunchHostFunc\0").ok().map(|s| *s),
            )
        };
        let mut rt = Runtime { calls, device_properties_r0600, stream_get_device, launch_host_func, error_name, error_string, path, version: 0, _lib: lib };
        let mut v = 0;
        // SAFETY: writes one int; allowed before hipInit.
        rt.check(unsafe { (rt.calls.runtime_version)(&mut v) }, "hipRuntimeGetVersion")?;
        rt.version = v;
        Ok(rt)
    }

    /// ROCm's major version (5, 6, 7).
    pub(crate) fn major(&self) -> i32 {
        self.version / 10_000_000
    }

    /// The runtime's name and description of `r`.
    pub(crate) fn error_text(&self, r: HipError) -> (String, String) {
        let text = |f: unsafe extern "C" fn(HipError) -> *const c_char| {
            // SAFETY: returns a static NUL-terminated string (or null for nothing).
            let p = unsafe { f(r) };
            // SAFETY: as above.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        (text(self.error_name).unwrap_or_else(|| "hipErrorUnknown".into()), text(self.error_string).unwrap_or_default())
    }

    /// `UnhandledCudaError` (NCCL's code for a failed GPU runtime call, RCCL's too) for
    /// `what` having returned `r`.
    pub(crate) fn error(&self, r: HipError, what: &str) -> Error {
        let (name, desc) = self.error_text(r);
        Error::cuda(format!("{what} failed: {name} ({r}): {desc}"))
    }

    #[inline]
    pub(crate) fn check(&self, r: HipError, what: &str) -> Result<()> {
        if r == HIP_SUCCESS {
            Ok(())
        } else {
            Err(self.error(r, what))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the runtime, loading it says what is missing and what to install; with one
    /// (CI installs Debian's runtime), every call the backend makes was found in it.
    #[test]
    fn the_hip_runtime_is_found_or_said_missing() {
        let lib = Runtime::get();
        match &lib {
            Ok(rt) => assert!(rt.path.to_string_lossy().contains("amdhip64") && rt.version >= 50_000_000, "{} {}", rt.path.display(), rt.version),
            Err(e) => assert!(e.message.contains("no HIP runtime") && e.message.contains("install ROCm"), "{}", e.message),
        }
        if std::env::var("RUSTCCL_TEST_REQUIRE_HIPRTC").as_deref() == Ok("1") {
            assert!(lib.is_ok(), "the HIP runtime should be installed here: {:?}", lib.err().map(|e| e.message));
        }
    }

    #[test]
    fn libraries_are_searched_in_the_named_place_first_then_rocm_then_the_loader() {
        let files = library_files("RUSTCCL_TEST_UNSET_HIP_PATH", &["libx.so.1", "libx.so"]);
        let at = |f: &str| files.iter().position(|p| p == &PathBuf::from(f)).unwrap_or_else(|| panic!("{f} not in {files:?}"));
        assert!(at("/opt/rocm/lib/libx.so.1") < at("/opt/rocm/lib/libx.so"));
        assert!(at("/opt/rocm/lib/libx.so") < at("/usr/lib/x86_64-linux-gnu/libx.so.1"));
        assert!(at("/usr/lib/x86_64-linux-gnu/libx.so") < at("libx.so.1"), "bare names (the loader's path) last");
        let r: std::result::Result<(), _> = open_first(&[PathBuf::from("/nonexistent/libx.so"), PathBuf::from("libnothing-here.so.9")], |f| {
            Err(Error::system(format!("cannot open {}", f.display())))
        });
        assert_eq!(r.unwrap_err(), Vec::<String>::new(), "missing files and bare names that fail are not errors to report");
    }
}
