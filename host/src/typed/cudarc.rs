//! cudarc interop (feature `cudarc`): `CudaSlice<T>`, `CudaView<T>` and `CudaViewMut<T>` are
//! buffers, and `CudaStream` (or `Arc<CudaStream>`) a stream, of the typed API on a
//! communicator of the CUDA backend.
//!
//! Ordering goes through cudarc's own events: the operation's stream first waits for the
//! buffers' earlier writes (and, for buffers it writes, reads), and once the operation has been
//! launched its use is recorded on the buffers, so cudarc orders later copies, kernels and the
//! buffers' frees after it, whether or not the [`Pending`](super::Pending) is waited for. A
//! cudarc buffer must be passed with a cudarc stream, of the communicator's device.
//!
//! ```no_run
//! use std::sync::Arc;
//! use rustccl::typed::{Comm, Op};
//! use cudarc::driver::CudaContext;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let comm = Comm::init_all(&[0])?.remove(0); // RUSTCCL_BACKEND=cuda
//! let stream: Arc<cudarc::driver::CudaStream> = CudaContext::new(0)?.default_stream();
//! let mut grads = stream.clone_htod(&[1.0f32; 1024])?;
//! comm.all_reduce_in_place(&mut grads, Op::Sum, &stream)?.wait()?;
//! let host = stream.clone_dtoh(&grads)?;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceSlice};

use super::buffer::{sealed, RecvBuf, Resolver, SendBuf};
use super::element::Element;
use super::error::{Error, ErrorKind, Result};
use super::stream::{sealed::StreamSealed, AsStream, StreamArg};
use crate::backend::{DeviceBackend, DevicePtr};

/// A cudarc stream may only be used with a communicator of the CUDA backend on its device.
pub(crate) fn check_stream(s: &CudaStream, backend: &dyn DeviceBackend, device: usize) -> Result<()> {
    if !backend.capabilities().cuda_handles {
        return Err(Error::new(
            ErrorKind::Memory,
            format!("a cudarc stream was passed to a communicator on the {} backend; use RUSTCCL_BACKEND=cuda, or rustccl's Stream", backend.kind()),
        ));
    }
    let ordinal = s.context().ordinal();
    if ordinal != device {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("the cudarc stream is on device {ordinal} but the communicator on device {device}"),
        ));
    }
    Ok(())
}

impl StreamSealed for CudaStream {
    fn stream_arg(&self) -> StreamArg<'_> {
        StreamArg::Cudarc(self)
    }
}
impl AsStream for CudaStream {}

impl StreamSealed for Arc<CudaStream> {
    fn stream_arg(&self) -> StreamArg<'_> {
        StreamArg::Cudarc(self)
    }
}
impl AsStream for Arc<CudaStream> {}

impl<'a> Resolver<'a> {
    /// The operation's cudarc stream, for a buffer on device `ordinal`.
    fn cudarc_stream(&self, ordinal: usize) -> Result<&'a CudaStream> {
        if !self.backend.capabilities().cuda_handles {
            return Err(Error::new(
                ErrorKind::Memory,
                format!(
                    "CUDA device memory (a cudarc buffer) was passed to a communicator on the {} backend; \
                     use RUSTCCL_BACKEND=cuda, or host memory",
                    self.backend.kind()
                ),
            ));
        }
        if ordinal != self.device {
            return Err(Error::new(
                ErrorKind::Memory,
                format!("a cudarc buffer of device {ordinal} was passed to a communicator on device {}", self.device),
            ));
        }
        match self.stream {
            StreamArg::Cudarc(s) => Ok(s),
            StreamArg::Own { .. } => Err(Error::new(
                ErrorKind::InvalidArgument,
                "cudarc buffers need a cudarc CudaStream as the operation's stream (cudarc orders its buffers' uses through it)",
            )),
        }
    }
}

fn ordinal<T>(b: &impl DeviceSlice<T>) -> usize {
    b.stream().context().ordinal()
}

/// The address of a cudarc buffer the operation reads, on the operation's cudarc stream; the
/// guard cudarc gives (which records the use on the buffer) is kept with the operation.
fn read_ptr<'a, T>(b: &'a impl cudarc::driver::DevicePtr<T>, r: &mut Resolver<'a>) -> Result<DevicePtr> {
    let stream = r.cudarc_stream(ordinal(b))?;
    let (ptr, guard) = b.device_ptr(stream);
    r.holds.guards.push(guard);
    Ok(DevicePtr(ptr))
}

/// Like `read_ptr`, for a buffer the operation writes.
fn write_ptr<'a, T>(b: &'a mut impl cudarc::driver::DevicePtrMut<T>, r: &mut Resolver<'a>) -> Result<DevicePtr> {
    let stream = r.cudarc_stream(ordinal(b))?;
    let (ptr, guard) = b.device_ptr_mut(stream);
    r.holds.guards.push(guard);
    Ok(DevicePtr(ptr))
}

impl<T: Element> sealed::SendSealed<T> for CudaSlice<T> {
    fn elems(&self) -> usize {
        DeviceSlice::len(self)
    }
    fn resolve_send<'a>(&'a self, r: &mut Resolver<'a>) -> Result<DevicePtr> {
        read_ptr(self, r)
    }
}
impl<T: Element> sealed::RecvSealed<T> for CudaSlice<T> {
    fn resolve_recv<'a>(&'a mut self, r: &mut Resolver<'a>) -> Result<DevicePtr> {
        write_ptr(self, r)
    }
}
impl<T: Element> SendBuf<T> for CudaSlice<T> {}
impl<T: Element> RecvBuf<T> for CudaSlice<T> {}

impl<T: Element> sealed::SendSealed<T> for CudaView<'_, T> {
    fn elems(&self) -> usize {
        DeviceSlice::len(self)
    }
    fn resolve_send<'a>(&'a self, r: &mut Resolver<'a>) -> Result<DevicePtr> {
        read_ptr(self, r)
    }
}
impl<T: Element> SendBuf<T> for CudaView<'_, T> {}

impl<T: Element> sealed::SendSealed<T> for CudaViewMut<'_, T> {
    fn elems(&self) -> usize {
        DeviceSlice::len(self)
    }
    fn resolve_send<'a>(&'a self, r: &mut Resolver<'a>) -> Result<DevicePtr> {
        read_ptr(self, r)
    }
}
impl<T: Element> sealed::RecvSealed<T> for CudaViewMut<'_, T> {
    fn resolve_recv<'a>(&'a mut self, r: &mut Resolver<'a>) -> Result<DevicePtr> {
        write_ptr(self, r)
    }
}
impl<T: Element> SendBuf<T> for CudaViewMut<'_, T> {}
impl<T: Element> RecvBuf<T> for CudaViewMut<'_, T> {}
