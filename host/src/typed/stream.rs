//! Streams as the typed API takes them: rustccl's own [`Stream`] (the default stream, or one
//! made with [`Comm::stream`](super::Comm::stream) and destroyed when dropped), or, with the
//! `cudarc` feature, a `cudarc::driver::CudaStream`.

use std::sync::Arc;

use crate::backend::{DeviceBackend, Stream as RawStream};

/// A stream of a communicator's backend: work enqueued on it runs in order. On the host
/// backend operations have completed when their call returns, and a stream orders nothing
/// more; on device backends the operation runs on it.
///
/// ```
/// # std::env::set_var("RUSTCCL_BACKEND", "host");
/// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
/// use rustccl::typed::{Comm, Op, Stream};
/// let comm = Comm::init_all(&[0])?.remove(0);
/// let stream = comm.stream()?; // destroyed when dropped
/// let mut x = vec![1.5f32; 4];
/// comm.all_reduce_in_place(&mut x, Op::Sum, &stream)?.wait()?;
/// comm.all_reduce_in_place(&mut x, Op::Sum, &Stream::DEFAULT)?.wait()?;
/// assert_eq!(x, [1.5; 4]);
/// # Ok::<(), rustccl::typed::Error>(())
/// ```
#[derive(Debug)]
pub struct Stream {
    raw: RawStream,
    /// The backend that made it (it is destroyed there when the last clone is dropped);
    /// `None` when borrowed. (No `Drop` on `Stream` itself, so that `&Stream::DEFAULT` is a
    /// `&'static` constant, which groups need.)
    owner: Option<Arc<Owner>>,
}

/// A stream this process made, destroyed when dropped.
#[derive(Debug)]
pub struct Owner {
    pub backend: Arc<dyn DeviceBackend>,
    pub device: usize,
    raw: RawStream,
}

impl Stream {
    /// The default stream (CUDA's legacy NULL stream; on the host backend, any order).
    pub const DEFAULT: Stream = Stream { raw: RawStream::DEFAULT, owner: None };

    pub(crate) fn owned(backend: Arc<dyn DeviceBackend>, device: usize, raw: RawStream) -> Stream {
        Stream { raw, owner: Some(Arc::new(Owner { backend, device, raw })) }
    }

    /// A stream handle made elsewhere (a `CUstream` as a number); it is not destroyed when
    /// this is dropped.
    ///
    /// ```
    /// let s = rustccl::typed::Stream::from_raw(rustccl::backend::Stream(0));
    /// assert!(s.raw().is_default());
    /// ```
    pub fn from_raw(raw: RawStream) -> Stream {
        Stream { raw, owner: None }
    }

    /// The raw handle.
    ///
    /// ```
    /// assert_eq!(rustccl::typed::Stream::DEFAULT.raw(), rustccl::backend::Stream::DEFAULT);
    /// ```
    pub fn raw(&self) -> RawStream {
        self.raw
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        if let Err(e) = self.backend.synchronize(self.raw).and_then(|_| self.backend.destroy_stream(self.raw)) {
            tracing::warn!(target: "CALL", "destroying a stream: {}", e.message);
        }
    }
}

/// The stream argument of an operation, as the typed API resolves it.
pub enum StreamArg<'a> {
    Own { raw: RawStream, owner: Option<&'a Owner> },
    #[cfg(feature = "cudarc")]
    Cudarc(&'a cudarc::driver::CudaStream),
}

pub(crate) mod sealed {
    pub trait StreamSealed {
        fn stream_arg(&self) -> super::StreamArg<'_>;
    }
}

/// What an operation accepts as its stream: a [`Stream`], or (feature `cudarc`) a
/// `cudarc::driver::CudaStream` or `Arc<CudaStream>`. Sealed.
///
/// ```
/// fn takes<S: rustccl::typed::AsStream + ?Sized>(_: &S) {}
/// takes(&rustccl::typed::Stream::DEFAULT);
/// ```
pub trait AsStream: sealed::StreamSealed {}

impl sealed::StreamSealed for Stream {
    fn stream_arg(&self) -> StreamArg<'_> {
        StreamArg::Own { raw: self.raw, owner: self.owner.as_deref() }
    }
}
impl AsStream for Stream {}
