//! One implementation of [`Elem`] per NCCL element type: how an element is loaded and stored,
//! and the device arithmetic on it (see the module documentation of `reduce` for the
//! semantics, type by type). The loops in `mod.rs` are generic over `Elem`, so each
//! (type, operation) pair compiles to its own tight loop.

use std::sync::OnceLock;

use super::float::{bf16_to_f64, f16_to_f64, f64_to_bf16, f64_to_f16, BF16_NAN, F16_NAN};
use super::fp8::Fp8Format;

/// An element type: storage, and the per-step device arithmetic, each result rounded to the
/// element type.
pub(crate) trait Elem {
    /// Bytes per element.
    const SIZE: usize;
    /// The stored representation (the bits, for the narrow float types).
    type Raw: Copy;
    /// What an operation needs besides its operands (the fp8 lookup tables); fetched once
    /// per call, outside the loop.
    type Ctx: Copy;
    fn ctx() -> Self::Ctx;
    /// `b.len() == SIZE`.
    fn load(b: &[u8]) -> Self::Raw;
    fn store(b: &mut [u8], v: Self::Raw);
    fn add(c: Self::Ctx, a: Self::Raw, b: Self::Raw) -> Self::Raw;
    fn mul(c: Self::Ctx, a: Self::Raw, b: Self::Raw) -> Self::Raw;
    fn min(c: Self::Ctx, a: Self::Raw, b: Self::Raw) -> Self::Raw;
    fn max(c: Self::Ctx, a: Self::Raw, b: Self::Raw) -> Self::Raw;
    /// The PreMulSum scalar converted to the element type.
    fn scalar(s: f64) -> Self::Raw;
    /// `a / n` (SumPostDiv's post step); `n >= 1`.
    fn div(a: Self::Raw, n: u64) -> Self::Raw;
}

// ---- Integers ---------------------------------------------------------------------------

macro_rules! int_elem {
    ($name:ident, $t:ty) => {
        pub(crate) enum $name {}
        impl Elem for $name {
            const SIZE: usize = std::mem::size_of::<$t>();
            type Raw = $t;
            type Ctx = ();
            #[inline(always)]
            fn ctx() {}
            #[inline(always)]
            fn load(b: &[u8]) -> $t {
                <$t>::from_ne_bytes(b.try_into().unwrap())
            }
            #[inline(always)]
            fn store(b: &mut [u8], v: $t) {
                b.copy_from_slice(&v.to_ne_bytes())
            }
            #[inline(always)]
            fn add(_: (), a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn mul(_: (), a: $t, b: $t) -> $t {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn min(_: (), a: $t, b: $t) -> $t {
                Ord::min(a, b)
            }
            #[inline(always)]
            fn max(_: (), a: $t, b: $t) -> $t {
                Ord::max(a, b)
            }
            /// Rust's `as`: truncation toward zero like C's cast; out-of-range saturates and
            /// NaN gives 0, where C would be undefined.
            #[inline(always)]
            fn scalar(s: f64) -> $t {
                s as $t
            }
            /// Truncating toward zero like C (and NCCL's `FuncSumPostDiv`, which divides the
            /// magnitude and puts the sign back); wraps for `MIN / 1`.
            #[inline(always)]
            fn div(a: $t, n: u64) -> $t {
                (a as i128 / i128::from(n)) as $t
            }
        }
    };
}

int_elem!(I8, i8);
int_elem!(U8, u8);
int_elem!(I32, i32);
int_elem!(U32, u32);
int_elem!(I64, i64);
int_elem!(U64, u64);

// ---- Min/max of floats --------------------------------------------------------------------

/// `fminf`/`fmaxf` (and `__hmin`/`__hmax`) on two elements, given their raw bits `a`, `b`,
/// their values `x`, `y` and the type's canonical NaN: a NaN operand is ignored; two NaNs give
/// the canonical NaN; -0 counts as less than +0, so that the result does not depend on the
/// order of the operands. For equal values the bits are equal, except ±0, which the OR (min)
/// and AND (max) of the sign bits settle. Written as selects, so that loops vectorise.
macro_rules! float_min_max {
    ($raw:ty, $nan:expr) => {
        #[inline(always)]
        fn min(_: Self::Ctx, a: $raw, b: $raw) -> $raw {
            let (x, y) = (Self::value(a), Self::value(b));
            #[allow(clippy::eq_op)]
            let (x_nan, y_nan) = (x != x, y != y);
            let r = if y < x || x_nan { b } else { a };
            let r = if x == y { a | b } else { r };
            if x_nan && y_nan {
                $nan
            } else {
                r
            }
        }
        #[inline(always)]
        fn max(_: Self::Ctx, a: $raw, b: $raw) -> $raw {
            let (x, y) = (Self::value(a), Self::value(b));
            #[allow(clippy::eq_op)]
            let (x_nan, y_nan) = (x != x, y != y);
            let r = if y > x || x_nan { b } else { a };
            let r = if x == y { a & b } else { r };
            if x_nan && y_nan {
                $nan
            } else {
                r
            }
        }
    };
}

// ---- f32, f64: IEEE arithmetic in the type ----------------------------------------------

macro_rules! ieee_elem {
    ($name:ident, $f:ty, $bits:ty, $nan:expr) => {
        pub(crate) enum $name {}
        impl $name {
            #[inline(always)]
            fn value(a: $bits) -> $f {
                <$f>::from_bits(a)
            }
        }
        /// Raw is the bit pattern, so that min/max can return an operand's exact bits; the
        /// arithmetic is the type's own (`a + b` rounded once, as `__fadd_rn` / `__dadd_rn`).
        impl Elem for $name {
            const SIZE: usize = std::mem::size_of::<$f>();
            type Raw = $bits;
            type Ctx = ();
            #[inline(always)]
            fn ctx() {}
            #[inline(always)]
            fn load(b: &[u8]) -> $bits {
                <$bits>::from_ne_bytes(b.try_into().unwrap())
            }
            #[inline(always)]
            fn store(b: &mut [u8], v: $bits) {
                b.copy_from_slice(&v.to_ne_bytes())
            }
            #[inline(always)]
            fn add(_: (), a: $bits, b: $bits) -> $bits {
                (<$f>::from_bits(a) + <$f>::from_bits(b)).to_bits()
            }
            #[inline(always)]
            fn mul(_: (), a: $bits, b: $bits) -> $bits {
                (<$f>::from_bits(a) * <$f>::from_bits(b)).to_bits()
            }
            float_min_max!($bits, $nan);
            /// Round to nearest (`as`; out of range gives ±inf).
            #[inline(always)]
            fn scalar(s: f64) -> $bits {
                (s as $f).to_bits()
            }
            #[inline(always)]
            fn div(a: $bits, n: u64) -> $bits {
                ((f64::from(<$f>::from_bits(a)) / n as f64) as $f).to_bits()
            }
        }
    };
}

ieee_elem!(F32, f32, u32, 0x7fff_ffff);
ieee_elem!(F64, f64, u64, 0x7fff_ffff_ffff_ffff);

// ---- half, bfloat16: the exact result rounded once --------------------------------------

/// Half bits to `f32`, exact, without branches (so that loops vectorise). Signed 32-bit
/// arithmetic throughout: baseline x86-64 (SSE2) has signed vector compares and
/// int-to-float conversion, not unsigned ones.
#[inline(always)]
fn h2f(h: u16) -> f32 {
    let h = i32::from(h);
    let em = h & 0x7fff;
    // Normal: rebias the exponent (15 -> 127). Subnormal: em * 2^-24, exact in f32 (and no
    // f32 subnormal on the way). Infinity and NaN: all-ones exponent, mantissa kept.
    let normal = (em << 13) + (112 << 23);
    let sub = (em as f32 * f32::from_bits(0x3380_0000)).to_bits() as i32; // 2^-24
    let special = 0x7f80_0000 | (em & 0x3ff) << 13;
    let bits = if em < 0x400 {
        sub
    } else if em >= 0x7c00 {
        special
    } else {
        normal
    };
    f32::from_bits((bits | (h & 0x8000) << 16) as u32)
}

/// `f32` to half bits, rounding to nearest even (subnormals kept, overflow to infinity, NaN
/// to 0x7fff), without branches; signed arithmetic as in [`h2f`].
#[inline(always)]
fn f2h(f: f32) -> u16 {
    let b = f.to_bits() as i32;
    let sign = (b >> 16) & 0x8000;
    let a = b & 0x7fff_ffff;
    // A normal half: rebias, then round at bit 13 (a carry bumps the exponent, up to inf).
    // No overflow: a <= 0x7fff_ffff, minus 112 << 23, plus 0x1000 at most.
    let odd = (a >> 13) & 1;
    let normal = ((a - (112 << 23) + 0xfff + odd) >> 13).min(0x7c00);
    // A subnormal half (|f| < 2^-14): adding 0.5, whose ulp is 2^-24, rounds to the
    // subnormal grid; the bits above 0.5's are the half's (1024 being the smallest normal).
    let sub = (f32::from_bits(a as u32) + 0.5).to_bits() as i32 - 0x3f00_0000;
    let r = if a < 113 << 23 { sub } else { normal };
    if a > 0x7f80_0000 {
        F16_NAN
    } else {
        (r | sign) as u16
    }
}

/// Bfloat16 bits to `f32` (exact).
#[inline(always)]
fn b2f(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// `f32` to bfloat16 bits, rounding to nearest even (overflow to infinity, NaN to 0x7fff),
/// without branches.
#[inline(always)]
fn f2b(f: f32) -> u16 {
    let b = f.to_bits();
    let r = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    if b & 0x7fff_ffff > 0x7f80_0000 {
        BF16_NAN
    } else {
        r
    }
}

macro_rules! narrow_elem {
    ($name:ident, $to32:path, $from32:path, $to64:path, $from64:path, $nan:expr) => {
        pub(crate) enum $name {}
        impl $name {
            #[inline(always)]
            fn value(a: u16) -> f32 {
                $to32(a)
            }
        }
        /// `__hadd`/`__hmul` (and the bfloat16 ones): the exact result of one operation,
        /// rounded once to the type; NaN results are the canonical 0x7fff.
        ///
        /// Computed in `f32`, then rounded to the type, which is the same: a product of two
        /// such operands is exact in `f32` (22 or 16 significant bits; for a bfloat16
        /// product in `f32`'s subnormal range the second rounding cannot land on a tie it
        /// was not on), and for a sum `f32` has at least 2p + 1 bits (24 >= 23 for half,
        /// 24 >= 17 for bfloat16), which makes rounding twice the same as rounding once.
        /// The ignored test `narrow_f32_path_equals_f64_reference_on_all_pairs` checks
        /// every one of the 2^32 pairs of each type against the `f64` reference
        /// (`$from64($to64(a) + $to64(b))`).
        impl Elem for $name {
            const SIZE: usize = 2;
            type Raw = u16;
            type Ctx = ();
            #[inline(always)]
            fn ctx() {}
            #[inline(always)]
            fn load(b: &[u8]) -> u16 {
                u16::from_ne_bytes(b.try_into().unwrap())
            }
            #[inline(always)]
            fn store(b: &mut [u8], v: u16) {
                b.copy_from_slice(&v.to_ne_bytes())
            }
            #[inline(always)]
            fn add(_: (), a: u16, b: u16) -> u16 {
                $from32($to32(a) + $to32(b))
            }
            #[inline(always)]
            fn mul(_: (), a: u16, b: u16) -> u16 {
                $from32($to32(a) * $to32(b))
            }
            float_min_max!(u16, $nan);
            /// One rounding from the `f64` (not through `f32`).
            #[inline(always)]
            fn scalar(s: f64) -> u16 {
                $from64(s)
            }
            #[inline(always)]
            fn div(a: u16, n: u64) -> u16 {
                $from64($to64(a) / n as f64)
            }
        }
    };
}

narrow_elem!(F16, h2f, f2h, f16_to_f64, f64_to_f16, F16_NAN);
narrow_elem!(BF16, b2f, f2b, bf16_to_f64, f64_to_bf16, BF16_NAN);

/// The `f64` reference for the narrow types' Sum/Prod: exact operands, the `f64` result
/// rounded once (exact in `f64` for half; for bfloat16 sums, 53 >= 2p + 2 bits).
#[cfg(test)]
pub(crate) mod reference {
    use super::super::float::{bf16_to_f64, f16_to_f64, f64_to_bf16, f64_to_f16};
    pub fn f16_add(a: u16, b: u16) -> u16 {
        f64_to_f16(f16_to_f64(a) + f16_to_f64(b))
    }
    pub fn f16_mul(a: u16, b: u16) -> u16 {
        f64_to_f16(f16_to_f64(a) * f16_to_f64(b))
    }
    pub fn bf16_add(a: u16, b: u16) -> u16 {
        f64_to_bf16(bf16_to_f64(a) + bf16_to_f64(b))
    }
    pub fn bf16_mul(a: u16, b: u16) -> u16 {
        f64_to_bf16(bf16_to_f64(a) * bf16_to_f64(b))
    }
}

#[cfg(test)]
pub(crate) fn fast_conversions() -> (fn(u16) -> f32, fn(f32) -> u16, fn(u16) -> f32, fn(f32) -> u16) {
    (h2f, f2h, b2f, f2b)
}

// ---- fp8: through half, by table -----------------------------------------------------------

/// The result of every (a, b) pair for one format, indexed `a << 8 | b`, built once from
/// [`fp8_reference`].
pub(crate) struct Fp8Tables {
    sum: Box<[u8; 65536]>,
    prod: Box<[u8; 65536]>,
    min: Box<[u8; 65536]>,
    max: Box<[u8; 65536]>,
}

/// One fp8 operation as NCCL's device code does it: both operands widened to half (exact),
/// `__hadd` / `__hmul` / `__hmin` / `__hmax` (the exact result rounded once to half; min/max
/// as [`F16`]'s), then `__nv_cvt_halfraw_to_fp8(.., __NV_SATFINITE, ..)`. So e.g. e5m2
/// `inf + 1` and even `max(inf, 1)` give the largest finite value, and a NaN result 0x7f.
pub(crate) fn fp8_reference(fmt: Fp8Format, op: Fp8Op, a: u8, b: u8) -> u8 {
    let (ha, hb) = (fmt.to_f16(a), fmt.to_f16(b));
    let h = match op {
        Fp8Op::Sum => f64_to_f16(f16_to_f64(ha) + f16_to_f64(hb)),
        Fp8Op::Prod => f64_to_f16(f16_to_f64(ha) * f16_to_f64(hb)),
        Fp8Op::Min => F16::min((), ha, hb),
        Fp8Op::Max => F16::max((), ha, hb),
    };
    fmt.from_f16(h)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fp8Op {
    Sum,
    Prod,
    Min,
    Max,
}

impl Fp8Tables {
    fn build(fmt: Fp8Format) -> Fp8Tables {
        let table = |op| -> Box<[u8; 65536]> {
            let all: Box<[u8]> = (0..=u16::MAX).map(|i| fp8_reference(fmt, op, (i >> 8) as u8, i as u8)).collect();
            all.try_into().expect("65536 entries")
        };
        Fp8Tables { sum: table(Fp8Op::Sum), prod: table(Fp8Op::Prod), min: table(Fp8Op::Min), max: table(Fp8Op::Max) }
    }

    pub(crate) fn get(fmt: Fp8Format) -> &'static Fp8Tables {
        static E4M3: OnceLock<Fp8Tables> = OnceLock::new();
        static E5M2: OnceLock<Fp8Tables> = OnceLock::new();
        match fmt {
            Fp8Format::E4M3 => E4M3.get_or_init(|| Fp8Tables::build(fmt)),
            Fp8Format::E5M2 => E5M2.get_or_init(|| Fp8Tables::build(fmt)),
        }
    }
}

#[inline(always)]
fn idx(a: u8, b: u8) -> usize {
    usize::from(a) << 8 | usize::from(b)
}

macro_rules! fp8_elem {
    ($name:ident, $fmt:expr) => {
        pub(crate) enum $name {}
        impl Elem for $name {
            const SIZE: usize = 1;
            type Raw = u8;
            type Ctx = &'static Fp8Tables;
            #[inline(always)]
            fn ctx() -> &'static Fp8Tables {
                Fp8Tables::get($fmt)
            }
            #[inline(always)]
            fn load(b: &[u8]) -> u8 {
                b[0]
            }
            #[inline(always)]
            fn store(b: &mut [u8], v: u8) {
                b[0] = v
            }
            // The tables are arrays of 65536 entries and `idx` < 65536: no bounds checks.
            #[inline(always)]
            fn add(c: &'static Fp8Tables, a: u8, b: u8) -> u8 {
                c.sum[idx(a, b)]
            }
            #[inline(always)]
            fn mul(c: &'static Fp8Tables, a: u8, b: u8) -> u8 {
                c.prod[idx(a, b)]
            }
            #[inline(always)]
            fn min(c: &'static Fp8Tables, a: u8, b: u8) -> u8 {
                c.min[idx(a, b)]
            }
            #[inline(always)]
            fn max(c: &'static Fp8Tables, a: u8, b: u8) -> u8 {
                c.max[idx(a, b)]
            }
            /// NCCL keeps the PreMulSum scalar in the element type: the `f64` rounded once
            /// (`__nv_cvt_double_to_fp8`, SATFINITE). The product then goes through half like
            /// any other, i.e. it is `mul(x, scalar)`.
            #[inline(always)]
            fn scalar(s: f64) -> u8 {
                $fmt.from_f64(s)
            }
            #[inline(always)]
            fn div(a: u8, n: u64) -> u8 {
                $fmt.from_f16(f64_to_f16(f16_to_f64($fmt.to_f16(a)) / n as f64))
            }
        }
    };
}

fp8_elem!(E4M3, Fp8Format::E4M3);
fp8_elem!(E5M2, Fp8Format::E5M2);
