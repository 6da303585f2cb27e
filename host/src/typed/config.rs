//! [`CollConfig`]: per-call options of a collective (NCCL 2.31's `ncclCollConfig_t`), the
//! optional last argument of [`Comm::all_reduce_with`](super::Comm::all_reduce_with) and the
//! other `_with` operations, single or in a group ([`Group::all_reduce_with`](super::Group::all_reduce_with)
//! ...: each call of a group with its own config, as `nccl*Config` calls between
//! `ncclGroupStart` and `ncclGroupEnd`).

use crate::coll::options::CollOptions;
use crate::spec::Collective;

use super::error::Result;

/// Options for one collective call. The default changes nothing; every rank must pass the
/// same ones (each checks only its own).
///
/// ```
/// # std::env::set_var("RUSTCCL_BACKEND", "host");
/// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
/// use rustccl::typed::{CollConfig, Comm, ErrorKind, Op, Stream};
/// let comm = Comm::init_all(&[0])?.remove(0);
/// let cfg = CollConfig::new().algorithms("TREE").max_channels(1).profiler_tag(7);
/// let mut sum = vec![0.0f32; 4];
/// comm.all_reduce_with(&[1.0; 4], &mut sum, Op::Sum, &Stream::DEFAULT, &cfg)?.wait()?;
/// assert_eq!(sum, [1.0; 4]);
/// // An all_gather has no tree: refused before anything is enqueued...
/// let mut all = vec![0.0f32; 4];
/// let e = comm.all_gather_with(&[1.0; 4], &mut all, &Stream::DEFAULT, &cfg).unwrap_err();
/// assert_eq!(e.kind(), ErrorKind::InvalidArgument);
/// // ...unless the selection may fall back to automatic selection.
/// comm.all_gather_with(&[1.0; 4], &mut all, &Stream::DEFAULT, &cfg.clone().fall_back(true))?.wait()?;
/// # Ok::<(), rustccl::typed::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CollConfig {
    algorithms: Option<String>,
    fall_back: bool,
    min_channels: Option<u32>,
    max_channels: Option<u32>,
    profiler_tag: u64,
}

impl CollConfig {
    pub fn new() -> CollConfig {
        CollConfig::default()
    }

    /// The algorithms the call may use, in NCCL's words (`algSelection`): names such as
    /// `RING`, `TREE`, `RING_LL128` (each a case-insensitive prefix of NCCL's names), joined
    /// by `,` (either), `+` (both) and `^` (not). rustccl plans RING for every collective and
    /// TREE for all_reduce. A selection that leaves the call nothing is
    /// [`ErrorKind::InvalidArgument`](super::ErrorKind::InvalidArgument), unless
    /// [`fall_back`](Self::fall_back) allows automatic selection instead.
    pub fn algorithms(mut self, selection: impl Into<String>) -> CollConfig {
        self.algorithms = Some(selection.into());
        self
    }

    /// Whether a selection that cannot be honoured falls back to automatic selection
    /// (NCCL's `forceAlgSelection = 0`) instead of failing the call. Default: no.
    pub fn fall_back(mut self, yes: bool) -> CollConfig {
        self.fall_back = yes;
        self
    }

    /// The fewest channels (NCCL's `minCTAs`), within the communicator's limits.
    pub fn min_channels(mut self, n: u32) -> CollConfig {
        self.min_channels = Some(n.max(1));
        self
    }

    /// The most channels (NCCL's `maxCTAs`), within the communicator's limits.
    pub fn max_channels(mut self, n: u32) -> CollConfig {
        self.max_channels = Some(n.max(1));
        self
    }

    /// A tag for the call's profiler events (`userProfilerTag`; values with the top bit set
    /// are NCCL's): profiler plugins get it on the call's API and Coll events (NCCL's C
    /// profiler v7, rustccl's profiler ABI v3).
    pub fn profiler_tag(mut self, tag: u64) -> CollConfig {
        self.profiler_tag = tag;
        self
    }

    /// The core's options for a call of `coll` (`what` names it in errors).
    pub(crate) fn options(&self, coll: Collective, what: &str) -> Result<CollOptions> {
        let mut o = CollOptions { min_channels: self.min_channels, max_channels: self.max_channels, pairs: None, profiler_tag: self.profiler_tag };
        if let Some(sel) = &self.algorithms {
            o.select(sel, !self.fall_back, coll, what)?;
        }
        Ok(o)
    }
}

/// The collectives with a [`CollConfig`] (NCCL's `nccl*Config` calls): each is its plain
/// operation, with the config checked first.
mod with {
    use super::super::buffer::{RecvBuf, SendBuf};
    use super::super::build;
    use super::super::element::Element;
    use super::super::error::Result;
    use super::super::pending::Pending;
    use super::super::rank::{Op, Rank};
    use super::super::stream::AsStream;
    use super::super::{Comm, Group};
    use super::CollConfig;
    use crate::spec::Collective;

    /// The same calls queued in a group ([`Comm::group`]), each with its own config.
    impl<'scope, 'env> Group<'scope, 'env> {
        /// Queues an all-reduce with `config` ([`Comm::all_reduce_with`]).
        ///
        /// ```
        /// # std::env::set_var("RUSTCCL_BACKEND", "host");
        /// # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
        /// # use rustccl::typed::{CollConfig, Comm, Op, Stream};
        /// # let comm = Comm::init_all(&[0])?.remove(0);
        /// let (mut a, mut b) = ([0i32; 2], [0i32; 2]);
        /// comm.group(|g| {
        ///     g.all_reduce_with(&[1, 2], &mut a, Op::Sum, &Stream::DEFAULT, &CollConfig::new().profiler_tag(1))?;
        ///     g.all_reduce_with(&[3, 4], &mut b, Op::Sum, &Stream::DEFAULT, &CollConfig::new().algorithms("RING"))
        /// })?;
        /// assert_eq!((a, b), ([1, 2], [3, 4]));
        /// # Ok::<(), rustccl::typed::Error>(())
        /// ```
        pub fn all_reduce_with<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &self,
            send: &'scope S,
            recv: &'scope mut R,
            op: Op<T>,
            stream: &'scope St,
            config: &CollConfig,
        ) -> Result<()> {
            self.enqueue_with(stream, T::DATA_TYPE, Some((config, Collective::AllReduce)), |r| build::all_reduce(r, send, recv, op))
        }

        /// Queues a broadcast with `config` ([`Comm::broadcast_with`]).
        pub fn broadcast_with<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &self,
            send: &'scope S,
            recv: &'scope mut R,
            root: Rank,
            stream: &'scope St,
            config: &CollConfig,
        ) -> Result<()> {
            self.enqueue_with(stream, T::DATA_TYPE, Some((config, Collective::Broadcast)), |r| build::broadcast(r, send, recv, root))
        }

        /// Queues a reduce with `config` ([`Comm::reduce_with`]).
        #[allow(clippy::too_many_arguments)]
        pub fn reduce_with<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &self,
            send: &'scope S,
            recv: &'scope mut R,
            op: Op<T>,
            root: Rank,
            stream: &'scope St,
            config: &CollConfig,
        ) -> Result<()> {
            self.enqueue_with(stream, T::DATA_TYPE, Some((config, Collective::Reduce)), |r| build::reduce(r, send, recv, op, root))
        }

        /// Queues an all-gather with `config` ([`Comm::all_gather_with`]).
        pub fn all_gather_with<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &self,
            send: &'scope S,
            recv: &'scope mut R,
            stream: &'scope St,
            config: &CollConfig,
        ) -> Result<()> {
            self.enqueue_with(stream, T::DATA_TYPE, Some((config, Collective::AllGather)), |r| build::all_gather(r, send, recv))
        }

        /// Queues a reduce-scatter with `config` ([`Comm::reduce_scatter_with`]).
        pub fn reduce_scatter_with<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &self,
            send: &'scope S,
            recv: &'scope mut R,
            op: Op<T>,
            stream: &'scope St,
            config: &CollConfig,
        ) -> Result<()> {
            self.enqueue_with(stream, T::DATA_TYPE, Some((config, Collective::ReduceScatter)), |r| build::reduce_scatter(r, send, recv, op))
        }

        /// Queues an all-to-all with `config` ([`Comm::all_to_all_with`]).
        pub fn all_to_all_with<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &self,
            send: &'scope S,
            recv: &'scope mut R,
            stream: &'scope St,
            config: &CollConfig,
        ) -> Result<()> {
            self.enqueue_with(stream, T::DATA_TYPE, Some((config, Collective::AlltoAll)), |r| build::all_to_all(r, send, recv))
        }

        /// Queues a gather with `config` ([`Comm::gather_with`]).
        pub fn gather_with<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &self,
            send: &'scope S,
            recv: &'scope mut R,
            root: Rank,
            stream: &'scope St,
            config: &CollConfig,
        ) -> Result<()> {
            self.enqueue_with(stream, T::DATA_TYPE, Some((config, Collective::Gather)), |r| build::gather(r, send, recv, root))
        }

        /// Queues a scatter with `config` ([`Comm::scatter_with`]).
        pub fn scatter_with<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &self,
            send: &'scope S,
            recv: &'scope mut R,
            root: Rank,
            stream: &'scope St,
            config: &CollConfig,
        ) -> Result<()> {
            self.enqueue_with(stream, T::DATA_TYPE, Some((config, Collective::Scatter)), |r| build::scatter(r, send, recv, root))
        }
    }

    impl Comm {
        /// [`Comm::all_reduce`] with `config` (`ncclAllReduceConfig`).
        pub fn all_reduce_with<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &'a self,
            send: &'a S,
            recv: &'a mut R,
            op: Op<T>,
            stream: &'a St,
            config: &CollConfig,
        ) -> Result<Pending<'a>> {
            self.issue_with(stream, T::DATA_TYPE, Some((config, Collective::AllReduce)), |r| build::all_reduce(r, send, recv, op))
        }

        /// [`Comm::broadcast`] with `config` (`ncclBroadcastConfig`).
        pub fn broadcast_with<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &'a self,
            send: &'a S,
            recv: &'a mut R,
            root: Rank,
            stream: &'a St,
            config: &CollConfig,
        ) -> Result<Pending<'a>> {
            self.issue_with(stream, T::DATA_TYPE, Some((config, Collective::Broadcast)), |r| build::broadcast(r, send, recv, root))
        }

        /// [`Comm::reduce`] with `config` (`ncclReduceConfig`).
        #[allow(clippy::too_many_arguments)]
        pub fn reduce_with<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &'a self,
            send: &'a S,
            recv: &'a mut R,
            op: Op<T>,
            root: Rank,
            stream: &'a St,
            config: &CollConfig,
        ) -> Result<Pending<'a>> {
            self.issue_with(stream, T::DATA_TYPE, Some((config, Collective::Reduce)), |r| build::reduce(r, send, recv, op, root))
        }

        /// [`Comm::all_gather`] with `config` (`ncclAllGatherConfig`).
        pub fn all_gather_with<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &'a self,
            send: &'a S,
            recv: &'a mut R,
            stream: &'a St,
            config: &CollConfig,
        ) -> Result<Pending<'a>> {
            self.issue_with(stream, T::DATA_TYPE, Some((config, Collective::AllGather)), |r| build::all_gather(r, send, recv))
        }

        /// [`Comm::reduce_scatter`] with `config` (`ncclReduceScatterConfig`).
        pub fn reduce_scatter_with<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &'a self,
            send: &'a S,
            recv: &'a mut R,
            op: Op<T>,
            stream: &'a St,
            config: &CollConfig,
        ) -> Result<Pending<'a>> {
            self.issue_with(stream, T::DATA_TYPE, Some((config, Collective::ReduceScatter)), |r| build::reduce_scatter(r, send, recv, op))
        }

        /// [`Comm::all_to_all`] with `config` (`ncclAlltoAllConfig`; it has no algorithm
        /// names: a selection is an error unless it may fall back).
        pub fn all_to_all_with<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &'a self,
            send: &'a S,
            recv: &'a mut R,
            stream: &'a St,
            config: &CollConfig,
        ) -> Result<Pending<'a>> {
            self.issue_with(stream, T::DATA_TYPE, Some((config, Collective::AlltoAll)), |r| build::all_to_all(r, send, recv))
        }

        /// [`Comm::gather`] with `config` (`ncclGatherConfig`; no algorithm names either).
        pub fn gather_with<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &'a self,
            send: &'a S,
            recv: &'a mut R,
            root: Rank,
            stream: &'a St,
            config: &CollConfig,
        ) -> Result<Pending<'a>> {
            self.issue_with(stream, T::DATA_TYPE, Some((config, Collective::Gather)), |r| build::gather(r, send, recv, root))
        }

        /// [`Comm::scatter`] with `config` (`ncclScatterConfig`; no algorithm names either).
        pub fn scatter_with<'a, T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized, St: AsStream + ?Sized>(
            &'a self,
            send: &'a S,
            recv: &'a mut R,
            root: Rank,
            stream: &'a St,
            config: &CollConfig,
        ) -> Result<Pending<'a>> {
            self.issue_with(stream, T::DATA_TYPE, Some((config, Collective::Scatter)), |r| build::scatter(r, send, recv, root))
        }
    }
}
