//! Loading the libraries: dlopen (never closed), symbol resolution, and the tables of
//! resolved functions the driver calls — [`NcclApi`] (the NCCL library) and [`CudaApi`] (the
//! CUDA runtime) — with their readable error messages.

use std::ffi::{c_char, c_int, CStr};

use libloading::Library;

use super::abi::*;
use super::graph::GraphFns;
use crate::driver::Result;

/// Resolves `name` in `lib`, copying the function pointer out (the library is never closed).
///
/// # Safety
/// `T` must be the symbol's true type.
unsafe fn sym<T: Copy>(lib: &'static Library, path: &str, name: &str) -> Result<T> {
    let cname = format!("{name}\0");
    // SAFETY: the caller promises T; the library is leaked, so the pointer stays valid.
    unsafe { lib.get::<T>(cname.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("{path}: cannot resolve {name}: {e}"))
}

/// Resolves `name` in `lib` when it is there.
///
/// # Safety
/// As for [`sym`].
pub(super) unsafe fn opt_sym<T: Copy>(lib: &'static Library, name: &str) -> Option<T> {
    let cname = format!("{name}\0");
    // SAFETY: as for sym.
    unsafe { lib.get::<T>(cname.as_bytes()) }.ok().map(|s| *s)
}

/// Opens a library and never closes it (NCCL keeps threads running until exit).
fn open(path: &str) -> std::result::Result<&'static Library, String> {
    // SAFETY: loading a library runs its initialisers; that is what the user asked for.
    let lib = unsafe { Library::new(path) }.map_err(|e| format!("cannot load {path}: {e}"))?;
    Ok(Box::leak(Box::new(lib)))
}

/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub(super) unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: as promised.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The NCCL functions the benchmark uses.
pub struct NcclApi {
    pub path: String,
    pub(super) get_unique_id: FnGetUniqueId,
    pub(super) comm_init_rank: FnCommInitRank,
    pub(super) comm_destroy: FnCommDestroy,
    pub(super) all_reduce: FnAllReduce,
    pub(super) all_gather: FnAllGather,
    pub(super) reduce_scatter: FnReduceScatter,
    pub(super) broadcast: FnBroadcast,
    pub(super) reduce: FnReduce,
    pub(super) send: FnSend,
    pub(super) recv: FnRecv,
    pub(super) group_start: FnGroup,
    pub(super) group_end: FnGroup,
    pub(super) get_error_string: FnGetErrorString,
    pub(super) red_op_create_pre_mul_sum: FnRedOpCreatePreMulSum,
    pub(super) comm_user_rank: FnCommUserRank,
    pub(super) red_op_destroy: Option<FnRedOpDestroy>,
    pub(super) get_last_error: Option<FnGetLastError>,
    pub(super) get_version: Option<FnGetVersion>,
    /// `-R`: buffer registration (checked when `-R` asks for it, [`NcclApi::need`]).
    pub(super) mem_alloc: Option<FnMemAlloc>,
    pub(super) mem_free: Option<FnMemFree>,
    pub(super) comm_register: Option<FnCommRegister>,
    pub(super) comm_deregister: Option<FnCommDeregister>,
    pub(super) comm_window_register: Option<FnCommWindowRegister>,
    pub(super) comm_window_deregister: Option<FnCommWindowDeregister>,
}

impl NcclApi {
    pub fn load(path: &str) -> Result<NcclApi> {
        let lib = open(path)?;
        // SAFETY: each type is the function's signature in nccl.h (2.28).
        unsafe {
            Ok(NcclApi {
                path: path.to_string(),
                get_unique_id: sym(lib, path, "ncclGetUniqueId")?,
                comm_init_rank: sym(lib, path, "ncclCommInitRank")?,
                comm_destroy: sym(lib, path, "ncclCommDestroy")?,
                all_reduce: sym(lib, path, "ncclAllReduce")?,
                all_gather: sym(lib, path, "ncclAllGather")?,
                reduce_scatter: sym(lib, path, "ncclReduceScatter")?,
                broadcast: sym(lib, path, "ncclBroadcast")?,
                reduce: sym(lib, path, "ncclReduce")?,
                send: sym(lib, path, "ncclSend")?,
                recv: sym(lib, path, "ncclRecv")?,
                group_start: sym(lib, path, "ncclGroupStart")?,
                group_end: sym(lib, path, "ncclGroupEnd")?,
                get_error_string: sym(lib, path, "ncclGetErrorString")?,
                red_op_create_pre_mul_sum: sym(lib, path, "ncclRedOpCreatePreMulSum")?,
                comm_user_rank: sym(lib, path, "ncclCommUserRank")?,
                red_op_destroy: opt_sym(lib, "ncclRedOpDestroy"),
                get_last_error: opt_sym(lib, "ncclGetLastError"),
                get_version: opt_sym(lib, "ncclGetVersion"),
                mem_alloc: opt_sym(lib, "ncclMemAlloc"),
                mem_free: opt_sym(lib, "ncclMemFree"),
                comm_register: opt_sym(lib, "ncclCommRegister"),
                comm_deregister: opt_sym(lib, "ncclCommDeregister"),
                comm_window_register: opt_sym(lib, "ncclCommWindowRegister"),
                comm_window_deregister: opt_sym(lib, "ncclCommWindowDeregister"),
            })
        }
    }

    /// A readable error for return code `rc` of `what` (Ok for ncclSuccess).
    pub(super) fn check(&self, what: &str, rc: c_int, comm: NcclComm) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static string for any value.
        let s = unsafe { cstr((self.get_error_string)(rc)) };
        let mut msg = format!("{what} failed: {s} (ncclResult_t {rc})");
        if let Some(last) = self.get_last_error {
            // SAFETY: ncclGetLastError takes a communicator or NULL and returns a string.
            let l = unsafe { cstr(last(comm)) };
            if !l.is_empty() {
                msg.push_str(&format!("; last error: {l}"));
            }
        }
        Err(msg)
    }

    /// `f`, an optional function of the library, or an error saying that `-R mode` needs it.
    pub(super) fn need<T: Copy>(&self, f: Option<T>, name: &str, mode: u32) -> Result<T> {
        f.ok_or_else(|| {
            format!(
                "-R {mode} ({}) needs {name}, which {} does not export (ncclMemAlloc and ncclCommRegister came with NCCL 2.19, the window functions with 2.27)",
                crate::opts::register_text(mode),
                self.path
            )
        })
    }

    /// `ncclGetVersion`, when the library has it.
    pub fn version(&self) -> Option<i32> {
        let f = self.get_version?;
        let mut v: c_int = 0;
        // SAFETY: v is a valid int.
        (unsafe { f(&mut v) } == 0).then_some(v)
    }

    /// `ncclGetUniqueId`: NVIDIA's library starts the rendezvous root in this process.
    pub fn unique_id(&self) -> Result<NcclUniqueId> {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: id is a valid ncclUniqueId.
        let rc = unsafe { (self.get_unique_id)(&mut id) };
        self.check("ncclGetUniqueId", rc, std::ptr::null_mut())?;
        Ok(id)
    }
}

/// The CUDA runtime functions the benchmark uses.
pub struct CudaApi {
    pub path: String,
    pub(super) set_device: FnCudaInt,
    pub(super) get_device_count: FnCudaIntPtr,
    pub(super) malloc: FnCudaMalloc,
    pub(super) free: FnCudaFree,
    pub(super) memcpy: FnCudaMemcpy,
    pub(super) memset: FnCudaMemset,
    pub(super) stream_create: FnCudaStreamCreate,
    pub(super) stream_synchronize: FnCudaStream,
    pub(super) device_synchronize: FnCudaVoid,
    pub(super) get_error_string: FnCudaErrorString,
    pub(super) stream_destroy: Option<FnCudaStream>,
    pub(super) pci_bus_id: Option<FnCudaPciBusId>,
    /// The graph functions of `-G` ([`super::graph`]), or why they are missing.
    pub(super) graph: std::result::Result<GraphFns, String>,
}

/// The names tried for the CUDA runtime when `--cudart` is not given.
pub const CUDART_NAMES: [&str; 3] = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"];

impl CudaApi {
    pub fn load(path: Option<&str>) -> Result<CudaApi> {
        let (lib, path) = match path {
            Some(p) => (open(p)?, p.to_string()),
            None => {
                let mut errors = Vec::new();
                let mut found = None;
                for name in CUDART_NAMES {
                    match open(name) {
                        Ok(l) => {
                            found = Some((l, name.to_string()));
                            break;
                        }
                        Err(e) => errors.push(e),
                    }
                }
                found.ok_or_else(|| {
                    format!(
                        "cannot load the CUDA runtime ({}); give its path with --cudart, or use --host-memory",
                        errors.join("; ")
                    )
                })?
            }
        };
        let p = path.as_str();
        // SAFETY: each type is the function's signature in cuda_runtime_api.h.
        unsafe {
            Ok(CudaApi {
                set_device: sym(lib, p, "cudaSetDevice")?,
                get_device_count: sym(lib, p, "cudaGetDeviceCount")?,
                malloc: sym(lib, p, "cudaMalloc")?,
                free: sym(lib, p, "cudaFree")?,
                memcpy: sym(lib, p, "cudaMemcpy")?,
                memset: sym(lib, p, "cudaMemset")?,
                stream_create: sym(lib, p, "cudaStreamCreate")?,
                stream_synchronize: sym(lib, p, "cudaStreamSynchronize")?,
                device_synchronize: sym(lib, p, "cudaDeviceSynchronize")?,
                get_error_string: sym(lib, p, "cudaGetErrorString")?,
                stream_destroy: opt_sym(lib, "cudaStreamDestroy"),
                pci_bus_id: opt_sym(lib, "cudaDeviceGetPCIBusId"),
                graph: GraphFns::resolve(lib, p),
                path,
            })
        }
    }

    pub fn check(&self, what: &str, rc: c_int) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: cudaGetErrorString returns a static string for any value.
        let s = unsafe { cstr((self.get_error_string)(rc)) };
        Err(format!("{what} failed: {s} (cudaError_t {rc})"))
    }
}
