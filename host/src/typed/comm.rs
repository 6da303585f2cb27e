//! [`Comm`]: a communicator whose lifetime is safe by construction. Dropping it completes its
//! work, finalizes and destroys it (a finalize that fails is logged, and it is destroyed
//! anyway: it is never aborted silently); [`Comm::abort`] and [`Comm::finalize`] end it
//! explicitly. Non-blocking init is a [`PendingInit`] to poll or wait for.
//!
//! `Comm` is `Send` but not `Sync`: NCCL's rule that one communicator's operations are issued
//! by one thread at a time (every rank must see them in the same order) becomes a type rule.
//! Another thread that must stop it gets an [`AbortHandle`], which is `Send + Sync`.

use std::cell::Cell;
use std::marker::PhantomData;

use super::device_buffer::DeviceBuffer;
use super::element::Element;
use super::error::{Error, ErrorKind, Result};
use super::rank::Rank;
use super::stream::Stream;
use crate::bootstrap::UniqueId;
use crate::comm::{Communicator, ShrinkFlags, SPLIT_NOCOLOR};
use crate::config::CommConfig;
use crate::error::ResultCode;

/// One rank's communicator (the typed API's; [`Comm::raw`] gives the raw one).
///
/// ```
/// # std::env::set_var("RUSTCCL_BACKEND", "host");
/// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
/// use rustccl::typed::{Comm, Rank};
/// let id = rustccl::get_unique_id()?;
/// let comm = Comm::init(1, &id, Rank::new(0))?;
/// assert_eq!((comm.rank(), comm.size()), (Rank::new(0), 1));
/// drop(comm); // finalizes and destroys
/// # Ok::<(), rustccl::typed::Error>(())
/// ```
pub struct Comm {
    pub(crate) raw: Communicator,
    /// Set once `abort`, `finalize` or `into_raw` has ended it (Drop then does nothing).
    closed: bool,
    /// Not `Sync`: operations of one communicator come from one thread at a time.
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Comm({:?})", self.raw)
    }
}

fn rank_arg(r: Rank, what: &str) -> Result<i32> {
    i32::try_from(r.get()).map_err(|_| Error::new(ErrorKind::Rank, format!("{what} {} is beyond any communicator", r.get())))
}

fn nranks_arg(n: u32) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::new(ErrorKind::InvalidArgument, format!("nranks {n} is more than a communicator can have")))
}

impl Comm {
    /// Wraps a raw communicator (its lifetime is then this `Comm`'s).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let raw = rustccl::Communicator::init_all(&[0])?.remove(0);
    /// let comm = rustccl::typed::Comm::from_raw(raw);
    /// assert_eq!(comm.size(), 1);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn from_raw(raw: Communicator) -> Comm {
        Comm { raw, closed: false, _not_sync: PhantomData }
    }

    /// The raw communicator, for the raw API. Ending it there (destroy, abort) is allowed;
    /// this `Comm`'s drop then does nothing more.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// assert_eq!(comm.raw().count()?, 1);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn raw(&self) -> &Communicator {
        &self.raw
    }

    /// Gives up ownership: the raw communicator is returned, not finalized nor destroyed.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let raw = rustccl::typed::Comm::init_all(&[0])?.remove(0).into_raw();
    /// raw.destroy()?;
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn into_raw(mut self) -> Communicator {
        self.closed = true;
        self.raw.handle()
    }

    /// `ncclCommInitRank`: rank `rank` of `nranks`, on device 0, default config. Every rank
    /// calls it with the same `id` (from [`crate::get_unique_id`] on one rank, sent to the
    /// others however the application likes).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank};
    /// let comm = Comm::init(1, &rustccl::get_unique_id()?, Rank::new(0))?;
    /// assert_eq!(comm.device(), 0);
    /// assert!(Comm::init(1, &rustccl::get_unique_id()?, Rank::new(1)).is_err(), "rank 1 of 1");
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn init(nranks: u32, id: &UniqueId, rank: Rank) -> Result<Comm> {
        Comm::init_config(nranks, id, rank, 0, &CommConfig::default())
    }

    /// `ncclCommInitRankConfig` on `device`, waiting for the init to finish even when
    /// `config` is non-blocking (then the communicator's operations are, see
    /// [`Pending`](super::Pending)); [`Comm::init_nonblocking`] does not wait.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank};
    /// let config = rustccl::CommConfig::non_blocking();
    /// let comm = Comm::init_config(1, &rustccl::get_unique_id()?, Rank::new(0), 1, &config)?;
    /// assert_eq!(comm.device(), 1);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn init_config(nranks: u32, id: &UniqueId, rank: Rank, device: i32, config: &CommConfig) -> Result<Comm> {
        let raw = Communicator::init_rank_config(nranks_arg(nranks)?, id, rank_arg(rank, "rank")?, device, config)?;
        let comm = Comm::from_raw(raw);
        comm.raw.wait_ready()?;
        Ok(comm)
    }

    /// A non-blocking init (`config.blocking = 0` is set here): returns at once; poll or
    /// wait for the [`PendingInit`].
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank};
    /// let pending = Comm::init_nonblocking(1, &rustccl::get_unique_id()?, Rank::new(0), 0, &Default::default())?;
    /// let comm = pending.wait()?;
    /// assert_eq!(comm.size(), 1);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn init_nonblocking(nranks: u32, id: &UniqueId, rank: Rank, device: i32, config: &CommConfig) -> Result<PendingInit> {
        let config = CommConfig { blocking: 0, ..config.clone() };
        let raw = Communicator::init_rank_config(nranks_arg(nranks)?, id, rank_arg(rank, "rank")?, device, &config)?;
        Ok(PendingInit { raw: Some(raw) })
    }

    /// `ncclCommInitAll`: one communicator per device of `devices`, all in this process
    /// (rank `i` on `devices[i]`). Drive them from one thread inside one
    /// [`group`](Comm::group), or from one thread each.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comms = rustccl::typed::Comm::init_all(&[0, 1])?;
    /// assert_eq!(comms.iter().map(|c| c.rank().get()).collect::<Vec<_>>(), [0, 1]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn init_all(devices: &[i32]) -> Result<Vec<Comm>> {
        Ok(Communicator::init_all(devices)?.into_iter().map(Comm::from_raw).collect())
    }

    /// This rank.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// assert_eq!(rustccl::typed::Comm::init_all(&[0])?[0].rank().get(), 0);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn rank(&self) -> Rank {
        Rank::new(self.raw.rank_unchecked())
    }

    /// The number of ranks.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// assert_eq!(rustccl::typed::Comm::init_all(&[0, 1])?[1].size(), 2);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn size(&self) -> u32 {
        self.raw.nranks_unchecked()
    }

    /// Every rank, in order.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank};
    /// let comms = Comm::init_all(&[0, 1])?;
    /// assert_eq!(comms[0].ranks().collect::<Vec<_>>(), [Rank::new(0), Rank::new(1)]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn ranks(&self) -> impl Iterator<Item = Rank> {
        (0..self.size()).map(Rank::new)
    }

    /// `rank`, if it is a rank of this communicator (else an [`ErrorKind::Rank`] error).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// assert!(comm.checked_rank(0).is_ok());
    /// assert_eq!(comm.checked_rank(1).unwrap_err().kind(), rustccl::typed::ErrorKind::Rank);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn checked_rank(&self, rank: u32) -> Result<Rank> {
        Rank::new(rank).check(self.size(), "rank").map(|_| Rank::new(rank))
    }

    /// The device this rank uses.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// assert_eq!(rustccl::typed::Comm::init_all(&[3])?[0].device(), 3);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn device(&self) -> i32 {
        self.raw.device().unwrap_or(-1)
    }

    /// `len` zeroed elements of this communicator's backend and device.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// let buf = comm.alloc::<rustccl::typed::bf16>(4)?;
    /// assert_eq!(buf.to_vec()?, [rustccl::typed::bf16::ZERO; 4]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn alloc<T: Element>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        DeviceBuffer::zeroed(self.raw.backend(), self.raw.device()? as usize, len)
    }

    /// A [`DeviceBuffer`] holding a copy of `data`.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// assert_eq!(comm.buffer_from(&[1u32, 2, 3])?.to_vec()?, [1, 2, 3]);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn buffer_from<T: Element>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        let mut b = self.alloc(data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }

    /// A new stream on this communicator's device (destroyed when dropped).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// assert!(!comm.stream()?.raw().is_default());
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn stream(&self) -> Result<Stream> {
        let device = self.raw.device()? as usize;
        let backend = std::sync::Arc::clone(self.raw.backend());
        let raw = backend.create_stream(device)?;
        Ok(Stream::owned(backend, device, raw))
    }

    /// The communicator's asynchronous error: `None` while all is well (or work is still
    /// running), else what failed (a peer's death, an aborted or timed-out operation).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// assert!(comm.async_error().is_none());
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn async_error(&self) -> Option<Error> {
        self.raw.async_error_detail().map(Error::from)
    }

    /// Waits until every operation queued on this (non-blocking) communicator has completed;
    /// the asynchronous error if one failed.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// rustccl::typed::Comm::init_all(&[0])?[0].wait_idle()?;
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn wait_idle(&self) -> Result<()> {
        self.raw.wait_idle().map_err(Error::from)
    }

    /// A handle another thread can abort or revoke this communicator with.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// let stopper = comm.abort_handle();
    /// std::thread::spawn(move || stopper.abort()).join().unwrap();
    /// let mut x = [1.0f32];
    /// let e = comm.all_reduce_in_place(&mut x, rustccl::typed::Op::Sum, &rustccl::typed::Stream::DEFAULT).unwrap_err();
    /// assert_eq!(e.kind(), rustccl::typed::ErrorKind::InvalidArgument, "{e}");
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle { raw: self.raw.handle() }
    }

    /// `ncclCommRevoke`: stops operations in flight and refuses new ones; the communicator
    /// can still be shrunk, and is finalized and destroyed when dropped.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, ErrorKind, Op, Stream};
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// comm.revoke()?;
    /// let mut x = [1u8];
    /// let e = comm.all_reduce_in_place(&mut x, Op::Sum, &Stream::DEFAULT).unwrap_err();
    /// assert_eq!(e.kind(), ErrorKind::Revoked);
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn revoke(&self) -> Result<()> {
        self.raw.revoke(0).map_err(Error::from)
    }

    /// `ncclCommAbort`: stops everything now, even with dead peers; peers see this rank as
    /// failed. Always succeeds.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// rustccl::typed::Comm::init_all(&[0])?.remove(0).abort();
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn abort(mut self) {
        self.closed = true;
        let _ = self.raw.abort();
    }

    /// Ends the communicator as dropping it does (completes its work, finalizes, destroys),
    /// returning the first failure instead of logging it.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// rustccl::typed::Comm::init_all(&[0])?.remove(0).finalize()?;
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn finalize(mut self) -> Result<()> {
        self.closed = true;
        self.close()
    }

    fn close(&self) -> Result<()> {
        let finalized = match self.raw.finalize() {
            Err(e) if e.code == ResultCode::InProgress => self.raw.wait_idle(),
            r => r,
        };
        if let Err(e) = &finalized {
            tracing::warn!(
                target: "INIT",
                "rank {}: finalize failed ({}); destroying the communicator anyway",
                self.raw.rank_unchecked(),
                e.message
            );
        }
        let destroyed = self.raw.destroy();
        finalized.and(destroyed).map_err(Error::from)
    }

    /// `ncclCommSplit`: collective over this communicator. Ranks passing the same `color`
    /// form a new communicator, ordered by `key` then by rank; `None` (no colour) gets none.
    /// Without a config the child inherits this one's.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
    /// let child = comm.split(Some(7), 0, None)?.expect("colour 7 has this rank");
    /// assert_eq!(child.size(), 1);
    /// assert!(comm.split(None, 0, None)?.is_none());
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn split(&self, color: Option<u32>, key: i32, config: Option<&CommConfig>) -> Result<Option<Comm>> {
        let color = match color {
            None => SPLIT_NOCOLOR,
            Some(c) => i32::try_from(c)
                .map_err(|_| Error::new(ErrorKind::InvalidArgument, format!("split colour {c} is above {}", i32::MAX)))?,
        };
        Ok(self.raw.split(color, key, config)?.map(Comm::from_raw))
    }

    /// `ncclCommShrink`: called by every rank not in `exclude` (they may be dead); the new
    /// communicator keeps the other ranks in order. [`ShrinkFlags::Abort`] first aborts what
    /// is in flight here (use it after a failure).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// use rustccl::typed::{Comm, Rank};
    /// use rustccl::ShrinkFlags;
    /// let comm = Comm::init_all(&[0])?.remove(0);
    /// let same = comm.shrink(&[], ShrinkFlags::Default, None)?;
    /// assert_eq!(same.size(), 1);
    /// assert!(comm.shrink(&[Rank::new(5)], ShrinkFlags::Default, None).is_err());
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn shrink(&self, exclude: &[Rank], flags: ShrinkFlags, config: Option<&CommConfig>) -> Result<Comm> {
        let n = self.size();
        let exclude = exclude.iter().map(|r| r.check(n, "shrink: the excluded rank")).collect::<Result<Vec<i32>>>()?;
        Ok(Comm::from_raw(self.raw.shrink(&exclude, config, flags)?))
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        // Ended through the raw API (destroy, or abort through an AbortHandle): nothing left.
        if self.raw.is_ended() {
            return;
        }
        if let Err(e) = self.close() {
            tracing::warn!(target: "INIT", "rank {}: ending the communicator: {}", self.raw.rank_unchecked(), e.message());
        }
    }
}

/// Stops a [`Comm`] from any thread (a watchdog): `Send + Sync + Clone`.
///
/// ```
/// # std::env::set_var("RUSTCCL_BACKEND", "host");
/// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
/// let comm = rustccl::typed::Comm::init_all(&[0])?.remove(0);
/// let h = comm.abort_handle();
/// assert!(h.async_error().is_none());
/// h.revoke()?;
/// # Ok::<(), rustccl::typed::Error>(())
/// ```
#[derive(Debug)]
pub struct AbortHandle {
    raw: Communicator,
}

impl Clone for AbortHandle {
    fn clone(&self) -> AbortHandle {
        AbortHandle { raw: self.raw.handle() }
    }
}

impl AbortHandle {
    /// `ncclCommAbort` (see [`Comm::abort`]); the `Comm`'s drop then does nothing more.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// rustccl::typed::Comm::init_all(&[0])?[0].abort_handle().abort();
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn abort(&self) {
        let _ = self.raw.abort();
    }

    /// `ncclCommRevoke` (see [`Comm::revoke`]).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// rustccl::typed::Comm::init_all(&[0])?[0].abort_handle().revoke()?;
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn revoke(&self) -> Result<()> {
        self.raw.revoke(0).map_err(Error::from)
    }

    /// The communicator's asynchronous error (see [`Comm::async_error`]).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// assert!(rustccl::typed::Comm::init_all(&[0])?[0].abort_handle().async_error().is_none());
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn async_error(&self) -> Option<Error> {
        self.raw.async_error_detail().map(Error::from)
    }
}

/// A non-blocking init under way ([`Comm::init_nonblocking`]). Dropping it before it is
/// waited for aborts the half-made communicator (and says so in the log).
///
/// ```
/// # std::env::set_var("RUSTCCL_BACKEND", "host");
/// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
/// # use rustccl::typed::{Comm, Rank};
/// let mut init = Comm::init_nonblocking(1, &rustccl::get_unique_id()?, Rank::new(0), 0, &Default::default())?;
/// while init.poll().is_none() {
///     std::thread::sleep(std::time::Duration::from_millis(1)); // other work here
/// }
/// assert!(init.is_ready());
/// let comm = init.wait()?;
/// # Ok::<(), rustccl::typed::Error>(())
/// ```
pub struct PendingInit {
    raw: Option<Communicator>,
}

impl std::fmt::Debug for PendingInit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingInit({:?})", self.raw)
    }
}

impl PendingInit {
    fn raw(&self) -> &Communicator {
        self.raw.as_ref().expect("a PendingInit holds its communicator until wait")
    }

    /// `None` while the init runs; then whether it succeeded.
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank};
    /// let mut init = Comm::init_nonblocking(1, &rustccl::get_unique_id()?, Rank::new(0), 0, &Default::default())?;
    /// let done = loop { if let Some(r) = init.poll() { break r; } };
    /// assert!(done.is_ok());
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn poll(&mut self) -> Option<Result<()>> {
        match self.raw().async_error() {
            ResultCode::InProgress => None,
            ResultCode::Success => Some(Ok(())),
            code => Some(Err(self.raw().async_error_detail().map_or_else(
                || Error::from(crate::Error::new(code, "the non-blocking init failed")),
                Error::from,
            ))),
        }
    }

    /// Whether the init has finished (successfully or not).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank};
    /// let init = Comm::init_nonblocking(1, &rustccl::get_unique_id()?, Rank::new(0), 0, &Default::default())?;
    /// while !init.is_ready() { std::thread::yield_now(); }
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn is_ready(&self) -> bool {
        self.raw().async_error() != ResultCode::InProgress
    }

    /// Blocks until the init has finished; the communicator, or why it could not be made
    /// (then the half-made one is aborted).
    ///
    /// ```
    /// # std::env::set_var("RUSTCCL_BACKEND", "host");
    /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    /// # use rustccl::typed::{Comm, Rank};
    /// let comm = Comm::init_nonblocking(1, &rustccl::get_unique_id()?, Rank::new(0), 0, &Default::default())?.wait()?;
    /// assert_eq!(comm.rank(), Rank::new(0));
    /// # Ok::<(), rustccl::typed::Error>(())
    /// ```
    pub fn wait(mut self) -> Result<Comm> {
        let raw = self.raw.take().expect("a PendingInit holds its communicator until wait");
        match raw.wait_ready() {
            Ok(()) => Ok(Comm::from_raw(raw)),
            Err(e) => {
                let _ = raw.abort();
                Err(e.into())
            }
        }
    }
}

impl Drop for PendingInit {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            tracing::warn!(target: "INIT", "a non-blocking init was dropped before wait(): aborting its communicator");
            let _ = raw.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_send<T: Send>() {}
    fn is_send_sync<T: Send + Sync>() {}

    #[test]
    fn thread_rules() {
        is_send::<Comm>();
        is_send_sync::<AbortHandle>();
        is_send_sync::<Communicator>();
        is_send::<PendingInit>();
        is_send_sync::<DeviceBuffer<f32>>();
    }
}
