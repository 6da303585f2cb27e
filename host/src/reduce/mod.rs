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
//!   (nearest even, subnormals kept, overflow to infinity). The reference is "compute in
//!   `f64`, round once from `f64`" (exact for half; for bfloat16 sums `f64`'s 53 bits exceed
//!   the 2p + 2 = 18 that make a second rounding harmless) — never rounding an `f32` result
//!   that was itself rounded from something wider. The loops compute in `f32` and round the
//!   `f32` to the type, which gives the same bits for one operation on two operands of the type
//!   (a product is exact in `f32`; for a sum `f32` has at least 2p + 1 bits); an ignored test
//!   checks all 2^32 pairs of each type, Sum and Prod, against the `f64` reference.
//! * **Float8e4m3, Float8e5m2**: as NCCL does it: both operands widened to half (exact), the
//!   half operation (`__hadd`/`__hmul`/`__hmin`/`__hmax`, rounded to half), then
//!   `__nv_cvt_halfraw_to_fp8(h, __NV_SATFINITE, fmt)`: nearest even, magnitudes past the
//!   largest finite value (infinity included) saturate to it (e4m3 ±448, e5m2 ±57344), NaN
//!   becomes 0x7f. So with e5m2, any operation on an infinity — Min/Max too — gives ±57344.
//!   See [`fp8`]. Implemented with 64 KiB lookup tables per (format, operation), built once
//!   (on first use) from that reference path.
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
//! # Relation to the device code in `kernels/src/device/`
//!
//! `exec.cu` (the collective interpreter) computes through `elem.h`, which implements these
//! semantics element for element: the kernels give this module's bits (NaN payloads of
//! f32/f64 aside, as above). This module is the only host reducer: the host executor
//! reduces with it, and the device code is checked against it.
//!
//! # Performance
//!
//! The element type and the operation are dispatched once per call; each (type, operation)
//! pair is its own loop (generic over `elem::Elem`), in blocks of 64 elements that the
//! compiler vectorises (integers, f32/f64, bfloat16, and half without F16C). On x86-64 with
//! F16C, half Sum/Prod/PreMulSum use the hardware conversions (`simd.rs`), same bits. fp8 uses
//! 64 KiB tables per (format, operation).

pub mod float;
pub mod float16;
pub mod fp8;

mod elem;
mod simd;
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
    PreMulSum {
        scalar: f64,
    },
    /// Summed, then the result divided by `n` (integer Avg; `n >= 1`).
    SumPostDiv {
        n: u64,
    },
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
        self.pre_impl(src, dst, true)
    }

    /// [`Reducer::pre`] in place.
    pub fn pre_in_place(&self, buf: &mut [u8]) {
        self.pre_in_place_impl(buf, true)
    }

    /// `out = a ⊕ b` elementwise (Sum, PreMulSum, SumPostDiv add; Prod multiplies; Min/Max),
    /// each result rounded to the element type.
    pub fn combine(&self, a: &[u8], b: &[u8], out: &mut [u8]) {
        self.combine_impl(a, b, out, true)
    }

    /// `acc = acc ⊕ b`: [`Reducer::combine`] with the output over the first input.
    pub fn combine_into(&self, acc: &mut [u8], b: &[u8]) {
        self.combine_into_impl(acc, b, true)
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
        self.pre_combine_impl(local, incoming, out, true)
    }

    /// `acc = pre(local) ⊕ acc`: [`Reducer::pre_combine`] with the output over the incoming
    /// data (e.g. a receive buffer reduced in place).
    pub fn pre_combine_into(&self, acc: &mut [u8], local: &[u8]) {
        self.pre_combine_into_impl(acc, local, true)
    }

    // The implementations; `fast` lets the tests turn the SIMD path off to compare.

    /// The half value of the PreMulSum scalar, for the SIMD path.
    fn f16_scalar(scalar: f64) -> f32 {
        float::f16_to_f32(float::f64_to_f16(scalar))
    }

    /// The SIMD op for a combine step, if there is one for this reduction.
    fn simd_combine_op(&self, fast: bool) -> Option<simd::Op> {
        if !fast || self.dtype != DataType::Float16 {
            return None;
        }
        match self.op {
            DevOp::Sum | DevOp::PreMulSum { .. } | DevOp::SumPostDiv { .. } => Some(simd::Op::Add),
            DevOp::Prod => Some(simd::Op::Mul),
            DevOp::Min | DevOp::Max => None,
        }
    }

    /// The PreMulSum scalar, when the SIMD path applies to its pre step.
    fn simd_pre_scalar(&self, fast: bool) -> Option<f32> {
        match self.op {
            DevOp::PreMulSum { scalar } if fast && self.dtype == DataType::Float16 => Some(Self::f16_scalar(scalar)),
            _ => None,
        }
    }

    fn pre_impl(&self, src: &[u8], dst: &mut [u8], fast: bool) {
        self.check(dst.len(), &[src.len()]);
        let DevOp::PreMulSum { scalar } = self.op else {
            return dst.copy_from_slice(src);
        };
        let done = self.simd_pre_scalar(fast).map_or(0, |s| simd::binary(simd::Op::MulScalar(s), src, src, dst));
        let (src, dst) = (&src[done..], &mut dst[done..]);
        with_elem!(self.dtype, T => {
            let (c, s) = (T::ctx(), T::scalar(scalar));
            map::<T>(src, dst, |x| T::mul(c, x, s))
        })
    }

    fn pre_in_place_impl(&self, buf: &mut [u8], fast: bool) {
        self.check(buf.len(), &[]);
        let DevOp::PreMulSum { scalar } = self.op else { return };
        let done = self.simd_pre_scalar(fast).map_or(0, |s| simd::unary_in_place(simd::Op::MulScalar(s), buf));
        let buf = &mut buf[done..];
        with_elem!(self.dtype, T => {
            let (c, s) = (T::ctx(), T::scalar(scalar));
            map_in_place::<T>(buf, |x| T::mul(c, x, s))
        })
    }

    fn combine_impl(&self, a: &[u8], b: &[u8], out: &mut [u8], fast: bool) {
        self.check(out.len(), &[a.len(), b.len()]);
        let done = self.simd_combine_op(fast).map_or(0, |op| simd::binary(op, a, b, out));
        let (a, b, out) = (&a[done..], &b[done..], &mut out[done..]);
        with_elem!(self.dtype, T => with_binop!(T, self.op, f => zip::<T>(a, b, out, f)))
    }

    fn combine_into_impl(&self, acc: &mut [u8], b: &[u8], fast: bool) {
        self.check(acc.len(), &[b.len()]);
        let done = self.simd_combine_op(fast).map_or(0, |op| simd::binary_into(op, acc, b));
        let (acc, b) = (&mut acc[done..], &b[done..]);
        with_elem!(self.dtype, T => with_binop!(T, self.op, f => zip_into::<T>(acc, b, f)))
    }

    fn pre_combine_impl(&self, local: &[u8], incoming: &[u8], out: &mut [u8], fast: bool) {
        let DevOp::PreMulSum { scalar } = self.op else {
            return self.combine_impl(local, incoming, out, fast);
        };
        self.check(out.len(), &[local.len(), incoming.len()]);
        let done = self.simd_pre_scalar(fast).map_or(0, |s| simd::binary(simd::Op::MulAdd(s), local, incoming, out));
        let (local, incoming, out) = (&local[done..], &incoming[done..], &mut out[done..]);
        with_elem!(self.dtype, T => {
            let (c, s) = (T::ctx(), T::scalar(scalar));
            zip::<T>(local, incoming, out, |x, y| T::add(c, T::mul(c, x, s), y))
        })
    }

    fn pre_combine_into_impl(&self, acc: &mut [u8], local: &[u8], fast: bool) {
        self.check(acc.len(), &[local.len()]);
        match self.op {
            DevOp::PreMulSum { scalar } => {
                let done = self.simd_pre_scalar(fast).map_or(0, |s| simd::binary_into(simd::Op::MulAdd(s), acc, local));
                let (acc, local) = (&mut acc[done..], &local[done..]);
                with_elem!(self.dtype, T => {
                    let (c, s) = (T::ctx(), T::scalar(scalar));
                    zip_into::<T>(acc, local, |y, x| T::add(c, T::mul(c, x, s), y))
                })
            }
            // Sum and Prod are commutative (to the bit: NaN results are canonical for half),
            // so the SIMD `acc = acc op local` is `local op acc`.
            _ => {
                let done = self.simd_combine_op(fast).map_or(0, |op| simd::binary_into(op, acc, local));
                let (acc, local) = (&mut acc[done..], &local[done..]);
                with_elem!(self.dtype, T => with_binop!(T, self.op, f => zip_into::<T>(acc, local, |y, x| f(x, y))))
            }
        }
    }
}

// ---- The loops ------------------------------------------------------------------------------
//
// Blocks of `BLOCK` elements: loaded into arrays, computed array to array, stored. The middle
// loop has a fixed trip count and no aliasing, so the compiler vectorises it whatever the
// operation (selects included), which it does not reliably do for a loop straight over the
// byte slices. The tail (fewer than `BLOCK` elements) goes element by element.

const BLOCK: usize = 64;

#[inline(always)]
fn load_block<T: Elem>(b: &[u8]) -> [T::Raw; BLOCK] {
    std::array::from_fn(|i| T::load(&b[i * T::SIZE..(i + 1) * T::SIZE]))
}

#[inline(always)]
fn store_block<T: Elem>(b: &mut [u8], v: &[T::Raw; BLOCK]) {
    for (o, x) in b.chunks_exact_mut(T::SIZE).zip(v) {
        T::store(o, *x);
    }
}

/// `out[i] = f(a[i], b[i])`.
#[inline(always)]
fn zip<T: Elem>(a: &[u8], b: &[u8], out: &mut [u8], f: impl Fn(T::Raw, T::Raw) -> T::Raw) {
    let bs = BLOCK * T::SIZE;
    let (mut oc, mut ac, mut bc) = (out.chunks_exact_mut(bs), a.chunks_exact(bs), b.chunks_exact(bs));
    for ((o, x), y) in (&mut oc).zip(&mut ac).zip(&mut bc) {
        let (x, y) = (load_block::<T>(x), load_block::<T>(y));
        let r: [T::Raw; BLOCK] = std::array::from_fn(|i| f(x[i], y[i]));
        store_block::<T>(o, &r);
    }
    let n = T::SIZE;
    let tail =
        oc.into_remainder().chunks_exact_mut(n).zip(ac.remainder().chunks_exact(n)).zip(bc.remainder().chunks_exact(n));
    for ((o, x), y) in tail {
        T::store(o, f(T::load(x), T::load(y)));
    }
}

/// `acc[i] = f(acc[i], b[i])`.
#[inline(always)]
fn zip_into<T: Elem>(acc: &mut [u8], b: &[u8], f: impl Fn(T::Raw, T::Raw) -> T::Raw) {
    let bs = BLOCK * T::SIZE;
    let (mut oc, mut bc) = (acc.chunks_exact_mut(bs), b.chunks_exact(bs));
    for (o, y) in (&mut oc).zip(&mut bc) {
        let (x, y) = (load_block::<T>(o), load_block::<T>(y));
        let r: [T::Raw; BLOCK] = std::array::from_fn(|i| f(x[i], y[i]));
        store_block::<T>(o, &r);
    }
    let n = T::SIZE;
    for (o, y) in oc.into_remainder().chunks_exact_mut(n).zip(bc.remainder().chunks_exact(n)) {
        let x = T::load(o);
        T::store(o, f(x, T::load(y)));
    }
}

/// `dst[i] = f(src[i])`.
#[inline(always)]
fn map<T: Elem>(src: &[u8], dst: &mut [u8], f: impl Fn(T::Raw) -> T::Raw) {
    let bs = BLOCK * T::SIZE;
    let (mut oc, mut sc) = (dst.chunks_exact_mut(bs), src.chunks_exact(bs));
    for (o, x) in (&mut oc).zip(&mut sc) {
        let x = load_block::<T>(x);
        let r: [T::Raw; BLOCK] = std::array::from_fn(|i| f(x[i]));
        store_block::<T>(o, &r);
    }
    let n = T::SIZE;
    for (o, x) in oc.into_remainder().chunks_exact_mut(n).zip(sc.remainder().chunks_exact(n)) {
        T::store(o, f(T::load(x)));
    }
}

/// `buf[i] = f(buf[i])`.
#[inline(always)]
fn map_in_place<T: Elem>(buf: &mut [u8], f: impl Fn(T::Raw) -> T::Raw) {
    let bs = BLOCK * T::SIZE;
    let mut oc = buf.chunks_exact_mut(bs);
    for o in &mut oc {
        let x = load_block::<T>(o);
        let r: [T::Raw; BLOCK] = std::array::from_fn(|i| f(x[i]));
        store_block::<T>(o, &r);
    }
    for o in oc.into_remainder().chunks_exact_mut(T::SIZE) {
        let x = T::load(o);
        T::store(o, f(x));
    }
}
