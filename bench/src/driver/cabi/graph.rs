//! CUDA graphs through the CUDA runtime, for `-G` (nccl-tests' `--cudagraph`): capture the
//! calls enqueued on a stream, instantiate them, replay the instance, destroy it. Both drivers
//! use these (the C driver on its runtime stream, the Rust driver on rustccl's stream, a
//! `CUstream` and so a valid `cudaStream_t`).
//!
//! Capture mode: `cudaStreamCaptureModeThreadLocal`, as nccl-tests (see
//! [`CAPTURE_MODE_THREAD_LOCAL`]).

use std::ffi::c_int;

use libloading::Library;

use super::abi::*;
use super::libraries::{opt_sym, CudaApi};
use crate::driver::{GraphHandle, Result};

/// The runtime's graph functions.
pub struct GraphFns {
    begin_capture: FnCudaStreamBeginCapture,
    end_capture: FnCudaStreamEndCapture,
    instantiate: FnCudaGraphInstantiateWithFlags,
    launch: FnCudaGraphLaunch,
    exec_destroy: FnCudaGraphExecDestroy,
    destroy: FnCudaGraphDestroy,
}

impl GraphFns {
    /// Resolves the graph functions in the runtime at `path`; Err names the missing ones.
    pub(super) fn resolve(
        lib: &'static Library,
        path: &str,
    ) -> std::result::Result<GraphFns, String> {
        // SAFETY: each type is the function's signature in cuda_runtime_api.h (11.4 to 13).
        let (b, e, i, l, xd, d) = unsafe {
            (
                opt_sym::<FnCudaStreamBeginCapture>(lib, "cudaStreamBeginCapture"),
                opt_sym::<FnCudaStreamEndCapture>(lib, "cudaStreamEndCapture"),
                opt_sym::<FnCudaGraphInstantiateWithFlags>(lib, "cudaGraphInstantiateWithFlags"),
                opt_sym::<FnCudaGraphLaunch>(lib, "cudaGraphLaunch"),
                opt_sym::<FnCudaGraphExecDestroy>(lib, "cudaGraphExecDestroy"),
                opt_sym::<FnCudaGraphDestroy>(lib, "cudaGraphDestroy"),
            )
        };
        match (b, e, i, l, xd, d) {
            (
                Some(begin_capture),
                Some(end_capture),
                Some(instantiate),
                Some(launch),
                Some(exec_destroy),
                Some(destroy),
            ) => Ok(GraphFns {
                begin_capture,
                end_capture,
                instantiate,
                launch,
                exec_destroy,
                destroy,
            }),
            _ => {
                let names = [
                    ("cudaStreamBeginCapture", b.is_some()),
                    ("cudaStreamEndCapture", e.is_some()),
                    ("cudaGraphInstantiateWithFlags", i.is_some()),
                    ("cudaGraphLaunch", l.is_some()),
                    ("cudaGraphExecDestroy", xd.is_some()),
                    ("cudaGraphDestroy", d.is_some()),
                ];
                let missing: Vec<&str> = names
                    .iter()
                    .filter(|(_, ok)| !ok)
                    .map(|(n, _)| *n)
                    .collect();
                Err(format!(
                    "CUDA graphs (-G) need the CUDA runtime's graph functions; {path} lacks {} (CUDA 11.4 or later has them; give another runtime with --cudart)",
                    missing.join(", ")
                ))
            }
        }
    }
}

impl CudaApi {
    fn graph_fns(&self) -> Result<&GraphFns> {
        self.graph.as_ref().map_err(|e| e.clone())
    }

    /// `cudaSetDevice(device)`: the device the runtime's calls on this thread go to.
    pub fn use_device(&self, device: usize) -> Result<()> {
        // SAFETY: plain int argument; the runtime checks the range.
        self.check(&format!("cudaSetDevice({device})"), unsafe {
            (self.set_device)(device as c_int)
        })
    }

    /// Starts capturing the work enqueued on `stream` (not the NULL stream) from this thread.
    ///
    /// # Safety
    /// `stream` is a live CUDA stream (or NULL, refused).
    pub unsafe fn begin_capture(&self, stream: CudaStream) -> Result<()> {
        let f = self.graph_fns()?;
        if stream.is_null() {
            return Err("CUDA graphs (-G): the NULL stream cannot be captured".into());
        }
        // SAFETY: a live stream of this runtime (or the driver API's, the same handle).
        self.check(
            "cudaStreamBeginCapture(cudaStreamCaptureModeThreadLocal)",
            unsafe { (f.begin_capture)(stream, CAPTURE_MODE_THREAD_LOCAL) },
        )
    }

    /// Ends the capture on `stream` and instantiates the graph. On error nothing is left
    /// behind (the graph is destroyed when the instantiation fails).
    ///
    /// # Safety
    /// `stream` is a live CUDA stream.
    pub unsafe fn end_capture(&self, stream: CudaStream) -> Result<GraphHandle> {
        let f = self.graph_fns()?;
        let mut graph: CudaGraph = std::ptr::null_mut();
        // SAFETY: graph is a valid out-pointer; the stream is live.
        let rc = unsafe { (f.end_capture)(stream, &mut graph) };
        if rc != 0 {
            if !graph.is_null() {
                // SAFETY: a graph the runtime just returned, destroyed once.
                let _ = unsafe { (f.destroy)(graph) };
            }
            // rc is not cudaSuccess: this returns the error.
            self.check("cudaStreamEndCapture (a call during the capture could not be captured, or the capture was invalidated)", rc)?;
        }
        if graph.is_null() {
            return Err("cudaStreamEndCapture returned no graph".into());
        }
        let mut exec: CudaGraphExec = std::ptr::null_mut();
        // SAFETY: exec is a valid out-pointer; graph is live.
        let rc = unsafe { (f.instantiate)(&mut exec, graph, 0) };
        if rc != 0 || exec.is_null() {
            // SAFETY: the graph is live and destroyed once.
            let _ = unsafe { (f.destroy)(graph) };
            // With rc not cudaSuccess this returns the error; else exec is NULL.
            self.check("cudaGraphInstantiateWithFlags", rc)?;
            return Err("cudaGraphInstantiateWithFlags returned no executable graph".into());
        }
        Ok(GraphHandle {
            graph: graph as u64,
            exec: exec as u64,
        })
    }

    /// Launches the instantiated graph on `stream` (returns once enqueued).
    ///
    /// # Safety
    /// `stream` is a live CUDA stream of the graph's device.
    pub unsafe fn launch_graph(&self, g: &GraphHandle, stream: CudaStream) -> Result<()> {
        let f = self.graph_fns()?;
        // SAFETY: g.exec came from end_capture and is not destroyed yet (destroy takes g).
        self.check("cudaGraphLaunch", unsafe {
            (f.launch)(g.exec as CudaGraphExec, stream)
        })
    }

    /// Destroys the executable graph and the graph (both, even when the first fails).
    pub fn destroy_graph(&self, g: GraphHandle) -> Result<()> {
        let f = self.graph_fns()?;
        // SAFETY: both came from end_capture and are destroyed once (g is consumed).
        let (rx, rg) = unsafe {
            (
                (f.exec_destroy)(g.exec as CudaGraphExec),
                (f.destroy)(g.graph as CudaGraph),
            )
        };
        self.check("cudaGraphExecDestroy", rx)?;
        self.check("cudaGraphDestroy", rg)
    }
}
