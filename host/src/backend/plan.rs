//! [`LocalPlan`]: the device-local work of one collective on one device, as an ordered list
//! of [`Step`]s a backend executes in order on a stream.
//!
//! The planner turns a collective (all-reduce, all-gather, ...) into these steps plus the
//! transports' sends and receives. New kinds of step are added as new [`Step`] variants;
//! every backend must then handle them in `launch` (the compiler lists the places).

use super::DevicePtr;
use crate::error::{Error, Result};
use crate::types::{DataType, RedOp};

/// One unit of device-local work.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Copies `bytes` bytes from `src` to `dst`. The ranges must not overlap (unless equal,
    /// which copies nothing).
    Copy { dst: DevicePtr, src: DevicePtr, bytes: usize },
    /// `dst[i] = op(srcs[0][i], srcs[1][i], ...)` for `i` in `0..count` elements of `dtype`.
    /// [`RedOp::Avg`] divides the sum by `srcs.len()`; [`RedOp::PreMulSum`] multiplies each
    /// input by `scalar` (given in, and first converted to, `dtype`) and sums. `scalar` is set
    /// for PreMulSum and only then. `dst` may be one of the `srcs` (in place) but must not
    /// otherwise overlap them.
    Reduce { dst: DevicePtr, srcs: Vec<DevicePtr>, count: usize, dtype: DataType, op: RedOp, scalar: Option<f64> },
    /// Sets `bytes` bytes at `dst` to `value`.
    Fill { dst: DevicePtr, bytes: usize, value: u8 },
}

/// A memory range a step reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub ptr: DevicePtr,
    pub bytes: usize,
    pub write: bool,
}

fn overlaps(a: DevicePtr, b: DevicePtr, bytes: usize) -> bool {
    let (a, b, n) = (a.0 as u128, b.0 as u128, bytes as u128);
    a < b + n && b < a + n
}

impl Step {
    /// The number of bytes each range of this step covers.
    fn range_bytes(&self) -> Result<usize> {
        match self {
            Step::Copy { bytes, .. } | Step::Fill { bytes, .. } => Ok(*bytes),
            Step::Reduce { count, dtype, .. } => count
                .checked_mul(dtype.size())
                .ok_or_else(|| Error::invalid_argument(format!("reduce of {count} {dtype} elements overflows"))),
        }
    }

    /// Every memory range this step touches; a backend validates them before it runs it.
    pub fn accesses(&self) -> Result<Vec<Access>> {
        let bytes = self.range_bytes()?;
        let read = |ptr| Access { ptr, bytes, write: false };
        Ok(match self {
            Step::Copy { dst, src, .. } => {
                vec![Access { ptr: *dst, bytes, write: true }, read(*src)]
            }
            Step::Fill { dst, .. } => vec![Access { ptr: *dst, bytes, write: true }],
            Step::Reduce { dst, srcs, .. } => {
                std::iter::once(Access { ptr: *dst, bytes, write: true }).chain(srcs.iter().map(|s| read(*s))).collect()
            }
        })
    }

    /// Checks what can be checked without looking at memory: operand counts, the scalar,
    /// sizes and overlaps.
    pub fn check(&self) -> Result<()> {
        let bytes = self.range_bytes()?;
        match self {
            Step::Copy { dst, src, .. } => {
                if dst != src && overlaps(*dst, *src, bytes) {
                    return Err(Error::invalid_argument(format!(
                        "copy of {bytes} bytes from {src} to {dst}: the ranges overlap"
                    )));
                }
            }
            Step::Fill { .. } => {}
            Step::Reduce { dst, srcs, op, scalar, .. } => {
                if srcs.is_empty() {
                    return Err(Error::invalid_argument("reduce step with no inputs"));
                }
                match (op, scalar) {
                    (RedOp::PreMulSum, None) => {
                        return Err(Error::invalid_argument("premulsum reduce step without a scalar"))
                    }
                    (RedOp::PreMulSum, Some(_)) | (_, None) => {}
                    (op, Some(s)) => {
                        return Err(Error::invalid_argument(format!(
                            "{op} reduce step given a scalar ({s}); only premulsum takes one"
                        )))
                    }
                }
                if let Some(s) = srcs.iter().find(|s| *s != dst && overlaps(*dst, **s, bytes)) {
                    return Err(Error::invalid_argument(format!(
                        "reduce output {dst} partially overlaps input {s} ({bytes} bytes)"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The ordered device-local steps of one collective on one device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LocalPlan {
    pub steps: Vec<Step>,
}

impl LocalPlan {
    pub fn new() -> LocalPlan {
        LocalPlan::default()
    }

    pub fn push(&mut self, step: Step) -> &mut LocalPlan {
        self.steps.push(step);
        self
    }

    pub fn copy(&mut self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> &mut LocalPlan {
        self.push(Step::Copy { dst, src, bytes })
    }

    pub fn fill(&mut self, dst: DevicePtr, bytes: usize, value: u8) -> &mut LocalPlan {
        self.push(Step::Fill { dst, bytes, value })
    }

    /// Adds a reduce step; `scalar` only for [`RedOp::PreMulSum`].
    pub fn reduce(
        &mut self,
        dst: DevicePtr,
        srcs: Vec<DevicePtr>,
        count: usize,
        dtype: DataType,
        op: RedOp,
        scalar: Option<f64>,
    ) -> &mut LocalPlan {
        self.push(Step::Reduce { dst, srcs, count, dtype, op, scalar })
    }

    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// [`Step::check`] on every step; the error names the step.
    pub fn check(&self) -> Result<()> {
        for (i, step) in self.steps.iter().enumerate() {
            step.check().map_err(|e| e.context(format!("plan step {i}")))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ResultCode::InvalidArgument;

    #[test]
    fn builds_in_order_and_lists_accesses() {
        let mut plan = LocalPlan::new();
        plan.fill(DevicePtr(0x100), 16, 0).copy(DevicePtr(0x200), DevicePtr(0x100), 16).reduce(
            DevicePtr(0x300),
            vec![DevicePtr(0x100), DevicePtr(0x200)],
            4,
            DataType::Float32,
            RedOp::Sum,
            None,
        );
        assert_eq!(plan.len(), 3);
        plan.check().unwrap();
        let acc = plan.steps[2].accesses().unwrap();
        assert_eq!(acc.len(), 3);
        assert_eq!(acc[0], Access { ptr: DevicePtr(0x300), bytes: 16, write: true });
        assert_eq!(acc[2], Access { ptr: DevicePtr(0x200), bytes: 16, write: false });
    }

    #[test]
    fn check_rejects_malformed_steps() {
        let p = DevicePtr(0x1000);
        let bad = [
            Step::Reduce { dst: p, srcs: vec![], count: 1, dtype: DataType::Int32, op: RedOp::Sum, scalar: None },
            Step::Reduce {
                dst: p,
                srcs: vec![p],
                count: 1,
                dtype: DataType::Int32,
                op: RedOp::PreMulSum,
                scalar: None,
            },
            Step::Reduce { dst: p, srcs: vec![p], count: 1, dtype: DataType::Int32, op: RedOp::Max, scalar: Some(2.0) },
            Step::Reduce {
                dst: p,
                srcs: vec![p.offset(4)],
                count: 2,
                dtype: DataType::Int32,
                op: RedOp::Sum,
                scalar: None,
            },
            Step::Reduce {
                dst: p,
                srcs: vec![p],
                count: usize::MAX,
                dtype: DataType::Int64,
                op: RedOp::Sum,
                scalar: None,
            },
            Step::Copy { dst: p.offset(1), src: p, bytes: 8 },
        ];
        for step in bad {
            assert_eq!(step.check().unwrap_err().code, InvalidArgument, "{step:?}");
        }
        // In place and adjacent ranges are fine.
        Step::Reduce {
            dst: p,
            srcs: vec![p, p.offset(8)],
            count: 2,
            dtype: DataType::Int32,
            op: RedOp::Sum,
            scalar: None,
        }
        .check()
        .unwrap();
        Step::Copy { dst: p.offset(8), src: p, bytes: 8 }.check().unwrap();
    }

    #[test]
    fn plan_check_names_the_step() {
        let mut plan = LocalPlan::new();
        plan.fill(DevicePtr(8), 1, 0).reduce(DevicePtr(8), vec![], 1, DataType::Uint8, RedOp::Sum, None);
        assert!(plan.check().unwrap_err().message.starts_with("plan step 1:"));
    }
}
