//! Tests of the reduction primitives. Expected values come from hand computation, from an
//! independent brute-force model of the formats, or from the plain `f32` conversions of
//! `float16.rs` (written separately from the reducer's branch-free ones) — never from the code
//! under test.

use super::float::*;
use super::fp8::*;
use super::*;
use crate::error::ResultCode;

macro_rules! bytes_of {
    ($t:ty, $v:expr) => {
        $v.iter().flat_map(|x: &$t| x.to_ne_bytes()).collect::<Vec<u8>>()
    };
}

fn comb(dtype: DataType, op: DevOp, a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut out = vec![0xa5u8; a.len()];
    Reducer::new(dtype, op).combine(a, b, &mut out);
    out
}

fn p2(e: i32) -> f64 {
    2f64.powi(e)
}

/// xorshift64*: reproducible test data without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

// ---- An independent model of the fp8 formats ----------------------------------------------

/// The value of a code from the format's definition (NaN: None; e5m2 infinities: ±inf).
fn fp8_model_value(fmt: Fp8Format, c: u8) -> Option<f64> {
    let (eb, mb, bias) = match fmt {
        Fp8Format::E4M3 => (4, 3, 7),
        Fp8Format::E5M2 => (5, 2, 15),
    };
    let sign = if c & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = i32::from(c >> mb) & ((1 << eb) - 1);
    let m = f64::from(c & ((1 << mb) - 1));
    let top = (1 << eb) - 1;
    match fmt {
        Fp8Format::E4M3 if e == top && m == 7.0 => return None,
        Fp8Format::E5M2 if e == top && m != 0.0 => return None,
        Fp8Format::E5M2 if e == top => return Some(sign * f64::INFINITY),
        _ => {}
    }
    let mant = f64::from(1 << mb);
    Some(if e == 0 { sign * m / mant * p2(1 - bias) } else { sign * (1.0 + m / mant) * p2(e - bias) })
}

/// The nearest finite code to `x` (not NaN), ties to the even code, magnitudes past the
/// largest finite value (infinity too) to the largest: SATFINITE round-to-nearest-even, by
/// search.
fn fp8_model_nearest(fmt: Fp8Format, x: f64) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let ax = x.abs();
    let mut best = 0u8;
    let mut best_d = f64::INFINITY;
    for c in 0u8..0x80 {
        let Some(v) = fp8_model_value(fmt, c).filter(|v| v.is_finite()) else { continue };
        let d = if ax.is_infinite() { -v } else { (v - ax).abs() };
        if d < best_d || (d == best_d && c & 1 == 0) {
            best = c;
            best_d = d;
        }
    }
    sign | best
}

const FORMATS: [(Fp8Format, DataType); 2] =
    [(Fp8Format::E4M3, DataType::Float8e4m3), (Fp8Format::E5M2, DataType::Float8e5m2)];

fn to_f32(fmt: Fp8Format, c: u8) -> f32 {
    match fmt {
        Fp8Format::E4M3 => e4m3_to_f32(c),
        Fp8Format::E5M2 => e5m2_to_f32(c),
    }
}

fn from_f32(fmt: Fp8Format, x: f32) -> u8 {
    match fmt {
        Fp8Format::E4M3 => f32_to_e4m3(x),
        Fp8Format::E5M2 => f32_to_e5m2(x),
    }
}

// ---- fp8 conversions ---------------------------------------------------------------------------

#[test]
fn e4m3_known_values() {
    let table: &[(u8, f64)] = &[
        (0x00, 0.0),
        (0x80, -0.0),
        (0x01, p2(-9)), // smallest subnormal
        (0x81, -p2(-9)),
        (0x07, 7.0 * p2(-9)), // largest subnormal
        (0x08, p2(-6)),       // smallest normal
        (0x30, 0.5),
        (0x38, 1.0),
        (0x3c, 1.5),
        (0xbc, -1.5),
        (0x40, 2.0),
        (0x41, 2.25),
        (0xc0, -2.0),
        (0x77, 240.0),
        (0x7e, 448.0), // largest normal
        (0xfe, -448.0),
    ];
    for &(code, v) in table {
        assert_eq!(f64::from(e4m3_to_f32(code)).to_bits(), v.to_bits(), "{code:#04x}");
        assert_eq!(f32_to_e4m3(v as f32), code, "{v}");
        assert_eq!(f64_to_e4m3(v), code, "{v}");
        assert_eq!(e4m3_to_f16(code), f32_to_f16(v as f32), "{code:#04x}");
        assert_eq!(f16_to_e4m3(f32_to_f16(v as f32)), code, "{v}");
    }
    // Ties to even: 1.0625 is halfway between 1.0 (0x38, even) and 1.125 (0x39).
    assert_eq!(f32_to_e4m3(1.0625), 0x38);
    assert_eq!(f32_to_e4m3(1.0626), 0x39);
    // 1.1875 is halfway between 1.125 (0x39) and 1.25 (0x3a, even).
    assert_eq!(f32_to_e4m3(1.1875), 0x3a);
    assert_eq!(f32_to_e4m3(-1.1875), 0xba);
    // Subnormal ties: 2^-10 is halfway between 0 and 2^-9: zero (keeping the sign).
    assert_eq!(f32_to_e4m3(p2(-10) as f32), 0x00);
    assert_eq!(f32_to_e4m3(-p2(-10) as f32), 0x80);
    assert_eq!(f32_to_e4m3((p2(-10) * 1.001) as f32), 0x01);
    assert_eq!(f32_to_e4m3((3.0 * p2(-10)) as f32), 0x02);
    // Halfway between the largest subnormal (0x07) and the smallest normal (0x08, even).
    assert_eq!(f32_to_e4m3((7.5 * p2(-9)) as f32), 0x08);
    assert_eq!(f32_to_e4m3(1e-30), 0x00);
    // Saturation (SATFINITE): 448 is the largest; 464 ties to even 448; above, still 448.
    for x in [456.0f32, 464.0, 465.0, 480.0, 1000.0, 1e30, f32::MAX, f32::INFINITY] {
        assert_eq!(f32_to_e4m3(x), 0x7e, "{x}");
        assert_eq!(f32_to_e4m3(-x), 0xfe, "{x}");
    }
    assert_eq!(f32_to_e4m3(447.0), 0x7e);
    assert_eq!(f32_to_e4m3(431.0), 0x7d); // below 432, halfway between 416 and 448
    assert_eq!(f32_to_e4m3(432.0), 0x7e); // the tie goes to even 448
                                          // NaN: 0x7f/0xff decode as NaN; f32 and half NaN become 0x7f; only f64 keeps the sign.
    assert!(e4m3_to_f32(0x7f).is_nan());
    assert!(e4m3_to_f32(0xff).is_nan());
    assert_eq!(e4m3_to_f16(0xff), 0x7fff);
    assert_eq!(f32_to_e4m3(f32::NAN), 0x7f);
    assert_eq!(f32_to_e4m3(-f32::NAN), 0x7f);
    assert_eq!(f16_to_e4m3(0xfe00), 0x7f);
    assert_eq!(f64_to_e4m3(f64::NAN), 0x7f);
    assert_eq!(f64_to_e4m3(-f64::NAN), 0xff);
}

#[test]
fn e5m2_known_values() {
    let table: &[(u8, f64)] = &[
        (0x00, 0.0),
        (0x80, -0.0),
        (0x01, p2(-16)), // smallest subnormal
        (0x03, 3.0 * p2(-16)),
        (0x04, p2(-14)), // smallest normal
        (0x38, 0.5),
        (0x3c, 1.0),
        (0x3e, 1.5),
        (0xbe, -1.5),
        (0x40, 2.0),
        (0xbc, -1.0),
        (0x7b, 57344.0), // largest normal
        (0xfb, -57344.0),
    ];
    for &(code, v) in table {
        assert_eq!(f64::from(e5m2_to_f32(code)).to_bits(), v.to_bits(), "{code:#04x}");
        assert_eq!(f32_to_e5m2(v as f32), code, "{v}");
        assert_eq!(e5m2_to_f16(code), f32_to_f16(v as f32), "{code:#04x}");
        assert_eq!(f16_to_e5m2(f32_to_f16(v as f32)), code, "{v}");
    }
    assert_eq!(e5m2_to_f32(0x7c), f32::INFINITY);
    assert_eq!(e5m2_to_f32(0xfc), f32::NEG_INFINITY);
    // Ties to even.
    assert_eq!(f32_to_e5m2(1.125), 0x3c);
    assert_eq!(f32_to_e5m2(1.375), 0x3e);
    assert_eq!(f32_to_e5m2(-1.375), 0xbe);
    assert_eq!(f32_to_e5m2(p2(-17) as f32), 0x00);
    assert_eq!(f32_to_e5m2((3.0 * p2(-17)) as f32), 0x02);
    // Saturation: 61440 (halfway to 65536) and above, and infinity, give 57344.
    for x in [58000.0f32, 61439.0, 61440.0, 65504.0, 1e6, f32::INFINITY] {
        assert_eq!(f32_to_e5m2(x), 0x7b, "{x}");
        assert_eq!(f32_to_e5m2(-x), 0xfb, "{x}");
    }
    assert_eq!(f16_to_e5m2(0x7c00), 0x7b); // half infinity
    assert_eq!(f16_to_e5m2(0xfc00), 0xfb);
    // NaN.
    for c in [0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff] {
        assert!(e5m2_to_f32(c).is_nan(), "{c:#04x}");
        assert_eq!(e5m2_to_f16(c), 0x7fff);
    }
    assert_eq!(f32_to_e5m2(f32::NAN), 0x7f);
    assert_eq!(f32_to_e5m2(-f32::NAN), 0x7f);
    assert_eq!(f64_to_e5m2(-f64::NAN), 0xfe); // 0x7e | sign | top mantissa bits (10)
}

#[test]
fn fp8_every_code_round_trips_and_matches_the_format_definition() {
    for (fmt, _) in FORMATS {
        for c in 0..=255u8 {
            let v = to_f32(fmt, c);
            match fp8_model_value(fmt, c) {
                None => {
                    assert!(v.is_nan(), "{fmt:?} {c:#04x}");
                    assert_eq!(from_f32(fmt, v), 0x7f);
                }
                Some(m) if m.is_infinite() => {
                    assert_eq!(f64::from(v), m);
                    // SATFINITE: infinity converts back to the largest finite value.
                    assert_eq!(from_f32(fmt, v), c - 1, "{fmt:?} {c:#04x}");
                }
                Some(m) => {
                    assert_eq!(f64::from(v).to_bits(), m.to_bits(), "{fmt:?} {c:#04x}");
                    assert_eq!(from_f32(fmt, v), c, "{fmt:?} {c:#04x}");
                    assert_eq!(fmt.from_f16(fmt.to_f16(c)), c, "{fmt:?} {c:#04x}");
                    assert_eq!(fmt.from_f64(m), c, "{fmt:?} {c:#04x}");
                }
            }
        }
    }
}

#[test]
fn fp8_narrowing_matches_a_brute_force_nearest_search() {
    // Every half value (which covers every fp8 tie and subnormal case), and random f32s.
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut inputs: Vec<f32> = (0..=u16::MAX).map(f16_to_f32).filter(|x| !x.is_nan()).collect();
    inputs.extend((0..20_000).map(|_| {
        // Exponents around the fp8 range.
        let m = (rng.next() >> 40) as f32 / (1u64 << 24) as f32 + 1.0;
        let e = (rng.next() % 48) as i32 - 24;
        let s = if rng.next() & 1 == 0 { 1.0 } else { -1.0 };
        s * m * 2f32.powi(e)
    }));
    for (fmt, _) in FORMATS {
        for &x in &inputs {
            let want = fp8_model_nearest(fmt, f64::from(x));
            assert_eq!(from_f32(fmt, x), want, "{fmt:?} {x:e}");
            assert_eq!(fmt.from_f64(f64::from(x)), want, "{fmt:?} {x:e}");
        }
    }
}

// ---- Rounding from f64 ------------------------------------------------------------------------

#[test]
fn f64_narrowing_agrees_with_the_f32_conversions_on_f32_values() {
    // Every f32 is exact in f64, so both must round it the same (once).
    let mut rng = Rng(77);
    for _ in 0..300_000 {
        let x = f32::from_bits(rng.next() as u32);
        if x.is_nan() {
            assert_eq!(f64_to_f16(f64::from(x)), 0x7fff);
            continue;
        }
        assert_eq!(f64_to_f16(f64::from(x)), f32_to_f16(x), "{x:e}");
        assert_eq!(f64_to_bf16(f64::from(x)), f32_to_bf16(x), "{x:e}");
    }
    for h in 0..=u16::MAX {
        let x = f16_to_f32(h);
        if !x.is_nan() {
            assert_eq!(f64_to_f16(f64::from(x)), h);
        }
    }
}

#[test]
fn f64_narrowing_rounds_once_where_f32_would_round_twice() {
    // 1 + 2^-8 + 2^-40: just above the bfloat16 tie between 1.0 and 1 + 2^-7, so it rounds
    // up. Through f32 the 2^-40 is lost, the value lands on the tie, and ties-to-even gives 1.0.
    let v = 1.0 + p2(-8) + p2(-40);
    assert_eq!(f64_to_bf16(v), 0x3f81);
    assert_eq!(f32_to_bf16(v as f32), 0x3f80, "the double rounding the f64 path avoids");
    // Same for half: 1 + 2^-11 + 2^-40.
    let v = 1.0 + p2(-11) + p2(-40);
    assert_eq!(f64_to_f16(v), 0x3c01);
    assert_eq!(f32_to_f16(v as f32), 0x3c00, "the double rounding the f64 path avoids");
    // PreMulSum scalars are rounded once from f64 too.
    let r = Reducer::new(DataType::Bfloat16, DevOp::PreMulSum { scalar: 1.0 + p2(-8) + p2(-40) });
    let mut out = [0u8; 2];
    r.pre(&bytes_of!(u16, [0x3f80u16]), &mut out);
    assert_eq!(out, 0x3f81u16.to_ne_bytes());
}

// ---- Float16 and Bfloat16 arithmetic ----------------------------------------------------------

#[test]
fn f16_sum_rounds_ties_to_even() {
    // (a, b, expected): values by bit pattern.
    let cases: [(u16, u16, u16); 9] = [
        (0x3c00, 0x1000, 0x3c00), // 1 + 2^-11: halfway, to even 1.0
        (0x3c01, 0x1000, 0x3c02), // 1 + 2^-10 + 2^-11: halfway, to even 0x3c02
        (0x3c00, 0x1001, 0x3c01), // just above halfway
        (0x7bff, 0x4c00, 0x7c00), // 65504 + 16 = 65520: halfway to 65536, to even = inf
        (0x7bff, 0x4800, 0x7bff), // 65504 + 8: rounds down
        (0x0001, 0x0001, 0x0002), // subnormals add exactly
        (0x8001, 0x0001, 0x0000), // x + -x = +0
        (0x0400, 0x8001, 0x03ff), // smallest normal - smallest subnormal
        (0x3c00, 0xbc00, 0x0000),
    ];
    let a: Vec<u16> = cases.iter().map(|c| c.0).collect();
    let b: Vec<u16> = cases.iter().map(|c| c.1).collect();
    let want: Vec<u16> = cases.iter().map(|c| c.2).collect();
    // Independently: these sums are exact in f32, and float16's f32 -> half rounds once.
    for (x, y, w) in cases {
        assert_eq!(f32_to_f16(f16_to_f32(x) + f16_to_f32(y)), w);
    }
    assert_eq!(comb(DataType::Float16, DevOp::Sum, &bytes_of!(u16, a), &bytes_of!(u16, b)), bytes_of!(u16, want));
}

#[test]
fn f16_and_bf16_single_steps_match_the_f32_path_on_random_operands() {
    // For one operation on two p-bit operands, an f32 intermediate (24 >= 2p + 2 bits) then a
    // rounding to the type is correctly rounded, so it is an independent reference.
    let mut rng = Rng(99);
    let n = 100_000;
    let a = rng.bytes(2 * n);
    let b = rng.bytes(2 * n);
    let halves = |v: &[u8]| -> Vec<u16> { v.chunks_exact(2).map(|c| u16::from_ne_bytes([c[0], c[1]])).collect() };
    let (ha, hb) = (halves(&a), halves(&b));
    type Conv = (DataType, fn(u16) -> f32, fn(f32) -> u16);
    let convs: [Conv; 2] =
        [(DataType::Float16, f16_to_f32, f32_to_f16), (DataType::Bfloat16, bf16_to_f32, f32_to_bf16)];
    for (dtype, widen, narrow) in convs {
        for (op, f) in [(DevOp::Sum, (|x, y| x + y) as fn(f32, f32) -> f32), (DevOp::Prod, |x, y| x * y)] {
            let got = halves(&comb(dtype, op, &a, &b));
            for i in 0..n {
                let r = f(widen(ha[i]), widen(hb[i]));
                if r.is_nan() {
                    assert_eq!(got[i], 0x7fff);
                } else {
                    assert_eq!(got[i], narrow(r), "{dtype} {op:?} {:#06x} {:#06x}", ha[i], hb[i]);
                }
            }
        }
    }
}

#[test]
fn bf16_sum_prod_min_max() {
    // 1.0, 1 + 2^-7, largest, -2.0, 1.0     and    2^-8, 2^-8, largest, 1.0, 2^-8 + 2^-15
    let a = bytes_of!(u16, [0x3f80u16, 0x3f81, 0x7f7f, 0xc000, 0x3f80]);
    let b = bytes_of!(u16, [0x3b80u16, 0x3b80, 0x7f7f, 0x3f80, 0x3b81]);
    let t = DataType::Bfloat16;
    // Ties to even; overflow to infinity; just above a tie rounds up.
    assert_eq!(comb(t, DevOp::Sum, &a, &b), bytes_of!(u16, [0x3f80u16, 0x3f82, 0x7f80, 0xbf80, 0x3f81]));
    // (1 + 2^-7) * 2^-8 exact; largest^2 = inf; 1 * (2^-8 + 2^-15) exact.
    assert_eq!(comb(t, DevOp::Prod, &a, &b), bytes_of!(u16, [0x3b80u16, 0x3b81, 0x7f80, 0xc000, 0x3b81]));
    assert_eq!(comb(t, DevOp::Max, &a, &b), bytes_of!(u16, [0x3f80u16, 0x3f81, 0x7f7f, 0x3f80, 0x3f80]));
    assert_eq!(comb(t, DevOp::Min, &a, &b), bytes_of!(u16, [0x3b80u16, 0x3b80, 0x7f7f, 0xc000, 0x3b81]));
    // The largest plus half an ulp (2^119) is a tie with infinity: even is infinity.
    assert_eq!(
        comb(t, DevOp::Sum, &bytes_of!(u16, [0x7f7fu16]), &bytes_of!(u16, [0x7b00u16])),
        bytes_of!(u16, [0x7f80u16])
    );
}

#[test]
fn f16_prod_min_max_and_nan() {
    // 1 + 2^-10, 65504, -2, NaN, -0      and   1 + 2^-10, 2, 0.5, 1, +0
    let a = bytes_of!(u16, [0x3c01u16, 0x7bff, 0xc000, 0x7e00, 0x8000]);
    let b = bytes_of!(u16, [0x3c01u16, 0x4000, 0x3800, 0x3c00, 0x0000]);
    let t = DataType::Float16;
    // (1 + 2^-10)^2 = 1 + 2^-9 + 2^-20 -> 1 + 2^-9; 65504 * 2 -> inf; NaN -> canonical.
    assert_eq!(comb(t, DevOp::Prod, &a, &b), bytes_of!(u16, [0x3c02u16, 0x7c00, 0xbc00, 0x7fff, 0x8000]));
    assert_eq!(comb(t, DevOp::Sum, &a, &b), bytes_of!(u16, [0x4001u16, 0x7bff, 0xbe00, 0x7fff, 0x0000]));
    // A NaN operand is ignored; -0 < +0.
    assert_eq!(comb(t, DevOp::Max, &a, &b), bytes_of!(u16, [0x3c01u16, 0x7bff, 0x3800, 0x3c00, 0x0000]));
    assert_eq!(comb(t, DevOp::Min, &a, &b), bytes_of!(u16, [0x3c01u16, 0x4000, 0xc000, 0x3c00, 0x8000]));
    let nan = bytes_of!(u16, [0x7e01u16]);
    assert_eq!(comb(t, DevOp::Min, &nan, &nan), bytes_of!(u16, [0x7fffu16]));
}

// ---- fp8 arithmetic ---------------------------------------------------------------------------

#[test]
fn fp8_ops_by_bit_pattern() {
    let t = DataType::Float8e4m3;
    // 1, 448, 1, 1.125, 1.5, NaN, -1, 2^-9      and    1, 448, 2^-4, 2^-4, 1.5, 1, 1, 2^-9
    let a = [0x38u8, 0x7e, 0x38, 0x39, 0x3c, 0x7f, 0xb8, 0x01];
    let b = [0x38u8, 0x7e, 0x18, 0x18, 0x3c, 0x38, 0x38, 0x01];
    // 2; 896 saturates to 448; 1.0625 ties to 1.0; 1.1875 ties to 1.25; 3; NaN; +0; 2^-8.
    assert_eq!(comb(t, DevOp::Sum, &a, &b), [0x40, 0x7e, 0x38, 0x3a, 0x44, 0x7f, 0x00, 0x02]);
    // 1; saturates; 2^-4; 1.125 * 2^-4; 2.25; NaN; -1; 2^-18 underflows to 0 (half keeps it
    // as a subnormal, fp8 cannot).
    assert_eq!(comb(t, DevOp::Prod, &a, &b), [0x38, 0x7e, 0x18, 0x19, 0x41, 0x7f, 0xb8, 0x00]);
    assert_eq!(comb(t, DevOp::Max, &a, &b), [0x38, 0x7e, 0x38, 0x39, 0x3c, 0x38, 0x38, 0x01]);
    assert_eq!(comb(t, DevOp::Min, &a, &b), [0x38, 0x7e, 0x18, 0x18, 0x3c, 0x38, 0xb8, 0x01]);
    assert_eq!(comb(t, DevOp::Min, &[0xff], &[0x7f]), [0x7f]);

    let t = DataType::Float8e5m2;
    // inf, -inf, inf, 57344, 1, NaN    and   1, 1, -inf, 57344, 1.25, 1
    let a = [0x7cu8, 0xfc, 0x7c, 0x7b, 0x3c, 0x7e];
    let b = [0x3cu8, 0x3c, 0xfc, 0x7b, 0x3d, 0x3c];
    // inf + 1 saturates to 57344; inf - inf is NaN; 57344 * 2 saturates; 2.25 ties to 2.0.
    assert_eq!(comb(t, DevOp::Sum, &a, &b), [0x7b, 0xfb, 0x7f, 0x7b, 0x40, 0x7f]);
    assert_eq!(comb(t, DevOp::Prod, &a, &b), [0x7b, 0xfb, 0xfb, 0x7b, 0x3d, 0x7f]);
    // Even Max/Min convert their half result back with SATFINITE: inf becomes 57344.
    assert_eq!(comb(t, DevOp::Max, &a, &b), [0x7b, 0x3c, 0x7b, 0x7b, 0x3d, 0x3c]);
    assert_eq!(comb(t, DevOp::Min, &a, &b), [0x3c, 0xfb, 0xfb, 0x7b, 0x3c, 0x3c]);
}

#[test]
fn fp8_all_pairs_match_the_exact_result_rounded_once() {
    // The kernels go through half (operands widened, the result rounded to half, then to
    // fp8); the model rounds the exact f64 result straight to fp8 by search. For two fp8
    // operands the two agree on every pair: this checks the tables and that claim.
    let all: Vec<u8> = (0..=u16::MAX).map(|i| (i >> 8) as u8).collect();
    let all_b: Vec<u8> = (0..=u16::MAX).map(|i| i as u8).collect();
    for (fmt, dtype) in FORMATS {
        for op in [DevOp::Sum, DevOp::Prod, DevOp::Min, DevOp::Max] {
            let got = comb(dtype, op, &all, &all_b);
            for i in 0..all.len() {
                let (a, b) = (all[i], all_b[i]);
                let want = match (fp8_model_value(fmt, a), fp8_model_value(fmt, b)) {
                    (None, None) => 0x7f,
                    (None, Some(y)) | (Some(y), None) if matches!(op, DevOp::Min | DevOp::Max) => {
                        fp8_model_nearest(fmt, y)
                    }
                    (None, _) | (_, None) => 0x7f,
                    (Some(x), Some(y)) => {
                        let r = match op {
                            DevOp::Sum => x + y,
                            DevOp::Prod => x * y,
                            // -0 < +0
                            DevOp::Min if x == y => {
                                if x.is_sign_negative() {
                                    x
                                } else {
                                    y
                                }
                            }
                            DevOp::Max if x == y => {
                                if x.is_sign_negative() {
                                    y
                                } else {
                                    x
                                }
                            }
                            DevOp::Min => x.min(y),
                            _ => x.max(y),
                        };
                        if r.is_nan() {
                            0x7f
                        } else {
                            fp8_model_nearest(fmt, r)
                        }
                    }
                };
                assert_eq!(got[i], want, "{fmt:?} {op:?} {a:#04x} {b:#04x}");
            }
        }
    }
}

// ---- Integers and IEEE types -----------------------------------------------------------------

#[test]
fn int8_and_uint8() {
    let a = bytes_of!(i8, [100i8, -128, 7, -3, 127]);
    let b = bytes_of!(i8, [100i8, -1, -9, -3, 1]);
    let t = DataType::Int8;
    assert_eq!(comb(t, DevOp::Sum, &a, &b), bytes_of!(i8, [-56i8, 127, -2, -6, -128]));
    assert_eq!(comb(t, DevOp::Prod, &a, &b), bytes_of!(i8, [16i8, -128, -63, 9, 127]));
    assert_eq!(comb(t, DevOp::Max, &a, &b), bytes_of!(i8, [100i8, -1, 7, -3, 127]));
    assert_eq!(comb(t, DevOp::Min, &a, &b), bytes_of!(i8, [100i8, -128, -9, -3, 1]));

    let (a, b) = (vec![200u8, 3, 0, 255], vec![100u8, 5, 255, 255]);
    let t = DataType::Uint8;
    assert_eq!(comb(t, DevOp::Sum, &a, &b), [44, 8, 255, 254]);
    assert_eq!(comb(t, DevOp::Prod, &a, &b), [32, 15, 0, 1]);
    assert_eq!(comb(t, DevOp::Max, &a, &b), [200, 5, 255, 255]);
    assert_eq!(comb(t, DevOp::Min, &a, &b), [100, 3, 0, 255]);
}

#[test]
fn int32_uint32_int64_uint64() {
    let a = bytes_of!(i32, [i32::MAX, -10, 6, i32::MIN]);
    let b = bytes_of!(i32, [1i32, 4, -7, -1]);
    let t = DataType::Int32;
    assert_eq!(comb(t, DevOp::Sum, &a, &b), bytes_of!(i32, [i32::MIN, -6, -1, i32::MAX]));
    assert_eq!(comb(t, DevOp::Prod, &a, &b), bytes_of!(i32, [i32::MAX, -40, -42, i32::MIN]));
    assert_eq!(comb(t, DevOp::Max, &a, &b), bytes_of!(i32, [i32::MAX, 4, 6, -1]));
    assert_eq!(comb(t, DevOp::Min, &a, &b), bytes_of!(i32, [1i32, -10, -7, i32::MIN]));

    let a = bytes_of!(u32, [u32::MAX, 10, 1 << 31]);
    let b = bytes_of!(u32, [2u32, 3, 2]);
    let t = DataType::Uint32;
    assert_eq!(comb(t, DevOp::Sum, &a, &b), bytes_of!(u32, [1u32, 13, (1 << 31) + 2]));
    assert_eq!(comb(t, DevOp::Prod, &a, &b), bytes_of!(u32, [u32::MAX - 1, 30, 0]));
    // Unsigned comparison: 2^31 is large, not negative.
    assert_eq!(comb(t, DevOp::Max, &a, &b), bytes_of!(u32, [u32::MAX, 10, 1 << 31]));
    assert_eq!(comb(t, DevOp::Min, &a, &b), bytes_of!(u32, [2u32, 3, 2]));

    let big = 1i64 << 40;
    let a = bytes_of!(i64, [big, -5, i64::MAX]);
    let b = bytes_of!(i64, [big, 2, 1]);
    let t = DataType::Int64;
    assert_eq!(comb(t, DevOp::Sum, &a, &b), bytes_of!(i64, [2 * big, -3, i64::MIN]));
    assert_eq!(comb(t, DevOp::Prod, &a, &b), bytes_of!(i64, [0i64, -10, i64::MAX])); // 2^80 wraps to 0
    assert_eq!(comb(t, DevOp::Max, &a, &b), bytes_of!(i64, [big, 2, i64::MAX]));
    assert_eq!(comb(t, DevOp::Min, &a, &b), bytes_of!(i64, [big, -5, 1]));

    let a = bytes_of!(u64, [u64::MAX, 1 << 33, 1 << 63]);
    let b = bytes_of!(u64, [u64::MAX, 1 << 33, 7]);
    let t = DataType::Uint64;
    assert_eq!(comb(t, DevOp::Sum, &a, &b), bytes_of!(u64, [u64::MAX - 1, 1 << 34, (1 << 63) + 7]));
    assert_eq!(comb(t, DevOp::Prod, &a, &b), bytes_of!(u64, [1u64, 0, 1 << 63]));
    assert_eq!(comb(t, DevOp::Max, &a, &b), bytes_of!(u64, [u64::MAX, 1 << 33, 1 << 63]));
    assert_eq!(comb(t, DevOp::Min, &a, &b), bytes_of!(u64, [u64::MAX, 1 << 33, 7]));
}

#[test]
fn float32_and_float64() {
    let a = bytes_of!(f32, [1.5f32, -2.0, 1e30, 0.1, 3e38]);
    let b = bytes_of!(f32, [2.25f32, 8.0, 1e30, 0.2, 3e38]);
    let t = DataType::Float32;
    // 0.1f32 + 0.2f32 rounded once in f32 (not 0.3f32 of an f64 sum: checked below).
    let s = 0.1f32 + 0.2f32;
    assert_eq!(s.to_bits(), 0x3e99_999a);
    assert_eq!(comb(t, DevOp::Sum, &a, &b), bytes_of!(f32, [3.75f32, 6.0, 2e30, s, f32::INFINITY]));
    assert_eq!(
        comb(t, DevOp::Prod, &a, &b),
        bytes_of!(f32, [3.375f32, -16.0, f32::INFINITY, 0.1f32 * 0.2f32, f32::INFINITY])
    );
    assert_eq!(comb(t, DevOp::Max, &a, &b), bytes_of!(f32, [2.25f32, 8.0, 1e30, 0.2, 3e38]));
    assert_eq!(comb(t, DevOp::Min, &a, &b), bytes_of!(f32, [1.5f32, -2.0, 1e30, 0.1, 3e38]));

    let a = bytes_of!(f64, [0.5f64, -4.0, 0.1]);
    let b = bytes_of!(f64, [0.25f64, 3.0, 0.2]);
    let t = DataType::Float64;
    assert_eq!(comb(t, DevOp::Sum, &a, &b), bytes_of!(f64, [0.75f64, -1.0, 0.30000000000000004]));
    assert_eq!(comb(t, DevOp::Prod, &a, &b), bytes_of!(f64, [0.125f64, -12.0, 0.1 * 0.2]));
    assert_eq!(comb(t, DevOp::Max, &a, &b), bytes_of!(f64, [0.5f64, 3.0, 0.2]));
    assert_eq!(comb(t, DevOp::Min, &a, &b), bytes_of!(f64, [0.25f64, -4.0, 0.1]));
}

#[test]
fn float_min_max_ignore_nan_and_order_signed_zeros() {
    let nan = f32::from_bits(0x7fc0_1234);
    let a = bytes_of!(f32, [nan, 3.0, nan, -0.0, 0.0, f32::NEG_INFINITY]);
    let b = bytes_of!(f32, [3.0f32, nan, nan, 0.0, -0.0, 1.0]);
    let t = DataType::Float32;
    let canon = f32::from_bits(0x7fff_ffff);
    assert_eq!(comb(t, DevOp::Min, &a, &b), bytes_of!(f32, [3.0f32, 3.0, canon, -0.0, -0.0, f32::NEG_INFINITY]));
    assert_eq!(comb(t, DevOp::Max, &a, &b), bytes_of!(f32, [3.0f32, 3.0, canon, 0.0, 0.0, 1.0]));
    let sum = comb(t, DevOp::Sum, &a, &b);
    assert!(f32::from_ne_bytes(sum[0..4].try_into().unwrap()).is_nan());

    let a = bytes_of!(f64, [f64::NAN, -0.0]);
    let b = bytes_of!(f64, [-7.0f64, 0.0]);
    assert_eq!(comb(DataType::Float64, DevOp::Min, &a, &b), bytes_of!(f64, [-7.0f64, -0.0]));
    assert_eq!(comb(DataType::Float64, DevOp::Max, &b, &a), bytes_of!(f64, [-7.0f64, 0.0]));
}

// ---- DevOp mapping, PreMulSum, post, aliasing --------------------------------------------------

#[test]
fn from_user_maps_like_nccl() {
    for dtype in DataType::ALL {
        for (op, dev) in
            [(RedOp::Sum, DevOp::Sum), (RedOp::Prod, DevOp::Prod), (RedOp::Min, DevOp::Min), (RedOp::Max, DevOp::Max)]
        {
            assert_eq!(DevOp::from_user(op, None, dtype, 4).unwrap(), dev);
        }
        let avg = DevOp::from_user(RedOp::Avg, None, dtype, 4).unwrap();
        if dtype.is_float() {
            assert_eq!(avg, DevOp::PreMulSum { scalar: 0.25 }, "{dtype}");
        } else {
            assert_eq!(avg, DevOp::SumPostDiv { n: 4 }, "{dtype}");
        }
        assert_eq!(DevOp::from_user(RedOp::PreMulSum, Some(2.5), dtype, 4).unwrap(), DevOp::PreMulSum { scalar: 2.5 });
        let e = DevOp::from_user(RedOp::PreMulSum, None, dtype, 4).unwrap_err();
        assert_eq!(e.code, ResultCode::InvalidArgument);
        assert_eq!(DevOp::from_user(RedOp::Avg, None, dtype, 0).unwrap_err().code, ResultCode::InvalidArgument);
    }
    assert_eq!(
        DevOp::from_user(RedOp::Avg, None, DataType::Float32, 3).unwrap(),
        DevOp::PreMulSum { scalar: 1.0 / 3.0 }
    );
}

#[test]
fn avg_over_three_ranks() {
    // Integers: sum, then truncating division.
    let r = Reducer::new(DataType::Int32, DevOp::from_user(RedOp::Avg, None, DataType::Int32, 3).unwrap());
    let ins = [bytes_of!(i32, [10i32, -10, 1]), bytes_of!(i32, [10i32, -10, 1]), bytes_of!(i32, [12i32, -12, -1])];
    let mut acc = vec![0u8; 12];
    r.pre(&ins[0], &mut acc);
    r.pre_combine_into(&mut acc, &ins[1]);
    r.pre_combine_into(&mut acc, &ins[2]);
    r.post(&mut acc);
    assert_eq!(acc, bytes_of!(i32, [10i32, -10, 0])); // 32/3, -32/3, 1/3 truncated

    // Half: each input times half(1/3) = 0x3555 (0.33325195...), rounded to half, then summed.
    let r = Reducer::new(DataType::Float16, DevOp::from_user(RedOp::Avg, None, DataType::Float16, 3).unwrap());
    let x = bytes_of!(u16, [0x4200u16]); // 3.0
    let mut acc = vec![0u8; 2];
    r.pre(&x, &mut acc);
    // 3 * 0.333251953125 = 0.999755859375 = 1 - 2^-12: halfway between 1 - 2^-11 (0x3bff,
    // odd) and 1.0 (0x3c00, even): 1.0.
    assert_eq!(acc, 0x3c00u16.to_ne_bytes());
    r.pre_combine_into(&mut acc, &x);
    r.pre_combine_into(&mut acc, &x);
    r.post(&mut acc); // nothing for PreMulSum
                      // 1 + 1 + 1.
    assert_eq!(acc, 0x4200u16.to_ne_bytes());
    // 0.5 * 0x3555 (1365 * 2^-12) = 1365 * 2^-13, exact (0x3155); twice that is 0x3555,
    // exact; three times is 4095 * 2^-13 = 2047.5 ulps of [0.25, 0.5): a tie between 0x37ff
    // (odd) and 0.5 (0x3800, even): 0.5.
    let x = bytes_of!(u16, [0x3800u16]);
    r.pre(&x, &mut acc);
    assert_eq!(acc, 0x3155u16.to_ne_bytes());
    r.pre_combine_into(&mut acc, &x);
    assert_eq!(acc, 0x3555u16.to_ne_bytes());
    r.pre_combine_into(&mut acc, &x);
    assert_eq!(acc, 0x3800u16.to_ne_bytes());
}

#[test]
fn premulsum_scalar_in_the_element_type_and_product_rounded() {
    let mul = |dtype, scalar, x: Vec<u8>| {
        let mut out = vec![0u8; x.len()];
        Reducer::new(dtype, DevOp::PreMulSum { scalar }).pre(&x, &mut out);
        out
    };
    // Integers: the scalar truncated toward zero (2.9 -> 2, -2.9 -> -2), products wrap;
    // out of range saturates (300 -> 127 for int8).
    assert_eq!(mul(DataType::Int32, 2.9, bytes_of!(i32, [5i32, -7])), bytes_of!(i32, [10i32, -14]));
    assert_eq!(mul(DataType::Int32, -2.9, bytes_of!(i32, [5i32, i32::MIN])), bytes_of!(i32, [-10i32, 0]));
    assert_eq!(mul(DataType::Int8, 300.0, bytes_of!(i8, [1i8, 2])), bytes_of!(i8, [127i8, -2]));
    assert_eq!(mul(DataType::Uint64, 3.0, bytes_of!(u64, [u64::MAX])), bytes_of!(u64, [u64::MAX - 2]));
    // f32: scalar rounded to f32 first, product rounded once in f32.
    assert_eq!(mul(DataType::Float32, 0.1, bytes_of!(f32, [3.0f32])), bytes_of!(f32, [3.0f32 * 0.1f32]));
    assert_eq!(mul(DataType::Float64, 0.1, bytes_of!(f64, [3.0f64])), bytes_of!(f64, [3.0f64 * 0.1]));
    // Half: 1.0008 -> 1 + 2^-10; times 3 = 3 + 1.5 ulps, a tie to even 0x4202.
    assert_eq!(mul(DataType::Float16, 1.0008, bytes_of!(u16, [0x4200u16])), bytes_of!(u16, [0x4202u16]));
    // e4m3: 0.3 -> 0.3125 (0x2a); 1.5 * 0.3125 = 0.46875 (0x2f) exactly.
    assert_eq!(f64_to_e4m3(0.3), 0x2a);
    // 448 * 0.3125 = 140 = 1.09375 * 2^7: nearest is 1.125 * 2^7 = 144 (0x71).
    assert_eq!(mul(DataType::Float8e4m3, 0.3, vec![0x3c, 0x7e]), vec![0x2f, 0x71]);
    assert_eq!(e4m3_to_f32(0x71), 144.0);
    // e5m2 scalar saturates: 1e9 -> 57344; 2 * 57344 saturates too.
    assert_eq!(mul(DataType::Float8e5m2, 1e9, vec![0x40, 0x00]), vec![0x7b, 0x00]);
}

#[test]
fn premulsum_rounds_the_product_before_the_add() {
    // bfloat16: x = s = 1 + 2^-7. x * s = 1 + 2^-6 + 2^-14 -> bf16 1 + 2^-6 (0x3f82). Adding
    // 2^-8 gives a tie between 0x3f82 (even) and 0x3f83: 0x3f82. A fused f32 computation
    // (product not rounded to bf16 first) would be just above the tie and give 0x3f83.
    let r = Reducer::new(DataType::Bfloat16, DevOp::PreMulSum { scalar: 1.0 + p2(-7) });
    let local = bytes_of!(u16, [0x3f81u16]);
    let incoming = bytes_of!(u16, [0x3b80u16]);
    let mut pre = vec![0u8; 2];
    r.pre(&local, &mut pre);
    assert_eq!(pre, bytes_of!(u16, [0x3f82u16]));
    let mut out = vec![0u8; 2];
    r.pre_combine(&local, &incoming, &mut out);
    assert_eq!(out, bytes_of!(u16, [0x3f82u16]));
    let fused = (bf16_to_f32(0x3f81) * bf16_to_f32(0x3f81)) + bf16_to_f32(0x3b80);
    assert_eq!(f32_to_bf16(fused), 0x3f83);

    // e4m3: 1.5 * 0.3125 = 0.46875, + 1.0 = 1.46875 -> 1.5 (0x3c).
    let r = Reducer::new(DataType::Float8e4m3, DevOp::PreMulSum { scalar: 0.3 });
    let mut out = [0u8];
    r.pre_combine(&[0x3c], &[0x38], &mut out);
    assert_eq!(out, [0x3c]);
}

#[test]
fn post_divides_only_for_sum_post_div() {
    let div = |dtype, n, v: Vec<u8>| {
        let mut b = v;
        Reducer::new(dtype, DevOp::SumPostDiv { n }).post(&mut b);
        b
    };
    assert_eq!(div(DataType::Int8, 3, bytes_of!(i8, [-128i8, 127, -7, 7, -1])), bytes_of!(i8, [-42i8, 42, -2, 2, 0]));
    assert_eq!(div(DataType::Int8, 1, bytes_of!(i8, [-128i8])), bytes_of!(i8, [-128i8]));
    assert_eq!(div(DataType::Uint8, 2, vec![255, 3]), vec![127, 1]);
    assert_eq!(div(DataType::Int32, 2, bytes_of!(i32, [-7i32, 7])), bytes_of!(i32, [-3i32, 3]));
    assert_eq!(div(DataType::Int64, 1, bytes_of!(i64, [i64::MIN])), bytes_of!(i64, [i64::MIN]));
    assert_eq!(div(DataType::Int64, 4, bytes_of!(i64, [i64::MIN])), bytes_of!(i64, [i64::MIN / 4]));
    assert_eq!(div(DataType::Uint64, 3, bytes_of!(u64, [u64::MAX])), bytes_of!(u64, [u64::MAX / 3]));
    assert_eq!(div(DataType::Uint32, 1 << 40, bytes_of!(u32, [u32::MAX])), bytes_of!(u32, [0u32]));
    // Every other op leaves the buffer alone.
    let v = bytes_of!(i32, [-7i32, 9]);
    for op in [DevOp::Sum, DevOp::Prod, DevOp::Min, DevOp::Max, DevOp::PreMulSum { scalar: 2.0 }] {
        let mut b = v.clone();
        Reducer::new(DataType::Int32, op).post(&mut b);
        assert_eq!(b, v);
    }
}

#[test]
fn aliasing_and_fused_forms_agree_with_the_plain_ones() {
    let mut rng = Rng(0xfeed);
    let ops = [
        DevOp::Sum,
        DevOp::Prod,
        DevOp::Min,
        DevOp::Max,
        DevOp::PreMulSum { scalar: 0.75 },
        DevOp::PreMulSum { scalar: -3.0 },
        DevOp::SumPostDiv { n: 3 },
    ];
    for dtype in DataType::ALL {
        let len = 1000 * dtype.size();
        let a = rng.bytes(len);
        let b = rng.bytes(len);
        for op in ops {
            let r = Reducer::new(dtype, op);
            let mut out = vec![0u8; len];
            r.combine(&a, &b, &mut out);
            let mut acc = a.clone();
            r.combine_into(&mut acc, &b);
            assert_eq!(acc, out, "{dtype} {op:?} combine_into");

            let mut pre = vec![0u8; len];
            r.pre(&a, &mut pre);
            let mut in_place = a.clone();
            r.pre_in_place(&mut in_place);
            assert_eq!(in_place, pre, "{dtype} {op:?} pre_in_place");
            if !matches!(op, DevOp::PreMulSum { .. }) {
                assert_eq!(pre, a, "{dtype} {op:?} pre is a copy");
            }
            let mut want = vec![0u8; len];
            r.combine(&pre, &b, &mut want);
            let mut fused = vec![0u8; len];
            r.pre_combine(&a, &b, &mut fused);
            assert_eq!(fused, want, "{dtype} {op:?} pre_combine");
            let mut acc = b.clone();
            r.pre_combine_into(&mut acc, &a);
            assert_eq!(acc, want, "{dtype} {op:?} pre_combine_into");
        }
    }
}

#[test]
#[should_panic(expected = "not the same whole number of elements")]
fn mismatched_lengths_panic() {
    let mut out = [0u8; 4];
    Reducer::new(DataType::Float32, DevOp::Sum).combine(&[0; 4], &[0; 8], &mut out);
}

#[test]
#[should_panic(expected = "not the same whole number of elements")]
fn partial_elements_panic() {
    let mut out = [0u8; 3];
    Reducer::new(DataType::Int32, DevOp::Sum).combine(&[0; 3], &[0; 3], &mut out);
}

// ---- Throughput (release mode, on demand) --------------------------------------------------------

/// `cargo test -p rustccl --lib --release reduce::tests::throughput -- --ignored --nocapture`
#[test]
#[ignore = "a measurement, run in release mode"]
fn throughput() {
    const BYTES: usize = 64 << 20;
    // Typical data: values of either sign, magnitudes between 1/16 and 16.
    let fill = |dtype: DataType, seed: u64| -> Vec<u8> {
        let mut rng = Rng(seed);
        let mut v = Vec::with_capacity(BYTES);
        while v.len() < BYTES {
            let x = ((rng.next() >> 11) as f64 / p2(53) * 8.0 - 4.0).exp2().copysign(rng.next() as i64 as f64);
            match dtype {
                DataType::Float16 => v.extend(f64_to_f16(x).to_ne_bytes()),
                DataType::Bfloat16 => v.extend(f64_to_bf16(x).to_ne_bytes()),
                DataType::Float32 => v.extend((x as f32).to_ne_bytes()),
                DataType::Float64 => v.extend(x.to_ne_bytes()),
                DataType::Float8e4m3 => v.push(f64_to_e4m3(x)),
                DataType::Float8e5m2 => v.push(f64_to_e5m2(x)),
                _ => v.push(rng.next() as u8),
            }
        }
        v
    };
    let mut out = vec![0u8; BYTES];
    let time = |f: &mut dyn FnMut()| {
        f(); // warm up (page faults, fp8 tables)
        (0..5)
            .map(|_| {
                let t = std::time::Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let a = vec![1u8; BYTES];
    let tcopy = time(&mut || out.copy_from_slice(&a));
    println!("baseline copy_from_slice: {:6.2} GB/s", BYTES as f64 / tcopy / 1e9);
    for (dtype, op) in [
        (DataType::Float32, DevOp::Sum),
        (DataType::Float64, DevOp::Sum),
        (DataType::Int32, DevOp::Sum),
        (DataType::Float32, DevOp::Max),
        (DataType::Float16, DevOp::Sum),
        (DataType::Float16, DevOp::Max),
        (DataType::Float16, DevOp::PreMulSum { scalar: 0.5 }),
        (DataType::Bfloat16, DevOp::Sum),
        (DataType::Float8e4m3, DevOp::Sum),
        (DataType::Int8, DevOp::Sum),
        (DataType::Float32, DevOp::PreMulSum { scalar: 0.5 }),
    ] {
        let r = Reducer::new(dtype, op);
        let (a, b) = (fill(dtype, 1), fill(dtype, 2));
        let mut acc = a.clone();
        let t3 = time(&mut || r.pre_combine(&a, &b, &mut out));
        let t2 = time(&mut || r.combine_into(&mut acc, &b));
        println!(
            "{:>10} {:<28} pre_combine(a, b, out): {:6.2} GB/s   combine_into(acc, b): {:6.2} GB/s   (64 MiB per buffer, per second)",
            dtype.name(),
            format!("{op:?}"),
            BYTES as f64 / t3 / 1e9,
            BYTES as f64 / t2 / 1e9
        );
    }
}

#[test]
fn decode_scalar_round_trips_through_premulsum() {
    let cases: Vec<(DataType, Vec<u8>, f64)> = vec![
        (DataType::Int8, bytes_of!(i8, [-5i8]), -5.0),
        (DataType::Uint8, vec![200], 200.0),
        (DataType::Int32, bytes_of!(i32, [-70000i32]), -70000.0),
        (DataType::Uint32, bytes_of!(u32, [u32::MAX]), 4294967295.0),
        (DataType::Int64, bytes_of!(i64, [-(1i64 << 50)]), -p2(50)),
        (DataType::Uint64, bytes_of!(u64, [1u64 << 60]), p2(60)),
        (DataType::Float16, bytes_of!(u16, [0x3555u16]), 0.333251953125),
        (DataType::Float32, bytes_of!(f32, [0.1f32]), f64::from(0.1f32)),
        (DataType::Float64, bytes_of!(f64, [0.1f64]), 0.1),
        (DataType::Bfloat16, bytes_of!(u16, [0x3eabu16]), f64::from(bf16_to_f32(0x3eab))),
        (DataType::Float8e4m3, vec![0x2a], 0.3125),
        (DataType::Float8e5m2, vec![0xbd], -1.25),
    ];
    for (dtype, bytes, value) in cases {
        let v = decode_scalar(dtype, &bytes);
        assert_eq!(v, value, "{dtype}");
        // Multiplying 1 by the decoded scalar gives back the scalar's bytes.
        let one: Vec<u8> = match dtype {
            DataType::Int8 | DataType::Uint8 => vec![1],
            DataType::Int32 | DataType::Uint32 => bytes_of!(u32, [1u32]),
            DataType::Int64 | DataType::Uint64 => bytes_of!(u64, [1u64]),
            DataType::Float16 => bytes_of!(u16, [0x3c00u16]),
            DataType::Float32 => bytes_of!(f32, [1.0f32]),
            DataType::Float64 => bytes_of!(f64, [1.0f64]),
            DataType::Bfloat16 => bytes_of!(u16, [0x3f80u16]),
            DataType::Float8e4m3 => vec![0x38],
            DataType::Float8e5m2 => vec![0x3c],
        };
        let mut out = vec![0u8; bytes.len()];
        Reducer::new(dtype, DevOp::PreMulSum { scalar: v }).pre(&one, &mut out);
        assert_eq!(out, bytes, "{dtype}");
    }
}

#[test]
fn branch_free_conversions_match_the_plain_ones() {
    let (h2f, f2h, b2f, f2b) = super::elem::fast_conversions();
    for h in 0..=u16::MAX {
        let (x, y) = (h2f(h), f16_to_f32(h));
        assert!(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()), "{h:#06x}");
        assert_eq!(b2f(h).to_bits(), bf16_to_f32(h).to_bits());
    }
    let mut rng = Rng(5);
    let specials = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN_POSITIVE, 65520.0, 65519.0];
    let randoms = (0..500_000).map(|_| f32::from_bits(rng.next() as u32));
    // Also values in and around half's range, where f2h's paths switch.
    let near = (0..500_000).map(|i| f32::from_bits(0x3000_0000 + i * 0x40));
    for x in specials.into_iter().chain(randoms).chain(near) {
        if x.is_nan() {
            assert_eq!(f2h(x), 0x7fff);
            assert_eq!(f2b(x), 0x7fff);
        } else {
            assert_eq!(f2h(x), f32_to_f16(x), "{x:e}");
            assert_eq!(f2b(x), f32_to_bf16(x), "{x:e}");
        }
    }
}

#[test]
fn narrow_sum_prod_match_the_f64_reference_on_random_pairs() {
    use super::elem::reference as r;
    let mut rng = Rng(31337);
    let n = 200_000;
    let a = rng.bytes(2 * n);
    let b = rng.bytes(2 * n);
    let h = |v: &[u8], i: usize| u16::from_ne_bytes([v[2 * i], v[2 * i + 1]]);
    type Ref = fn(u16, u16) -> u16;
    let cases: [(DataType, DevOp, Ref); 4] = [
        (DataType::Float16, DevOp::Sum, r::f16_add),
        (DataType::Float16, DevOp::Prod, r::f16_mul),
        (DataType::Bfloat16, DevOp::Sum, r::bf16_add),
        (DataType::Bfloat16, DevOp::Prod, r::bf16_mul),
    ];
    for (dtype, op, reference) in cases {
        let got = comb(dtype, op, &a, &b);
        for i in 0..n {
            assert_eq!(h(&got, i), reference(h(&a, i), h(&b, i)), "{dtype} {op:?} {:#06x} {:#06x}", h(&a, i), h(&b, i));
        }
    }
}

/// Every pair of halves and of bfloat16s, Sum and Prod: the `f32` computation the reducer
/// uses against the `f64` reference. About a minute per core in release mode:
/// `cargo test -p rustccl --lib --release narrow_f32_path -- --ignored --nocapture`
#[test]
#[ignore = "exhaustive (2^34 operations), run in release mode"]
fn narrow_f32_path_equals_f64_reference_on_all_pairs() {
    use super::elem::{reference as r, Elem, BF16, F16};
    type Pair = (&'static str, fn(u16, u16) -> u16, fn(u16, u16) -> u16);
    let cases: [Pair; 4] = [
        ("f16 add", |a, b| F16::add((), a, b), r::f16_add),
        ("f16 mul", |a, b| F16::mul((), a, b), r::f16_mul),
        ("bf16 add", |a, b| BF16::add((), a, b), r::bf16_add),
        ("bf16 mul", |a, b| BF16::mul((), a, b), r::bf16_mul),
    ];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    for (name, fast, reference) in cases {
        let t = std::time::Instant::now();
        let bad: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|k| {
                    s.spawn(move || {
                        let mut bad = 0u64;
                        let mut a = k;
                        while a <= 0xffff {
                            for b in 0..=u16::MAX {
                                if fast(a as u16, b) != reference(a as u16, b) {
                                    if bad < 5 {
                                        eprintln!("{name}: {a:#06x} {b:#06x}");
                                    }
                                    bad += 1;
                                }
                            }
                            a += threads;
                        }
                        bad
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        println!("{name}: 2^32 pairs, {bad} mismatches, {:.1} s", t.elapsed().as_secs_f64());
        assert_eq!(bad, 0, "{name}");
    }
}

#[test]
fn f16_simd_path_gives_the_portable_bits() {
    // Random halves (every class: NaN, inf, subnormal...), lengths that leave tails, all
    // methods, with the SIMD path on (where the CPU has it) and off.
    let mut rng = Rng(4242);
    let ops = [
        DevOp::Sum,
        DevOp::Prod,
        DevOp::Min,
        DevOp::Max,
        DevOp::PreMulSum { scalar: 1.0 / 3.0 },
        DevOp::PreMulSum { scalar: 1e-6 },
        DevOp::PreMulSum { scalar: 7000.0 },
        DevOp::SumPostDiv { n: 2 },
    ];
    eprintln!("simd available: {}", super::simd::available());
    for len in [0usize, 1, 7, 8, 9, 16, 63, 64, 65, 1000, 4099] {
        let a = rng.bytes(2 * len);
        let b = rng.bytes(2 * len);
        for op in ops {
            let r = Reducer::new(DataType::Float16, op);
            let mut outs = Vec::new();
            for fast in [true, false] {
                let mut o = Vec::new();
                let mut out = vec![0u8; 2 * len];
                r.combine_impl(&a, &b, &mut out, fast);
                o.push(out.clone());
                let mut acc = a.clone();
                r.combine_into_impl(&mut acc, &b, fast);
                o.push(acc);
                r.pre_impl(&a, &mut out, fast);
                o.push(out.clone());
                let mut buf = a.clone();
                r.pre_in_place_impl(&mut buf, fast);
                o.push(buf);
                r.pre_combine_impl(&a, &b, &mut out, fast);
                o.push(out.clone());
                let mut acc = b.clone();
                r.pre_combine_into_impl(&mut acc, &a, fast);
                o.push(acc);
                outs.push(o);
            }
            for (k, name) in
                ["combine", "combine_into", "pre", "pre_in_place", "pre_combine", "pre_combine_into"].iter().enumerate()
            {
                assert_eq!(outs[0][k], outs[1][k], "{op:?} {name} len {len}");
            }
        }
    }
}

/// Every pair of halves through the reducer's SIMD path (where the CPU has it), Sum and
/// Prod, against the `f64` reference.
#[test]
#[ignore = "exhaustive (2^33 operations), run in release mode"]
fn f16_simd_path_equals_f64_reference_on_all_pairs() {
    use super::elem::reference as r;
    let bs: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_ne_bytes()).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    type Ref = fn(u16, u16) -> u16;
    for (op, reference) in [(DevOp::Sum, r::f16_add as Ref), (DevOp::Prod, r::f16_mul as Ref)] {
        let red = Reducer::new(DataType::Float16, op);
        let bad: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|k| {
                    let bs = &bs;
                    s.spawn(move || {
                        let (mut bad, mut out) = (0u64, vec![0u8; bs.len()]);
                        let mut a = k;
                        while a <= 0xffff {
                            let av: Vec<u8> = std::iter::repeat_n((a as u16).to_ne_bytes(), 65536).flatten().collect();
                            red.combine_impl(&av, bs, &mut out, true);
                            for b in 0..=u16::MAX {
                                let got = u16::from_ne_bytes([out[2 * b as usize], out[2 * b as usize + 1]]);
                                bad += u64::from(got != reference(a as u16, b));
                            }
                            a += threads;
                        }
                        bad
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        println!("f16 {op:?} (simd available: {}): {bad} mismatches", super::simd::available());
        assert_eq!(bad, 0);
    }
}
