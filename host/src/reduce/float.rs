//! Rounding from `f64` to the narrow float formats, once, to nearest even.
//!
//! The `f32` conversions (`f16_to_f32` and `bf16_to_f32`, exact; `f32_to_f16` and
//! `f32_to_bf16`) are [`super::float16`]'s, re-exported here. The narrowing ones here start
//! from `f64` rather than `f32`: a value that is already rounded to `f32` and then rounded
//! again to half or bfloat16 can land on a tie that the exact value was not on (double
//! rounding), so every narrowing in this module is a single rounding of the `f64` it is given.

pub use super::float16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// CUDA's canonical half NaN (what `__hadd` & co. return for a NaN result).
pub const F16_NAN: u16 = 0x7fff;
/// CUDA's canonical bfloat16 NaN.
pub const BF16_NAN: u16 = 0x7fff;

/// `x >> shift` rounded to nearest, ties to even (`1 <= shift <= 63`).
#[inline(always)]
fn shift_round_even(x: u64, shift: u32) -> u64 {
    let kept = x >> shift;
    let rest = x & ((1u64 << shift) - 1);
    let half = 1u64 << (shift - 1);
    kept + u64::from(rest > half || (rest == half && kept & 1 == 1))
}

/// Rounds a magnitude to a binary format with `eb` exponent bits (bias `2^(eb-1) - 1`) and
/// `mb` stored mantissa bits, IEEE layout with subnormals, to nearest even.
///
/// `a` is the bit pattern of a non-negative, non-NaN `f64` (infinity allowed). The result is
/// the sign-less code; the exponent is unbounded above, so a value past the largest finite
/// number gives a code past it (infinity gives a huge code): the caller clamps, to infinity
/// (IEEE formats) or to the largest finite code (fp8 with saturation).
#[inline(always)]
pub(crate) fn round_magnitude(a: u64, eb: u32, mb: u32) -> u64 {
    let bias = (1i32 << (eb - 1)) - 1;
    let exp = (a >> 52) as i32; // f64 biased exponent; 0 for zero and f64 subnormals
    let man = a & ((1u64 << 52) - 1);
    let e = exp - 1023 + bias; // the target's biased exponent
    if e >= 1 {
        // A normal result: keep the top `mb` mantissa bits. A carry out of the mantissa
        // bumps the exponent, which is what the next code up is.
        let shift = 52 - mb;
        let kept = (e as u64) << mb | man >> shift;
        let rest = man & ((1u64 << shift) - 1);
        let half = 1u64 << (shift - 1);
        kept + u64::from(rest > half || (rest == half && kept & 1 == 1))
    } else {
        // A subnormal result, in units of the smallest subnormal 2^(1 - bias - mb).
        // Every f64 subnormal (and zero) is far below half of any unit here.
        if exp == 0 {
            return 0;
        }
        let full = man | 1u64 << 52; // value = full * 2^(exp - 1075)
        let shift = (1076 - bias - mb as i32 - exp) as u32; // >= 53 - mb >= 1
        if shift > 53 {
            // full < 2^53, so the value is under half a unit: zero.
            return 0;
        }
        // A carry into bit `mb` correctly gives the smallest normal.
        shift_round_even(full, shift)
    }
}

/// The half bit pattern nearest `x` (ties to even, subnormals kept, overflow to infinity,
/// NaN to the canonical NaN 0x7fff): `__double2half`, i.e. one rounding.
#[inline(always)]
pub fn f64_to_f16(x: f64) -> u16 {
    let bits = x.to_bits();
    let sign = (bits >> 48) as u16 & 0x8000;
    let a = bits & !(1u64 << 63);
    if a > 0x7ff0_0000_0000_0000 {
        return F16_NAN;
    }
    sign | round_magnitude(a, 5, 10).min(0x7c00) as u16
}

/// The bfloat16 bit pattern nearest `x` (ties to even, subnormals kept, overflow to
/// infinity, NaN to the canonical NaN 0x7fff): one rounding.
#[inline(always)]
pub fn f64_to_bf16(x: f64) -> u16 {
    let bits = x.to_bits();
    let sign = (bits >> 48) as u16 & 0x8000;
    let a = bits & !(1u64 << 63);
    if a > 0x7ff0_0000_0000_0000 {
        return BF16_NAN;
    }
    sign | round_magnitude(a, 8, 7).min(0x7f80) as u16
}

/// The exact `f64` value of a half bit pattern.
#[inline(always)]
pub fn f16_to_f64(h: u16) -> f64 {
    f64::from(f16_to_f32(h))
}

/// The exact `f64` value of a bfloat16 bit pattern.
#[inline(always)]
pub fn bf16_to_f64(b: u16) -> f64 {
    f64::from(bf16_to_f32(b))
}
