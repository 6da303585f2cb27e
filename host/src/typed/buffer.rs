//! The buffers an operation takes: one pair of traits, [`SendBuf`] and [`RecvBuf`], for host
//! memory (`[T]`, `Vec<T>`, `[T; N]`), rustccl's [`DeviceBuffer`](super::DeviceBuffer) and,
//! with the `cudarc` feature, cudarc's `CudaSlice`/`CudaView`/`CudaViewMut`; so one call
//! works on every backend. Where a buffer's memory is refused (host memory on a device
//! backend, device memory of another backend or device) the call fails before enqueuing
//! anything, with an [`ErrorKind::Memory`] error that says what to use instead.

use std::marker::PhantomData;
use std::sync::Arc;

use super::device_buffer::FenceList;
use super::element::Element;
use super::error::{Error, ErrorKind, Result};
use super::host_mem::{self, HostHold};
use super::stream::{AsStream, StreamArg};
use crate::backend::{DeviceBackend, DevicePtr, Stream as RawStream};
use crate::comm::Communicator;

/// What an operation keeps until it has completed: registrations of host slices, the fence
/// lists of device buffers it uses, and (cudarc) the guards that record its use of cudarc
/// buffers on the stream once it has been enqueued.
#[derive(Default)]
pub struct Holds<'a> {
    pub host: Vec<HostHold>,
    pub fences: Vec<Arc<FenceList>>,
    /// Whether a borrowed host slice is used (the operation must complete within the call).
    pub borrowed_host: bool,
    #[cfg(feature = "cudarc")]
    pub guards: Vec<cudarc::driver::SyncOnDrop<'a>>,
    _borrows: PhantomData<&'a ()>,
}

/// Resolves buffers against one communicator and stream.
pub struct Resolver<'a> {
    pub comm: &'a Communicator,
    pub backend: Arc<dyn DeviceBackend>,
    pub device: usize,
    pub stream: StreamArg<'a>,
    pub holds: Holds<'a>,
}

impl<'a> Resolver<'a> {
    /// Checks that `stream` belongs to `comm`'s backend and device.
    pub fn new<S: AsStream + ?Sized>(comm: &'a Communicator, stream: &'a S) -> Result<Resolver<'a>> {
        let backend = Arc::clone(comm.backend());
        let device = comm.device()? as usize;
        let stream = stream.stream_arg();
        match &stream {
            StreamArg::Own { owner: Some(o), .. } => {
                if !std::ptr::addr_eq(Arc::as_ptr(&o.backend), Arc::as_ptr(&backend)) || o.device != device {
                    return Err(Error::new(
                        ErrorKind::InvalidArgument,
                        format!("the stream was made for another backend or device; use a stream of this communicator (Comm::stream), device {device}"),
                    ));
                }
            }
            StreamArg::Own { owner: None, .. } => {}
            #[cfg(feature = "cudarc")]
            StreamArg::Cudarc(s) => super::cudarc::check_stream(s, &*backend, device)?,
        }
        Ok(Resolver { comm, backend, device, stream, holds: Holds::default() })
    }

    /// The raw stream handle.
    pub fn raw_stream(&self) -> RawStream {
        match &self.stream {
            StreamArg::Own { raw, .. } => *raw,
            #[cfg(feature = "cudarc")]
            StreamArg::Cudarc(s) => RawStream(s.cu_stream() as u64),
        }
    }

    /// Whether the backend runs on host memory (the host backend).
    pub fn host_backend(&self) -> bool {
        self.backend.capabilities().host_addressable
    }

    /// A host slice the operation reads, borrowed for `'a`.
    fn host<T: Element>(&mut self, data: &'a [T]) -> Result<DevicePtr> {
        // SAFETY: `data` is borrowed for 'a and only read.
        unsafe { self.host_range(data.as_ptr() as *const u8, std::mem::size_of_val(data)) }
    }

    /// A host slice the operation writes, borrowed mutably for `'a`.
    fn host_mut<T: Element>(&mut self, data: &'a mut [T]) -> Result<DevicePtr> {
        // SAFETY: `data` is borrowed mutably for 'a, so nothing else reads or writes it
        // meanwhile; the address comes from the mutable borrow.
        unsafe { self.host_range(data.as_mut_ptr() as *const u8, std::mem::size_of_val(data)) }
    }

    /// # Safety
    /// `ptr..ptr+bytes` is host memory borrowed for 'a (mutably if the operation writes it).
    unsafe fn host_range(&mut self, ptr: *const u8, bytes: usize) -> Result<DevicePtr> {
        if !self.host_backend() {
            return Err(Error::new(
                ErrorKind::Memory,
                format!(
                    "a host slice was passed to a communicator on the {} backend (device {}), which cannot use host memory; \
                     copy it into a DeviceBuffer (Comm::buffer_from) or pass device memory",
                    self.backend.kind(),
                    self.device
                ),
            ));
        }
        // SAFETY: the memory is borrowed for 'a (the caller's promise), and the hold is kept
        // in `self.holds`, which the typed API drops only once the operation has completed:
        // a single operation waits for that before it returns when it holds host slices, and
        // a group before `group` returns; both within 'a.
        let (ptr, hold) = unsafe { host_mem::hold(&self.backend, ptr, bytes) }?;
        self.holds.host.extend(hold);
        self.holds.borrowed_host = true;
        Ok(ptr)
    }

    /// Device memory of `backend` on `device`, `len` elements at `ptr`.
    pub(crate) fn device_memory(&mut self, backend: &Arc<dyn DeviceBackend>, device: usize, ptr: DevicePtr, fences: &Arc<FenceList>) -> Result<DevicePtr> {
        let same_backend = std::ptr::addr_eq(Arc::as_ptr(backend), Arc::as_ptr(&self.backend));
        if !same_backend || device != self.device {
            let whose = if same_backend { String::new() } else { "another instance of ".to_string() };
            return Err(Error::new(
                ErrorKind::Memory,
                format!(
                    "a DeviceBuffer of {whose}the {} backend, device {device}, was passed to a communicator on the {} backend, device {}; \
                     allocate it with this communicator (Comm::alloc / Comm::buffer_from)",
                    backend.kind(),
                    self.backend.kind(),
                    self.device
                ),
            ));
        }
        self.holds.fences.push(Arc::clone(fences));
        Ok(ptr)
    }

    /// The number of ranks.
    pub fn nranks(&self) -> u32 {
        self.comm.nranks_unchecked()
    }
}

pub(crate) mod sealed {
    use super::*;

    pub trait SendSealed<T: Element> {
        fn elems(&self) -> usize;
        fn resolve_send<'a>(&'a self, r: &mut Resolver<'a>) -> Result<DevicePtr>;
    }

    pub trait RecvSealed<T: Element> {
        fn resolve_recv<'a>(&'a mut self, r: &mut Resolver<'a>) -> Result<DevicePtr>;
    }
}

/// A buffer an operation reads: `count` elements of `T`. Host memory (`[T]`, `Vec<T>`,
/// `[T; N]`) works on the host backend, [`DeviceBuffer`](super::DeviceBuffer) on every
/// backend, cudarc's slices and views (feature `cudarc`) on CUDA. Sealed.
///
/// ```
/// use rustccl::typed::SendBuf;
/// fn count<B: SendBuf<f32> + ?Sized>(b: &B) -> usize { b.len() }
/// assert_eq!(count(&[1.0f32, 2.0][..]), 2);
/// assert_eq!(count(&vec![0.0f32; 5]), 5);
/// assert_eq!(count(&[0.0f32; 3]), 3);
/// ```
pub trait SendBuf<T: Element>: sealed::SendSealed<T> {
    /// Its length in elements.
    fn len(&self) -> usize {
        self.elems()
    }

    /// Whether it holds no element.
    ///
    /// ```
    /// use rustccl::typed::SendBuf;
    /// assert!(SendBuf::<u8>::is_empty(&Vec::<u8>::new()));
    /// ```
    fn is_empty(&self) -> bool {
        self.elems() == 0
    }
}

/// A buffer an operation writes (and, in place, also reads). Sealed.
///
/// ```
/// use rustccl::typed::RecvBuf;
/// fn clear<B: RecvBuf<i32> + ?Sized>(b: &B) -> usize { b.len() }
/// let mut out = vec![0i32; 8];
/// assert_eq!(clear(&mut out), 8);
/// ```
pub trait RecvBuf<T: Element>: SendBuf<T> + sealed::RecvSealed<T> {}

impl<T: Element> sealed::SendSealed<T> for [T] {
    fn elems(&self) -> usize {
        self.len()
    }
    fn resolve_send<'a>(&'a self, r: &mut Resolver<'a>) -> Result<DevicePtr> {
        r.host(self)
    }
}
impl<T: Element> sealed::RecvSealed<T> for [T] {
    fn resolve_recv<'a>(&'a mut self, r: &mut Resolver<'a>) -> Result<DevicePtr> {
        r.host_mut(self)
    }
}
impl<T: Element> SendBuf<T> for [T] {}
impl<T: Element> RecvBuf<T> for [T] {}

impl<T: Element> sealed::SendSealed<T> for Vec<T> {
    fn elems(&self) -> usize {
        self.len()
    }
    fn resolve_send<'a>(&'a self, r: &mut Resolver<'a>) -> Result<DevicePtr> {
        r.host(self.as_slice())
    }
}
impl<T: Element> sealed::RecvSealed<T> for Vec<T> {
    fn resolve_recv<'a>(&'a mut self, r: &mut Resolver<'a>) -> Result<DevicePtr> {
        r.host_mut(self.as_mut_slice())
    }
}
impl<T: Element> SendBuf<T> for Vec<T> {}
impl<T: Element> RecvBuf<T> for Vec<T> {}

impl<T: Element, const N: usize> sealed::SendSealed<T> for [T; N] {
    fn elems(&self) -> usize {
        N
    }
    fn resolve_send<'a>(&'a self, r: &mut Resolver<'a>) -> Result<DevicePtr> {
        r.host(self.as_slice())
    }
}
impl<T: Element, const N: usize> sealed::RecvSealed<T> for [T; N] {
    fn resolve_recv<'a>(&'a mut self, r: &mut Resolver<'a>) -> Result<DevicePtr> {
        r.host_mut(self.as_mut_slice())
    }
}
impl<T: Element, const N: usize> SendBuf<T> for [T; N] {}
impl<T: Element, const N: usize> RecvBuf<T> for [T; N] {}
