//! IEEE half (`f16`) and bfloat16 conversions to and from `f32`, rounding to nearest even
//! (what the GPU's `__float2half_rn` and `__float2bfloat16_rn` do). Both are stored as `u16`
//! bit patterns.
//!
//! Written plainly, branch by branch: the reducer's loops use their own branch-free versions
//! (`elem.rs`), and the tests check those against these.

/// The `f32` value of the half-precision bit pattern `h` (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    match exp {
        // Zero and subnormals: man * 2^-24, exact in f32.
        0 => sign * man as f32 * (1.0 / 16_777_216.0),
        // Infinity and NaN (payload kept).
        0x1f => f32::from_bits(u32::from(h & 0x8000) << 16 | 0x7f80_0000 | man << 13),
        _ => f32::from_bits(u32::from(h & 0x8000) << 16 | (exp + 112) << 23 | man << 13),
    }
}

/// Rounds `x >> shift` to nearest, ties to even (`shift` >= 1).
fn shift_round_even(x: u32, shift: u32) -> u32 {
    let kept = x >> shift;
    let rest = x & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    if rest > half || (rest == half && kept & 1 == 1) {
        kept + 1
    } else {
        kept
    }
}

/// The half-precision bit pattern nearest `x` (ties to even; overflow gives infinity).
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        // Infinity stays infinity; NaN stays a (quiet) NaN.
        return if man == 0 { sign | 0x7c00 } else { sign | 0x7e00 | (man >> 13) as u16 };
    }
    let e = exp - 127 + 15; // the half exponent field, before rounding
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // Subnormal half (or zero): the value is m * 2^-24 with m = full mantissa >> (14 - e).
        // Below e = -10 it is under half the smallest subnormal and rounds to zero.
        if e < -10 {
            return sign;
        }
        let full = man | 0x80_0000;
        // A carry out of the mantissa correctly gives the smallest normal (0x0400).
        return sign | shift_round_even(full, (14 - e) as u32) as u16;
    }
    // Normal: a carry out of the mantissa bumps the exponent, up to infinity (0x7c00).
    let rounded = (e as u32) << 10 | man >> 13;
    let rest = man & 0x1fff;
    let up = rest > 0x1000 || (rest == 0x1000 && rounded & 1 == 1);
    sign | (rounded + u32::from(up)) as u16
}

/// The `f32` value of the bfloat16 bit pattern `b` (exact).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// The bfloat16 bit pattern nearest `x` (ties to even; overflow gives infinity).
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let lsb = (bits >> 16) & 1;
    (bits.wrapping_add(0x7fff + lsb) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_known_patterns() {
        let cases: [(u16, f32); 10] = [
            (0x0000, 0.0),
            (0x3c00, 1.0),
            (0xc000, -2.0),
            (0x3800, 0.5),
            (0x3e00, 1.5),
            (0x7bff, 65504.0),
            (0x0400, 6.103_515_6e-5), // smallest normal, 2^-14
            (0x0001, 5.960_464_5e-8), // smallest subnormal, 2^-24
            (0x3555, 0.333_251_95),   // nearest half to 1/3
            (0x7c00, f32::INFINITY),
        ];
        for (bits, value) in cases {
            assert_eq!(f16_to_f32(bits), value, "{bits:#06x}");
            assert_eq!(f32_to_f16(value), bits, "{value}");
        }
        assert_eq!(f32_to_f16(-0.0), 0x8000);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f32_to_f16(f32::NAN) & 0x7e00, 0x7e00);
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 is halfway between 1.0 (0x3c00, even) and 1 + 2^-10 (0x3c01).
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        // 1 + 3 * 2^-11 is halfway between 0x3c01 and 0x3c02 (even): rounds up.
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        // Just above halfway rounds up.
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11) + 2f32.powi(-20)), 0x3c01);
        // 65520 is halfway between 65504 and 65536 (= infinity): rounds to even, infinity.
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(1e6), 0x7c00);
        // Subnormals: 2^-25 is halfway between 0 and 2^-24: rounds to even, zero.
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0x0000);
        assert_eq!(f32_to_f16(1.5 * 2f32.powi(-24)), 0x0002);
        assert_eq!(f32_to_f16(2f32.powi(-26)), 0x0000);
        assert_eq!(f32_to_f16(3.0 * 2f32.powi(-24)), 0x0003);
    }

    #[test]
    fn f16_every_pattern_round_trips() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f16_to_f32(f32_to_f16(f)).is_nan());
            } else {
                assert_eq!(f32_to_f16(f), h, "{h:#06x} -> {f}");
            }
        }
    }

    #[test]
    fn bf16_known_patterns_and_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(-2.0), 0xc000);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(bf16_to_f32(0x4049), 3.140_625);
        // 1 + 2^-8 is halfway between 0x3f80 (even) and 0x3f81.
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80); // rounds to infinity
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        for b in 0..=u16::MAX {
            let f = bf16_to_f32(b);
            if !f.is_nan() {
                assert_eq!(f32_to_bf16(f), b);
            }
        }
    }
}
