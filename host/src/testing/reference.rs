//! The reference model of the collectives, on host values: for each element of a rank's
//! receive buffer, where its value comes from ([`Call::source`]: the reduction of one input
//! element over every rank, one rank's input element, or nothing), and the exact arithmetic of
//! the reductions ([`reduce_ints`], [`reduce_floats`]). The caller owns the inputs and their
//! encoding in the element types; this model only says which inputs make which output, from
//! the buffer rules of [`crate::spec::CollSpec`] and NCCL's definition of each operator.
//!
//! Used by `tests/src/bin/worker_coll.rs` (the correctness matrix) and `bench/src/data.rs`
//! (the benchmark's checks), so that both check the same definition.

use crate::spec::Collective;

/// What a rank's call does, as far as its output is concerned.
#[derive(Clone, Copy, Debug)]
pub enum Pattern<'a> {
    /// One of NCCL's collectives (`root` is ignored by those without one). A lone
    /// [`Collective::Send`] writes nothing; a lone [`Collective::Recv`] needs its sender: use
    /// [`Pattern::SendRecv`].
    Collective { coll: Collective, root: usize },
    /// A send to one rank and a receive of `count` elements from rank `from`.
    SendRecv { from: usize },
    /// AlltoAllv: for each source rank `p`, `blocks[p]` = (where its block starts in this
    /// rank's receive buffer, its elements, where it starts in `p`'s send buffer).
    AlltoAllv { blocks: &'a [(usize, usize, usize)] },
}

/// Where one output element's value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Input element `index`, reduced over every rank with the call's operator.
    Reduced(usize),
    /// Rank `rank`'s input element `index`.
    Input { rank: usize, index: usize },
    /// Nothing: the element keeps what it held before the call.
    Untouched,
}

/// One rank's call: what the reference needs to know about it.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    pub pattern: Pattern<'a>,
    /// The count argument, as NCCL's API has it (per rank for AllGather's send, ReduceScatter's
    /// receive, AlltoAll's, Gather's and Scatter's blocks).
    pub count: usize,
    pub nranks: usize,
    pub rank: usize,
    /// In place: the send and receive buffers overlap as NCCL's rule places them
    /// ([`crate::spec::CollSpec::in_place_offsets`]).
    pub in_place: bool,
}

impl Call<'_> {
    /// Elements of this rank's receive buffer that the call writes (0 where it has none, as a
    /// non-root's in Reduce and Gather).
    pub fn recv_elems(&self) -> usize {
        match self.pattern {
            Pattern::Collective { coll, root } => coll.spec().extents(self.count, self.nranks, self.rank, root).1,
            Pattern::SendRecv { .. } => self.count,
            Pattern::AlltoAllv { blocks } => blocks.iter().map(|&(at, len, _)| at + len).max().unwrap_or(0),
        }
    }

    /// Where element `j` of the receive buffer (counted from the receive pointer) comes from.
    /// Beyond what the call writes: `Untouched`, except that on a rank that receives nothing
    /// an in-place call leaves its own input where the rule put it (Reduce's and Gather's
    /// non-roots).
    pub fn source(&self, j: usize) -> Source {
        let (c, n, r) = (self.count, self.nranks, self.rank);
        let input = |rank: usize, index: usize| Source::Input { rank, index };
        match self.pattern {
            Pattern::SendRecv { from } => {
                if j < c {
                    input(from, j)
                } else {
                    Source::Untouched
                }
            }
            Pattern::AlltoAllv { blocks } => blocks
                .iter()
                .enumerate()
                .find(|(_, &(at, len, _))| j >= at && j < at + len)
                .map_or(Source::Untouched, |(p, &(at, _, from))| input(p, from + (j - at))),
            Pattern::Collective { coll, root } => {
                let spec = coll.spec();
                let (send, recv) = spec.extents(c, n, r, root);
                if j >= recv {
                    let (at, _) = spec.in_place_offsets(c, r);
                    return if recv == 0 && self.in_place && j >= at && j < at + send { input(r, j - at) } else { Source::Untouched };
                }
                match coll {
                    Collective::AllReduce | Collective::Reduce => Source::Reduced(j),
                    Collective::ReduceScatter => Source::Reduced(r * c + j),
                    Collective::Broadcast => input(root, j),
                    Collective::AllGather | Collective::Gather => input(j / c, j % c),
                    Collective::AlltoAll => input(j / c, r * c + j % c),
                    Collective::Scatter => input(root, r * c + j),
                    Collective::Send => Source::Untouched,
                    Collective::Recv => panic!("a lone Recv has no sender in the reference: use Pattern::SendRecv"),
                }
            }
        }
    }
}

/// A reduction operator of the reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Sum,
    Prod,
    Min,
    Max,
    /// Integers: the sum divided by the ranks, truncated toward zero (NCCL's SumPostDiv).
    /// Floats: PreMulSum by 1/nranks rounded to the type (the `avg_scalar` of
    /// [`reduce_floats`]), as NCCL computes it.
    Avg,
    /// Each rank's input times its own scalar, then the sum.
    PreMulSum,
}

/// The exact reduction over `nranks` ranks of integer inputs `x(rank)` (`scalar(rank)`: the
/// PreMulSum scalars). Sum, Prod and PreMulSum wrap as two's complement does, so the result
/// reduced mod 2^bits of the type is the type's result in any order; Avg assumes the sum does
/// not overflow.
pub fn reduce_ints(op: Op, nranks: usize, x: impl Fn(usize) -> i128, scalar: impl Fn(usize) -> i128) -> i128 {
    let all = 0..nranks;
    match op {
        Op::Sum => all.fold(0i128, |a, r| a.wrapping_add(x(r))),
        Op::Prod => all.fold(1i128, |a, r| a.wrapping_mul(x(r))),
        Op::Min => all.map(x).min().expect("one rank at least"),
        Op::Max => all.map(x).max().expect("one rank at least"),
        Op::Avg => all.map(x).sum::<i128>() / nranks as i128,
        Op::PreMulSum => all.fold(0i128, |a, r| a.wrapping_add(x(r).wrapping_mul(scalar(r)))),
    }
}

/// The smaller of two floats, -0 below +0.
pub fn fmin(a: f64, b: f64) -> f64 {
    if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}

/// The larger of two floats, +0 above -0.
pub fn fmax(a: f64, b: f64) -> f64 {
    if a > b || (a == b && b.is_sign_negative()) {
        a
    } else {
        b
    }
}

/// The reduction in `f64` over `nranks` ranks of float inputs `x(rank)` (`scalar(rank)`: the
/// PreMulSum scalars; `avg_scalar`: 1/nranks rounded to the element type). Exact when the
/// inputs are chosen so that every partial result is (the callers' generators do); the caller
/// rounds it to the type. A zero sum is +0 unless every input is -0, as IEEE addition gives.
pub fn reduce_floats(op: Op, nranks: usize, x: impl Fn(usize) -> f64, scalar: impl Fn(usize) -> f64, avg_scalar: f64) -> f64 {
    let all = 0..nranks;
    let res = match op {
        Op::Sum => all.map(&x).sum::<f64>(),
        Op::Prod => all.map(&x).product::<f64>(),
        Op::Min => (1..nranks).fold(x(0), |a, r| fmin(a, x(r))),
        Op::Max => (1..nranks).fold(x(0), |a, r| fmax(a, x(r))),
        Op::Avg => all.map(&x).sum::<f64>() * avg_scalar,
        Op::PreMulSum => all.map(|r| x(r) * scalar(r)).sum::<f64>(),
    };
    if res == 0.0 && !matches!(op, Op::Prod | Op::Min | Op::Max) {
        // f64's `sum` starts from -0.0 in newer Rust: normalise.
        let all_neg_zero = (0..nranks).all(|r| x(r) == 0.0 && x(r).is_sign_negative());
        return if all_neg_zero { -0.0 } else { 0.0 };
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(pattern: Pattern, count: usize, nranks: usize, rank: usize, in_place: bool, len: usize) -> Vec<Source> {
        let call = Call { pattern, count, nranks, rank, in_place };
        (0..len).map(|j| call.source(j)).collect()
    }

    fn coll(coll: Collective, root: usize) -> Pattern<'static> {
        Pattern::Collective { coll, root }
    }

    use Source::{Input, Reduced, Untouched};

    #[test]
    fn reductions_and_copies_on_three_ranks() {
        assert_eq!(sources(coll(Collective::AllReduce, 0), 2, 3, 1, false, 3), [Reduced(0), Reduced(1), Untouched]);
        assert_eq!(sources(coll(Collective::ReduceScatter, 0), 2, 3, 1, false, 2), [Reduced(2), Reduced(3)]);
        assert_eq!(sources(coll(Collective::Broadcast, 2), 2, 3, 0, false, 2), [Input { rank: 2, index: 0 }, Input { rank: 2, index: 1 }]);
        assert_eq!(
            sources(coll(Collective::AllGather, 0), 2, 3, 0, false, 6),
            [0, 0, 1, 1, 2, 2].iter().zip([0, 1, 0, 1, 0, 1]).map(|(&rank, index)| Input { rank, index }).collect::<Vec<_>>()
        );
        // AlltoAll: block p of rank 1's output is block 1 of rank p's input.
        assert_eq!(sources(coll(Collective::AlltoAll, 0), 2, 3, 1, false, 6)[4..], [Input { rank: 2, index: 2 }, Input { rank: 2, index: 3 }]);
        assert_eq!(sources(coll(Collective::Scatter, 0), 2, 3, 2, false, 2), [Input { rank: 0, index: 4 }, Input { rank: 0, index: 5 }]);
        assert_eq!(sources(Pattern::SendRecv { from: 2 }, 1, 3, 0, false, 2), [Input { rank: 2, index: 0 }, Untouched]);
        let blocks = [(3, 1, 5), (0, 0, 0), (0, 2, 1)];
        assert_eq!(
            sources(Pattern::AlltoAllv { blocks: &blocks }, 0, 3, 0, false, 5),
            [Input { rank: 2, index: 1 }, Input { rank: 2, index: 2 }, Untouched, Input { rank: 0, index: 5 }, Untouched]
        );
        assert_eq!(Call { pattern: Pattern::AlltoAllv { blocks: &blocks }, count: 0, nranks: 3, rank: 0, in_place: false }.recv_elems(), 4);
    }

    #[test]
    fn non_roots_keep_their_buffers_and_in_place_their_input() {
        assert_eq!(sources(coll(Collective::Reduce, 0), 2, 3, 1, false, 2), [Untouched, Untouched]);
        assert_eq!(sources(coll(Collective::Reduce, 0), 2, 3, 1, true, 3), [Input { rank: 1, index: 0 }, Input { rank: 1, index: 1 }, Untouched]);
        assert_eq!(sources(coll(Collective::Reduce, 1), 2, 3, 1, true, 2), [Reduced(0), Reduced(1)]);
        // Gather in place: a non-root's input sits at its block of the receive allocation.
        assert_eq!(sources(coll(Collective::Gather, 0), 1, 3, 2, true, 3), [Untouched, Untouched, Input { rank: 2, index: 0 }]);
        assert_eq!(sources(coll(Collective::Gather, 0), 1, 3, 2, false, 3), [Untouched; 3]);
        assert_eq!(sources(coll(Collective::Gather, 2), 1, 3, 2, false, 3)[1], Input { rank: 1, index: 0 });
        let c = Call { pattern: coll(Collective::Gather, 0), count: 2, nranks: 3, rank: 1, in_place: false };
        assert_eq!(c.recv_elems(), 0);
    }

    #[test]
    fn integer_reductions_wrap_and_truncate() {
        let x = |r: usize| [7i128, -3, 4][r];
        assert_eq!(reduce_ints(Op::Sum, 3, x, |_| 1), 8);
        assert_eq!(reduce_ints(Op::Prod, 3, x, |_| 1), -84);
        assert_eq!(reduce_ints(Op::Min, 3, x, |_| 1), -3);
        assert_eq!(reduce_ints(Op::Max, 3, x, |_| 1), 7);
        assert_eq!(reduce_ints(Op::Avg, 3, x, |_| 1), 2, "8 / 3 truncated");
        assert_eq!(reduce_ints(Op::Avg, 2, |r| [-3i128, 0][r], |_| 1), -1, "toward zero");
        assert_eq!(reduce_ints(Op::PreMulSum, 3, x, |r| r as i128 + 1), 7 - 6 + 12);
        assert_eq!(reduce_ints(Op::Prod, 2, |_| i128::MAX, |_| 1), 1, "wraps");
    }

    #[test]
    fn float_reductions_signed_zeros_and_average() {
        let x = |r: usize| [1.5f64, -0.25, 2.0, 0.75][r];
        assert_eq!(reduce_floats(Op::Sum, 4, x, |_| 1.0, 0.25), 4.0);
        assert_eq!(reduce_floats(Op::Prod, 4, x, |_| 1.0, 0.25), -0.5625);
        assert_eq!(reduce_floats(Op::Avg, 4, x, |_| 1.0, 0.25), 1.0);
        assert_eq!(reduce_floats(Op::Avg, 3, |r| [3.0, 0.0, 0.0][r], |_| 1.0, 0.375), 1.125, "times the rounded scalar, not divided");
        assert_eq!(reduce_floats(Op::PreMulSum, 2, x, |r| [2.0, 4.0][r], 0.5), 2.0);
        assert_eq!(reduce_floats(Op::Min, 2, |r| [0.0, -0.0][r], |_| 1.0, 0.5).to_bits(), (-0.0f64).to_bits());
        assert_eq!(reduce_floats(Op::Max, 2, |r| [-0.0, 0.0][r], |_| 1.0, 0.5).to_bits(), 0.0f64.to_bits());
        assert_eq!(reduce_floats(Op::Sum, 2, |r| [-0.0, 0.0][r], |_| 1.0, 0.5).to_bits(), 0.0f64.to_bits());
        assert_eq!(reduce_floats(Op::Sum, 2, |_| -0.0, |_| 1.0, 0.5).to_bits(), (-0.0f64).to_bits());
        assert_eq!(reduce_floats(Op::Sum, 2, |r| [1.0, -1.0][r], |_| 1.0, 0.5).to_bits(), 0.0f64.to_bits());
    }
}
