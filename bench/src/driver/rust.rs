//! The Rust API driver: rustccl in this process, on the backend `RUSTCCL_BACKEND` names
//! (host memory on the host backend). `-G` captures on rustccl's stream through the CUDA
//! runtime ([`super::cabi::graph`]), loaded on the first capture; the cuda backend only.

use std::collections::HashMap;
use std::sync::Arc;

use rustccl::backend::{DeviceBackend, DevicePtr, Stream};
use rustccl::window::{Window, WIN_COLL_SYMMETRIC};
use rustccl::{CommConfig, Communicator, ReduceOp, Scalar, UniqueId};

use super::cabi::{CudaApi, CudaStream};
use super::{no_graphs, no_register, Call, Driver, GraphHandle, Result};
use crate::ops::{Coll, Redop};
use crate::opts::{REGISTER_LOCAL, REGISTER_NONE, REGISTER_SYMMETRIC};

pub struct RustDriver {
    comm: Option<Communicator>,
    backend: Arc<dyn DeviceBackend>,
    device: usize,
    stream: Stream,
    rank: usize,
    nranks: usize,
    allocations: Vec<DevicePtr>,
    /// `-R 2`: the symmetric allocations' windows, by pointer (also in `allocations`).
    windows: HashMap<u64, Window>,
    /// Buffers registered with `register_buffer` (`-R 1`), by address: the registration id.
    registered: HashMap<u64, u64>,
    /// `--cudart`: the CUDA runtime `-G` loads (None: the default names).
    cudart: Option<String>,
    /// The CUDA runtime, once a capture has loaded it.
    graph_rt: Option<CudaApi>,
}

fn e(what: &str) -> impl Fn(rustccl::Error) -> String + '_ {
    move |err| format!("{what}: {err}")
}

impl RustDriver {
    /// Joins the communicator of `id` as `rank` of `nranks`, on device `rank % device_count`.
    pub fn new(nranks: usize, rank: usize, id: &UniqueId) -> Result<RustDriver> {
        let backend = rustccl::backend::select_backend().map_err(e("backend"))?;
        let count = backend.device_count().map_err(e("device_count"))?;
        if count == 0 {
            return Err(format!("the {} backend has no devices", backend.kind()));
        }
        let device = rank % count;
        let comm = Communicator::init_rank_config(
            nranks as i32,
            id,
            rank as i32,
            device as i32,
            &CommConfig::default(),
        )
        .map_err(e("init_rank"))?;
        let backend = comm.backend().clone();
        let stream = backend.create_stream(device).map_err(e("create_stream"))?;
        Ok(RustDriver {
            comm: Some(comm),
            backend,
            device,
            stream,
            rank,
            nranks,
            allocations: Vec::new(),
            windows: HashMap::new(),
            registered: HashMap::new(),
            cudart: None,
            graph_rt: None,
        })
    }

    /// The CUDA runtime `-G` loads (`--cudart`; None: libcudart.so, .so.13, .so.12).
    pub fn with_cudart(mut self, cudart: Option<String>) -> RustDriver {
        self.cudart = cudart;
        self
    }

    /// The CUDA runtime for `-G` (loaded, and pointed at this rank's device, on first use)
    /// and rustccl's stream as a `cudaStream_t`; only on the cuda backend.
    fn graph_runtime(&mut self) -> Result<(&CudaApi, CudaStream)> {
        if !self.backend.capabilities().cuda_handles {
            let kind = self.backend.kind();
            return Err(no_graphs(&format!(
                "the {kind} backend has none (RUSTCCL_BACKEND={}); run on the cuda backend (RUSTCCL_BACKEND=cuda) or drop -G",
                kind.name()
            )));
        }
        if self.graph_rt.is_none() {
            let rt = CudaApi::load(self.cudart.as_deref())
                .map_err(|err| format!("-G captures through the CUDA runtime: {err}"))?;
            // rustccl works in the device's primary context, which the runtime uses too.
            rt.use_device(self.device)?;
            self.graph_rt = Some(rt);
        }
        let rt = self.graph_rt.as_ref().expect("loaded above");
        // rustccl's stream handle is the raw CUstream, which is a cudaStream_t.
        Ok((rt, self.stream.0 as usize as CudaStream))
    }

    fn comm(&self) -> Result<&Communicator> {
        self.comm
            .as_ref()
            .ok_or_else(|| "the communicator is already destroyed".to_string())
    }

    fn reduce_op(call: &Call) -> ReduceOp {
        match call.redop {
            Redop::Sum => ReduceOp::Sum,
            Redop::Prod => ReduceOp::Prod,
            Redop::Max => ReduceOp::Max,
            Redop::Min => ReduceOp::Min,
            Redop::Avg => ReduceOp::Avg,
            Redop::PreMulSum => ReduceOp::PreMulSum(Scalar::Host(call.scalar)),
        }
    }

    fn launch_one(&self, call: &Call) -> rustccl::Result<()> {
        let comm = self.comm().map_err(rustccl::Error::invalid_usage)?;
        let (s, r, c, t, st) = (
            DevicePtr(call.send),
            DevicePtr(call.recv),
            call.count,
            call.dtype,
            self.stream,
        );
        let op = Self::reduce_op(call);
        match call.coll {
            Coll::AllReduce => comm.all_reduce(s, r, c, t, op, st),
            Coll::AllGather => comm.all_gather(s, r, c, t, st),
            Coll::ReduceScatter => comm.reduce_scatter(s, r, c, t, op, st),
            Coll::Broadcast => comm.broadcast(s, r, c, t, call.root, st),
            Coll::Reduce => comm.reduce(s, r, c, t, op, call.root, st),
            Coll::AlltoAll => comm.all_to_all(s, r, c, t, st),
            Coll::AlltoAllv => {
                let v = call
                    .vcounts
                    .as_ref()
                    .ok_or_else(|| rustccl::Error::invalid_usage("alltoallv without counts"))?;
                comm.all_to_allv(
                    s,
                    &v.send_counts,
                    &v.send_displs,
                    r,
                    &v.recv_counts,
                    &v.recv_displs,
                    t,
                    st,
                )
            }
            Coll::Gather => comm.gather(s, r, c, t, call.root, st),
            Coll::Scatter => comm.scatter(s, r, c, t, call.root, st),
            Coll::SendRecv => {
                let n = call.nranks;
                let (to, from) = ((call.rank + 1) % n, (call.rank + n - 1) % n);
                rustccl::group_start();
                let res = comm
                    .send(s, c, t, to as i32, st)
                    .and_then(|_| comm.recv(r, c, t, from as i32, st));
                let end = rustccl::group_end();
                res.and(end)
            }
        }
    }
}

impl Driver for RustDriver {
    fn describe(&self) -> String {
        format!(
            "rust API (rustccl {}), backend {}",
            rustccl::version::RUSTCCL_VERSION,
            self.backend.kind()
        )
    }

    fn device(&self) -> (usize, String) {
        let name = self
            .backend
            .device_name(self.device)
            .unwrap_or_else(|e| format!("? ({e})"));
        (self.device, format!("[{}] {name}", self.backend.kind()))
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn nranks(&self) -> usize {
        self.nranks
    }

    fn alloc(&mut self, bytes: usize) -> Result<u64> {
        let p = self
            .backend
            .alloc(self.device, bytes.max(1))
            .map_err(e("alloc"))?;
        self.allocations.push(p);
        Ok(p.0)
    }

    fn free(&mut self, ptr: u64) -> Result<()> {
        // A window goes before its memory.
        if let Some(w) = self.windows.remove(&ptr) {
            self.comm()?.window_deregister(&w).map_err(e("window_deregister"))?;
        }
        if let Some(id) = self.registered.remove(&ptr) {
            self.comm()?.deregister_buffer(id).map_err(e("deregister_buffer"))?;
        }
        self.allocations.retain(|p| p.0 != ptr);
        self.backend.free(DevicePtr(ptr)).map_err(e("free"))
    }

    fn alloc_registered(&mut self, bytes: usize, mode: u32) -> Result<u64> {
        match mode {
            REGISTER_NONE => self.alloc(bytes),
            REGISTER_SYMMETRIC => {
                let bytes = bytes.max(1);
                let p = self
                    .backend
                    .window_memory_or_err("-R 2")
                    .and_then(|w| w.alloc_symmetric(self.device, bytes))
                    .map_err(e("alloc_symmetric (-R 2)"))?;
                self.allocations.push(p);
                let w = self
                    .comm()?
                    .window_register(p, bytes, WIN_COLL_SYMMETRIC)
                    .map_err(e("window_register (-R 2, WIN_COLL_SYMMETRIC)"))?;
                self.windows.insert(p.0, w);
                Ok(p.0)
            }
            REGISTER_LOCAL => {
                let p = self.alloc(bytes)?;
                let id = self
                    .comm()?
                    .register_buffer(DevicePtr(p), bytes.max(1))
                    .map_err(e("register_buffer (-R 1, ncclCommRegister)"))?;
                self.registered.insert(p, id);
                Ok(p)
            }
            _ => Err(no_register(mode, &self.describe(), "unknown mode")),
        }
    }

    fn upload(&mut self, dst: u64, src: &[u8]) -> Result<()> {
        self.backend
            .copy_to_device(DevicePtr(dst), src, self.stream)
            .map_err(e("copy_to_device"))
    }

    fn download(&mut self, dst: &mut [u8], src: u64) -> Result<()> {
        self.backend
            .copy_from_device(dst, DevicePtr(src), self.stream)
            .map_err(e("copy_from_device"))
    }

    fn memset(&mut self, dst: u64, byte: u8, bytes: usize) -> Result<()> {
        self.backend
            .memset(DevicePtr(dst), byte, bytes, self.stream)
            .map_err(e("memset"))?;
        self.backend
            .synchronize(self.stream)
            .map_err(e("synchronize"))
    }

    fn launch(&mut self, call: &Call, agg: usize) -> Result<()> {
        let what = || {
            format!(
                "{} ({} x {} {})",
                call.coll.name(),
                agg,
                call.count,
                crate::ops::type_name(call.dtype)
            )
        };
        if agg <= 1 {
            return self
                .launch_one(call)
                .map_err(|err| format!("{}: {err}", what()));
        }
        rustccl::group_start();
        let res = (0..agg).try_for_each(|_| self.launch_one(call));
        let end = rustccl::group_end();
        res.and(end).map_err(|err| format!("{}: {err}", what()))
    }

    fn sync(&mut self) -> Result<()> {
        self.backend
            .synchronize(self.stream)
            .map_err(e("synchronize"))
    }

    fn graph_begin(&mut self) -> Result<()> {
        let (rt, st) = self.graph_runtime()?;
        // SAFETY: st is this driver's live stream on the cuda backend (graph_runtime).
        unsafe { rt.begin_capture(st) }
    }

    fn graph_end(&mut self) -> Result<GraphHandle> {
        let (rt, st) = self.graph_runtime()?;
        // SAFETY: as in graph_begin.
        unsafe { rt.end_capture(st) }
    }

    fn graph_launch(&mut self, g: &GraphHandle) -> Result<()> {
        let (rt, st) = self.graph_runtime()?;
        // SAFETY: as in graph_begin; the graph was captured on this stream's device.
        unsafe { rt.launch_graph(g, st) }
    }

    fn graph_destroy(&mut self, g: GraphHandle) -> Result<()> {
        let (rt, _) = self.graph_runtime()?;
        rt.destroy_graph(g)
    }

    fn barrier(&mut self) -> Result<()> {
        self.comm()?.barrier().map_err(e("barrier"))
    }

    fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.comm()?
            .allgather_bytes(mine)
            .map_err(e("allgather_bytes"))
    }

    fn finish(&mut self) -> Result<()> {
        if let Some(comm) = self.comm.as_ref() {
            for (_, w) in std::mem::take(&mut self.windows) {
                comm.window_deregister(&w).map_err(e("window_deregister"))?;
            }
        }
        for p in std::mem::take(&mut self.allocations) {
            self.backend.free(p).map_err(e("free"))?;
        }
        let _ = self.backend.destroy_stream(self.stream);
        if let Some(comm) = self.comm.take() {
            comm.destroy().map_err(e("destroy"))?;
        }
        Ok(())
    }
}
