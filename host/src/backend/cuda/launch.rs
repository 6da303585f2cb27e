//! [`Kernels`] and [`SymmetricKernels`] of the CUDA backend: launches of the collective
//! interpreter (`exec.cu`) and of the symmetric kernels, the kernels compiled ahead of time,
//! peer access to the memory a launch touches, and the stream memory operations and host
//! callbacks of device work. A launch is four steps, which
//! the trait also offers one by one so that a repeated collective does the middle two once:
//! check (and make reachable) each user buffer, make the connections' slots reachable, look
//! the kernel up (per context, operator and type), and `cuLaunchKernel` (the context is made
//! current only when another one is).

use std::ffi::c_void;

use cudarc::driver::sys;
use rustccl_kernels::DeviceOp;

use rustccl_kernels::exec::{ExecArgs, ExecEntry, SignalArgs, SymArgs, WaitSignalArgs};
use rustccl_kernels::symmetric::SymKernel;

use super::driver::{check, Ctx, CtxGuard};
use super::streams::raw_stream;
use super::{CudaBackend, Place};
use crate::backend::{DevicePtr, ExecKernel, Kernels, Stream, SymmetricKernels};
use crate::error::{Error, Result};
use crate::types::DataType;

impl CudaBackend {
    /// Compiles (or reads from the cache) and loads the collective interpreter for every
    /// operator and type on `device`, several compiles at once; returns how many.
    pub fn preload_exec_kernels(&self, device: usize) -> Result<usize> {
        let ctx = self.primary(device)?;
        let cc = self.devices[device].cc;
        crate::backend::rtc::for_every_exec_kernel(|_| true, |op, dt| self.kernels.exec(ctx, cc, self.driver_version, op, dt).map(|_| ()))
    }

    /// Registers per thread and local memory per thread (bytes) of every collective kernel
    /// loaded so far: (operator, type, registers, local bytes). Local memory means spills.
    pub fn exec_kernel_resources(&self) -> Vec<(DeviceOp, DataType, i32, i32)> {
        self.kernels.exec_resources()
    }

    /// Lets kernels on device `from` read and write memory of device `to`.
    pub(super) fn ensure_peer(&self, from: usize, to: usize) -> Result<()> {
        if from == to || self.peers.lock().unwrap_or_else(|p| p.into_inner()).contains(&(from, to)) {
            return Ok(());
        }
        let mut can = 0;
        // SAFETY: writes one int.
        check(
            unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.devices[from].handle, self.devices[to].handle) },
            "cuDeviceCanAccessPeer",
        )?;
        if can == 0 {
            return Err(Error::invalid_usage(format!(
                "device {from} cannot access memory of device {to} (no peer access between them)"
            )));
        }
        let peer = self.primary(to)?;
        let _g = CtxGuard::enter(self.primary(from)?)?;
        // SAFETY: both contexts are live primary contexts.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.0, 0) };
        if r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            check(r, "cuCtxEnablePeerAccess")?;
        }
        self.peers.lock().unwrap_or_else(|p| p.into_inner()).insert((from, to));
        Ok(())
    }
}

/// The interpreter for `op` on `dtype` in `ctx` (the context of `device` it is launched in).
fn kernel_in(b: &CudaBackend, ctx: Ctx, device: usize, op: DeviceOp, dtype: DataType, entry: ExecEntry) -> Result<ExecKernel> {
    let cc = b.devices[device].cc;
    let f = b.kernels.exec(ctx, cc, b.driver_version, op, dtype)?;
    Ok(ExecKernel { device, op, dtype, entry, handle: f.funcs[entry.index()].0 as usize as u64, context: ctx.key() as u64 })
}

/// Where `stream` runs, which must be on `device`.
fn place_on(b: &CudaBackend, stream: Stream, device: usize) -> Result<Place> {
    let place = b.place(stream, Some(device))?;
    if place.device != device {
        return Err(Error::invalid_usage(format!(
            "the stream belongs to device {} but the communicator to device {device}",
            place.device
        )));
    }
    Ok(place)
}

/// Launches `kernel` on `stream`, which runs at `place` (on the kernel's device).
fn launch_in(b: &CudaBackend, place: Place, kernel: &ExecKernel, args: &ExecArgs, blocks: u32, stream: Stream) -> Result<()> {
    // A stream of another context of the device (not the primary one): the kernel loaded there.
    let other;
    let kernel = if place.ctx.key() as u64 == kernel.context {
        kernel
    } else {
        other = kernel_in(b, place.ctx, place.device, kernel.op, kernel.dtype, kernel.entry)?;
        &other
    };
    // Switches (and later restores) the current context only when it is another one.
    let _g = CtxGuard::enter(place.ctx)?;
    let mut args = *args;
    let mut params = [&mut args as *mut ExecArgs as *mut c_void];
    // SAFETY: the kernel takes one RustcclExecArgs by value (same layout, checked in
    // rustccl_kernels::exec); the driver copies it before returning; the program it points
    // to is device memory the caller keeps until the launch completes. `handle` is a
    // CUfunction loaded in `place.ctx`, now current (modules are never unloaded).
    check(
        unsafe {
            sys::cuLaunchKernel(
                kernel.handle as usize as sys::CUfunction,
                blocks.max(1),
                1,
                1,
                rustccl_kernels::exec::EXEC_THREADS,
                1,
                1,
                0,
                raw_stream(stream),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
        kernel.entry.name(),
    )
}

impl Kernels for CudaBackend {
    fn launch_exec(&self, launch: &crate::backend::ExecLaunch, stream: Stream) -> Result<()> {
        let place = place_on(self, stream, launch.device)?;
        for &(ptr, bytes) in &launch.buffers {
            self.check_exec_buffer(place.device, ptr, bytes)?;
        }
        self.reach_exec_memory(place.device, &launch.slots)?;
        let kernel = kernel_in(self, place.ctx, place.device, launch.op, launch.dtype, launch.entry)?;
        launch_in(self, place, &kernel, &launch.args, launch.blocks, stream)
    }

    fn exec_kernel(&self, device: usize, op: DeviceOp, dtype: DataType, entry: ExecEntry) -> Result<ExecKernel> {
        self.device(device, "exec_kernel")?;
        kernel_in(self, self.primary(device)?, device, op, dtype, entry)
    }

    fn launch_exec_kernel(&self, kernel: &ExecKernel, args: &ExecArgs, blocks: u32, stream: Stream) -> Result<()> {
        launch_in(self, place_on(self, stream, kernel.device)?, kernel, args, blocks, stream)
    }

    fn check_exec_buffer(&self, device: usize, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.device(device, "check_exec_buffer")?;
        if let Some(owner) = self.check_range(ptr, bytes, "buffer")? {
            self.ensure_peer(device, owner)?;
        }
        Ok(())
    }

    fn reach_exec_memory(&self, device: usize, ptrs: &[DevicePtr]) -> Result<()> {
        self.device(device, "reach_exec_memory")?;
        for &ptr in ptrs {
            if let Some(owner) = self.tracked_device(ptr) {
                self.ensure_peer(device, owner)?;
            }
        }
        Ok(())
    }

    fn stream_write_u32(&self, addr: DevicePtr, value: u32, stream: Stream) -> Result<()> {
        let place = self.place_for(stream, &[addr])?;
        let _g = CtxGuard::enter(place.ctx)?;
        // SAFETY: a 4-byte device address the caller maps (a window's flag); the default flags
        // order the write after the stream's earlier work, memory included.
        let r = unsafe { sys::cuStreamWriteValue32_v2(raw_stream(stream), addr.0, value, 0) };
        check(r, "cuStreamWriteValue32")
    }

    fn stream_wait_u32(&self, addr: DevicePtr, value: u32, stream: Stream) -> Result<()> {
        let place = self.place_for(stream, &[addr])?;
        let _g = CtxGuard::enter(place.ctx)?;
        // SAFETY: as above; the stream waits until (int32_t)(word - value) >= 0 (the driver's
        // GEQ compares with wrap-around).
        let r = unsafe {
            sys::cuStreamWaitValue32_v2(raw_stream(stream), addr.0, value, sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32)
        };
        check(r, "cuStreamWaitValue32")
    }

    /// `cuLaunchHostFunc`: the driver calls `callback` in stream order (see the trait).
    unsafe fn launch_host_callback(&self, callback: &std::sync::Arc<crate::backend::HostCallback>, stream: Stream) -> Result<()> {
        let place = self.place_for(stream, &[])?;
        let _g = CtxGuard::enter(place.ctx)?;
        let user = std::sync::Arc::as_ptr(callback) as *mut c_void;
        // SAFETY: the trampoline reads `user` as the callback, which the caller keeps alive.
        let r = unsafe { sys::cuLaunchHostFunc(raw_stream(stream), Some(crate::backend::HostCallback::trampoline), user) };
        check(r, "cuLaunchHostFunc")
    }
}

/// Launches `f` (loaded in `place.ctx`) on one block of `threads` threads with the one
/// parameter `args` on `stream`.
fn launch_one_block<T>(place: Place, f: sys::CUfunction, threads: u32, args: &T, name: &str, stream: Stream) -> Result<()> {
    let _g = CtxGuard::enter(place.ctx)?;
    // The driver reads the parameter from where `params[0]` points: the struct itself.
    let mut params = [args as *const T as *mut c_void];
    // SAFETY: the kernel takes one struct of `T`'s layout by value (checked in
    // rustccl_kernels::exec against the generated header); the driver copies it before
    // returning; the memory it names stays mapped until the communicator's work is done. `f`
    // is a CUfunction loaded in `place.ctx`, now current.
    check(
        unsafe { sys::cuLaunchKernel(f, 1, 1, 1, threads, 1, 1, 0, raw_stream(stream), params.as_mut_ptr(), std::ptr::null_mut()) },
        name,
    )
}

impl SymmetricKernels for CudaBackend {
    fn launch_signal(&self, device: usize, args: &SignalArgs, stream: Stream) -> Result<()> {
        let place = place_on(self, stream, device)?;
        let f = self.kernels.one_sided(place.ctx, self.devices[device].cc, self.driver_version)?.signal.0;
        launch_one_block(place, f, rustccl_kernels::one_sided::SIGNAL_THREADS, args, rustccl_kernels::one_sided::SIGNAL_KERNEL, stream)
    }

    fn launch_wait_signal(&self, device: usize, args: &WaitSignalArgs, stream: Stream) -> Result<()> {
        let place = place_on(self, stream, device)?;
        let f = self.kernels.one_sided(place.ctx, self.devices[device].cc, self.driver_version)?.wait.0;
        launch_one_block(place, f, rustccl_kernels::exec::SIGNAL_WAIT_MAX as u32, args, rustccl_kernels::one_sided::WAIT_KERNEL, stream)
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_symmetric(
        &self,
        device: usize,
        op: DeviceOp,
        dtype: DataType,
        kernel: SymKernel,
        args: &SymArgs,
        blocks: u32,
        stream: Stream,
    ) -> Result<()> {
        let place = place_on(self, stream, device)?;
        let f = self.kernels.exec(place.ctx, self.devices[device].cc, self.driver_version, op, dtype)?.sym[kernel.index()].0;
        if f.is_null() {
            return Err(Error::invalid_usage(format!(
                "the kernel sources (RUSTCCL_KERNEL_SOURCE_DIR) have no symmetric kernel {}; use the built-in sources for runs with windows",
                kernel.name()
            )));
        }
        let _g = CtxGuard::enter(place.ctx)?;
        let mut args = *args;
        let mut params = [&mut args as *mut SymArgs as *mut c_void];
        // SAFETY: the kernel takes one RustcclSymArgs by value (same layout, checked in
        // rustccl_kernels::exec); the driver copies it before returning; the memory it points to
        // (windows, resource memory, control block) stays mapped until the communicator's work
        // is done. `f` is a CUfunction loaded in `place.ctx`, now current.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    f,
                    blocks.clamp(1, rustccl_kernels::exec::SYM_MAX_BLOCKS),
                    1,
                    1,
                    rustccl_kernels::exec::SYM_THREADS,
                    1,
                    1,
                    0,
                    raw_stream(stream),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            kernel.name(),
        )
    }
}
