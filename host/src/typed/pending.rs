//! [`Pending`]: an enqueued operation, which keeps the borrows of its buffers and stream
//! until it is known to have completed. Polling, not futures: [`Pending::poll`],
//! [`Pending::is_ready`], [`Pending::wait`].

use std::marker::PhantomData;
use std::sync::Arc;

use super::device_buffer::Fence;
use super::error::{Error, Result};
use crate::comm::Communicator;

/// An operation that was enqueued. It borrows its buffers (and communicator and stream) for
/// `'a`, so they cannot be touched, moved or freed until it is dropped, and dropping it
/// waits for the operation to complete.
///
/// When it completes: on the host backend when the call returns (already done); on a device
/// backend when its stream reaches it; on a non-blocking communicator when its background
/// job ends. [`wait`](Pending::wait) returns the operation's result (a failure found while it
/// ran is the communicator's asynchronous error).
///
/// Leaking one (`std::mem::forget`) is safe: host slices are only handed to operations that
/// have completed before the call returns (a non-blocking communicator's call waits for its
/// job when it uses host slices), [`DeviceBuffer`](super::DeviceBuffer)s wait for their
/// operations before they are read or freed, and cudarc's buffers record the operation's
/// stream.
///
/// ```
/// # std::env::set_var("RUSTCCL_BACKEND", "host");
/// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
/// use rustccl::typed::{Comm, Op, Stream};
/// let comm = Comm::init_all(&[0])?.remove(0);
/// let (a, mut b) = ([2i64; 3], [0i64; 3]);
/// let mut op = comm.all_reduce(&a, &mut b, Op::Max, &Stream::DEFAULT)?;
/// // `b` is borrowed until `op` is gone.
/// while op.poll().is_none() {}
/// assert!(op.is_ready());
/// op.wait()?;
/// assert_eq!(b, [2; 3]);
/// # Ok::<(), rustccl::typed::Error>(())
/// ```
#[must_use = "an operation's result is known only once it is waited for"]
pub struct Pending<'a> {
    comm: Communicator,
    fence: Arc<Fence>,
    finished: bool,
    _borrows: PhantomData<&'a mut ()>,
}

impl std::fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pending({:?}, {})", self.comm, if self.fence.is_done() { "complete" } else { "running" })
    }
}

impl<'a> Pending<'a> {
    pub(crate) fn new(comm: Communicator, fence: Arc<Fence>) -> Pending<'a> {
        Pending { comm, fence, finished: false, _borrows: PhantomData }
    }

    fn result(&self) -> Result<()> {
        match &*self.fence {
            Fence::Done => Ok(()),
            _ => self.comm.async_error_detail().map_or(Ok(()), |e| Err(Error::from(e))),
        }
    }

    /// `None` while the operation runs; then its result.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Op, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut x = [1u8; 2];
    /// let mut op = comm.all_reduce_in_place(&mut x, Op::Sum, &Stream::DEFAULT)?;
    /// let result = loop {
    ///     if let Some(r) = op.poll() { break r; }
    ///     std::thread::yield_now();
    /// };
    /// assert!(result.is_ok());
    /// # drop(op);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn poll(&mut self) -> Option<Result<()>> {
        if !self.fence.is_done() {
            return None;
        }
        self.finished = true;
        Some(self.result())
    }

    /// Whether the operation has completed.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Op, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut x = [1u8; 2];
    /// let op = comm.all_reduce_in_place(&mut x, Op::Sum, &Stream::DEFAULT)?;
    /// assert!(op.is_ready(), "on a blocking host communicator it completed in the call");
    /// # drop(op);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn is_ready(&self) -> bool {
        self.fence.is_done()
    }

    /// Blocks until the operation has completed; its result.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Op, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut x = [3i32; 2];
    /// comm.all_reduce_in_place(&mut x, Op::Prod, &Stream::DEFAULT)?.wait()?;
    /// assert_eq!(x, [3, 3]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn wait(mut self) -> Result<()> {
        self.fence.wait();
        self.finished = true;
        self.result()
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.finished {
            // The borrows end here: the operation must not outlive them.
            self.fence.wait();
            if let Err(e) = self.result() {
                tracing::warn!(target: "CALL", "an operation dropped without wait() failed: {}", e.message());
            }
        }
    }
}
