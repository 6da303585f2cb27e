// rustccl device code: element-wise reduction functors.
//
// One functor per reduction kind, for every NCCL element type:
//   FuncSum, FuncProd, FuncMin, FuncMax   the ncclRedOp_t operators;
//   FuncPreMulSum                        sum after multiplying each *input* by a
//                                        scalar (ncclRedOpCreatePreMulSum; also
//                                        how floating-point ncclAvg is done).
//
// A functor works on the type's accumulation type (RustcclNum<T>::Acc): float
// for the 16- and 8-bit floating types, T itself otherwise. Loads widen with
// RustcclNum<T>::load and stores narrow with RustcclNum<T>::store, so half,
// bfloat16 and fp8 round once per stored element. Integer sums and products
// wrap around as in NCCL.
//
// Interface, for a functor F of type T:
//   F f(scalar);          scalar: the PreMulSum factor (ignored by the others)
//   f.pre(x)              applied once to each input element as it is read
//                         from user memory (identity except for PreMulSum)
//   f(a, b)               combines two (pre-applied) accumulated values
// Min/max of floating values that are NaN follow the comparison (a < b):
// NaN propagation is not defined.
#ifndef RUSTCCL_REDUCE_OPS_H
#define RUSTCCL_REDUCE_OPS_H

#include "port.h"

// ---- Widening and narrowing --------------------------------------------------
template <typename T>
struct RustcclNum {
  typedef T Acc;
  static RUSTCCL_DEVICE Acc load(T x) { return x; }
  static RUSTCCL_DEVICE T store(Acc x) { return x; }
};

template <>
struct RustcclNum<rustccl_f16> {
  typedef float Acc;
  static RUSTCCL_DEVICE Acc load(rustccl_f16 x) { return __half2float(x); }
  static RUSTCCL_DEVICE rustccl_f16 store(Acc x) { return __float2half(x); }
};

template <>
struct RustcclNum<rustccl_bf16> {
  typedef float Acc;
  static RUSTCCL_DEVICE Acc load(rustccl_bf16 x) { return __bfloat162float(x); }
  static RUSTCCL_DEVICE rustccl_bf16 store(Acc x) { return __float2bfloat16(x); }
};

#if RUSTCCL_HAVE_FP8
template <>
struct RustcclNum<rustccl_f8e4m3> {
  typedef float Acc;
  static RUSTCCL_DEVICE Acc load(rustccl_f8e4m3 x) { return static_cast<float>(x); }
  static RUSTCCL_DEVICE rustccl_f8e4m3 store(Acc x) { return rustccl_f8e4m3(x); }
};

template <>
struct RustcclNum<rustccl_f8e5m2> {
  typedef float Acc;
  static RUSTCCL_DEVICE Acc load(rustccl_f8e5m2 x) { return static_cast<float>(x); }
  static RUSTCCL_DEVICE rustccl_f8e5m2 store(Acc x) { return rustccl_f8e5m2(x); }
};
#endif

// ---- Functors ------------------------------------------------------------------
template <typename T>
struct FuncSum {
  typedef typename RustcclNum<T>::Acc Acc;
  RUSTCCL_DEVICE explicit FuncSum(Acc) {}
  RUSTCCL_DEVICE Acc pre(Acc x) const { return x; }
  RUSTCCL_DEVICE Acc operator()(Acc a, Acc b) const { return Acc(a + b); }
};

template <typename T>
struct FuncProd {
  typedef typename RustcclNum<T>::Acc Acc;
  RUSTCCL_DEVICE explicit FuncProd(Acc) {}
  RUSTCCL_DEVICE Acc pre(Acc x) const { return x; }
  RUSTCCL_DEVICE Acc operator()(Acc a, Acc b) const { return Acc(a * b); }
};

template <typename T>
struct FuncMin {
  typedef typename RustcclNum<T>::Acc Acc;
  RUSTCCL_DEVICE explicit FuncMin(Acc) {}
  RUSTCCL_DEVICE Acc pre(Acc x) const { return x; }
  RUSTCCL_DEVICE Acc operator()(Acc a, Acc b) const { return b < a ? b : a; }
};

template <typename T>
struct FuncMax {
  typedef typename RustcclNum<T>::Acc Acc;
  RUSTCCL_DEVICE explicit FuncMax(Acc) {}
  RUSTCCL_DEVICE Acc pre(Acc x) const { return x; }
  RUSTCCL_DEVICE Acc operator()(Acc a, Acc b) const { return a < b ? b : a; }
};

template <typename T>
struct FuncPreMulSum {
  typedef typename RustcclNum<T>::Acc Acc;
  Acc scalar;
  RUSTCCL_DEVICE explicit FuncPreMulSum(Acc s) : scalar(s) {}
  RUSTCCL_DEVICE Acc pre(Acc x) const { return Acc(x * scalar); }
  RUSTCCL_DEVICE Acc operator()(Acc a, Acc b) const { return Acc(a + b); }
};

#endif  // RUSTCCL_REDUCE_OPS_H
