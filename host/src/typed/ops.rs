//! The operations of a [`Comm`], one call each: checks (lengths, ranks, where buffers live)
//! before anything is enqueued, then the raw API, and a [`Pending`] that keeps the borrows
//! until the operation has completed.
//!
//! Every example here runs one rank; [the module guide](super) has several.

use std::sync::Arc;

use super::buffer::{RecvBuf, Resolver, SendBuf};
use super::build;
use super::call::Call;
use super::comm::Comm;
use super::device_buffer::Fence;
use super::element::Element;
use super::error::{Error, ErrorKind, Result};
use super::pending::Pending;
use super::rank::{Op, Rank};
use super::stream::AsStream;
use crate::error::ResultCode;
use crate::types::DataType;

impl Comm {
    /// Records a refused call as the communicator's last error; the error.
    pub(crate) fn refused(&self, e: Error) -> Error {
        let raw: crate::Error = e.clone().into();
        crate::coll::cancel_group(&raw);
        self.raw.record_error(raw);
        e
    }

    /// Checks and resolves an operation with `build`, runs it through the raw API, and
    /// returns its [`Pending`].
    fn issue<'a, St: AsStream + ?Sized>(
        &'a self,
        stream: &'a St,
        dtype: DataType,
        build: impl FnOnce(&mut Resolver<'a>) -> Result<Call>,
    ) -> Result<Pending<'a>> {
        self.issue_with(stream, dtype, None, build)
    }

    /// [`Comm::issue`] with per-call options: `config` for a call of the collective, checked
    /// before anything is resolved or enqueued.
    pub(super) fn issue_with<'a, St: AsStream + ?Sized>(
        &'a self,
        stream: &'a St,
        dtype: DataType,
        config: Option<(&super::CollConfig, crate::spec::Collective)>,
        build: impl FnOnce(&mut Resolver<'a>) -> Result<Call>,
    ) -> Result<Pending<'a>> {
        if crate::coll::group::in_group() {
            return Err(self.refused(Error::new(
                ErrorKind::InvalidUsage,
                "a single typed operation was called inside a group; inside Comm::group call it on the group (g.all_reduce(..)), \
                 and do not mix the typed API with the raw group_start/group_end",
            )));
        }
        let options = match config {
            Some((c, coll)) => c.options(coll, coll.spec().name).map_err(|e| self.refused(e))?,
            None => Default::default(),
        };
        let mut r = Resolver::new(&self.raw, stream).map_err(|e| self.refused(e))?;
        let call = build(&mut r).map_err(|e| self.refused(e))?;
        let s = r.raw_stream();
        drop(crate::comm::jobs::take_launched());
        let fence = match crate::coll::options::scoped(options, || call.run(&self.raw, dtype, s)) {
            Ok(()) if r.host_backend() => Fence::Done,
            Ok(()) => event_after(&r, s),
            Err(e) if e.code == ResultCode::InProgress => match crate::comm::jobs::take_launched() {
                Some(job) => Fence::Job(job),
                None => return Err(Error::new(ErrorKind::Internal, "a non-blocking operation was queued without a job")),
            },
            Err(e) => return Err(e.into()),
        };
        let fence = Arc::new(fence);
        let mut holds = std::mem::take(&mut r.holds);
        // cudarc buffers: their use is recorded on the stream after the operation's launch.
        #[cfg(feature = "cudarc")]
        holds.guards.clear();
        for f in &holds.fences {
            f.push(&fence);
        }
        if holds.borrowed_host {
            // Borrowed host slices cannot outlive this call safely (a Pending may be leaked):
            // a background job that uses them completes here.
            fence.wait();
        }
        holds.host.clear();
        Ok(Pending::new(self.raw.handle(), fence))
    }
}

/// An event recorded on `s` after the operation (or, if that fails, the stream waited for).
fn event_after(r: &Resolver<'_>, s: crate::backend::Stream) -> Fence {
    let backend = Arc::clone(&r.backend);
    match backend.create_event(r.device) {
        Ok(event) => match backend.record_event(event, s) {
            Ok(()) => Fence::Event { backend, event },
            Err(e) => {
                let _ = backend.destroy_event(event);
                sync_instead(&*backend, s, &e)
            }
        },
        Err(e) => sync_instead(&*backend, s, &e),
    }
}

fn sync_instead(backend: &dyn crate::backend::DeviceBackend, s: crate::backend::Stream, e: &crate::Error) -> Fence {
    tracing::warn!(target: "CALL", "no event after an operation ({}); waiting for its stream instead", e.message);
    if let Err(e) = backend.synchronize(s) {
        tracing::warn!(target: "CALL", "waiting for a stream: {}", e.message);
    }
    Fence::Done
}

impl Comm {
    /// `ncclAllReduce`: every rank gets the reduction of every rank's `send`; `send` and
    /// `recv` have equal lengths.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// use rustccl::typed::{Comm, ErrorKind, Op, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut sum = vec![0.0f64; 3];
    /// comm.all_reduce(&[1.0, 2.0, 3.0], &mut sum, Op::Sum, &Stream::DEFAULT)?.wait()?;
    /// assert_eq!(sum, [1.0, 2.0, 3.0]);
    /// let mut short = vec![0.0f64; 2];
    /// let e = comm.all_reduce(&[1.0, 2.0, 3.0], &mut short, Op::Sum, &Stream::DEFAULT).unwrap_err();
    /// assert_eq!(e.kind(), ErrorKind::Length);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn all_reduce<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
        &'a self,
        send: &'a S,
        recv: &'a mut R,
        op: Op<T>,
        stream: &'a St,
    ) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::all_reduce(r, send, recv, op))
    }

    /// All-reduce in place: `buf` is both the input and the result.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Op, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut grads = vec![0.5f32; 4];
    /// comm.all_reduce_in_place(&mut grads, Op::PreMulSum(2.0), &Stream::DEFAULT)?.wait()?;
    /// assert_eq!(grads, [1.0; 4]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn all_reduce_in_place<'a, T: Element, B: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&'a self, buf: &'a mut B, op: Op<T>, stream: &'a St) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::all_reduce_in_place(r, buf, op))
    }

    /// `ncclBroadcast`: `root`'s `send` arrives in every rank's `recv`. Off the root `send`
    /// is unused: pass an empty one (or one of `recv`'s length).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut out = [0u8; 2];
    /// comm.broadcast(&[7u8, 8], &mut out, Rank::new(0), &Stream::DEFAULT)?.wait()?;
    /// assert_eq!(out, [7, 8]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn broadcast<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
        &'a self,
        send: &'a S,
        recv: &'a mut R,
        root: Rank,
        stream: &'a St,
    ) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::broadcast(r, send, recv, root))
    }

    /// Broadcast in place: `root`'s `buf` overwrites every other rank's.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, ErrorKind, Rank, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut weights = vec![0.25f32; 8];
    /// comm.broadcast_in_place(&mut weights, Rank::new(0), &Stream::DEFAULT)?.wait()?;
    /// let e = comm.broadcast_in_place(&mut weights, Rank::new(1), &Stream::DEFAULT).unwrap_err();
    /// assert_eq!(e.kind(), ErrorKind::Rank);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn broadcast_in_place<'a, T: Element, B: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&'a self, buf: &'a mut B, root: Rank, stream: &'a St) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::broadcast_in_place(r, buf, root))
    }

    /// `ncclReduce`: the reduction of every rank's `send` arrives in `root`'s `recv`. Off the
    /// root `recv` is unused: pass an empty one (or one of `send`'s length).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Op, Rank, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut out = [0i32; 2];
    /// comm.reduce(&[3, -4], &mut out, Op::Min, Rank::new(0), &Stream::DEFAULT)?.wait()?;
    /// assert_eq!(out, [3, -4]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn reduce<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
        &'a self,
        send: &'a S,
        recv: &'a mut R,
        op: Op<T>,
        root: Rank,
        stream: &'a St,
    ) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::reduce(r, send, recv, op, root))
    }

    /// Reduce in place: `root`'s `buf` becomes the reduction of every rank's.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Op, Rank, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut loss = [1.5f64];
    /// comm.reduce_in_place(&mut loss, Op::Avg, Rank::new(0), &Stream::DEFAULT)?.wait()?;
    /// assert_eq!(loss, [1.5]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn reduce_in_place<'a, T: Element, B: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&'a self, buf: &'a mut B, op: Op<T>, root: Rank, stream: &'a St) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::reduce_in_place(r, buf, op, root))
    }

    /// `ncclAllGather`: every rank's `send`, in rank order, in every rank's `recv`
    /// (`recv.len() == send.len() * size`).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, ErrorKind, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let e = comm.all_gather(&[1u8; 2][..], &mut [0u8; 3][..], &Stream::DEFAULT).unwrap_err();
    /// assert_eq!(e.kind(), ErrorKind::Length);
    /// let mut out = [0u8; 2];
    /// comm.all_gather(&[1u8, 2], &mut out, &Stream::DEFAULT)?.wait()?;
    /// assert_eq!(out, [1, 2]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn all_gather<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
        &'a self,
        send: &'a S,
        recv: &'a mut R,
        stream: &'a St,
    ) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::all_gather(r, send, recv))
    }

    /// All-gather in place: `buf` holds `size` blocks; this rank's block (block `rank`) is
    /// its input, and every block is filled.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut blocks = [5u32, 6];
    /// comm.all_gather_in_place(&mut blocks, &Stream::DEFAULT)?.wait()?;
    /// assert_eq!(blocks, [5, 6]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn all_gather_in_place<'a, T: Element, B: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&'a self, buf: &'a mut B, stream: &'a St) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::all_gather_in_place(r, buf))
    }

    /// `ncclReduceScatter`: block `i` of the reduction of every rank's `send` arrives in rank
    /// `i`'s `recv` (`send.len() == recv.len() * size`).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Op, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut mine = [0i64; 2];
    /// comm.reduce_scatter(&[4i64, 5], &mut mine, Op::Sum, &Stream::DEFAULT)?.wait()?;
    /// assert_eq!(mine, [4, 5]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn reduce_scatter<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
        &'a self,
        send: &'a S,
        recv: &'a mut R,
        op: Op<T>,
        stream: &'a St,
    ) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::reduce_scatter(r, send, recv, op))
    }

    /// Reduce-scatter in place: `buf` holds `size` blocks of input; this rank's block (block
    /// `rank`) receives its part of the reduction.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Op, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut buf = vec![2.0f32; 3];
    /// comm.reduce_scatter_in_place(&mut buf, Op::Max, &Stream::DEFAULT)?.wait()?;
    /// assert_eq!(buf, [2.0; 3]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn reduce_scatter_in_place<'a, T: Element, B: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&'a self, buf: &'a mut B, op: Op<T>, stream: &'a St) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::reduce_scatter_in_place(r, buf, op))
    }

    /// `ncclAlltoAll`: block `i` of this rank's `send` goes to rank `i`, and block `i` of
    /// `recv` comes from rank `i` (equal lengths, a multiple of `size`).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut out = [0i8; 3];
    /// comm.all_to_all(&[1i8, 2, 3], &mut out, &Stream::DEFAULT)?.wait()?;
    /// assert_eq!(out, [1, 2, 3]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn all_to_all<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
        &'a self,
        send: &'a S,
        recv: &'a mut R,
        stream: &'a St,
    ) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::all_to_all(r, send, recv))
    }

    /// `ncclGather`: every rank's `send`, in rank order, in `root`'s `recv`
    /// (`send.len() * size` there; off the root empty or the same).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut out = [0u8; 1];
    /// comm.gather(&[9u8], &mut out, Rank::new(0), &Stream::DEFAULT)?.wait()?;
    /// assert_eq!(out, [9]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn gather<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
        &'a self,
        send: &'a S,
        recv: &'a mut R,
        root: Rank,
        stream: &'a St,
    ) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::gather(r, send, recv, root))
    }

    /// `ncclScatter`: block `i` of `root`'s `send` arrives in rank `i`'s `recv`
    /// (`recv.len() * size` at the root; off the root empty or the same).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut out = [0u32; 2];
    /// comm.scatter(&[3u32, 4], &mut out, Rank::new(0), &Stream::DEFAULT)?.wait()?;
    /// assert_eq!(out, [3, 4]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn scatter<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
        &'a self,
        send: &'a S,
        recv: &'a mut R,
        root: Rank,
        stream: &'a St,
    ) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::scatter(r, send, recv, root))
    }

    /// `ncclSend` to `peer`, which calls [`recv`](Comm::recv) with the same length. A send
    /// and its receive on the same rank (or sends and receives that depend on each other)
    /// must be in one [`group`](Comm::group).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank, Stream};
    /// let comms = Comm::init_all(&[0, 1])?;
    /// std::thread::scope(|s| {
    ///     let mut it = comms.into_iter();
    ///     let (a, b) = (it.next().unwrap(), it.next().unwrap());
    ///     s.spawn(move || a.send(&[1.0f32, 2.0], Rank::new(1), &Stream::DEFAULT)?.wait());
    ///     let mut got = [0.0f32; 2];
    ///     b.recv(&mut got, Rank::new(0), &Stream::DEFAULT)?.wait()?;
    ///     assert_eq!(got, [1.0, 2.0]);
    ///     Ok::<(), rustccl::typed::Error>(())
    /// })?;
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn send<'a, T: Element, S: SendBuf<T> + ?Sized, St: AsStream + ?Sized>(&'a self, buf: &'a S, peer: Rank, stream: &'a St) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::send(r, buf, peer))
    }

    /// `ncclRecv` from `peer`, which calls [`send`](Comm::send) with the same length.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, ErrorKind, Rank, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut x = [0u8; 4];
    /// let e = comm.recv(&mut x, Rank::new(3), &Stream::DEFAULT).unwrap_err();
    /// assert_eq!(e.kind(), ErrorKind::Rank);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn recv<'a, T: Element, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&'a self, buf: &'a mut R, peer: Rank, stream: &'a St) -> Result<Pending<'a>> {
        self.issue(stream, T::DATA_TYPE, |r| build::recv(r, buf, peer))
    }
}
