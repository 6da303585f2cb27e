//! [`Kernels`](crate::backend::Kernels) of the HIP backend: launches of the collective interpreter on AMD GPUs (the
//! code objects `hip::module` builds, the disk cache's, else hipRTC's, loaded once per device
//! and (operator, type)), peer access to the memory a launch touches, the stream memory
//! operations and host callbacks of device work. No symmetric kernels (no windows yet). The same four steps as the CUDA
//! backend's launches, which the device executor (`exec::gpu`) takes one by one for a cached
//! collective: check each user buffer, reach the connections' slots, look the kernel up,
//! launch (`hipModuleLaunchKernel`).

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CString};
use std::sync::RwLock;

use rustccl_kernels::exec::{ExecArgs, ExecEntry};
use rustccl_kernels::DeviceOp;

use super::runtime::Handle;
use super::streams::raw;
use super::HipBackend;
use crate::backend::{gpu_memory, DevicePtr, ExecKernel, Stream};
use crate::error::{Error, Result};
use crate::types::DataType;

/// The interpreter of every (device, operator, type) loaded so far: a `hipFunction_t` per
/// entry point, in `ExecEntry::ALL`'s order (modules are never unloaded).
#[derive(Default)]
pub(super) struct Kernels {
    exec: RwLock<HashMap<(usize, DeviceOp, DataType), [u64; 4]>>,
}

impl HipBackend {
    /// Compiles (or reads from the kernel cache) and loads the collective interpreter for
    /// every operator and type on `device` (fp8 aside), several compiles at once; how many.
    pub fn preload_exec_kernels(&self, device: usize) -> Result<usize> {
        self.device(device, "preload_exec_kernels")?;
        crate::backend::rtc::for_every_exec_kernel(super::module::has_exec, |op, dt| self.exec_functions(device, op, dt).map(|_| ()))
    }

    /// The entry points of the interpreter for `op` on `dtype` on `device`: compiled for its
    /// target (or read from the kernel cache) and loaded on first use.
    fn exec_functions(&self, device: usize, op: DeviceOp, dtype: DataType) -> Result<[u64; 4]> {
        let key = (device, op, dtype);
        if let Some(f) = self.kernels.exec.read().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(*f);
        }
        // Compiled without the lock (a pair loaded twice by racing threads is kept once).
        let arch = self.arch(device)?.to_string();
        let compiled = super::module::compile_exec(&arch, self.rt.version.max(0) as u32, op, dtype)?;
        let what = format!("collective kernel {}/{dtype} for {arch}", op.suffix());
        let _g = self.enter(device)?;
        let mut module: Handle = std::ptr::null_mut();
        // SAFETY: `code` is an AMD code object that outlives the call.
        let r = unsafe { (self.rt.calls.module_load_data)(&mut module, compiled.code.as_ptr().cast()) };
        self.rt.check(r, &format!("hipModuleLoadData({what})"))?;
        let mut funcs = [0u64; 4];
        for entry in ExecEntry::ALL {
            let name = CString::new(entry.name()).expect("no NUL");
            let mut f: Handle = std::ptr::null_mut();
            // SAFETY: the module was just loaded and is never unloaded; writes one handle.
            let r = unsafe { (self.rt.calls.module_get_function)(&mut f, module, name.as_ptr()) };
            self.rt.check(r, &format!("hipModuleGetFunction({})", entry.name()))?;
            funcs[entry.index()] = f as u64;
        }
        tracing::info!(target: "INIT", "{what}: loaded on device {device}");
        Ok(*self.kernels.exec.write().unwrap_or_else(|p| p.into_inner()).entry(key).or_insert(funcs))
    }

    /// Lets kernels on device `from` read and write memory of device `to`.
    fn ensure_peer(&self, from: usize, to: usize) -> Result<()> {
        if from == to || self.peers.lock().unwrap_or_else(|p| p.into_inner()).contains(&(from, to)) {
            return Ok(());
        }
        self.device(to, "peer access")?;
        let mut can = 0;
        // SAFETY: writes one int.
        self.rt.check(unsafe { (self.rt.calls.can_access_peer)(&mut can, from as c_int, to as c_int) }, "hipDeviceCanAccessPeer")?;
        if can == 0 {
            return Err(Error::invalid_usage(format!("device {from} cannot access memory of device {to} (no peer access between them)")));
        }
        let _g = self.enter(from)?;
        // SAFETY: enables access from the current device (`from`) to `to`.
        let r = unsafe { (self.rt.calls.enable_peer_access)(to as c_int, 0) };
        if r != super::runtime::HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            self.rt.check(r, "hipDeviceEnablePeerAccess")?;
        }
        self.peers.lock().unwrap_or_else(|p| p.into_inner()).insert((from, to));
        Ok(())
    }

    /// The device `stream` runs on, which must be `device`.
    fn stream_on(&self, stream: Stream, device: usize) -> Result<()> {
        let on = self.stream_device(stream, Some(device))?;
        if on != device {
            return Err(Error::invalid_usage(format!("the stream belongs to device {on} but the communicator to device {device}")));
        }
        Ok(())
    }
}

impl crate::backend::Kernels for HipBackend {
    fn launch_exec(&self, launch: &crate::backend::ExecLaunch, stream: Stream) -> Result<()> {
        self.stream_on(stream, launch.device)?;
        for &(ptr, bytes) in &launch.buffers {
            self.check_exec_buffer(launch.device, ptr, bytes)?;
        }
        self.reach_exec_memory(launch.device, &launch.slots)?;
        let kernel = self.exec_kernel(launch.device, launch.op, launch.dtype, launch.entry)?;
        self.launch_exec_kernel(&kernel, &launch.args, launch.blocks, stream)
    }

    fn exec_kernel(&self, device: usize, op: DeviceOp, dtype: DataType, entry: ExecEntry) -> Result<ExecKernel> {
        self.device(device, "exec_kernel")?;
        let f = self.exec_functions(device, op, dtype)?;
        Ok(ExecKernel { device, op, dtype, entry, handle: f[entry.index()], context: device as u64 })
    }

    fn launch_exec_kernel(&self, kernel: &ExecKernel, args: &ExecArgs, blocks: u32, stream: Stream) -> Result<()> {
        self.stream_on(stream, kernel.device)?;
        let _g = self.enter(kernel.device)?;
        let mut args = *args;
        let mut params = [&mut args as *mut ExecArgs as *mut c_void];
        // SAFETY: the kernel takes one RustcclExecArgs by value (same layout, checked in
        // rustccl_kernels::exec); the runtime copies it before returning; the program it points
        // to is device memory the caller keeps until the launch completes. `handle` is a
        // hipFunction_t of a module loaded on the kernel's device, now current.
        let r = unsafe {
            (self.rt.calls.module_launch_kernel)(
                kernel.handle as Handle,
                blocks.max(1),
                1,
                1,
                rustccl_kernels::exec::EXEC_THREADS,
                1,
                1,
                0,
                raw(stream),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.rt.check(r, kernel.entry.name())
    }

    fn check_exec_buffer(&self, device: usize, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.device(device, "check_exec_buffer")?;
        if let Some(owner) = gpu_memory::check_range(self, ptr, bytes, "buffer")? {
            self.ensure_peer(device, owner)?;
        }
        Ok(())
    }

    fn reach_exec_memory(&self, device: usize, ptrs: &[DevicePtr]) -> Result<()> {
        self.device(device, "reach_exec_memory")?;
        for &ptr in ptrs {
            if let Some(owner) = gpu_memory::tracked_device(self, ptr) {
                self.ensure_peer(device, owner)?;
            }
        }
        Ok(())
    }

    fn stream_write_u32(&self, addr: DevicePtr, value: u32, stream: Stream) -> Result<()> {
        let _g = self.enter_for(stream, &[addr])?;
        // SAFETY: a 4-byte device address the caller maps; ordered after the stream's earlier work.
        self.rt.check(unsafe { (self.rt.calls.stream_write_value32)(raw(stream), addr.0 as Handle, value, 0) }, "hipStreamWriteValue32")
    }

    fn stream_wait_u32(&self, addr: DevicePtr, value: u32, stream: Stream) -> Result<()> {
        let _g = self.enter_for(stream, &[addr])?;
        // SAFETY: as above. hipStreamWaitValueGte (0), the whole word: `word >= value`, without
        // CUDA's wrap-around (see the module docs of `backend::hip`).
        self.rt.check(unsafe { (self.rt.calls.stream_wait_value32)(raw(stream), addr.0 as Handle, value, 0, u32::MAX) }, "hipStreamWaitValue32")
    }

    /// `hipLaunchHostFunc` (untested: no AMD GPU here).
    unsafe fn launch_host_callback(&self, callback: &std::sync::Arc<crate::backend::HostCallback>, stream: Stream) -> Result<()> {
        let _g = self.enter_for(stream, &[])?;
        let user = std::sync::Arc::as_ptr(callback) as *mut c_void;
        let Some(launch) = self.rt.launch_host_func else {
            return Err(Error::system(format!(
                "{}: this HIP runtime lacks hipLaunchHostFunc, which a captured launch that receives over the network \
                 needs (to tell the proxy of each replay's receives); update ROCm, or capture no network work",
                self.rt.path.display()
            )));
        };
        // SAFETY: the trampoline reads `user` as the callback, which the caller keeps alive.
        self.rt.check(unsafe { launch(raw(stream), crate::backend::HostCallback::trampoline, user) }, "hipLaunchHostFunc")
    }
}
