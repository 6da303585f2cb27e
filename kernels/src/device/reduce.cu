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
// and <type> in i8, u8, i32, u32, i64, u64, f16, f32, f64, bf16, f8e4m3, f8e5m2 (the fp8 ones
// only with RUSTCCL_HAVE_FP8). The single parameter is a RustcclReduceArgs, by value.
#include "port.h"
#include "elem.h"

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


// ---- The kernel ------------------------------------------------------------------------
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
