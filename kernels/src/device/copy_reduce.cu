// rustccl device code: the element-wise copy/reduce kernel.
//
//   dst[i] = op(op.pre(src0[i]), src1[i])   when src1 != NULL
//   dst[i] = op.pre(src0[i])                when src1 == NULL (copy; for
//                                           PreMulSum this scales the input)
//
// src0 is the local input (the user's buffer, so the pre-op applies to it);
// src1 is an already reduced partial result, e.g. one received from a peer.
// dst may alias src0 or src1 (each element is read before it is written by the
// same thread). Any grid shape works: threads stride over the n elements.
//
// One extern "C" kernel per (operator, element type), named
//   rustccl_copy_reduce_<op>_<type>
// with <op> in sum, prod, min, max, premulsum and <type> in i8, u8, i32, u32,
// i64, u64, f16, f32, f64, bf16, f8e4m3, f8e5m2 (fp8 only if RUSTCCL_HAVE_FP8).
// Signature: (T* dst, const T* src0, const T* src1, unsigned long long n,
// T scalar); scalar is the PreMulSum factor and ignored by the other operators.
#include "reduce_ops.h"

template <typename T, template <typename> class Op>
RUSTCCL_DEVICE void rustccl_copy_reduce(T* dst, const T* src0, const T* src1,
                                        unsigned long long n, T scalar) {
  typedef RustcclNum<T> Num;
  const Op<T> op(Num::load(scalar));
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    typename Num::Acc value = op.pre(Num::load(src0[i]));
    if (src1 != 0) value = op(value, Num::load(src1[i]));
    dst[i] = Num::store(value);
  }
}

#define RUSTCCL_COPY_REDUCE_KERNEL(opname, Op, tname, T)                                        \
  RUSTCCL_KERNEL void rustccl_copy_reduce_##opname##_##tname(                                   \
      T* dst, const T* src0, const T* src1, unsigned long long n, T scalar) {                   \
    rustccl_copy_reduce<T, Op>(dst, src0, src1, n, scalar);                                     \
  }

#define RUSTCCL_INSTANTIATE(tname, T)                          \
  RUSTCCL_COPY_REDUCE_KERNEL(sum, FuncSum, tname, T)           \
  RUSTCCL_COPY_REDUCE_KERNEL(prod, FuncProd, tname, T)         \
  RUSTCCL_COPY_REDUCE_KERNEL(min, FuncMin, tname, T)           \
  RUSTCCL_COPY_REDUCE_KERNEL(max, FuncMax, tname, T)           \
  RUSTCCL_COPY_REDUCE_KERNEL(premulsum, FuncPreMulSum, tname, T)

RUSTCCL_INSTANTIATE(i8, rustccl_i8)
RUSTCCL_INSTANTIATE(u8, rustccl_u8)
RUSTCCL_INSTANTIATE(i32, rustccl_i32)
RUSTCCL_INSTANTIATE(u32, rustccl_u32)
RUSTCCL_INSTANTIATE(i64, rustccl_i64)
RUSTCCL_INSTANTIATE(u64, rustccl_u64)
RUSTCCL_INSTANTIATE(f16, rustccl_f16)
RUSTCCL_INSTANTIATE(f32, float)
RUSTCCL_INSTANTIATE(f64, double)
RUSTCCL_INSTANTIATE(bf16, rustccl_bf16)
#if RUSTCCL_HAVE_FP8
RUSTCCL_INSTANTIATE(f8e4m3, rustccl_f8e4m3)
RUSTCCL_INSTANTIATE(f8e5m2, rustccl_f8e5m2)
#endif
