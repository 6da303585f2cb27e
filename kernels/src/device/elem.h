// rustccl device code: the element types' exact arithmetic on raw bits, used by the
// collective interpreter (exec.cu). Every operation is bit for bit what the host reference
// (host/src/reduce, `Reducer`) computes.
//
// A reduction (exec.cu) is pre, combine and post over these operations: pre is the identity
// except for PreMulSum (x * scalar, the product rounded to the element type); combine is add
// (sum, premulsum, sumpostdiv), multiply, min or max, each result rounded to the element
// type; post is SumPostDiv's division (integers, truncating toward zero). Avg is not an
// operator here: the host maps it as NCCL does (float types: PreMulSum with 1/n; integers:
// SumPostDiv by n).
//
// Semantics per type (see host/src/reduce/mod.rs): integers wrap; f32/f64 are IEEE in the
// type, never contracted into FMAs (__fadd_rn & co.); half and bfloat16 compute each
// operation in float and round once (the same as __hadd/__hmul); fp8 goes through half as
// NCCL does (widen to half, the half operation, then __nv_cvt_halfraw_to_fp8 with
// __NV_SATFINITE); min/max ignore a NaN operand, give the canonical NaN for two NaNs, and
// order -0 below +0; NaN results of the narrow types are canonical (half/bfloat16 0x7fff,
// fp8 0x7f).
#ifndef RUSTCCL_ELEM_H
#define RUSTCCL_ELEM_H
#include "port.h"

// ---- Min/max on raw bits ---------------------------------------------------------------
// a, b: the operands' bits; x, y: their values; nan: the type's canonical NaN.
template <typename R, typename F>
RUSTCCL_DEVICE R rustccl_fmin(R a, R b, F x, F y, R nan) {
  const bool xn = x != x, yn = y != y;
  R r = (y < x || xn) ? b : a;
  if (x == y) r = (R)(a | b);
  return (xn && yn) ? nan : r;
}
template <typename R, typename F>
RUSTCCL_DEVICE R rustccl_fmax(R a, R b, F x, F y, R nan) {
  const bool xn = x != x, yn = y != y;
  R r = (y > x || xn) ? b : a;
  if (x == y) r = (R)(a & b);
  return (xn && yn) ? nan : r;
}

// ---- Integers ------------------------------------------------------------------------
// T the element, U its unsigned twin (arithmetic in U wraps, as the host's wrapping ops).
template <typename T, typename U, bool Signed>
struct RustcclIntElem {
  typedef T Raw;
  static RUSTCCL_DEVICE T add(T a, T b) { return (T)(U)((U)a + (U)b); }
  static RUSTCCL_DEVICE T mul(T a, T b) { return (T)(U)((U)a * (U)b); }
  static RUSTCCL_DEVICE T min(T a, T b) { return b < a ? b : a; }
  static RUSTCCL_DEVICE T max(T a, T b) { return a < b ? b : a; }
  static RUSTCCL_DEVICE T div(T a, unsigned long long n) {
    if (Signed) return (T)((long long)a / (long long)n);
    return (T)((unsigned long long)a / n);
  }
};
typedef RustcclIntElem<rustccl_i8, unsigned char, true> RustcclElemI8;
typedef RustcclIntElem<rustccl_u8, unsigned char, false> RustcclElemU8;
typedef RustcclIntElem<rustccl_i32, unsigned int, true> RustcclElemI32;
typedef RustcclIntElem<rustccl_u32, unsigned int, false> RustcclElemU32;
typedef RustcclIntElem<rustccl_i64, unsigned long long, true> RustcclElemI64;
typedef RustcclIntElem<rustccl_u64, unsigned long long, false> RustcclElemU64;

// ---- f32, f64 ----------------------------------------------------------------------------
struct RustcclElemF32 {
  typedef unsigned int Raw;
  static RUSTCCL_DEVICE float v(Raw a) { return __uint_as_float(a); }
  static RUSTCCL_DEVICE Raw add(Raw a, Raw b) { return __float_as_uint(__fadd_rn(v(a), v(b))); }
  static RUSTCCL_DEVICE Raw mul(Raw a, Raw b) { return __float_as_uint(__fmul_rn(v(a), v(b))); }
  static RUSTCCL_DEVICE Raw min(Raw a, Raw b) { return rustccl_fmin(a, b, v(a), v(b), 0x7fffffffu); }
  static RUSTCCL_DEVICE Raw max(Raw a, Raw b) { return rustccl_fmax(a, b, v(a), v(b), 0x7fffffffu); }
  static RUSTCCL_DEVICE Raw div(Raw a, unsigned long long n) {
    return __float_as_uint((float)__ddiv_rn((double)v(a), (double)n));
  }
};
struct RustcclElemF64 {
  typedef unsigned long long Raw;
  static RUSTCCL_DEVICE double v(Raw a) { return __longlong_as_double((long long)a); }
  static RUSTCCL_DEVICE Raw w(double x) { return (Raw)__double_as_longlong(x); }
  static RUSTCCL_DEVICE Raw add(Raw a, Raw b) { return w(__dadd_rn(v(a), v(b))); }
  static RUSTCCL_DEVICE Raw mul(Raw a, Raw b) { return w(__dmul_rn(v(a), v(b))); }
  static RUSTCCL_DEVICE Raw min(Raw a, Raw b) { return rustccl_fmin(a, b, v(a), v(b), 0x7fffffffffffffffull); }
  static RUSTCCL_DEVICE Raw max(Raw a, Raw b) { return rustccl_fmax(a, b, v(a), v(b), 0x7fffffffffffffffull); }
  static RUSTCCL_DEVICE Raw div(Raw a, unsigned long long n) { return w(__ddiv_rn(v(a), (double)n)); }
};

// ---- half, bfloat16: one float operation, rounded once ---------------------------------
#if RUSTCCL_HIP
// A double to half in one rounding: first to float toward zero with the sticky bit kept in
// its last place (round to odd; float keeps 13 more bits than half), then to nearest even.
RUSTCCL_DEVICE unsigned short rustccl_half_rn_from_double(double q) {
  const float f = __double2float_rz(q);
  unsigned int u = __float_as_uint(f);
  if ((double)f != q) u |= 1u;
  return __half_as_ushort(__float2half_rn(__uint_as_float(u)));
}
#define RUSTCCL_HALF_RN_DOUBLE(q) rustccl_half_rn_from_double(q)
#else
#define RUSTCCL_HALF_RN_DOUBLE(q) __half_as_ushort(__double2half(q))
#endif
struct RustcclElemF16 {
  typedef unsigned short Raw;
  static RUSTCCL_DEVICE float v(Raw a) { return __half2float(__ushort_as_half(a)); }
  static RUSTCCL_DEVICE Raw w(float x) { return x != x ? (Raw)0x7fff : __half_as_ushort(__float2half_rn(x)); }
  static RUSTCCL_DEVICE Raw add(Raw a, Raw b) { return w(__fadd_rn(v(a), v(b))); }
  static RUSTCCL_DEVICE Raw mul(Raw a, Raw b) { return w(__fmul_rn(v(a), v(b))); }
  static RUSTCCL_DEVICE Raw min(Raw a, Raw b) { return rustccl_fmin(a, b, v(a), v(b), (Raw)0x7fff); }
  static RUSTCCL_DEVICE Raw max(Raw a, Raw b) { return rustccl_fmax(a, b, v(a), v(b), (Raw)0x7fff); }
  static RUSTCCL_DEVICE Raw div(Raw a, unsigned long long n) {
    const double q = __ddiv_rn((double)v(a), (double)n);
    return q != q ? (Raw)0x7fff : RUSTCCL_HALF_RN_DOUBLE(q);
  }
};
#if RUSTCCL_HIP
// bfloat16 rounding on raw bits (HIP has no portable bf16 intrinsics across ROCm versions):
// a float rounded to nearest even keeping its top 16 bits (not NaN: callers handle it); a
// double first rounded to float toward zero with the sticky bit kept in the last place
// (round to odd), so the second rounding is the one rounding of the double (float keeps 16
// more bits than bfloat16).
RUSTCCL_DEVICE unsigned short rustccl_bf16_rn(float x) {
  const unsigned int u = __float_as_uint(x);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
RUSTCCL_DEVICE unsigned short rustccl_bf16_rn_from_double(double q) {
  const float f = __double2float_rz(q);
  unsigned int u = __float_as_uint(f);
  if ((double)f != q) u |= 1u;
  return rustccl_bf16_rn(__uint_as_float(u));
}
#define RUSTCCL_BF16_RN(x) rustccl_bf16_rn(x)
#define RUSTCCL_BF16_RN_DOUBLE(q) rustccl_bf16_rn_from_double(q)
#else
#define RUSTCCL_BF16_RN(x) __bfloat16_as_ushort(__float2bfloat16_rn(x))
#define RUSTCCL_BF16_RN_DOUBLE(q) __bfloat16_as_ushort(__double2bfloat16(q))
#endif
struct RustcclElemBF16 {
  typedef unsigned short Raw;
  static RUSTCCL_DEVICE float v(Raw a) { return __uint_as_float(((unsigned int)a) << 16); }
  static RUSTCCL_DEVICE Raw w(float x) {
    return x != x ? (Raw)0x7fff : RUSTCCL_BF16_RN(x);
  }
  static RUSTCCL_DEVICE Raw add(Raw a, Raw b) { return w(__fadd_rn(v(a), v(b))); }
  static RUSTCCL_DEVICE Raw mul(Raw a, Raw b) { return w(__fmul_rn(v(a), v(b))); }
  static RUSTCCL_DEVICE Raw min(Raw a, Raw b) { return rustccl_fmin(a, b, v(a), v(b), (Raw)0x7fff); }
  static RUSTCCL_DEVICE Raw max(Raw a, Raw b) { return rustccl_fmax(a, b, v(a), v(b), (Raw)0x7fff); }
  static RUSTCCL_DEVICE Raw div(Raw a, unsigned long long n) {
    const double q = __ddiv_rn((double)v(a), (double)n);
    return q != q ? (Raw)0x7fff : RUSTCCL_BF16_RN_DOUBLE(q);
  }
};

// ---- fp8: through half -------------------------------------------------------------------
#if RUSTCCL_HAVE_FP8
template <__nv_fp8_interpretation_t Fmt>
struct RustcclElemF8 {
  typedef unsigned char Raw;
  typedef RustcclElemF16 H;
  static RUSTCCL_DEVICE unsigned short h(Raw a) { return __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)a, Fmt).x; }
  static RUSTCCL_DEVICE Raw f8(unsigned short x) {
    if ((x & 0x7fff) > 0x7c00) return (Raw)0x7f;  // NaN
    __half_raw r;
    r.x = x;
    return (Raw)__nv_cvt_halfraw_to_fp8(r, __NV_SATFINITE, Fmt);
  }
  static RUSTCCL_DEVICE Raw add(Raw a, Raw b) { return f8(H::add(h(a), h(b))); }
  static RUSTCCL_DEVICE Raw mul(Raw a, Raw b) { return f8(H::mul(h(a), h(b))); }
  static RUSTCCL_DEVICE Raw min(Raw a, Raw b) { return f8(H::min(h(a), h(b))); }
  static RUSTCCL_DEVICE Raw max(Raw a, Raw b) { return f8(H::max(h(a), h(b))); }
  static RUSTCCL_DEVICE Raw div(Raw a, unsigned long long n) { return f8(H::div(h(a), n)); }
};
typedef RustcclElemF8<__NV_E4M3> RustcclElemF8E4M3;
typedef RustcclElemF8<__NV_E5M2> RustcclElemF8E5M2;
#endif

enum { RUSTCCL_OP_SUM, RUSTCCL_OP_PROD, RUSTCCL_OP_MIN, RUSTCCL_OP_MAX, RUSTCCL_OP_PREMULSUM, RUSTCCL_OP_SUMPOSTDIV };

template <typename E, int Op>
RUSTCCL_DEVICE typename E::Raw rustccl_combine(typename E::Raw acc, typename E::Raw x) {
  if (Op == RUSTCCL_OP_PROD) return E::mul(acc, x);
  if (Op == RUSTCCL_OP_MIN) return E::min(acc, x);
  if (Op == RUSTCCL_OP_MAX) return E::max(acc, x);
  return E::add(acc, x);
}

#endif  // RUSTCCL_ELEM_H
