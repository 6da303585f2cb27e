//! One descriptor per collective: what NCCL's API defines for each call — its name, whether it
//! reduces, its `ncclFunc_t` for plugins, the elements its buffers hold on each rank (and where
//! they sit when the call is in place), and the traffic nccl-tests' bus bandwidth counts.
//!
//! Everything that needs one of these facts asks [`CollSpec`] instead of matching on the kind
//! again: the argument checks (`coll::submit`, the C API, the typed API), the planner's buffer
//! extents and tuner sizes, the board and the symmetric path, the profiler, the benchmark and
//! the tests' reference model (`crate::testing::reference`). A new collective is a new
//! [`Collective`] and its row in [`SPECS`].
//!
//! Pure data: this module imports nothing of the crate above it (it sits with `program.rs` and
//! `work.rs` in the layer order of docs/ARCHITECTURE.md).

use rustccl_plugin_api::CollType;

/// A collective of NCCL's API. `AlltoAll`, `Gather` and `Scatter` run as groups of sends and
/// receives (they have no `ncclFunc_t` of their own); they are here for their buffers and
/// their bandwidth.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    Send,
    Recv,
    AlltoAll,
    Gather,
    Scatter,
}

impl Collective {
    /// Every collective, in [`SPECS`] order.
    pub const ALL: [Collective; 10] = [
        Collective::AllReduce,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Send,
        Collective::Recv,
        Collective::AlltoAll,
        Collective::Gather,
        Collective::Scatter,
    ];

    /// Its descriptor.
    pub fn spec(self) -> &'static CollSpec {
        &SPECS[self as usize]
    }
}

/// How many elements one buffer of one rank holds, in units of the call's `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// Not used (Send's receive buffer, Recv's send buffer).
    Unused,
    /// `count` elements.
    Count,
    /// `count × nranks` elements (one block per rank).
    PerRank,
    /// `count` elements on the root, unused elsewhere.
    CountAtRoot,
    /// `count × nranks` elements on the root, unused elsewhere.
    PerRankAtRoot,
}

impl Side {
    fn elems(self, count: usize, nranks: usize, at_root: bool) -> usize {
        match self {
            Side::Unused => 0,
            Side::Count => count,
            Side::PerRank => count.saturating_mul(nranks),
            Side::CountAtRoot if at_root => count,
            Side::PerRankAtRoot if at_root => count.saturating_mul(nranks),
            Side::CountAtRoot | Side::PerRankAtRoot => 0,
        }
    }

    fn per_rank(self) -> bool {
        matches!(self, Side::PerRank | Side::PerRankAtRoot)
    }
}

/// nccl-tests' bus-bandwidth factor (busbw = algbw × factor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bus {
    /// 2(n-1)/n: every byte crosses the bus twice but for the rank's own share (AllReduce).
    TwiceAllButOwn,
    /// (n-1)/n: every byte once but the rank's own share.
    AllButOwn,
    /// 1: every byte once.
    Once,
}

/// What NCCL's API defines for one collective.
#[derive(Debug)]
pub struct CollSpec {
    pub coll: Collective,
    /// NCCL's name (`AllReduce`, ...), as logs, errors and the profiler say it.
    pub name: &'static str,
    /// NCCL's `ncclFunc_t` for the tuner and profiler plugins (`SendRecv` for the collectives
    /// made of sends and receives).
    pub func: CollType,
    /// Whether it applies a reduction operator.
    pub reduces: bool,
    /// Whether it takes a root.
    pub rooted: bool,
    /// A single send or receive.
    pub p2p: bool,
    send: Side,
    recv: Side,
    bus: Bus,
}

const fn spec(coll: Collective, name: &'static str, func: CollType, reduces: bool, send: Side, recv: Side, bus: Bus) -> CollSpec {
    let rooted = matches!(send, Side::CountAtRoot | Side::PerRankAtRoot) || matches!(recv, Side::CountAtRoot | Side::PerRankAtRoot);
    let p2p = matches!(coll, Collective::Send | Collective::Recv);
    CollSpec { coll, name, func, reduces, rooted, p2p, send, recv, bus }
}

/// The descriptors, indexed by [`Collective`] (`count` is per rank for AllGather's send,
/// ReduceScatter's receive, and AlltoAll, Gather and Scatter's blocks, as NCCL's API has it).
pub static SPECS: [CollSpec; 10] = [
    spec(Collective::AllReduce, "AllReduce", CollType::AllReduce, true, Side::Count, Side::Count, Bus::TwiceAllButOwn),
    // Broadcast's rooted side is the send buffer; every rank receives.
    spec(Collective::Broadcast, "Broadcast", CollType::Broadcast, false, Side::CountAtRoot, Side::Count, Bus::Once),
    spec(Collective::Reduce, "Reduce", CollType::Reduce, true, Side::Count, Side::CountAtRoot, Bus::Once),
    spec(Collective::AllGather, "AllGather", CollType::AllGather, false, Side::Count, Side::PerRank, Bus::AllButOwn),
    spec(Collective::ReduceScatter, "ReduceScatter", CollType::ReduceScatter, true, Side::PerRank, Side::Count, Bus::AllButOwn),
    spec(Collective::Send, "Send", CollType::Send, false, Side::Count, Side::Unused, Bus::Once),
    spec(Collective::Recv, "Recv", CollType::Recv, false, Side::Unused, Side::Count, Bus::Once),
    spec(Collective::AlltoAll, "AlltoAll", CollType::SendRecv, false, Side::PerRank, Side::PerRank, Bus::AllButOwn),
    spec(Collective::Gather, "Gather", CollType::SendRecv, false, Side::Count, Side::PerRankAtRoot, Bus::AllButOwn),
    spec(Collective::Scatter, "Scatter", CollType::SendRecv, false, Side::PerRankAtRoot, Side::Count, Bus::AllButOwn),
];

impl CollSpec {
    /// Elements of `rank`'s (send, receive) buffer for a call with `count` (NCCL's meaning of
    /// the count argument; `root` is ignored by the collectives without one). 0: the buffer
    /// is unused and may be NULL. Saturates at `usize::MAX` (callers check sizes first, with
    /// [`CollSpec::count_multiple`]).
    pub fn extents(&self, count: usize, nranks: usize, rank: usize, root: usize) -> (usize, usize) {
        let at_root = rank == root;
        (self.send.elems(count, nranks, at_root), self.recv.elems(count, nranks, at_root))
    }

    /// [`CollSpec::extents`] in bytes of `elem_size`-byte elements (saturating).
    pub fn extent_bytes(&self, count: usize, elem_size: usize, nranks: usize, rank: usize, root: usize) -> (usize, usize) {
        let (s, r) = self.extents(count, nranks, rank, root);
        (s.saturating_mul(elem_size), r.saturating_mul(elem_size))
    }

    /// Whether `rank` reads its send buffer (so it must not be NULL when `count > 0`).
    pub fn uses_send(&self, rank: usize, root: usize) -> bool {
        self.send.elems(1, 1, rank == root) > 0
    }

    /// Whether `rank` writes its receive buffer (so it must not be NULL when `count > 0`).
    pub fn uses_recv(&self, rank: usize, root: usize) -> bool {
        self.recv.elems(1, 1, rank == root) > 0
    }

    /// Whether a buffer holds one block per rank (its size depends on the number of ranks).
    pub fn has_rank_blocks(&self) -> bool {
        self.send.per_rank() || self.recv.per_rank()
    }

    /// The largest buffer of the call, in units of `count`: `nranks` for the collectives with
    /// one block per rank, else 1. `count × elem × this` is NCCL's `nBytes` for the tuner,
    /// nccl-tests' algorithm bytes, and what the argument checks bound.
    pub fn count_multiple(&self, nranks: usize) -> usize {
        if self.has_rank_blocks() {
            nranks
        } else {
            1
        }
    }

    /// Where the (send, receive) buffers start, in elements from the start of one allocation,
    /// when the call is in place (NCCL's rule: AllGather's and Gather's send buffer is rank
    /// `rank`'s block of the receive buffer, ReduceScatter's and Scatter's receive buffer
    /// rank `rank`'s block of the send buffer; the others use the same address for both).
    pub fn in_place_offsets(&self, count: usize, rank: usize) -> (usize, usize) {
        let block = count.saturating_mul(rank);
        match (self.send.per_rank(), self.recv.per_rank()) {
            (false, true) => (block, 0),
            (true, false) => (0, block),
            _ => (0, 0),
        }
    }

    /// nccl-tests' bus-bandwidth factor on `nranks` ranks (busbw = algbw × factor).
    pub fn bus_factor(&self, nranks: usize) -> f64 {
        let n = nranks as f64;
        match self.bus {
            Bus::TwiceAllButOwn => 2.0 * (n - 1.0) / n,
            Bus::AllButOwn => (n - 1.0) / n,
            Bus::Once => 1.0,
        }
    }

    /// The bytes nccl-tests' algorithm bandwidth divides by the time (`GetBw`'s S).
    pub fn alg_bytes(&self, count: usize, elem_size: usize, nranks: usize) -> f64 {
        count as f64 * elem_size as f64 * self.count_multiple(nranks) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_indexed_by_collective() {
        for c in Collective::ALL {
            assert_eq!(c.spec().coll, c);
        }
    }

    #[test]
    fn extents_follow_nccl_per_collective() {
        let ext = |c: Collective, rank, root| c.spec().extents(5, 4, rank, root);
        assert_eq!(ext(Collective::AllReduce, 1, 0), (5, 5));
        assert_eq!(ext(Collective::AllGather, 1, 0), (5, 20));
        assert_eq!(ext(Collective::ReduceScatter, 1, 0), (20, 5));
        assert_eq!(ext(Collective::Broadcast, 2, 2), (5, 5));
        assert_eq!(ext(Collective::Broadcast, 1, 2), (0, 5));
        assert_eq!(ext(Collective::Reduce, 2, 2), (5, 5));
        assert_eq!(ext(Collective::Reduce, 1, 2), (5, 0));
        assert_eq!(ext(Collective::Send, 1, 0), (5, 0));
        assert_eq!(ext(Collective::Recv, 1, 0), (0, 5));
        assert_eq!(ext(Collective::AlltoAll, 1, 0), (20, 20));
        assert_eq!(ext(Collective::Gather, 3, 3), (5, 20));
        assert_eq!(ext(Collective::Gather, 1, 3), (5, 0));
        assert_eq!(ext(Collective::Scatter, 3, 3), (20, 5));
        assert_eq!(ext(Collective::Scatter, 1, 3), (0, 5));
        assert_eq!(Collective::AllGather.spec().extents(usize::MAX, 2, 0, 0).1, usize::MAX, "saturates");
        let b = Collective::Broadcast.spec();
        assert!(b.uses_send(2, 2) && !b.uses_send(1, 2) && b.uses_recv(1, 2));
        let r = Collective::Reduce.spec();
        assert!(r.uses_send(1, 2) && !r.uses_recv(1, 2) && r.uses_recv(2, 2));
        assert!(!Collective::Send.spec().uses_recv(0, 0) && !Collective::Recv.spec().uses_send(0, 0));
    }

    #[test]
    fn names_kinds_and_plugin_types() {
        let s = Collective::ReduceScatter.spec();
        assert_eq!((s.name, s.func, s.reduces, s.rooted, s.p2p), ("ReduceScatter", CollType::ReduceScatter, true, false, false));
        let reducing: Vec<_> = Collective::ALL.into_iter().filter(|c| c.spec().reduces).collect();
        assert_eq!(reducing, [Collective::AllReduce, Collective::Reduce, Collective::ReduceScatter]);
        let rooted: Vec<_> = Collective::ALL.into_iter().filter(|c| c.spec().rooted).collect();
        assert_eq!(rooted, [Collective::Broadcast, Collective::Reduce, Collective::Gather, Collective::Scatter]);
        assert_eq!(Collective::Recv.spec().func.index(), 7);
        assert!(Collective::Send.spec().p2p && !Collective::AlltoAll.spec().p2p);
    }

    #[test]
    fn in_place_and_bandwidth() {
        assert_eq!(Collective::AllGather.spec().in_place_offsets(5, 3), (15, 0));
        assert_eq!(Collective::Gather.spec().in_place_offsets(5, 3), (15, 0));
        assert_eq!(Collective::ReduceScatter.spec().in_place_offsets(5, 3), (0, 15));
        assert_eq!(Collective::Scatter.spec().in_place_offsets(5, 3), (0, 15));
        assert_eq!(Collective::AllReduce.spec().in_place_offsets(5, 3), (0, 0));
        assert_eq!(Collective::AlltoAll.spec().in_place_offsets(5, 3), (0, 0));
        assert_eq!(Collective::AllReduce.spec().bus_factor(4), 1.5);
        assert_eq!(Collective::AllGather.spec().bus_factor(4), 0.75);
        assert_eq!(Collective::Broadcast.spec().bus_factor(4), 1.0);
        assert_eq!(Collective::AllGather.spec().alg_bytes(10, 4, 8), 320.0);
        assert_eq!(Collective::Reduce.spec().alg_bytes(10, 4, 8), 40.0);
        assert_eq!(Collective::AllGather.spec().count_multiple(8), 8);
        assert_eq!(Collective::Send.spec().count_multiple(8), 1);
    }
}
