//! x86-64 fast path for half (`Float16`) Sum/Prod/PreMulSum: the F16C conversions
//! (`vcvtph2ps`, exact; `vcvtps2ph` with round-to-nearest-even, subnormals kept, overflow to
//! infinity), 8 elements at a time, with the `f32` arithmetic of the portable path — so the
//! same bits as that path (which see, in `elem.rs`, for why `f32` arithmetic gives the
//! correctly rounded half result). NaN results are set to the canonical 0x7fff as there.
//!
//! Used when the CPU has AVX and F16C (checked at run time, once per call); each function
//! returns how many bytes it did — a multiple of 16, the rest is left to the portable loop.

/// The computation, per element.
#[derive(Clone, Copy, Debug)]
pub(super) enum Op {
    /// `a + b`.
    Add,
    /// `a * b`.
    Mul,
    /// `round_half(a * s) + b`: PreMulSum's fused step; `s` is a half value.
    MulAdd(f32),
    /// `a * s` (unary; `b` unused): PreMulSum's pre step.
    MulScalar(f32),
}

/// Whether the fast path can run on this CPU.
#[inline]
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx") && std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `out = op(a, b)` on the leading whole groups of 8 halves; returns the bytes done. `b` is
/// ignored for unary ops (pass `a`). All three slices have the same length.
pub(super) fn binary(op: Op, a: &[u8], b: &[u8], out: &mut [u8]) -> usize {
    assert!(a.len() == out.len() && b.len() == out.len());
    let n = out.len() / 16 * 16;
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: the CPU has AVX and F16C; the pointers cover `n` bytes each.
        unsafe { x86::run(op, a.as_ptr(), b.as_ptr(), out.as_mut_ptr(), n) };
        return n;
    }
    let _ = op;
    0
}

/// `acc = op(acc, b)` (for [`Op::MulAdd`]: `acc = round_half(b * s) + acc`) on the leading
/// whole groups of 8 halves; returns the bytes done.
pub(super) fn binary_into(op: Op, acc: &mut [u8], b: &[u8]) -> usize {
    assert!(acc.len() == b.len());
    let n = acc.len() / 16 * 16;
    #[cfg(target_arch = "x86_64")]
    if available() {
        let p = acc.as_mut_ptr();
        // SAFETY: as in `binary`; the output is the first (or, for MulAdd, the second)
        // input, and every group of 8 is read before it is written.
        unsafe {
            match op {
                Op::MulAdd(_) => x86::run(op, b.as_ptr(), p, p, n),
                _ => x86::run(op, p, b.as_ptr(), p, n),
            }
        }
        return n;
    }
    let _ = op;
    0
}

/// `buf = op(buf)` for a unary op ([`Op::MulScalar`]) on the leading whole groups of 8
/// halves; returns the bytes done.
pub(super) fn unary_in_place(op: Op, buf: &mut [u8]) -> usize {
    assert!(matches!(op, Op::MulScalar(_)));
    let n = buf.len() / 16 * 16;
    #[cfg(target_arch = "x86_64")]
    if available() {
        let p = buf.as_mut_ptr();
        // SAFETY: as in `binary`; each group is read before it is written.
        unsafe { x86::run(op, p, p, p, n) };
        return n;
    }
    0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Op;
    use std::arch::x86_64::*;

    /// `n` bytes (a multiple of 16) at `a`, `b`, `out`; `out` may be `a` or `b`.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn run(op: Op, a: *const u8, b: *const u8, out: *mut u8, n: usize) {
        // The f32 NaN whose conversion is the canonical half NaN 0x7fff.
        let nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_e000));
        let s = match op {
            Op::MulAdd(s) | Op::MulScalar(s) => _mm256_set1_ps(s),
            _ => _mm256_setzero_ps(),
        };
        let mut i = 0;
        while i < n {
            let x = _mm256_cvtph_ps(_mm_loadu_si128(a.add(i) as *const __m128i));
            let r = match op {
                Op::Add => _mm256_add_ps(x, _mm256_cvtph_ps(_mm_loadu_si128(b.add(i) as *const __m128i))),
                Op::Mul => _mm256_mul_ps(x, _mm256_cvtph_ps(_mm_loadu_si128(b.add(i) as *const __m128i))),
                Op::MulScalar(_) => _mm256_mul_ps(x, s),
                Op::MulAdd(_) => {
                    // The product rounded to half first (a NaN stays a NaN).
                    let p = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(x, s)));
                    _mm256_add_ps(p, _mm256_cvtph_ps(_mm_loadu_si128(b.add(i) as *const __m128i)))
                }
            };
            let r = _mm256_blendv_ps(r, nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(r, r));
            _mm_storeu_si128(out.add(i) as *mut __m128i, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r));
            i += 16;
        }
    }
}
