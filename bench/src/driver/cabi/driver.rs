//! [`CDriver`]: the [`Driver`] that runs the benchmark's operations on a loaded NCCL library
//! (buffers in CUDA device memory, or host memory with `--host-memory`), issuing the calls
//! [`marshal`] makes.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};

use rustccl::types::DataType;

use super::abi::{
    CudaStream, NcclComm, NcclUniqueId, NcclWindow, MEMCPY_D2H, MEMCPY_H2D,
    SCALAR_HOST_IMMEDIATE, WIN_COLL_SYMMETRIC,
};
use super::libraries::{cstr, CudaApi, NcclApi};
use super::marshal::{marshal, Prim};
use crate::driver::{no_graphs, no_register, scalar_bytes, Call, Driver, GraphHandle, Result};
use crate::opts::{REGISTER_LOCAL, REGISTER_NONE, REGISTER_SYMMETRIC};

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
    /// `-R 2`: `ncclMemAlloc` buffers and their windows (in neither list above).
    windows: HashMap<u64, NcclWindow>,
    /// `-R 1`: `ncclCommRegister` handles of buffers of the lists above.
    registrations: HashMap<u64, *mut c_void>,
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
            windows: HashMap::new(),
            registrations: HashMap::new(),
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
                    Prim::AllReduce { send, recv, count, dtype, op } => (
                        (n.all_reduce)(cp(send), mp(recv), count, dtype, op, comm, st),
                        "ncclAllReduce",
                    ),
                    Prim::AllGather { send, recv, count, dtype } => (
                        (n.all_gather)(cp(send), mp(recv), count, dtype, comm, st),
                        "ncclAllGather",
                    ),
                    Prim::ReduceScatter { send, recv, count, dtype, op } => (
                        (n.reduce_scatter)(cp(send), mp(recv), count, dtype, op, comm, st),
                        "ncclReduceScatter",
                    ),
                    Prim::Broadcast { send, recv, count, dtype, root } => (
                        (n.broadcast)(cp(send), mp(recv), count, dtype, root, comm, st),
                        "ncclBroadcast",
                    ),
                    Prim::Reduce { send, recv, count, dtype, op, root } => (
                        (n.reduce)(cp(send), mp(recv), count, dtype, op, root, comm, st),
                        "ncclReduce",
                    ),
                    Prim::Send { buf, count, dtype, peer } => ((n.send)(cp(buf), count, dtype, peer, comm, st), "ncclSend"),
                    Prim::Recv { buf, count, dtype, peer } => ((n.recv)(mp(buf), count, dtype, peer, comm, st), "ncclRecv"),
                }
            };
            if rc != 0 {
                return n.check(&format!("{what} ({p:?})"), rc, comm);
            }
        }
        Ok(())
    }

    /// The runtime for `-G`: CUDA memory and a stream of our own, not `--host-memory`.
    fn graph_runtime(&self) -> Result<&CudaApi> {
        match &self.cuda {
            Some(c) if !self.stream.is_null() => Ok(c),
            _ => Err(no_graphs(
                "--host-memory runs on host memory and the NULL stream; drop --host-memory (or -G)",
            )),
        }
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

    fn alloc_registered(&mut self, bytes: usize, mode: u32) -> Result<u64> {
        let bytes = bytes.max(1);
        let n = &self.nccl;
        match mode {
            REGISTER_NONE => self.alloc(bytes),
            REGISTER_LOCAL => {
                let register = n.need(n.comm_register, "ncclCommRegister", mode)?;
                n.need(n.comm_deregister, "ncclCommDeregister", mode)?;
                let p = self.alloc(bytes)?;
                let mut handle: *mut c_void = std::ptr::null_mut();
                // SAFETY: p is a live buffer of `bytes` bytes of this driver (freed after its
                // deregistration); handle is a valid out-pointer.
                let rc = unsafe { register(self.comm, p as *mut c_void, bytes, &mut handle) };
                if let Err(err) = self.nccl.check(&format!("ncclCommRegister({bytes} bytes)"), rc, self.comm) {
                    let _ = self.free(p);
                    return Err(err);
                }
                self.registrations.insert(p, handle);
                Ok(p)
            }
            REGISTER_SYMMETRIC => {
                let mem_alloc = n.need(n.mem_alloc, "ncclMemAlloc", mode)?;
                let mem_free = n.need(n.mem_free, "ncclMemFree", mode)?;
                let register = n.need(n.comm_window_register, "ncclCommWindowRegister", mode)?;
                n.need(n.comm_window_deregister, "ncclCommWindowDeregister", mode)?;
                let mut p: *mut c_void = std::ptr::null_mut();
                // SAFETY: p is a valid out-pointer (on this rank's device: cudaSetDevice ran).
                let rc = unsafe { mem_alloc(&mut p, bytes) };
                n.check(&format!("ncclMemAlloc({bytes})"), rc, self.comm)?;
                let mut win: NcclWindow = std::ptr::null_mut();
                // SAFETY: p holds `bytes` bytes from ncclMemAlloc; win is a valid out-pointer.
                // Every rank registers its send buffer, then its receive buffer.
                let rc = unsafe { register(self.comm, p, bytes, &mut win, WIN_COLL_SYMMETRIC) };
                if let Err(err) = n.check(
                    &format!("ncclCommWindowRegister({bytes} bytes, NCCL_WIN_COLL_SYMMETRIC)"),
                    rc,
                    self.comm,
                ) {
                    // SAFETY: p came from ncclMemAlloc and is not registered.
                    let _ = unsafe { mem_free(p) };
                    return Err(err);
                }
                self.windows.insert(p as u64, win);
                Ok(p as u64)
            }
            _ => Err(no_register(mode, &self.describe(), "unknown mode")),
        }
    }

    fn free(&mut self, ptr: u64) -> Result<()> {
        if let Some(win) = self.windows.remove(&ptr) {
            let n = &self.nccl;
            let mode = REGISTER_SYMMETRIC;
            let deregister = n.need(n.comm_window_deregister, "ncclCommWindowDeregister", mode)?;
            let mem_free = n.need(n.mem_free, "ncclMemFree", mode)?;
            // SAFETY: win is this communicator's window of ptr, deregistered once.
            let rc = unsafe { deregister(self.comm, win) };
            n.check("ncclCommWindowDeregister", rc, self.comm)?;
            // SAFETY: ptr came from ncclMemAlloc; its window is gone.
            let rc = unsafe { mem_free(ptr as *mut c_void) };
            return n.check("ncclMemFree", rc, self.comm);
        }
        if let Some(handle) = self.registrations.remove(&ptr) {
            let n = &self.nccl;
            let deregister = n.need(n.comm_deregister, "ncclCommDeregister", REGISTER_LOCAL)?;
            // SAFETY: handle came from ncclCommRegister on this communicator, used once.
            let rc = unsafe { deregister(self.comm, handle) };
            n.check("ncclCommDeregister", rc, self.comm)?;
        }
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

    fn graph_begin(&mut self) -> Result<()> {
        let rt = self.graph_runtime()?;
        // SAFETY: graph_runtime checked that the stream is ours (live, not NULL).
        unsafe { rt.begin_capture(self.stream) }
    }

    fn graph_end(&mut self) -> Result<GraphHandle> {
        let rt = self.graph_runtime()?;
        // SAFETY: as in graph_begin.
        unsafe { rt.end_capture(self.stream) }
    }

    fn graph_launch(&mut self, g: &GraphHandle) -> Result<()> {
        let rt = self.graph_runtime()?;
        // SAFETY: as in graph_begin; the graph was captured on this stream's device.
        unsafe { rt.launch_graph(g, self.stream) }
    }

    fn graph_destroy(&mut self, g: GraphHandle) -> Result<()> {
        self.graph_runtime()?.destroy_graph(g)
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
        // While the communicator lives: free deregisters registered buffers (the windows'
        // are in neither list, the others' in one).
        let bufs: Vec<u64> = self
            .windows
            .keys()
            .copied()
            .chain(self.device_bufs.clone())
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
