//! Ranks and reduction operators as types: a root or peer is a [`Rank`] (checked against
//! the communicator's size before anything is enqueued), an operator an [`Op`] whose
//! PreMulSum scalar has the buffers' element type.

use super::element::Element;
use super::error::{Error, ErrorKind, Result};
use crate::coll::{ReduceOp, Scalar};

/// A rank of a communicator: the root of a broadcast, reduce, gather or scatter, or the
/// peer of a send or receive. Every typed call checks it is below the communicator's size
/// and refuses it (kind [`ErrorKind::Rank`]) before enqueuing anything.
///
/// ```
/// use rustccl::typed::Rank;
/// let root = Rank::new(0);
/// assert_eq!(root.get(), 0);
/// assert_eq!(Rank::from(3u32), Rank::new(3));
/// assert_eq!(Rank::new(2).to_string(), "rank 2");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Rank(u32);

impl Rank {
    /// Rank `r` (checked against a communicator when used).
    ///
    /// ```
    /// assert_eq!(rustccl::typed::Rank::new(5).get(), 5);
    /// ```
    pub const fn new(r: u32) -> Rank {
        Rank(r)
    }

    /// The rank's number.
    ///
    /// ```
    /// assert_eq!(rustccl::typed::Rank::new(1).get(), 1);
    /// ```
    pub const fn get(self) -> u32 {
        self.0
    }

    /// The rank as a `usize` (an index into per-rank blocks).
    ///
    /// ```
    /// assert_eq!(rustccl::typed::Rank::new(1).index(), 1usize);
    /// ```
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// This rank, if it is below `nranks`; else a [`ErrorKind::Rank`] error naming `what`.
    pub(crate) fn check(self, nranks: u32, what: &str) -> Result<i32> {
        if self.0 >= nranks {
            return Err(Error::new(
                ErrorKind::Rank,
                format!("{what} {} is not a rank of this {nranks}-rank communicator (ranks are 0..{nranks})", self.0),
            ));
        }
        Ok(self.0 as i32)
    }
}

impl From<u32> for Rank {
    fn from(r: u32) -> Rank {
        Rank(r)
    }
}

impl std::fmt::Display for Rank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {}", self.0)
    }
}

/// A reduction operator for elements of type `T`.
///
/// `PreMulSum(s)` multiplies each rank's input by its own `s` before summing (each rank may
/// pass a different one; `Avg` is `PreMulSum(1/nranks)` for floats, and rounds towards
/// zero for integers).
///
/// ```
/// use rustccl::typed::Op;
/// let scale: Op<f32> = Op::PreMulSum(0.5);
/// assert_eq!(scale, Op::PreMulSum(0.5f32));
/// assert_ne!(Op::<i32>::Max, Op::Min);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op<T: Element> {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    PreMulSum(T),
}

impl<T: Element> Op<T> {
    /// The raw operator.
    ///
    /// ```
    /// use rustccl::typed::Op;
    /// assert_eq!(Op::PreMulSum(2i32).raw(), rustccl::ReduceOp::PreMulSum(rustccl::Scalar::Host(2.0)));
    /// ```
    pub fn raw(self) -> ReduceOp {
        match self {
            Op::Sum => ReduceOp::Sum,
            Op::Prod => ReduceOp::Prod,
            Op::Max => ReduceOp::Max,
            Op::Min => ReduceOp::Min,
            Op::Avg => ReduceOp::Avg,
            Op::PreMulSum(s) => ReduceOp::PreMulSum(Scalar::Host(s.to_scalar())),
        }
    }
}
