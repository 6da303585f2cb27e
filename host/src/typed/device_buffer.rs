//! [`DeviceBuffer`]: memory of a communicator's backend (device memory on CUDA, host memory
//! the host backend manages), typed, freed when dropped. It remembers the operations still
//! using it ([`Fence`]s): dropping it, or copying from or into it, first waits for them, so
//! it is never freed or read under a running operation, even when that operation's
//! [`Pending`](super::Pending) was leaked.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use super::buffer::{sealed, RecvBuf, Resolver, SendBuf};
use super::element::Element;
use super::error::{Error, ErrorKind, Result};
use crate::backend::{DeviceBackend, DevicePtr, Event, Stream as RawStream};
use crate::comm::jobs::Completion;

/// The end of one enqueued operation.
pub enum Fence {
    /// Completed when the call returned.
    Done,
    /// A background job of a non-blocking communicator.
    Job(Arc<Completion>),
    /// An event recorded on the operation's stream after it.
    Event { backend: Arc<dyn DeviceBackend>, event: Event },
}

impl Fence {
    pub fn is_done(&self) -> bool {
        match self {
            Fence::Done => true,
            Fence::Job(c) => c.is_done(),
            Fence::Event { backend, event } => backend.query_event(*event).unwrap_or_else(|e| {
                tracing::warn!(target: "CALL", "querying an operation's event: {}", e.message);
                true
            }),
        }
    }

    pub fn wait(&self) {
        match self {
            Fence::Done => {}
            Fence::Job(c) => c.wait(),
            Fence::Event { backend, event } => {
                if let Err(e) = backend.synchronize_event(*event) {
                    tracing::warn!(target: "CALL", "waiting for an operation's event: {}", e.message);
                }
            }
        }
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        if let Fence::Event { backend, event } = self {
            if let Err(e) = backend.destroy_event(*event) {
                tracing::warn!(target: "CALL", "destroying an operation's event: {}", e.message);
            }
        }
    }
}

/// The operations that may still use a buffer.
#[derive(Default)]
pub struct FenceList(Mutex<Vec<Arc<Fence>>>);

impl FenceList {
    pub fn push(&self, f: &Arc<Fence>) {
        let mut l = self.0.lock().unwrap_or_else(|p| p.into_inner());
        l.retain(|f| !f.is_done());
        if !f.is_done() {
            l.push(Arc::clone(f));
        }
    }

    pub fn wait_all(&self) {
        let fences = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        for f in fences {
            f.wait();
        }
    }
}

/// `len` elements of `T` in memory of a communicator's backend, on its device; freed when
/// dropped. Make one with [`Comm::alloc`](super::Comm::alloc) or
/// [`Comm::buffer_from`](super::Comm::buffer_from); it works with every operation of
/// communicators on the same backend and device, and is the buffer to use on GPUs.
///
/// ```
/// # std::env::set_var("RUSTCCL_BACKEND", "host");
/// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
/// use rustccl::typed::{Comm, Op, Stream};
/// let comm = Comm::init_all(&[0])?.remove(0);
/// let mut grads = comm.buffer_from(&[1.0f32, 2.0, 3.0])?;
/// comm.all_reduce_in_place(&mut grads, Op::Sum, &Stream::DEFAULT)?.wait()?;
/// assert_eq!(grads.to_vec()?, [1.0, 2.0, 3.0]);
/// assert_eq!(grads.len(), 3);
/// # Ok::<(), rustccl::typed::Error>(())
/// ```
pub struct DeviceBuffer<T: Element> {
    backend: Arc<dyn DeviceBackend>,
    device: usize,
    ptr: DevicePtr,
    len: usize,
    fences: Arc<FenceList>,
    _elems: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer<{}>({} elements at {} on {} device {})", T::DATA_TYPE, self.len, self.ptr, self.backend.kind(), self.device)
    }
}

fn bytes_of<T: Element>(len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>()).filter(|&b| b <= isize::MAX as usize).ok_or_else(|| {
        Error::new(ErrorKind::Length, format!("{len} elements of {} are more bytes than a buffer can hold", T::DATA_TYPE))
    })
}

impl<T: Element> DeviceBuffer<T> {
    /// `len` zeroed elements on `device` of `backend`.
    pub(crate) fn zeroed(backend: &Arc<dyn DeviceBackend>, device: usize, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = bytes_of::<T>(len)?;
        let ptr = backend.alloc(device, bytes.max(1))?;
        let buf = DeviceBuffer { backend: Arc::clone(backend), device, ptr, len, fences: Default::default(), _elems: PhantomData };
        backend.memset(ptr, 0, bytes, RawStream::DEFAULT)?;
        backend.synchronize(RawStream::DEFAULT)?;
        Ok(buf)
    }

    /// Its length in elements.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// assert_eq!(comm.alloc::<u8>(7)?.len(), 7);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// assert!(comm.alloc::<u8>(0)?.is_empty());
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its raw address, for the raw API ([`crate::Communicator`]); valid while `self` lives.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// assert!(!comm.alloc::<f64>(2)?.device_ptr().is_null());
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn device_ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Copies `src` (of the same length) in, after the operations still using the buffer.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// let mut b = comm.alloc::<i32>(2)?;
    /// b.copy_from_host(&[4, 5])?;
    /// assert_eq!(b.to_vec()?, [4, 5]);
    /// assert!(b.copy_from_host(&[1]).is_err(), "lengths must match");
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        self.check_len("copy_from_host", src.len())?;
        self.fences.wait_all();
        self.backend.copy_to_device(self.ptr, bytemuck::cast_slice(src), RawStream::DEFAULT).map_err(Error::from)
    }

    /// Copies the buffer out into `dst` (of the same length), after the operations still
    /// using it.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// let b = comm.buffer_from(&[1u64, 2])?;
    /// let mut out = [0u64; 2];
    /// b.copy_to_host(&mut out)?;
    /// assert_eq!(out, [1, 2]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.check_len("copy_to_host", dst.len())?;
        self.fences.wait_all();
        self.backend.copy_from_device(bytemuck::cast_slice_mut(dst), self.ptr, RawStream::DEFAULT).map_err(Error::from)
    }

    /// The buffer's elements, copied to a new `Vec`.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// assert_eq!(comm.alloc::<i8>(3)?.to_vec()?, [0, 0, 0]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::zeroed(); self.len];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    fn check_len(&self, what: &str, n: usize) -> Result<()> {
        if n != self.len {
            return Err(Error::new(ErrorKind::Length, format!("{what}: the host slice has {n} elements, the DeviceBuffer {}", self.len)));
        }
        Ok(())
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        self.fences.wait_all();
        if let Err(e) = self.backend.free(self.ptr) {
            tracing::warn!(target: "CALL", "freeing a DeviceBuffer: {}", e.message);
        }
    }
}

impl<T: Element> sealed::SendSealed<T> for DeviceBuffer<T> {
    fn elems(&self) -> usize {
        self.len
    }
    fn resolve_send<'a>(&'a self, r: &mut Resolver<'a>) -> Result<DevicePtr> {
        r.device_memory(&self.backend, self.device, self.ptr, &self.fences)
    }
}
impl<T: Element> sealed::RecvSealed<T> for DeviceBuffer<T> {
    fn resolve_recv<'a>(&'a mut self, r: &mut Resolver<'a>) -> Result<DevicePtr> {
        r.device_memory(&self.backend, self.device, self.ptr, &self.fences)
    }
}
impl<T: Element> SendBuf<T> for DeviceBuffer<T> {}
impl<T: Element> RecvBuf<T> for DeviceBuffer<T> {}
