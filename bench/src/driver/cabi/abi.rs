//! The C types of the NCCL and CUDA runtime ABIs the driver uses: `ncclUniqueId` (and the
//! hex form the launcher hands to the ranks), the opaque handles, the constants, and the
//! signatures of the functions resolved in the libraries (as in `nccl.h` 2.28 and
//! `cuda_runtime_api.h`).

use std::ffi::{c_char, c_int, c_void};

use crate::driver::Result;

/// `ncclUniqueId`: 128 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    pub internal: [u8; 128],
}

pub type NcclComm = *mut c_void;
/// `ncclWindow_t`: opaque.
pub type NcclWindow = *mut c_void;
pub type CudaStream = *mut c_void;
/// `cudaGraph_t` and `cudaGraphExec_t`: opaque handles.
pub type CudaGraph = *mut c_void;
pub type CudaGraphExec = *mut c_void;

/// `NCCL_WIN_COLL_SYMMETRIC`: the window flag of `-R 2`.
pub const WIN_COLL_SYMMETRIC: c_int = 1;
/// `ncclScalarHostImmediate`.
pub const SCALAR_HOST_IMMEDIATE: c_int = 1;
/// `cudaStreamCaptureModeThreadLocal` (`Global` is 0, `Relaxed` 2): what nccl-tests' `-G`
/// captures with. Only the capturing thread is barred from calls that are unsafe during a
/// capture (`cudaMalloc`, synchronous copies); the library's other threads (proxies, which may
/// allocate while a first call connects) stay free, which `Global` would forbid them.
pub const CAPTURE_MODE_THREAD_LOCAL: c_int = 1;
/// `cudaMemcpyHostToDevice`, `cudaMemcpyDeviceToHost`.
pub const MEMCPY_H2D: c_int = 1;
pub const MEMCPY_D2H: c_int = 2;

/// The unique id as the launcher hands it to the ranks: 256 hex digits.
pub fn id_to_hex(id: &NcclUniqueId) -> String {
    id.internal.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn id_from_hex(s: &str) -> Result<NcclUniqueId> {
    let s = s.trim();
    if s.len() != 256 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "a unique id is 256 hex digits (128 bytes); got {} characters",
            s.len()
        ));
    }
    let mut id = NcclUniqueId { internal: [0; 128] };
    for (i, b) in id.internal.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    Ok(id)
}

// ---- NCCL functions --------------------------------------------------------------------------

pub(super) type FnGetUniqueId = unsafe extern "C" fn(*mut NcclUniqueId) -> c_int;
pub(super) type FnCommInitRank =
    unsafe extern "C" fn(*mut NcclComm, c_int, NcclUniqueId, c_int) -> c_int;
pub(super) type FnCommDestroy = unsafe extern "C" fn(NcclComm) -> c_int;
pub(super) type FnAllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    NcclComm,
    CudaStream,
) -> c_int;
pub(super) type FnAllGather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, NcclComm, CudaStream) -> c_int;
pub(super) type FnReduceScatter = FnAllReduce;
/// `ncclBroadcast` has `ncclAllReduce`'s C signature (its extra int is the root, not the
/// operator).
pub(super) type FnBroadcast = FnAllReduce;
pub(super) type FnReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    NcclComm,
    CudaStream,
) -> c_int;
pub(super) type FnSend =
    unsafe extern "C" fn(*const c_void, usize, c_int, c_int, NcclComm, CudaStream) -> c_int;
pub(super) type FnRecv =
    unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, NcclComm, CudaStream) -> c_int;
pub(super) type FnGroup = unsafe extern "C" fn() -> c_int;
pub(super) type FnGetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
pub(super) type FnGetLastError = unsafe extern "C" fn(NcclComm) -> *const c_char;
pub(super) type FnRedOpCreatePreMulSum =
    unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, c_int, NcclComm) -> c_int;
pub(super) type FnRedOpDestroy = unsafe extern "C" fn(c_int, NcclComm) -> c_int;
pub(super) type FnCommUserRank = unsafe extern "C" fn(NcclComm, *mut c_int) -> c_int;
pub(super) type FnGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
/// `ncclMemAlloc(void** ptr, size_t size)`, `ncclMemFree(void* ptr)` (NCCL 2.19+).
pub(super) type FnMemAlloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
pub(super) type FnMemFree = unsafe extern "C" fn(*mut c_void) -> c_int;
/// `ncclCommRegister(comm, buff, size, void** handle)`, `ncclCommDeregister(comm, handle)`.
pub(super) type FnCommRegister =
    unsafe extern "C" fn(NcclComm, *mut c_void, usize, *mut *mut c_void) -> c_int;
pub(super) type FnCommDeregister = unsafe extern "C" fn(NcclComm, *mut c_void) -> c_int;
/// `ncclCommWindowRegister(comm, buff, size, ncclWindow_t* win, int winFlags)`,
/// `ncclCommWindowDeregister(comm, win)` (NCCL 2.27+).
pub(super) type FnCommWindowRegister =
    unsafe extern "C" fn(NcclComm, *mut c_void, usize, *mut NcclWindow, c_int) -> c_int;
pub(super) type FnCommWindowDeregister = unsafe extern "C" fn(NcclComm, NcclWindow) -> c_int;

// ---- CUDA runtime functions ------------------------------------------------------------------

pub(super) type FnCudaInt = unsafe extern "C" fn(c_int) -> c_int;
pub(super) type FnCudaIntPtr = unsafe extern "C" fn(*mut c_int) -> c_int;
pub(super) type FnCudaMalloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
pub(super) type FnCudaFree = unsafe extern "C" fn(*mut c_void) -> c_int;
pub(super) type FnCudaMemcpy =
    unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> c_int;
pub(super) type FnCudaMemset = unsafe extern "C" fn(*mut c_void, c_int, usize) -> c_int;
pub(super) type FnCudaStreamCreate = unsafe extern "C" fn(*mut CudaStream) -> c_int;
pub(super) type FnCudaStream = unsafe extern "C" fn(CudaStream) -> c_int;
pub(super) type FnCudaVoid = unsafe extern "C" fn() -> c_int;
pub(super) type FnCudaErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
pub(super) type FnCudaPciBusId = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;

// ---- CUDA runtime graph functions (`-G`; the same signatures in CUDA 11.4 to 13) -------------

pub(super) type FnCudaStreamBeginCapture = unsafe extern "C" fn(CudaStream, c_int) -> c_int;
pub(super) type FnCudaStreamEndCapture = unsafe extern "C" fn(CudaStream, *mut CudaGraph) -> c_int;
/// `cudaGraphInstantiateWithFlags(cudaGraphExec_t*, cudaGraph_t, unsigned long long flags)`:
/// the three-argument form in every runtime since 11.4 (where `cudaGraphInstantiate` itself
/// still took five arguments).
pub(super) type FnCudaGraphInstantiateWithFlags =
    unsafe extern "C" fn(*mut CudaGraphExec, CudaGraph, std::ffi::c_ulonglong) -> c_int;
pub(super) type FnCudaGraphLaunch = unsafe extern "C" fn(CudaGraphExec, CudaStream) -> c_int;
pub(super) type FnCudaGraphExecDestroy = unsafe extern "C" fn(CudaGraphExec) -> c_int;
pub(super) type FnCudaGraphDestroy = unsafe extern "C" fn(CudaGraph) -> c_int;
