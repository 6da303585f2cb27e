//! Elementwise reduction primitives with the device kernels' rounding: what a collective
//! applies to every chunk, on byte buffers of one element type (native byte order).
//!
//! A collective reduces step by step: each rank's own input first goes through
//! [`Reducer::pre`] (PreMulSum's multiplication by the scalar), then partial results are
//! combined two at a time with [`Reducer::combine`] — every step rounded to the element type,
//! as a kernel stores each step's result in the element type — and the final result goes
//! through [`Reducer::post`] (SumPostDiv's division). [`Reducer::pre_combine`] fuses the most
//! common step, `pre(local) ⊕ incoming`.
//!
//! # Semantics, per element type (NCCL's device code, `reduce_kernel.h`)
//!
//! * **Integers** (`Int8`..`Uint64`): two's complement, sums and products wrap; Min/Max signed
//!   or unsigned per type. PreMulSum's scalar is converted with Rust's `as` (truncation toward
//!   zero, like C's cast; out of range saturates and NaN gives 0, where C is undefined).
//!   SumPostDiv divides truncating toward zero, like C.
//! * **Float32, Float64**: IEEE arithmetic in the type (`a + b`, `a * b` rounded once, to
//!   nearest even). Min/Max like `fminf`/`fmaxf`: a NaN operand is ignored.
//! * **Float16, Bfloat16**: `__hadd`/`__hmul`: the exact result, rounded once to the type
//!   (nearest even, subnormals kept, overflow to infinity). Computed as `f64` (exact for half;
//!   for bfloat16 sums, `f64`'s 53 bits are more than the 2p+2 = 18 that make the second
//!   rounding harmless) and rounded once from `f64` — never through `f32`.
//! * **Float8e4m3, Float8e5m2**: as NCCL does it: both operands widened to half (exact), the
//!   half operation (`__hadd`/`__hmul`/`__hmin`/`__hmax`, rounded to half), then
//!   `__nv_cvt_halfraw_to_fp8(h, __NV_SATFINITE, fmt)`: nearest even, magnitudes past the
//!   largest finite value (infinity included) saturate to it (e4m3 ±448, e5m2 ±57344), NaN
//!   becomes 0x7f. So with e5m2, any operation on an infinity — Min/Max too — gives ±57344.
//!   See [`fp8`]. Implemented with 64 KiB lookup tables per (format, operation), built once
//!   from that reference path.
//! * **Min/Max of every float type**: a NaN operand is ignored (the other one is the result);
//!   two NaNs give the type's canonical NaN (f32 0x7fffffff, f64 0x7fff..., half and bfloat16
//!   0x7fff, fp8 0x7f); -0 counts as less than +0 (so min(-0, +0) = -0, max = +0) whatever
//!   the order of the operands.
//! * **NaN from arithmetic**: half, bfloat16 and fp8 give the canonical NaN; f32/f64 give
//!   whatever the CPU gives (a quiet NaN, perhaps with an operand's payload, where a GPU gives
//!   its canonical NaN): NaN payloads are not part of the contract.
//! * **PreMulSum** ([`Reducer::pre`]): `x * scalar` with the scalar first converted to the
//!   element type (one rounding from the `f64`), the product computed and rounded like
//!   [`DevOp::Prod`]. The product is rounded to the element type *before* it is added: NCCL's
//!   `FuncPreMulSum<half>` is `__hmul`, then the sum is `__hadd`.
//!
//! # Relation to `kernels/src/device/reduce_ops.h`
//!
//! Two differences from this crate's own (not yet launched) CUDA functors, which compute in
//! `float` for the 16- and 8-bit types and round only at the store:
//! * Their `copy_reduce` does `store(op(pre(load(src0)), load(src1)))` without storing
//!   `pre`'s product in between, so for PreMulSum on half, bfloat16 and fp8 the product is
//!   not rounded to the element type before the add (two roundings fewer than NCCL). Here
//!   [`Reducer::pre_combine`] rounds the product, as NCCL does.
//! * Their `FuncMin`/`FuncMax` are `b < a ? b : a` / `a < b ? b : a`: with a NaN operand they
//!   return the first operand, NaN or not. Here a NaN is ignored, like `fminf`.
//!
//! Everything else gives the same bits: for a single Sum/Prod on two operands of a p-bit
//! format, computing in `float` (24 >= 2p+2 for half, bfloat16 and fp8) and rounding the
//! `float` gives the correctly rounded result; and for fp8, going through half or straight
//! from `float` gives the same fp8 (the tests check all 65536 pairs).
//!
//! # Performance
//!
//! The element type and the operation are dispatched once per call; each (type, operation)
//! pair is its own loop over elements (generic over [`elem::Elem`]), which the compiler
//! vectorises for the integer and IEEE types.

pub mod float;
pub mod fp8;

mod elem;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use crate::types::{DataType, RedOp};
use elem::Elem;

/// The operation the kernels apply (NCCL's device ops, `ncclDevRedOp_t`): user [`RedOp`]s
/// map onto these with [`DevOp::from_user`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DevOp {
    Sum,
    Prod,
    Min,
    Max,
    /// Each rank's input multiplied by `scalar` (in the element type), then summed.
    PreMulSum { scalar: f64 },
    /// Summed, then the result divided by `n` (integer Avg; `n >= 1`).
    SumPostDiv { n: u64 },
}

impl DevOp {
    /// NCCL's mapping (`hostToDevRedOp`): Sum/Prod/Min/Max as is; Avg becomes
    /// `PreMulSum { 1/nranks }` for float types and `SumPostDiv { nranks }` for integers;
    /// PreMulSum takes its scalar (which it requires). Other ops ignore `scalar`.
    ///
    /// Errors (`InvalidArgument`): PreMulSum without a scalar; Avg with `nranks == 0`.
    pub fn from_user(op: RedOp, scalar: Option<f64>, dtype: DataType, nranks: usize) -> Result<DevOp> {
        Ok(match op {
            RedOp::Sum => DevOp::Sum,
            RedOp::Prod => DevOp::Prod,
            RedOp::Min => DevOp::Min,
            RedOp::Max => DevOp::Max,
            RedOp::Avg => {
                if nranks == 0 {
                    return Err(Error::invalid_argument("avg reduction over 0 ranks"));
                }
                if dtype.is_float() {
                    DevOp::PreMulSum { scalar: 1.0 / nranks as f64 }
                } else {
                    DevOp::SumPostDiv { n: nranks as u64 }
                }
            }
            RedOp::PreMulSum => match scalar {
                Some(scalar) => DevOp::PreMulSum { scalar },
                None => return Err(Error::invalid_argument("premulsum reduction without a scalar")),
            },
        })
    }
}

/// The value of one element of `dtype` (the first `dtype.size()` bytes of `bytes`, native byte
/// order) as an `f64`: exact, except 64-bit integers beyond 2^53, which round to nearest.
///
/// For a PreMulSum scalar given in the element type (e.g. read from device memory):
/// `DevOp::PreMulSum { scalar: decode_scalar(dtype, bytes) }` converts back to the very same
/// element-type scalar (those large 64-bit integers aside). fp8 and half NaNs give a NaN.
/// Panics if `bytes` is shorter than one element.
pub fn decode_scalar(dtype: DataType, bytes: &[u8]) -> f64 {
    let b = &bytes[..dtype.size()];
    let mut a = [0u8; 8];
    a[..b.len()].copy_from_slice(b);
    match dtype {
        DataType::Int8 => f64::from(b[0] as i8),
        DataType::Uint8 => f64::from(b[0]),
        DataType::Int32 => f64::from(i32::from_ne_bytes([a[0], a[1], a[2], a[3]])),
        DataType::Uint32 => f64::from(u32::from_ne_bytes([a[0], a[1], a[2], a[3]])),
        DataType::Int64 => i64::from_ne_bytes(a) as f64,
        DataType::Uint64 => u64::from_ne_bytes(a) as f64,
        DataType::Float16 => float::f16_to_f64(u16::from_ne_bytes([a[0], a[1]])),
        DataType::Float32 => f64::from(f32::from_ne_bytes([a[0], a[1], a[2], a[3]])),
        DataType::Float64 => f64::from_ne_bytes(a),
        DataType::Bfloat16 => float::bf16_to_f64(u16::from_ne_bytes([a[0], a[1]])),
        DataType::Float8e4m3 => f64::from(fp8::e4m3_to_f32(b[0])),
        DataType::Float8e5m2 => f64::from(fp8::e5m2_to_f32(b[0])),
    }
}

/// The reduction of one element type with one device op.
///
/// Every method takes buffers of whole elements of `dtype`, all of the same length, and
/// panics otherwise (a caller's bug, not a runtime condition).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reducer {
    pub dtype: DataType,
    pub op: DevOp,
}

/// Runs `$body` with `$T` naming the [`Elem`] of `$dtype`.
macro_rules! with_elem {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DataType::Int8 => {
                type $T = elem::I8;
                $body
            }
            DataType::Uint8 => {
                type $T = elem::U8;
                $body
            }
            DataType::Int32 => {
                type $T = elem::I32;
                $body
            }
            DataType::Uint32 => {
                type $T = elem::U32;
                $body
            }
            DataType::Int64 => {
                type $T = elem::I64;
                $body
            }
            DataType::Uint64 => {
                type $T = elem::U64;
                $body
            }
            DataType::Float16 => {
                type $T = elem::F16;
                $body
            }
            DataType::Float32 => {
                type $T = elem::F32;
                $body
            }
            DataType::Float64 => {
                type $T = elem::F64;
                $body
            }
            DataType::Bfloat16 => {
                type $T = elem::BF16;
                $body
            }
            DataType::Float8e4m3 => {
                type $T = elem::E4M3;
                $body
            }
            DataType::Float8e5m2 => {
                type $T = elem::E5M2;
                $body
            }
        }
    };
}

/// Runs `$body` with `$f` bound to the binary operation of `$op` on `$T` (add for the
/// sum-like ops).
macro_rules! with_binop {
    ($T:ident, $op:expr, $f:ident => $body:expr) => {{
        let c = $T::ctx();
        match $op {
            DevOp::Sum | DevOp::PreMulSum { .. } | DevOp::SumPostDiv { .. } => {
                let $f = |x, y| $T::add(c, x, y);
                $body
            }
            DevOp::Prod => {
                let $f = |x, y| $T::mul(c, x, y);
                $body
            }
            DevOp::Min => {
                let $f = |x, y| $T::min(c, x, y);
                $body
            }
            DevOp::Max => {
                let $f = |x, y| $T::max(c, x, y);
                $body
            }
        }
    }};
}

impl Reducer {
    pub fn new(dtype: DataType, op: DevOp) -> Reducer {
        Reducer { dtype, op }
    }

    /// Bytes per element.
    pub fn elem_size(&self) -> usize {
        self.dtype.size()
    }

    fn check(&self, len: usize, others: &[usize]) {
        assert!(
            len % self.dtype.size() == 0 && others.iter().all(|&l| l == len),
            "reduce {}: buffers of {len} and {others:?} bytes are not the same whole number of elements",
            self.dtype
        );
    }

    /// The local input as it enters the reduction: for PreMulSum `x * scalar` (the scalar
    /// converted to the element type, the product rounded to the element type); otherwise a
    /// copy.
    pub fn pre(&self, src: &[u8], dst: &mut [u8]) {
        self.check(dst.len(), &[src.len()]);
        match self.op {
            DevOp::PreMulSum { scalar } => with_elem!(self.dtype, T => {
                let (c, s) = (T::ctx(), T::scalar(scalar));
                map::<T>(src, dst, |x| T::mul(c, x, s))
            }),
            _ => dst.copy_from_slice(src),
        }
    }

    /// [`Reducer::pre`] in place.
    pub fn pre_in_place(&self, buf: &mut [u8]) {
        self.check(buf.len(), &[]);
        if let DevOp::PreMulSum { scalar } = self.op {
            with_elem!(self.dtype, T => {
                let (c, s) = (T::ctx(), T::scalar(scalar));
                map_in_place::<T>(buf, |x| T::mul(c, x, s))
            })
        }
    }

    /// `out = a ⊕ b` elementwise (Sum, PreMulSum, SumPostDiv add; Prod multiplies; Min/Max),
    /// each result rounded to the element type.
    pub fn combine(&self, a: &[u8], b: &[u8], out: &mut [u8]) {
        self.check(out.len(), &[a.len(), b.len()]);
        with_elem!(self.dtype, T => with_binop!(T, self.op, f => zip::<T>(a, b, out, f)))
    }

    /// `acc = acc ⊕ b`: [`Reducer::combine`] with the output over the first input.
    pub fn combine_into(&self, acc: &mut [u8], b: &[u8]) {
        self.check(acc.len(), &[b.len()]);
        with_elem!(self.dtype, T => with_binop!(T, self.op, f => zip_into::<T>(acc, b, f)))
    }

    /// After the last step: SumPostDiv divides by `n` (integers: truncating toward zero, as
    /// C); the other ops leave `buf` as it is. Panics if `n == 0`.
    pub fn post(&self, buf: &mut [u8]) {
        self.check(buf.len(), &[]);
        if let DevOp::SumPostDiv { n } = self.op {
            assert!(n >= 1, "SumPostDiv by 0");
            with_elem!(self.dtype, T => map_in_place::<T>(buf, |x| T::div(x, n)))
        }
    }

    /// `out = pre(local) ⊕ incoming` in one pass (a kernel's "recvReduce" step): the same bits
    /// as [`Reducer::pre`] into a temporary, then [`Reducer::combine`].
    pub fn pre_combine(&self, local: &[u8], incoming: &[u8], out: &mut [u8]) {
        match self.op {
            DevOp::PreMulSum { scalar } => {
                self.check(out.len(), &[local.len(), incoming.len()]);
                with_elem!(self.dtype, T => {
                    let (c, s) = (T::ctx(), T::scalar(scalar));
                    zip::<T>(local, incoming, out, |x, y| T::add(c, T::mul(c, x, s), y))
                })
            }
            _ => self.combine(local, incoming, out),
        }
    }

    /// `acc = pre(local) ⊕ acc`: [`Reducer::pre_combine`] with the output over the incoming
    /// data (e.g. a receive buffer reduced in place).
    pub fn pre_combine_into(&self, acc: &mut [u8], local: &[u8]) {
        self.check(acc.len(), &[local.len()]);
        match self.op {
            DevOp::PreMulSum { scalar } => with_elem!(self.dtype, T => {
                let (c, s) = (T::ctx(), T::scalar(scalar));
                zip_into::<T>(acc, local, |y, x| T::add(c, T::mul(c, x, s), y))
            }),
            _ => with_elem!(self.dtype, T => with_binop!(T, self.op, f => zip_into::<T>(acc, local, |y, x| f(x, y)))),
        }
    }
}

// ---- The loops ------------------------------------------------------------------------------

#[inline(always)]
fn zip<T: Elem>(a: &[u8], b: &[u8], out: &mut [u8], f: impl Fn(T::Raw, T::Raw) -> T::Raw) {
    let n = T::SIZE;
    for ((o, x), y) in out.chunks_exact_mut(n).zip(a.chunks_exact(n)).zip(b.chunks_exact(n)) {
        T::store(o, f(T::load(x), T::load(y)));
    }
}

/// `acc[i] = f(acc[i], b[i])`.
#[inline(always)]
fn zip_into<T: Elem>(acc: &mut [u8], b: &[u8], f: impl Fn(T::Raw, T::Raw) -> T::Raw) {
    let n = T::SIZE;
    for (o, y) in acc.chunks_exact_mut(n).zip(b.chunks_exact(n)) {
        let x = T::load(o);
        T::store(o, f(x, T::load(y)));
    }
}

#[inline(always)]
fn map<T: Elem>(src: &[u8], dst: &mut [u8], f: impl Fn(T::Raw) -> T::Raw) {
    let n = T::SIZE;
    for (o, x) in dst.chunks_exact_mut(n).zip(src.chunks_exact(n)) {
        T::store(o, f(T::load(x)));
    }
}

#[inline(always)]
fn map_in_place<T: Elem>(buf: &mut [u8], f: impl Fn(T::Raw) -> T::Raw) {
    for o in buf.chunks_exact_mut(T::SIZE) {
        let x = T::load(o);
        T::store(o, f(x));
    }
}
