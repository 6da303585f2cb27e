//! The two fp8 formats of the NCCL ABI (`ncclFloat8e4m3`, `ncclFloat8e5m2`), as CUDA's
//! `cuda_fp8.h` converts them with `__NV_SATFINITE`, the mode of the `__nv_fp8_e4m3` /
//! `__nv_fp8_e5m2` constructors and of NCCL's device code.
//!
//! * **e4m3** (OCP "E4M3FN"): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits. No
//!   infinities; `S.1111.111` (0x7f, 0xff) is NaN, so the largest finite value is
//!   `S.1111.110` = ±448. Smallest subnormal 2^-9, smallest normal 2^-6.
//! * **e5m2**: 1 sign, 5 exponent bits (bias 15), 2 mantissa bits: IEEE-like, the top byte of
//!   a half. 0x7c is +infinity, 0x7d..=0x7f NaN; largest finite 0x7b = 57344. Smallest
//!   subnormal 2^-16, smallest normal 2^-14.
//!
//! Narrowing (to fp8) rounds to nearest even, once, and with `__NV_SATFINITE`: anything whose
//! magnitude rounds past the largest finite value, infinity included, becomes ±largest finite
//! (e4m3 ±448, e5m2 ±57344); zero and underflow keep their sign.
//!
//! NaN, following the CUDA code paths: converting from `f32` or from half first canonicalises
//! the NaN (`__nv_cvt_float_to_fp8` does so in software; the sm_89 `cvt.rn.satfinite` emits the
//! canonical fp8 NaN), so [`f32_to_e4m3`], [`f16_to_e4m3`] and the e5m2 ones give **0x7f** for
//! every NaN, whatever its sign. Only the `f64` entry points ([`f64_to_e4m3`], [`f64_to_e5m2`],
//! `__nv_cvt_double_to_fp8`) keep the sign (e4m3 `0x7f | sign`, e5m2 `0x7e | sign | the two top
//! mantissa bits`). Widening a NaN gives the canonical half NaN 0x7fff (sign dropped), as
//! `__nv_cvt_fp8_to_halfraw` does.
//!
//! Widening (fp8 to half, f32 or f64) is exact.

use super::float::{f16_to_f32, round_magnitude, F16_NAN};

/// The largest finite e4m3 code (448).
pub const E4M3_MAX: u8 = 0x7e;
/// The largest finite e5m2 code (57344).
pub const E5M2_MAX: u8 = 0x7b;
/// The fp8 NaN that conversions from `f32` and half produce (both formats).
pub const FP8_NAN: u8 = 0x7f;

/// Whether `x` is an e4m3 NaN (0x7f or 0xff).
#[inline(always)]
pub fn e4m3_is_nan(x: u8) -> bool {
    x & 0x7f == 0x7f
}

/// Whether `x` is an e5m2 NaN (0x7d..=0x7f and 0xfd..=0xff).
#[inline(always)]
pub fn e5m2_is_nan(x: u8) -> bool {
    x & 0x7f > 0x7c
}

/// The half bit pattern of an e4m3 value (exact; NaN gives 0x7fff).
#[inline(always)]
pub fn e4m3_to_f16(x: u8) -> u16 {
    if e4m3_is_nan(x) {
        return F16_NAN;
    }
    let sign = u16::from(x & 0x80) << 8;
    let exp = u16::from(x >> 3 & 0xf);
    let man = u16::from(x & 7);
    if exp != 0 {
        // Rebias 7 -> 15; 3 mantissa bits -> 10.
        sign | (exp + 8) << 10 | man << 7
    } else if man == 0 {
        sign
    } else {
        // Subnormal man * 2^-9 is a normal half: normalise.
        let lz = man.leading_zeros() as u16 - 13; // 0..=2 for man in 1..=7 (3 significant bits)
        let m = (man << (lz + 1)) & 7; // drop the leading one
        let e = 15 - 9 + 2 - lz; // 2^(2 - lz) * 2^-9, rebias 15
        sign | e << 10 | m << 7
    }
}

/// The half bit pattern of an e5m2 value (exact: e5m2 is the top byte of a half; NaN gives
/// 0x7fff).
#[inline(always)]
pub fn e5m2_to_f16(x: u8) -> u16 {
    if e5m2_is_nan(x) {
        F16_NAN
    } else {
        u16::from(x) << 8
    }
}

/// The `f32` value of an e4m3 code (exact).
#[inline]
pub fn e4m3_to_f32(x: u8) -> f32 {
    f16_to_f32(e4m3_to_f16(x))
}

/// The `f32` value of an e5m2 code (exact).
#[inline]
pub fn e5m2_to_f32(x: u8) -> f32 {
    f16_to_f32(e5m2_to_f16(x))
}

/// `__nv_cvt_double_to_fp8(x, __NV_SATFINITE, __NV_E4M3)`: one rounding to nearest even,
/// saturating to ±448; NaN gives `0x7f | sign`.
#[inline]
pub fn f64_to_e4m3(x: f64) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 56) as u8 & 0x80;
    let a = bits & !(1u64 << 63);
    if a > 0x7ff0_0000_0000_0000 {
        return sign | 0x7f;
    }
    // 464 (halfway to the would-be 480) ties to even 448; above it the code is 0x7f or more.
    sign | round_magnitude(a, 4, 3).min(u64::from(E4M3_MAX)) as u8
}

/// `__nv_cvt_double_to_fp8(x, __NV_SATFINITE, __NV_E5M2)`: one rounding to nearest even,
/// saturating to ±57344 (infinity too); NaN gives `0x7e | sign | top two mantissa bits`.
#[inline]
pub fn f64_to_e5m2(x: f64) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 56) as u8 & 0x80;
    let a = bits & !(1u64 << 63);
    if a > 0x7ff0_0000_0000_0000 {
        return sign | 0x7e | (bits >> 50) as u8 & 3;
    }
    // 61440 (halfway to 65536) ties up to the infinity code and saturates, as in CUDA.
    sign | round_magnitude(a, 5, 2).min(u64::from(E5M2_MAX)) as u8
}

/// `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)`: NaN gives 0x7f.
#[inline]
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        FP8_NAN
    } else {
        f64_to_e4m3(f64::from(x))
    }
}

/// `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2)`: NaN gives 0x7f.
#[inline]
pub fn f32_to_e5m2(x: f32) -> u8 {
    if x.is_nan() {
        FP8_NAN
    } else {
        f64_to_e5m2(f64::from(x))
    }
}

/// `__nv_cvt_halfraw_to_fp8(h, __NV_SATFINITE, __NV_E4M3)`: NaN gives 0x7f.
#[inline]
pub fn f16_to_e4m3(h: u16) -> u8 {
    f32_to_e4m3(f16_to_f32(h))
}

/// `__nv_cvt_halfraw_to_fp8(h, __NV_SATFINITE, __NV_E5M2)`: NaN gives 0x7f.
#[inline]
pub fn f16_to_e5m2(h: u16) -> u8 {
    f32_to_e5m2(f16_to_f32(h))
}

/// One of the two formats, for code shared between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Format {
    E4M3,
    E5M2,
}

impl Fp8Format {
    /// Widening to half (exact).
    #[inline]
    pub fn to_f16(self, x: u8) -> u16 {
        match self {
            Fp8Format::E4M3 => e4m3_to_f16(x),
            Fp8Format::E5M2 => e5m2_to_f16(x),
        }
    }
    /// Narrowing from half (`__nv_cvt_halfraw_to_fp8`, SATFINITE).
    #[inline]
    pub fn from_f16(self, h: u16) -> u8 {
        match self {
            Fp8Format::E4M3 => f16_to_e4m3(h),
            Fp8Format::E5M2 => f16_to_e5m2(h),
        }
    }
    /// Narrowing from `f64` (`__nv_cvt_double_to_fp8`, SATFINITE).
    #[inline]
    pub fn from_f64(self, x: f64) -> u8 {
        match self {
            Fp8Format::E4M3 => f64_to_e4m3(x),
            Fp8Format::E5M2 => f64_to_e5m2(x),
        }
    }
}
