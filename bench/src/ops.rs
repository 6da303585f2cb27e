//! The operations: names, buffer layouts (nccl-tests' `GetCollByteCount`), in-place offsets and
//! bandwidth formulas (nccl-tests' `GetBw`).

use rustccl::spec::{CollSpec, Collective};
use rustccl::types::DataType;

/// A benchmarked operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AlltoAll,
    AlltoAllv,
    Gather,
    Scatter,
    SendRecv,
}

impl Coll {
    pub const ALL: [Coll; 10] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AlltoAll,
        Coll::AlltoAllv,
        Coll::Gather,
        Coll::Scatter,
        Coll::SendRecv,
    ];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AlltoAll => "alltoall",
            Coll::AlltoAllv => "alltoallv",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
            Coll::SendRecv => "sendrecv",
        }
    }

    /// NCCL's descriptor of the operation (`None` for SendRecv, a send and a receive, and
    /// AlltoAllv, which NCCL does not have).
    pub fn spec(self) -> Option<&'static CollSpec> {
        let c = match self {
            Coll::AllReduce => Collective::AllReduce,
            Coll::AllGather => Collective::AllGather,
            Coll::ReduceScatter => Collective::ReduceScatter,
            Coll::Broadcast => Collective::Broadcast,
            Coll::Reduce => Collective::Reduce,
            Coll::AlltoAll => Collective::AlltoAll,
            Coll::Gather => Collective::Gather,
            Coll::Scatter => Collective::Scatter,
            Coll::AlltoAllv | Coll::SendRecv => return None,
        };
        Some(c.spec())
    }

    /// Whether the operation takes a reduction operator.
    pub fn has_redop(self) -> bool {
        self.spec().is_some_and(|s| s.reduces)
    }

    /// Whether the operation takes a root.
    pub fn has_root(self) -> bool {
        self.spec().is_some_and(|s| s.rooted)
    }

    /// Whether the in-place variant has a defined result (nccl-tests reports `N/A` for the
    /// others: alltoall, alltoallv and sendrecv with one buffer race by definition).
    pub fn in_place_checked(self) -> bool {
        !matches!(self, Coll::AlltoAll | Coll::AlltoAllv | Coll::SendRecv)
    }

    /// The bus-bandwidth factor (plugin-abi.md §4; AlltoAllv's is AlltoAll's, SendRecv's 1).
    pub fn bus_factor(self, nranks: usize) -> f64 {
        match self {
            Coll::AlltoAllv => Collective::AlltoAll.spec().bus_factor(nranks),
            Coll::SendRecv => 1.0,
            c => c.spec().expect("every other operation has a spec").bus_factor(nranks),
        }
    }
}

/// A reduction operator as the benchmark selects it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Redop {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    /// Each rank multiplies its input by its own scalar ([`premul_scalar`]), then the sum.
    PreMulSum,
}

impl Redop {
    pub const ALL: [Redop; 6] = [
        Redop::Sum,
        Redop::Prod,
        Redop::Max,
        Redop::Min,
        Redop::Avg,
        Redop::PreMulSum,
    ];

    /// The name in the table (nccl-tests' names: `mulsum` for PreMulSum, 6 columns wide).
    pub fn name(self) -> &'static str {
        match self {
            Redop::Sum => "sum",
            Redop::Prod => "prod",
            Redop::Max => "max",
            Redop::Min => "min",
            Redop::Avg => "avg",
            Redop::PreMulSum => "mulsum",
        }
    }

    /// NCCL's value for the built-in operators (`None` for PreMulSum, made per communicator).
    pub fn nccl_value(self) -> Option<i32> {
        match self {
            Redop::Sum => Some(0),
            Redop::Prod => Some(1),
            Redop::Max => Some(2),
            Redop::Min => Some(3),
            Redop::Avg => Some(4),
            Redop::PreMulSum => None,
        }
    }
}

/// The PreMulSum scalar of `rank`: 1 on even ranks, 2 on odd ones (so every product is exact).
pub fn premul_scalar(rank: usize) -> f64 {
    if rank & 1 == 0 {
        1.0
    } else {
        2.0
    }
}

/// AlltoAllv's counts of one rank, in elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VCounts {
    pub send_counts: Vec<usize>,
    pub send_displs: Vec<usize>,
    pub recv_counts: Vec<usize>,
    pub recv_displs: Vec<usize>,
}

/// AlltoAllv's uneven matrix: what rank `from` sends to rank `to`, with `base` = count/nranks
/// elements per peer at most: `base * (n + (2*from + to) % n) / (2n)`, between base/2 and
/// base. Every rank sends the same total; what ranks receive differs when n is even.
pub fn a2av_count(base: usize, nranks: usize, from: usize, to: usize) -> usize {
    let n = nranks;
    base * (n + (2 * from + to) % n) / (2 * n)
}

/// The counts and displacements (packed, in peer order) of `rank`.
pub fn a2av_counts(base: usize, nranks: usize, rank: usize) -> VCounts {
    let send_counts: Vec<usize> = (0..nranks)
        .map(|p| a2av_count(base, nranks, rank, p))
        .collect();
    let recv_counts: Vec<usize> = (0..nranks)
        .map(|p| a2av_count(base, nranks, p, rank))
        .collect();
    let displs = |c: &[usize]| {
        let mut off = 0;
        c.iter()
            .map(|&x| {
                let d = off;
                off += x;
                d
            })
            .collect::<Vec<usize>>()
    };
    VCounts {
        send_displs: displs(&send_counts),
        recv_displs: displs(&recv_counts),
        send_counts,
        recv_counts,
    }
}

/// The most elements any rank sends or receives in AlltoAllv.
pub fn a2av_max_elems(base: usize, nranks: usize) -> usize {
    (0..nranks)
        .map(|r| {
            let v = a2av_counts(base, nranks, r);
            v.send_counts
                .iter()
                .sum::<usize>()
                .max(v.recv_counts.iter().sum::<usize>())
        })
        .max()
        .unwrap_or(0)
}

/// One size of one operation: nccl-tests' `GetCollByteCount`, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Elements of the send buffer.
    pub send_count: usize,
    /// Elements of the receive buffer (what is checked).
    pub recv_count: usize,
    /// The count argument of the call (per rank for all_gather, reduce_scatter, alltoall,
    /// gather, scatter; the whole buffer for alltoallv, whose counts come separately).
    pub param_count: usize,
    /// In place, the send buffer is the receive allocation plus `rank * send_inplace`
    /// elements, and the receive buffer that allocation plus `rank * recv_inplace`.
    pub send_inplace: usize,
    pub recv_inplace: usize,
}

impl Layout {
    /// The layout for `count` elements (the size divided by the element size).
    pub fn new(coll: Coll, count: usize, nranks: usize) -> Layout {
        let n = nranks.max(1);
        let per = count / n;
        // The buffers as the root sees them (the largest); in place, rank 1's offsets are
        // the offsets per rank.
        let (send_count, recv_count, param_count, send_inplace, recv_inplace) = match coll.spec() {
            Some(spec) => {
                let param = if spec.has_rank_blocks() { per } else { count };
                let (send, recv) = spec.extents(param, n, 0, 0);
                let (send_inplace, recv_inplace) = spec.in_place_offsets(param, 1);
                (send, recv, param, send_inplace, recv_inplace)
            }
            None if coll == Coll::AlltoAllv => (per * n, per * n, per * n, 0, 0),
            None => (count, count, count, 0, 0),
        };
        Layout {
            send_count,
            recv_count,
            param_count,
            send_inplace,
            recv_inplace,
        }
    }

    /// The size column: the larger of the two buffers, in bytes.
    pub fn size_bytes(&self, elem: usize) -> usize {
        self.send_count.max(self.recv_count) * elem
    }

    /// The bytes the algorithm bandwidth divides by the time (nccl-tests' `GetBw`).
    pub fn alg_bytes(&self, coll: Coll, elem: usize, nranks: usize) -> f64 {
        match coll.spec() {
            Some(spec) => spec.alg_bytes(self.param_count, elem, nranks),
            None if coll == Coll::AlltoAllv => {
                (a2av_max_elems(self.param_count / nranks.max(1), nranks) * elem) as f64
            }
            None => (self.param_count * elem) as f64,
        }
    }
}

/// (algbw, busbw) in GB/s (1e9 bytes) for `seconds`.
pub fn bandwidth(
    coll: Coll,
    layout: &Layout,
    dtype: DataType,
    nranks: usize,
    seconds: f64,
) -> (f64, f64) {
    if seconds <= 0.0 {
        return (0.0, 0.0);
    }
    let alg = layout.alg_bytes(coll, dtype.size(), nranks) / 1.0e9 / seconds;
    (alg, alg * coll.bus_factor(nranks))
}

/// nccl-tests' type names (`half`, `float`, ...; `f8e4m3`/`f8e5m2` for the fp8 types).
pub fn type_name(t: DataType) -> &'static str {
    match t {
        DataType::Int8 => "int8",
        DataType::Uint8 => "uint8",
        DataType::Int32 => "int32",
        DataType::Uint32 => "uint32",
        DataType::Int64 => "int64",
        DataType::Uint64 => "uint64",
        DataType::Float16 => "half",
        DataType::Float32 => "float",
        DataType::Float64 => "double",
        DataType::Bfloat16 => "bfloat16",
        DataType::Float8e4m3 => "f8e4m3",
        DataType::Float8e5m2 => "f8e5m2",
    }
}
