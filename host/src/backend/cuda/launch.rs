//! Launches of the collective interpreter (`exec.cu`): the kernels compiled ahead of time, peer
//! access to the memory a launch touches, and stream capture. A launch is four steps, which
//! the trait also offers one by one so that a repeated collective does the middle two once:
//! check (and make reachable) each user buffer, make the connections' slots reachable, look
//! the kernel up (per context, operator and type), and `cuLaunchKernel` (the context is made
//! current only when another one is).

use std::ffi::c_void;

use cudarc::driver::sys;
use rustccl_kernels::DeviceOp;

use rustccl_kernels::exec::{ExecArgs, ExecEntry, SymArgs};
use rustccl_kernels::symmetric::SymKernel;

use super::driver::{check, Ctx, CtxGuard};
use super::streams::raw_stream;
use super::{CudaBackend, Place};
use crate::backend::{DevicePtr, ExecKernel, Stream};
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

pub(super) fn exec_kernel(b: &CudaBackend, device: usize, op: DeviceOp, dtype: DataType, entry: ExecEntry) -> Result<ExecKernel> {
    kernel_in(b, b.primary(device)?, device, op, dtype, entry)
}

pub(super) fn reach_exec_memory(b: &CudaBackend, device: usize, ptrs: &[DevicePtr]) -> Result<()> {
    for &ptr in ptrs {
        if let Some(owner) = b.tracked_device(ptr) {
            b.ensure_peer(device, owner)?;
        }
    }
    Ok(())
}

pub(super) fn check_exec_buffer(b: &CudaBackend, device: usize, ptr: DevicePtr, bytes: usize) -> Result<()> {
    if let Some(owner) = b.check_range(ptr, bytes, "buffer")? {
        b.ensure_peer(device, owner)?;
    }
    Ok(())
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

pub(super) fn launch_exec_kernel(b: &CudaBackend, kernel: &ExecKernel, args: &ExecArgs, blocks: u32, stream: Stream) -> Result<()> {
    launch_in(b, place_on(b, stream, kernel.device)?, kernel, args, blocks, stream)
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

pub(super) fn launch_exec(b: &CudaBackend, launch: &crate::backend::ExecLaunch, stream: Stream) -> Result<()> {
    let place = place_on(b, stream, launch.device)?;
    for &(ptr, bytes) in &launch.buffers {
        check_exec_buffer(b, place.device, ptr, bytes)?;
    }
    reach_exec_memory(b, place.device, &launch.slots)?;
    let kernel = kernel_in(b, place.ctx, place.device, launch.op, launch.dtype, launch.entry)?;
    launch_in(b, place, &kernel, &launch.args, launch.blocks, stream)
}

pub(super) fn with_relaxed_capture(f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: swaps a thread-local setting; restored below.
    check(unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }, "cuThreadExchangeStreamCaptureMode")?;
    let r = f();
    // SAFETY: as above, putting the caller's mode back.
    let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    r
}

pub(super) fn is_capturing(b: &CudaBackend, stream: Stream) -> Result<bool> {
    let place = b.place(stream, None)?;
    let _g = CtxGuard::enter(place.ctx)?;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: writes one enum.
    check(unsafe { sys::cuStreamIsCapturing(raw_stream(stream), &mut status) }, "cuStreamIsCapturing")?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn launch_symmetric(
    b: &CudaBackend,
    device: usize,
    op: DeviceOp,
    dtype: DataType,
    kernel: SymKernel,
    args: &SymArgs,
    blocks: u32,
    stream: Stream,
) -> Result<()> {
    let place = place_on(b, stream, device)?;
    let f = b.kernels.exec(place.ctx, b.devices[device].cc, b.driver_version, op, dtype)?.sym[kernel.index()].0;
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
