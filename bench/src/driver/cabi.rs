//! The C-ABI driver: any libnccl-compatible library (NVIDIA's `libnccl.so.2`, or rustccl's
//! own C library), dlopened with libloading. Device memory and streams come from the CUDA
//! runtime (`libcudart.so`, dlopened too); with `--host-memory` buffers are host memory and
//! the stream is NULL (rustccl's library on its host backend).
//!
//! The pure part — turning a [`Call`] into the sequence of NCCL calls it makes
//! ([`marshal`]) — is separate from the part that calls the library, so it is unit-tested
//! without one.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};

use libloading::Library;
use rustccl::types::DataType;

use super::{scalar_bytes, Call, Driver, Result};
use crate::ops::Coll;

/// `ncclUniqueId`: 128 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    pub internal: [u8; 128],
}

pub type NcclComm = *mut c_void;
pub type CudaStream = *mut c_void;

/// `ncclScalarHostImmediate`.
pub const SCALAR_HOST_IMMEDIATE: c_int = 1;
/// `cudaMemcpyHostToDevice`, `cudaMemcpyDeviceToHost`.
pub const MEMCPY_H2D: c_int = 1;
pub const MEMCPY_D2H: c_int = 2;

// ---- marshalling (pure) ----------------------------------------------------------------------

/// One NCCL call, with its arguments as the C ABI takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prim {
    GroupStart,
    GroupEnd,
    AllReduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
        op: i32,
    },
    AllGather {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
    },
    ReduceScatter {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
        op: i32,
    },
    Broadcast {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
        root: i32,
    },
    Reduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
        op: i32,
        root: i32,
    },
    Send {
        buf: u64,
        count: usize,
        dtype: i32,
        peer: i32,
    },
    Recv {
        buf: u64,
        count: usize,
        dtype: i32,
        peer: i32,
    },
}

/// The NCCL calls that run `call` `agg` times with operator value `op` (a built-in value or
/// one `ncclRedOpCreatePreMulSum` made). AlltoAll, AlltoAllv, Gather, Scatter and SendRecv
/// are groups of sends and receives, as nccl-tests makes them.
pub fn marshal(call: &Call, op: i32, agg: usize) -> Vec<Prim> {
    let mut out = Vec::new();
    if agg > 1 {
        out.push(Prim::GroupStart);
    }
    for _ in 0..agg.max(1) {
        marshal_one(call, op, &mut out);
    }
    if agg > 1 {
        out.push(Prim::GroupEnd);
    }
    out
}

fn marshal_one(call: &Call, op: i32, out: &mut Vec<Prim>) {
    let dtype = call.dtype as i32;
    let e = call.dtype.size() as u64;
    let (send, recv, count, root) = (call.send, call.recv, call.count, call.root);
    let n = call.nranks;
    let rank = call.rank;
    match call.coll {
        Coll::AllReduce => out.push(Prim::AllReduce {
            send,
            recv,
            count,
            dtype,
            op,
        }),
        Coll::AllGather => out.push(Prim::AllGather {
            send,
            recv,
            count,
            dtype,
        }),
        Coll::ReduceScatter => out.push(Prim::ReduceScatter {
            send,
            recv,
            count,
            dtype,
            op,
        }),
        Coll::Broadcast => out.push(Prim::Broadcast {
            send,
            recv,
            count,
            dtype,
            root,
        }),
        Coll::Reduce => out.push(Prim::Reduce {
            send,
            recv,
            count,
            dtype,
            op,
            root,
        }),
        Coll::AlltoAll => {
            out.push(Prim::GroupStart);
            for p in 0..n {
                let off = p as u64 * count as u64 * e;
                out.push(Prim::Send {
                    buf: send + off,
                    count,
                    dtype,
                    peer: p as i32,
                });
                out.push(Prim::Recv {
                    buf: recv + off,
                    count,
                    dtype,
                    peer: p as i32,
                });
            }
            out.push(Prim::GroupEnd);
        }
        Coll::AlltoAllv => {
            out.push(Prim::GroupStart);
            if let Some(v) = &call.vcounts {
                for p in 0..n {
                    out.push(Prim::Send {
                        buf: send + v.send_displs[p] as u64 * e,
                        count: v.send_counts[p],
                        dtype,
                        peer: p as i32,
                    });
                    out.push(Prim::Recv {
                        buf: recv + v.recv_displs[p] as u64 * e,
                        count: v.recv_counts[p],
                        dtype,
                        peer: p as i32,
                    });
                }
            }
            out.push(Prim::GroupEnd);
        }
        Coll::Gather => {
            out.push(Prim::GroupStart);
            out.push(Prim::Send {
                buf: send,
                count,
                dtype,
                peer: root,
            });
            if rank as i32 == root {
                for p in 0..n {
                    out.push(Prim::Recv {
                        buf: recv + p as u64 * count as u64 * e,
                        count,
                        dtype,
                        peer: p as i32,
                    });
                }
            }
            out.push(Prim::GroupEnd);
        }
        Coll::Scatter => {
            out.push(Prim::GroupStart);
            if rank as i32 == root {
                for p in 0..n {
                    out.push(Prim::Send {
                        buf: send + p as u64 * count as u64 * e,
                        count,
                        dtype,
                        peer: p as i32,
                    });
                }
            }
            out.push(Prim::Recv {
                buf: recv,
                count,
                dtype,
                peer: root,
            });
            out.push(Prim::GroupEnd);
        }
        Coll::SendRecv => {
            out.push(Prim::GroupStart);
            out.push(Prim::Send {
                buf: send,
                count,
                dtype,
                peer: ((rank + 1) % n) as i32,
            });
            out.push(Prim::Recv {
                buf: recv,
                count,
                dtype,
                peer: ((rank + n - 1) % n) as i32,
            });
            out.push(Prim::GroupEnd);
        }
    }
}

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

// ---- the libraries ---------------------------------------------------------------------------

type FnGetUniqueId = unsafe extern "C" fn(*mut NcclUniqueId) -> c_int;
type FnCommInitRank = unsafe extern "C" fn(*mut NcclComm, c_int, NcclUniqueId, c_int) -> c_int;
type FnCommDestroy = unsafe extern "C" fn(NcclComm) -> c_int;
type FnAllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    NcclComm,
    CudaStream,
) -> c_int;
type FnAllGather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, NcclComm, CudaStream) -> c_int;
type FnReduceScatter = FnAllReduce;
type FnBroadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    NcclComm,
    CudaStream,
) -> c_int;
type FnReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    NcclComm,
    CudaStream,
) -> c_int;
type FnSend =
    unsafe extern "C" fn(*const c_void, usize, c_int, c_int, NcclComm, CudaStream) -> c_int;
type FnRecv = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, NcclComm, CudaStream) -> c_int;
type FnGroup = unsafe extern "C" fn() -> c_int;
type FnGetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type FnGetLastError = unsafe extern "C" fn(NcclComm) -> *const c_char;
type FnRedOpCreatePreMulSum =
    unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, c_int, NcclComm) -> c_int;
type FnRedOpDestroy = unsafe extern "C" fn(c_int, NcclComm) -> c_int;
type FnCommUserRank = unsafe extern "C" fn(NcclComm, *mut c_int) -> c_int;
type FnGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;

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

unsafe fn opt_sym<T: Copy>(lib: &'static Library, name: &str) -> Option<T> {
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

/// The NCCL functions the benchmark uses.
pub struct NcclApi {
    pub path: String,
    get_unique_id: FnGetUniqueId,
    comm_init_rank: FnCommInitRank,
    comm_destroy: FnCommDestroy,
    all_reduce: FnAllReduce,
    all_gather: FnAllGather,
    reduce_scatter: FnReduceScatter,
    broadcast: FnBroadcast,
    reduce: FnReduce,
    send: FnSend,
    recv: FnRecv,
    group_start: FnGroup,
    group_end: FnGroup,
    get_error_string: FnGetErrorString,
    red_op_create_pre_mul_sum: FnRedOpCreatePreMulSum,
    comm_user_rank: FnCommUserRank,
    red_op_destroy: Option<FnRedOpDestroy>,
    get_last_error: Option<FnGetLastError>,
    get_version: Option<FnGetVersion>,
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
            })
        }
    }

    /// A readable error for return code `rc` of `what` (Ok for ncclSuccess).
    fn check(&self, what: &str, rc: c_int, comm: NcclComm) -> Result<()> {
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

/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: as promised.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

type FnCudaInt = unsafe extern "C" fn(c_int) -> c_int;
type FnCudaIntPtr = unsafe extern "C" fn(*mut c_int) -> c_int;
type FnCudaMalloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type FnCudaFree = unsafe extern "C" fn(*mut c_void) -> c_int;
type FnCudaMemcpy = unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> c_int;
type FnCudaMemset = unsafe extern "C" fn(*mut c_void, c_int, usize) -> c_int;
type FnCudaStreamCreate = unsafe extern "C" fn(*mut CudaStream) -> c_int;
type FnCudaStream = unsafe extern "C" fn(CudaStream) -> c_int;
type FnCudaVoid = unsafe extern "C" fn() -> c_int;
type FnCudaErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type FnCudaPciBusId = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;

/// The CUDA runtime functions the benchmark uses.
pub struct CudaApi {
    pub path: String,
    set_device: FnCudaInt,
    get_device_count: FnCudaIntPtr,
    malloc: FnCudaMalloc,
    free: FnCudaFree,
    memcpy: FnCudaMemcpy,
    memset: FnCudaMemset,
    stream_create: FnCudaStreamCreate,
    stream_synchronize: FnCudaStream,
    device_synchronize: FnCudaVoid,
    get_error_string: FnCudaErrorString,
    stream_destroy: Option<FnCudaStream>,
    pci_bus_id: Option<FnCudaPciBusId>,
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

// ---- the driver ------------------------------------------------------------------------------

/// Host memory of the `--host-memory` mode.
struct HostBuf {
    layout: std::alloc::Layout,
}

pub struct CDriver {
    nccl: NcclApi,
    cuda: Option<CudaApi>,
    comm: NcclComm,
    stream: CudaStream,
    rank: usize,
    nranks: usize,
    device: usize,
    device_desc: String,
    host_bufs: HashMap<u64, HostBuf>,
    device_bufs: Vec<u64>,
    /// PreMulSum operators made so far, by (type, scalar bits).
    premul_ops: HashMap<(i32, u64), c_int>,
    /// Scratch buffers of the barrier and the allgather (pointer, bytes).
    scratch: Option<(u64, u64, usize)>,
}

impl CDriver {
    /// Loads the libraries, picks GPU `rank % device_count` (or host memory) and joins the
    /// communicator of `id`.
    pub fn new(
        lib: &str,
        cudart: Option<&str>,
        host_memory: bool,
        nranks: usize,
        rank: usize,
        id: &NcclUniqueId,
    ) -> Result<CDriver> {
        let nccl = NcclApi::load(lib)?;
        let (cuda, device, device_desc, stream) = if host_memory {
            (
                None,
                0,
                "[host memory] NULL stream".to_string(),
                std::ptr::null_mut(),
            )
        } else {
            let cuda = CudaApi::load(cudart)?;
            let mut count: c_int = 0;
            // SAFETY: count is a valid int.
            cuda.check("cudaGetDeviceCount", unsafe {
                (cuda.get_device_count)(&mut count)
            })?;
            if count <= 0 {
                return Err("cudaGetDeviceCount: no CUDA device".into());
            }
            let device = rank % count as usize;
            // SAFETY: a device index below the count.
            cuda.check(&format!("cudaSetDevice({device})"), unsafe {
                (cuda.set_device)(device as c_int)
            })?;
            let mut stream: CudaStream = std::ptr::null_mut();
            // SAFETY: stream is a valid out-pointer.
            cuda.check("cudaStreamCreate", unsafe {
                (cuda.stream_create)(&mut stream)
            })?;
            let mut desc = format!("[cuda] GPU {device} of {count}");
            if let Some(f) = cuda.pci_bus_id {
                let mut buf = [0 as c_char; 64];
                // SAFETY: buf holds 64 bytes.
                if unsafe { f(buf.as_mut_ptr(), 64, device as c_int) } == 0 {
                    // SAFETY: NUL-terminated by the runtime.
                    desc.push_str(&format!(" pci {}", unsafe { cstr(buf.as_ptr()) }));
                }
            }
            (Some(cuda), device, desc, stream)
        };
        let mut comm: NcclComm = std::ptr::null_mut();
        // SAFETY: comm is a valid out-pointer; the id is passed by value.
        let rc = unsafe { (nccl.comm_init_rank)(&mut comm, nranks as c_int, *id, rank as c_int) };
        nccl.check(
            &format!("ncclCommInitRank(nranks {nranks}, rank {rank})"),
            rc,
            std::ptr::null_mut(),
        )?;
        let mut user_rank: c_int = -1;
        // SAFETY: comm is live; user_rank is a valid int.
        nccl.check(
            "ncclCommUserRank",
            unsafe { (nccl.comm_user_rank)(comm, &mut user_rank) },
            comm,
        )?;
        if user_rank != rank as c_int {
            return Err(format!(
                "ncclCommUserRank says {user_rank}, this process is rank {rank}"
            ));
        }
        Ok(CDriver {
            nccl,
            cuda,
            comm,
            stream,
            rank,
            nranks,
            device,
            device_desc,
            host_bufs: HashMap::new(),
            device_bufs: Vec::new(),
            premul_ops: HashMap::new(),
            scratch: None,
        })
    }

    /// The operator value for `call`: built-in, or a PreMulSum made once per type and scalar.
    fn op_value(&mut self, call: &Call) -> Result<c_int> {
        if let Some(v) = call.redop.nccl_value() {
            return Ok(v);
        }
        let key = (call.dtype as i32, call.scalar.to_bits());
        if let Some(&op) = self.premul_ops.get(&key) {
            return Ok(op);
        }
        let mut scalar = scalar_bytes(call.dtype, call.scalar);
        let mut op: c_int = 0;
        // SAFETY: scalar holds one element of the type (read before the call returns).
        let rc = unsafe {
            (self.nccl.red_op_create_pre_mul_sum)(
                &mut op,
                scalar.as_mut_ptr().cast(),
                call.dtype as c_int,
                SCALAR_HOST_IMMEDIATE,
                self.comm,
            )
        };
        self.nccl.check("ncclRedOpCreatePreMulSum", rc, self.comm)?;
        self.premul_ops.insert(key, op);
        Ok(op)
    }

    fn run_prims(&self, prims: &[Prim]) -> Result<()> {
        let (n, comm, st) = (&self.nccl, self.comm, self.stream);
        let cp = |a: u64| a as *const c_void;
        let mp = |a: u64| a as *mut c_void;
        for p in prims {
            // SAFETY: every pointer is a live buffer of this driver with room for the count
            // (the benchmark's layouts); comm and stream are live.
            let (rc, what) = unsafe {
                match *p {
                    Prim::GroupStart => ((n.group_start)(), "ncclGroupStart"),
                    Prim::GroupEnd => ((n.group_end)(), "ncclGroupEnd"),
                    Prim::AllReduce {
                        send,
                        recv,
                        count,
                        dtype,
                        op,
                    } => (
                        (n.all_reduce)(cp(send), mp(recv), count, dtype, op, comm, st),
                        "ncclAllReduce",
                    ),
                    Prim::AllGather {
                        send,
                        recv,
                        count,
                        dtype,
                    } => (
                        (n.all_gather)(cp(send), mp(recv), count, dtype, comm, st),
                        "ncclAllGather",
                    ),
                    Prim::ReduceScatter {
                        send,
                        recv,
                        count,
                        dtype,
                        op,
                    } => (
                        (n.reduce_scatter)(cp(send), mp(recv), count, dtype, op, comm, st),
                        "ncclReduceScatter",
                    ),
                    Prim::Broadcast {
                        send,
                        recv,
                        count,
                        dtype,
                        root,
                    } => (
                        (n.broadcast)(cp(send), mp(recv), count, dtype, root, comm, st),
                        "ncclBroadcast",
                    ),
                    Prim::Reduce {
                        send,
                        recv,
                        count,
                        dtype,
                        op,
                        root,
                    } => (
                        (n.reduce)(cp(send), mp(recv), count, dtype, op, root, comm, st),
                        "ncclReduce",
                    ),
                    Prim::Send {
                        buf,
                        count,
                        dtype,
                        peer,
                    } => ((n.send)(cp(buf), count, dtype, peer, comm, st), "ncclSend"),
                    Prim::Recv {
                        buf,
                        count,
                        dtype,
                        peer,
                    } => ((n.recv)(mp(buf), count, dtype, peer, comm, st), "ncclRecv"),
                }
            };
            if rc != 0 {
                return n.check(&format!("{what} ({p:?})"), rc, comm);
            }
        }
        Ok(())
    }

    fn ensure_scratch(&mut self, bytes: usize) -> Result<(u64, u64)> {
        if let Some((s, r, b)) = self.scratch {
            if b >= bytes {
                return Ok((s, r));
            }
            self.free(s)?;
            self.free(r)?;
        }
        let b = bytes.max(64);
        let s = self.alloc(b)?;
        let r = self.alloc(b * self.nranks)?;
        self.scratch = Some((s, r, b));
        Ok((s, r))
    }
}

impl Driver for CDriver {
    fn describe(&self) -> String {
        let v = self
            .nccl
            .version()
            .map(|v| format!(" (ncclGetVersion {v})"))
            .unwrap_or_default();
        match &self.cuda {
            Some(c) => format!("C ABI {}{v}, CUDA runtime {}", self.nccl.path, c.path),
            None => format!("C ABI {}{v}, host memory, NULL stream", self.nccl.path),
        }
    }

    fn device(&self) -> (usize, String) {
        (self.device, self.device_desc.clone())
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn nranks(&self) -> usize {
        self.nranks
    }

    fn alloc(&mut self, bytes: usize) -> Result<u64> {
        let bytes = bytes.max(1);
        match &self.cuda {
            Some(c) => {
                let mut p: *mut c_void = std::ptr::null_mut();
                // SAFETY: p is a valid out-pointer.
                c.check(&format!("cudaMalloc({bytes})"), unsafe {
                    (c.malloc)(&mut p, bytes)
                })?;
                self.device_bufs.push(p as u64);
                Ok(p as u64)
            }
            None => {
                let layout =
                    std::alloc::Layout::from_size_align(bytes, 4096).map_err(|e| e.to_string())?;
                // SAFETY: the layout has a non-zero size.
                let p = unsafe { std::alloc::alloc_zeroed(layout) };
                if p.is_null() {
                    return Err(format!("cannot allocate {bytes} bytes of host memory"));
                }
                self.host_bufs.insert(p as u64, HostBuf { layout });
                Ok(p as u64)
            }
        }
    }

    fn free(&mut self, ptr: u64) -> Result<()> {
        match &self.cuda {
            Some(c) => {
                self.device_bufs.retain(|&p| p != ptr);
                // SAFETY: ptr came from cudaMalloc.
                c.check("cudaFree", unsafe { (c.free)(ptr as *mut c_void) })
            }
            None => {
                let b = self
                    .host_bufs
                    .remove(&ptr)
                    .ok_or_else(|| format!("free of unknown host buffer {ptr:#x}"))?;
                // SAFETY: allocated with this layout.
                unsafe { std::alloc::dealloc(ptr as *mut u8, b.layout) };
                Ok(())
            }
        }
    }

    fn upload(&mut self, dst: u64, src: &[u8]) -> Result<()> {
        match &self.cuda {
            Some(c) => {
                // SAFETY: dst is device memory of at least src.len() bytes (the caller's layout).
                let rc = unsafe {
                    (c.memcpy)(
                        dst as *mut c_void,
                        src.as_ptr().cast(),
                        src.len(),
                        MEMCPY_H2D,
                    )
                };
                c.check("cudaMemcpy(host to device)", rc)
            }
            None => {
                // SAFETY: dst is a host buffer of this driver with room for src.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
                Ok(())
            }
        }
    }

    fn download(&mut self, dst: &mut [u8], src: u64) -> Result<()> {
        match &self.cuda {
            Some(c) => {
                // SAFETY: src is device memory of at least dst.len() bytes.
                let rc = unsafe {
                    (c.memcpy)(
                        dst.as_mut_ptr().cast(),
                        src as *const c_void,
                        dst.len(),
                        MEMCPY_D2H,
                    )
                };
                c.check("cudaMemcpy(device to host)", rc)
            }
            None => {
                // SAFETY: src is a host buffer of this driver holding dst.len() bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len())
                };
                Ok(())
            }
        }
    }

    fn memset(&mut self, dst: u64, byte: u8, bytes: usize) -> Result<()> {
        match &self.cuda {
            Some(c) => {
                // SAFETY: dst is device memory of at least `bytes` bytes.
                c.check("cudaMemset", unsafe {
                    (c.memset)(dst as *mut c_void, c_int::from(byte), bytes)
                })?;
                // SAFETY: no arguments.
                c.check("cudaDeviceSynchronize", unsafe { (c.device_synchronize)() })
            }
            None => {
                // SAFETY: dst is a host buffer of this driver of at least `bytes` bytes.
                unsafe { std::ptr::write_bytes(dst as *mut u8, byte, bytes) };
                Ok(())
            }
        }
    }

    fn launch(&mut self, call: &Call, agg: usize) -> Result<()> {
        let op = self.op_value(call)?;
        let prims = marshal(call, op, agg);
        self.run_prims(&prims)
    }

    fn sync(&mut self) -> Result<()> {
        match &self.cuda {
            // SAFETY: the stream is live.
            Some(c) => c.check("cudaStreamSynchronize", unsafe {
                (c.stream_synchronize)(self.stream)
            }),
            None => Ok(()),
        }
    }

    fn barrier(&mut self) -> Result<()> {
        let (s, r) = self.ensure_scratch(64)?;
        let prim = Prim::AllReduce {
            send: s,
            recv: r,
            count: 1,
            dtype: DataType::Int32 as i32,
            op: 0,
        };
        self.run_prims(&[prim])?;
        self.sync()
    }

    fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let len = mine.len();
        let (s, r) = self.ensure_scratch(len)?;
        self.upload(s, mine)?;
        let prim = Prim::AllGather {
            send: s,
            recv: r,
            count: len,
            dtype: DataType::Uint8 as i32,
        };
        self.run_prims(&[prim])?;
        self.sync()?;
        let mut all = vec![0u8; len * self.nranks];
        self.download(&mut all, r)?;
        Ok(all
            .chunks(len.max(1))
            .take(self.nranks)
            .map(|c| c.to_vec())
            .collect())
    }

    fn finish(&mut self) -> Result<()> {
        self.sync()?;
        if let Some(destroy) = self.nccl.red_op_destroy {
            for (_, op) in std::mem::take(&mut self.premul_ops) {
                // SAFETY: op was made on this communicator.
                self.nccl.check(
                    "ncclRedOpDestroy",
                    unsafe { destroy(op, self.comm) },
                    self.comm,
                )?;
            }
        }
        self.scratch = None;
        let bufs: Vec<u64> = self
            .device_bufs
            .clone()
            .into_iter()
            .chain(self.host_bufs.keys().copied())
            .collect();
        for p in bufs {
            self.free(p)?;
        }
        if !self.comm.is_null() {
            // SAFETY: the communicator is live and destroyed once.
            let rc = unsafe { (self.nccl.comm_destroy)(self.comm) };
            self.comm = std::ptr::null_mut();
            self.nccl
                .check("ncclCommDestroy", rc, std::ptr::null_mut())?;
        }
        if let (Some(c), false) = (&self.cuda, self.stream.is_null()) {
            if let Some(d) = c.stream_destroy {
                // SAFETY: the stream is live and destroyed once.
                c.check("cudaStreamDestroy", unsafe { d(self.stream) })?;
            }
            self.stream = std::ptr::null_mut();
        }
        Ok(())
    }
}
