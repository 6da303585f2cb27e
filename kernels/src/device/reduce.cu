// rustccl device code: the n-input element-wise reduce that a LocalPlan's Reduce step runs,
// bit for bit what the host's reference (host/src/reduce, `Reducer`) computes.
//
//   acc = pre(srcs[0])                      (no pre when RUSTCCL_REDUCE_ACC_FIRST is set:
//                                            srcs[0] is an already reduced partial result)
//   acc = combine(acc, pre(srcs[k]))        k = 1 .. nsrcs-1, in order (a left fold)
//   dst = post(acc)                         (only when RUSTCCL_REDUCE_POST is set)
//
// pre is the identity except for PreMulSum (x * scalar, the product rounded to the element
// type); combine is add (sum, premulsum, sumpostdiv), multiply, min or max, each result
// rounded to the element type; post is SumPostDiv's division (integers, truncating toward
// zero). Avg is not an operator here: the host maps it as NCCL does (float types:
// PreMulSum with 1/n; integers: SumPostDiv by n).
//
// Semantics per type (see host/src/reduce/mod.rs): integers wrap; f32/f64 are IEEE in the
// type, never contracted into FMAs (__fadd_rn & co.); half and bfloat16 compute each
// operation in float and round once (the same as __hadd/__hmul); fp8 goes through half as
// NCCL does (widen to half, the half operation, then __nv_cvt_halfraw_to_fp8 with
// __NV_SATFINITE); min/max ignore a NaN operand, give the canonical NaN for two NaNs, and
// order -0 below +0; NaN results of the narrow types are canonical (half/bfloat16 0x7fff,
// fp8 0x7f).
//
// dst may be one of the srcs (each thread reads element i of every input before it writes
// element i of dst) but must not otherwise overlap them. Any grid shape works.
//
// One extern "C" kernel per (operator, element type), named
//   rustccl_reduce_<op>_<type>
// with <op> in sum, prod, min, max, premulsum, sumpostdiv (sumpostdiv: integer types only)
// and <type> as in copy_reduce.cu. The single parameter is a RustcclReduceArgs, by value.
#include "port.h"

#define RUSTCCL_REDUCE_MAX_SRCS 32
// srcs[0] is an accumulated partial result: PreMulSum does not scale it.
#define RUSTCCL_REDUCE_ACC_FIRST 1u
// Apply the post-op (SumPostDiv's division) to the result.
#define RUSTCCL_REDUCE_POST 2u

// Laid out like the host's #[repr(C)] struct: 8-byte fields first, no padding.
struct RustcclReduceArgs {
  unsigned long long dst;
  unsigned long long srcs[RUSTCCL_REDUCE_MAX_SRCS];
  unsigned long long n;        // elements
  unsigned long long scalar;   // PreMulSum: the scalar's bits in the element type
  unsigned long long divisor;  // SumPostDiv: n >= 1
  unsigned int nsrcs;          // 1 .. RUSTCCL_REDUCE_MAX_SRCS
  unsigned int flags;
};

// Kernel parameters read in place (no per-thread copy) where the architecture allows it.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 700) && !RUSTCCL_HIP
#define RUSTCCL_GRID_CONSTANT __grid_constant__
#else
#define RUSTCCL_GRID_CONSTANT
#endif

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
    return q != q ? (Raw)0x7fff : __half_as_ushort(__double2half(q));
  }
};
struct RustcclElemBF16 {
  typedef unsigned short Raw;
  static RUSTCCL_DEVICE float v(Raw a) { return __uint_as_float(((unsigned int)a) << 16); }
  static RUSTCCL_DEVICE Raw w(float x) {
    return x != x ? (Raw)0x7fff : __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
  static RUSTCCL_DEVICE Raw add(Raw a, Raw b) { return w(__fadd_rn(v(a), v(b))); }
  static RUSTCCL_DEVICE Raw mul(Raw a, Raw b) { return w(__fmul_rn(v(a), v(b))); }
  static RUSTCCL_DEVICE Raw min(Raw a, Raw b) { return rustccl_fmin(a, b, v(a), v(b), (Raw)0x7fff); }
  static RUSTCCL_DEVICE Raw max(Raw a, Raw b) { return rustccl_fmax(a, b, v(a), v(b), (Raw)0x7fff); }
  static RUSTCCL_DEVICE Raw div(Raw a, unsigned long long n) {
    const double q = __ddiv_rn((double)v(a), (double)n);
    return q != q ? (Raw)0x7fff : __bfloat16_as_ushort(__double2bfloat16(q));
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

// ---- The kernel ------------------------------------------------------------------------
enum { RUSTCCL_OP_SUM, RUSTCCL_OP_PROD, RUSTCCL_OP_MIN, RUSTCCL_OP_MAX, RUSTCCL_OP_PREMULSUM, RUSTCCL_OP_SUMPOSTDIV };

template <typename E, int Op>
RUSTCCL_DEVICE typename E::Raw rustccl_combine(typename E::Raw acc, typename E::Raw x) {
  if (Op == RUSTCCL_OP_PROD) return E::mul(acc, x);
  if (Op == RUSTCCL_OP_MIN) return E::min(acc, x);
  if (Op == RUSTCCL_OP_MAX) return E::max(acc, x);
  return E::add(acc, x);
}

template <typename E, int Op>
RUSTCCL_DEVICE void rustccl_reduce(const RustcclReduceArgs& args) {
  typedef typename E::Raw R;
  R* dst = (R*)args.dst;
  const R scalar = (R)args.scalar;
  const unsigned int nsrcs = args.nsrcs;
  const bool pre_first = Op == RUSTCCL_OP_PREMULSUM && !(args.flags & RUSTCCL_REDUCE_ACC_FIRST);
  const bool post = Op == RUSTCCL_OP_SUMPOSTDIV && (args.flags & RUSTCCL_REDUCE_POST);
  const unsigned long long n = args.n;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    R acc = ((const R*)args.srcs[0])[i];
    if (pre_first) acc = E::mul(acc, scalar);
    for (unsigned int k = 1; k < nsrcs; ++k) {
      R x = ((const R*)args.srcs[k])[i];
      if (Op == RUSTCCL_OP_PREMULSUM) x = E::mul(x, scalar);
      acc = rustccl_combine<E, Op>(acc, x);
    }
    if (post) acc = E::div(acc, args.divisor);
    dst[i] = acc;
  }
}

#define RUSTCCL_REDUCE_KERNEL(opname, Op, tname, E)                                              \
  RUSTCCL_KERNEL void rustccl_reduce_##opname##_##tname(RUSTCCL_GRID_CONSTANT const RustcclReduceArgs args) { \
    rustccl_reduce<E, Op>(args);                                                                 \
  }

#define RUSTCCL_REDUCE_FLOAT_TYPE(tname, E)                        \
  RUSTCCL_REDUCE_KERNEL(sum, RUSTCCL_OP_SUM, tname, E)             \
  RUSTCCL_REDUCE_KERNEL(prod, RUSTCCL_OP_PROD, tname, E)           \
  RUSTCCL_REDUCE_KERNEL(min, RUSTCCL_OP_MIN, tname, E)             \
  RUSTCCL_REDUCE_KERNEL(max, RUSTCCL_OP_MAX, tname, E)             \
  RUSTCCL_REDUCE_KERNEL(premulsum, RUSTCCL_OP_PREMULSUM, tname, E)

#define RUSTCCL_REDUCE_INT_TYPE(tname, E) \
  RUSTCCL_REDUCE_FLOAT_TYPE(tname, E)     \
  RUSTCCL_REDUCE_KERNEL(sumpostdiv, RUSTCCL_OP_SUMPOSTDIV, tname, E)

RUSTCCL_REDUCE_INT_TYPE(i8, RustcclElemI8)
RUSTCCL_REDUCE_INT_TYPE(u8, RustcclElemU8)
RUSTCCL_REDUCE_INT_TYPE(i32, RustcclElemI32)
RUSTCCL_REDUCE_INT_TYPE(u32, RustcclElemU32)
RUSTCCL_REDUCE_INT_TYPE(i64, RustcclElemI64)
RUSTCCL_REDUCE_INT_TYPE(u64, RustcclElemU64)
RUSTCCL_REDUCE_FLOAT_TYPE(f16, RustcclElemF16)
RUSTCCL_REDUCE_FLOAT_TYPE(f32, RustcclElemF32)
RUSTCCL_REDUCE_FLOAT_TYPE(f64, RustcclElemF64)
RUSTCCL_REDUCE_FLOAT_TYPE(bf16, RustcclElemBF16)
#if RUSTCCL_HAVE_FP8
RUSTCCL_REDUCE_FLOAT_TYPE(f8e4m3, RustcclElemF8E4M3)
RUSTCCL_REDUCE_FLOAT_TYPE(f8e5m2, RustcclElemF8E5M2)
#endif
