//! Groups as a scope: [`Comm::group`] runs a closure that queues operations on a [`Group`]
//! (on this communicator, and with [`Group::on`] on others), then ends the group; the
//! operations run together (sends and receives that depend on each other, several ranks
//! of one process driven by one thread). When the closure returns an error (or panics) the
//! group is cancelled: nothing in it runs. A group cannot be left open.
//!
//! Buffers must outlive the whole group, as threads must outlive `std::thread::scope`: they
//! are borrowed for `'scope`, which ends when `group` returns, by which time every operation
//! of the group has completed.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;

use super::buffer::{RecvBuf, Resolver, SendBuf};
use super::build;
use super::call::Call;
use super::comm::Comm;
use super::element::Element;
use super::error::{Error, ErrorKind, Result};
use super::host_mem::HostHold;
use super::rank::{Op, Rank};
use super::stream::AsStream;
use crate::backend::{DeviceBackend, Stream as RawStream};
use crate::comm::Communicator;
use crate::error::ResultCode;
use crate::types::DataType;

/// What the operations of a group keep until it has completed.
#[derive(Default)]
struct GroupState {
    host: Vec<HostHold>,
    /// Device streams to wait for at the end.
    streams: Vec<(Arc<dyn DeviceBackend>, RawStream)>,
    comms: Vec<Communicator>,
    /// cudarc guards, recorded on their streams once the group has launched. Stored with
    /// their lifetime erased: see `Group::enqueue`.
    #[cfg(feature = "cudarc")]
    guards: Vec<cudarc::driver::SyncOnDrop<'static>>,
}

/// An open group ([`Comm::group`]). Its operations take the same arguments as
/// [`Comm`]'s and are checked the same way, but return `Ok(())` when queued: they run when
/// the group ends.
///
/// ```
/// # std::env::set_var("RUSTCCL_BACKEND", "host");
/// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
/// use rustccl::typed::{Comm, Op, Stream};
/// let comms = Comm::init_all(&[0, 1])?;
/// let mut grads = vec![vec![1.0f32; 4], vec![2.0f32; 4]];
/// // One thread drives both ranks: their operations must be in one group.
/// comms[0].group(|g| {
///     for (c, buf) in comms.iter().zip(grads.iter_mut()) {
///         g.on(c).all_reduce_in_place(buf, Op::Sum, &Stream::DEFAULT)?;
///     }
///     Ok(())
/// })?;
/// assert_eq!(grads, [[3.0; 4], [3.0; 4]]);
/// # Ok::<(), rustccl::typed::Error>(())
/// ```
pub struct Group<'scope, 'env: 'scope> {
    comm: &'env Comm,
    state: &'scope RefCell<GroupState>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl Clone for Group<'_, '_> {
    fn clone(&self) -> Self {
        *self
    }
}
impl Copy for Group<'_, '_> {}

/// Ends the raw group if the closure unwinds: nothing of it runs, and this thread is left
/// outside any group.
struct EndOnUnwind {
    armed: bool,
}

impl Drop for EndOnUnwind {
    fn drop(&mut self) {
        if self.armed {
            crate::coll::cancel_group(&crate::Error::invalid_usage("the group's closure panicked"));
            let _ = crate::coll::group_end();
        }
    }
}

impl Comm {
    /// Runs `f` inside a group and ends it: every operation `f` queued runs together, and
    /// has completed when `group` returns `Ok`. If `f` returns an error (or panics), the
    /// group is cancelled and nothing in it runs. Groups do not nest.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// use rustccl::typed::{Comm, ErrorKind, Rank, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let (out, mut back) = ([1u8, 2, 3], [0u8; 3]);
    /// // A send to oneself and its receive must be in one group.
    /// comm.group(|g| {
    ///     g.send(&out, Rank::new(0), &Stream::DEFAULT)?;
    ///     g.recv(&mut back, Rank::new(0), &Stream::DEFAULT)
    /// })?;
    /// assert_eq!(back, [1, 2, 3]);
    /// // An error inside cancels the whole group.
    /// let mut untouched = [0u8; 3];
    /// let e = comm.group(|g| {
    ///     g.recv(&mut untouched, Rank::new(0), &Stream::DEFAULT)?;
    ///     g.send(&out, Rank::new(9), &Stream::DEFAULT) // no rank 9
    /// }).unwrap_err();
    /// assert_eq!(e.kind(), ErrorKind::Rank);
    /// assert_eq!(untouched, [0; 3]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn group<'env, R>(&'env self, f: impl for<'scope> FnOnce(&'scope Group<'scope, 'env>) -> Result<R>) -> Result<R> {
        if crate::coll::group::in_group() {
            return Err(self.refused(Error::new(
                ErrorKind::InvalidUsage,
                "Comm::group was called inside a group; typed groups do not nest (queue the operations on the open group)",
            )));
        }
        let state = RefCell::new(GroupState::default());
        drop(crate::comm::jobs::take_launched());
        crate::coll::group_start();
        let mut unwind = EndOnUnwind { armed: true };
        let g = Group { comm: self, state: &state, _scope: PhantomData, _env: PhantomData };
        let out = f(&g);
        unwind.armed = false;
        let result = match out {
            Err(e) => {
                crate::coll::cancel_group(&e.clone().into());
                let _ = crate::coll::group_end();
                Err(e)
            }
            Ok(v) => finish(&mut state.borrow_mut()).map(|()| v),
        };
        // Host registrations end (and cudarc guards record) here, after completion.
        drop(state);
        result
    }
}

/// Ends the raw group and waits for its operations.
fn finish(state: &mut GroupState) -> Result<()> {
    let end = crate::coll::group_end();
    #[cfg(feature = "cudarc")]
    state.guards.clear();
    let waited = match end {
        Ok(()) => {
            for (backend, s) in &state.streams {
                backend.synchronize(*s)?;
            }
            !state.streams.is_empty()
        }
        Err(e) if e.code == ResultCode::InProgress => {
            if let Some(job) = crate::comm::jobs::take_launched() {
                job.wait();
            }
            true
        }
        Err(e) => return Err(e.into()),
    };
    if waited {
        if let Some(e) = state.comms.iter().find_map(|c| c.async_error_detail()) {
            return Err(e.into());
        }
    }
    state.host.clear();
    Ok(())
}

impl<'scope, 'env> Group<'scope, 'env> {
    /// The same group, queuing on `comm` (another rank of this process, or another
    /// communicator): one group may span several.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Stream};
    /// let comms = Comm::init_all(&[0, 1])?;
    /// let mut out = [[0u8; 2]; 2];
    /// let [a, b] = &mut out;
    /// comms[0].group(|g| {
    ///     g.all_gather(&[10u8], a, &Stream::DEFAULT)?;
    ///     g.on(&comms[1]).all_gather(&[11u8], b, &Stream::DEFAULT)
    /// })?;
    /// assert_eq!(out, [[10, 11], [10, 11]]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn on(&self, comm: &'env Comm) -> Group<'scope, 'env> {
        Group { comm, ..*self }
    }

    /// The communicator this handle queues on.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// comm.group(|g| { assert_eq!(g.comm().size(), 1); Ok(()) })?;
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn comm(&self) -> &'env Comm {
        self.comm
    }

    fn enqueue<St: AsStream + ?Sized>(&self, stream: &'scope St, dtype: DataType, build: impl FnOnce(&mut Resolver<'scope>) -> Result<Call>) -> Result<()> {
        self.enqueue_with(stream, dtype, None, build)
    }

    /// Queues the call `build` makes, with the options of `config` for `coll` if given (the
    /// group's `_with` operations); a config the call cannot honour is refused before
    /// anything is queued.
    pub(super) fn enqueue_with<St: AsStream + ?Sized>(
        &self,
        stream: &'scope St,
        dtype: DataType,
        config: Option<(&super::CollConfig, crate::spec::Collective)>,
        build: impl FnOnce(&mut Resolver<'scope>) -> Result<Call>,
    ) -> Result<()> {
        let comm: &'scope Comm = self.comm;
        let options = match config {
            Some((c, coll)) => c.options(coll, coll.spec().name).map_err(|e| comm.refused(e))?,
            None => Default::default(),
        };
        let mut r = Resolver::new(&comm.raw, stream).map_err(|e| comm.refused(e))?;
        let call = build(&mut r).map_err(|e| comm.refused(e))?;
        let s = r.raw_stream();
        // A refusal here has cancelled the group already.
        crate::coll::options::scoped(options, || call.run(&comm.raw, dtype, s))?;
        let mut state = self.state.borrow_mut();
        state.host.append(&mut r.holds.host);
        #[cfg(feature = "cudarc")]
        for g in r.holds.guards.drain(..) {
            // SAFETY: a guard borrows a cudarc buffer and stream for 'scope. It is only
            // stored in the group's state, which `Comm::group` drops before it returns (also
            // when unwinding), while those borrows (which outlive the group call) are live;
            // nothing reads the guard meanwhile. Erasing its lifetime only lets it be stored
            // in a state that `group` itself owns.
            state.guards.push(unsafe { std::mem::transmute::<cudarc::driver::SyncOnDrop<'scope>, cudarc::driver::SyncOnDrop<'static>>(g) });
        }
        if !r.host_backend() && !state.streams.iter().any(|(b, x)| std::ptr::addr_eq(Arc::as_ptr(b), Arc::as_ptr(&r.backend)) && *x == s) {
            state.streams.push((Arc::clone(&r.backend), s));
        }
        if !state.comms.iter().any(|c| c.same_as(&comm.raw)) {
            state.comms.push(comm.raw.handle());
        }
        Ok(())
    }

    /// Queues an [all-reduce](Comm::all_reduce).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Op, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let (a, mut b) = ([1i32, 2], [0i32; 2]);
    /// comm.group(|g| g.all_reduce(&a, &mut b, Op::Sum, &Stream::DEFAULT))?;
    /// assert_eq!(b, [1, 2]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn all_reduce<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, send: &'scope S, recv: &'scope mut R, op: Op<T>, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::all_reduce(r, send, recv, op))
    }

    /// Queues an [in-place all-reduce](Comm::all_reduce_in_place).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Op, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let (mut a, mut b) = ([1u8], [2u8]);
    /// comm.group(|g| {
    ///     g.all_reduce_in_place(&mut a, Op::Sum, &Stream::DEFAULT)?;
    ///     g.all_reduce_in_place(&mut b, Op::Sum, &Stream::DEFAULT)
    /// })?;
    /// assert_eq!((a, b), ([1], [2]));
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn all_reduce_in_place<T: Element, B: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, buf: &'scope mut B, op: Op<T>, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::all_reduce_in_place(r, buf, op))
    }

    /// Queues a [broadcast](Comm::broadcast).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut b = [0u8; 2];
    /// comm.group(|g| g.broadcast(&[4u8, 2], &mut b, Rank::new(0), &Stream::DEFAULT))?;
    /// assert_eq!(b, [4, 2]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn broadcast<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, send: &'scope S, recv: &'scope mut R, root: Rank, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::broadcast(r, send, recv, root))
    }

    /// Queues an [in-place broadcast](Comm::broadcast_in_place).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut b = [5u64];
    /// comm.group(|g| g.broadcast_in_place(&mut b, Rank::new(0), &Stream::DEFAULT))?;
    /// assert_eq!(b, [5]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn broadcast_in_place<T: Element, B: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, buf: &'scope mut B, root: Rank, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::broadcast_in_place(r, buf, root))
    }

    /// Queues a [reduce](Comm::reduce).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Op, Rank, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut b = [0.0f64];
    /// comm.group(|g| g.reduce(&[2.5], &mut b, Op::Prod, Rank::new(0), &Stream::DEFAULT))?;
    /// assert_eq!(b, [2.5]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn reduce<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, send: &'scope S, recv: &'scope mut R, op: Op<T>, root: Rank, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::reduce(r, send, recv, op, root))
    }

    /// Queues an [in-place reduce](Comm::reduce_in_place).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Op, Rank, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut b = [3i8];
    /// comm.group(|g| g.reduce_in_place(&mut b, Op::Max, Rank::new(0), &Stream::DEFAULT))?;
    /// assert_eq!(b, [3]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn reduce_in_place<T: Element, B: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, buf: &'scope mut B, op: Op<T>, root: Rank, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::reduce_in_place(r, buf, op, root))
    }

    /// Queues an [all-gather](Comm::all_gather).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut b = [0u32; 2];
    /// comm.group(|g| g.all_gather(&[6u32, 7], &mut b, &Stream::DEFAULT))?;
    /// assert_eq!(b, [6, 7]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn all_gather<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, send: &'scope S, recv: &'scope mut R, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::all_gather(r, send, recv))
    }

    /// Queues an [in-place all-gather](Comm::all_gather_in_place).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut b = [1u8, 2];
    /// comm.group(|g| g.all_gather_in_place(&mut b, &Stream::DEFAULT))?;
    /// assert_eq!(b, [1, 2]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn all_gather_in_place<T: Element, B: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, buf: &'scope mut B, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::all_gather_in_place(r, buf))
    }

    /// Queues a [reduce-scatter](Comm::reduce_scatter).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Op, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut b = [0i32];
    /// comm.group(|g| g.reduce_scatter(&[8i32], &mut b, Op::Sum, &Stream::DEFAULT))?;
    /// assert_eq!(b, [8]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn reduce_scatter<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, send: &'scope S, recv: &'scope mut R, op: Op<T>, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::reduce_scatter(r, send, recv, op))
    }

    /// Queues an [in-place reduce-scatter](Comm::reduce_scatter_in_place).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Op, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut b = [9u32];
    /// comm.group(|g| g.reduce_scatter_in_place(&mut b, Op::Min, &Stream::DEFAULT))?;
    /// assert_eq!(b, [9]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn reduce_scatter_in_place<T: Element, B: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, buf: &'scope mut B, op: Op<T>, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::reduce_scatter_in_place(r, buf, op))
    }

    /// Queues an [all-to-all](Comm::all_to_all).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut b = [0u8; 2];
    /// comm.group(|g| g.all_to_all(&[3u8, 4], &mut b, &Stream::DEFAULT))?;
    /// assert_eq!(b, [3, 4]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn all_to_all<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, send: &'scope S, recv: &'scope mut R, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::all_to_all(r, send, recv))
    }

    /// Queues a [gather](Comm::gather).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut b = [0u8; 1];
    /// comm.group(|g| g.gather(&[1u8], &mut b, Rank::new(0), &Stream::DEFAULT))?;
    /// assert_eq!(b, [1]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn gather<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, send: &'scope S, recv: &'scope mut R, root: Rank, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::gather(r, send, recv, root))
    }

    /// Queues a [scatter](Comm::scatter).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut b = [0u8; 1];
    /// comm.group(|g| g.scatter(&[2u8], &mut b, Rank::new(0), &Stream::DEFAULT))?;
    /// assert_eq!(b, [2]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn scatter<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, send: &'scope S, recv: &'scope mut R, root: Rank, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::scatter(r, send, recv, root))
    }

    /// Queues a [send](Comm::send) to `peer`.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank, Stream};
    /// let comms = Comm::init_all(&[0, 1])?;
    /// let (ping, mut got) = ([1.0f32, 2.0], [[0.0f32; 2]; 2]);
    /// let [g0, g1] = &mut got;
    /// // Ring exchange: each rank sends to the next and receives from the previous.
    /// comms[0].group(|g| {
    ///     g.send(&ping, Rank::new(1), &Stream::DEFAULT)?;
    ///     g.recv(g0, Rank::new(1), &Stream::DEFAULT)?;
    ///     let g = g.on(&comms[1]);
    ///     g.send(&ping, Rank::new(0), &Stream::DEFAULT)?;
    ///     g.recv(g1, Rank::new(0), &Stream::DEFAULT)
    /// })?;
    /// assert_eq!(got, [[1.0, 2.0]; 2]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn send<T: Element, S: SendBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, buf: &'scope S, peer: Rank, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::send(r, buf, peer))
    }

    /// Queues a [receive](Comm::recv) from `peer`.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank, Stream};
    /// # let comm = Comm::init_all(&[0])?.remove(0);
    /// let mut b = [0i64; 2];
    /// comm.group(|g| {
    ///     g.recv(&mut b, Rank::new(0), &Stream::DEFAULT)?;
    ///     g.send(&[7i64, 8], Rank::new(0), &Stream::DEFAULT)
    /// })?;
    /// assert_eq!(b, [7, 8]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn recv<T: Element, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(&self, buf: &'scope mut R, peer: Rank, stream: &'scope St) -> Result<()> {
        self.enqueue(stream, T::DATA_TYPE, |r| build::recv(r, buf, peer))
    }
}
