// rustccl device code: portability layer between CUDA (NVRTC) and HIP (hipRTC).
//
// Every device source includes this header first. It picks the vendor headers,
// names the element types, and wraps the few intrinsics whose spelling differs:
// warp size, shuffles, atomics, fences, volatile flag access.
//
// The sources are compiled at run time: the host hands this file to NVRTC or
// hipRTC as a named header ("port.h"), together with the toolkit include
// directory for the vendor headers below.
//
// Knobs (pass as -D options):
//   RUSTCCL_HAVE_FP8=0|1  build the fp8 (e4m3, e5m2) kernels. Default: 1 with
//                         CUDA >= 11.8 (cuda_fp8.h), 0 with HIP (ROCm's OCP vs
//                         FNUZ fp8 choice is left to a later issue).
#ifndef RUSTCCL_PORT_H
#define RUSTCCL_PORT_H

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(__HIPCC_RTC__)
#define RUSTCCL_HIP 1
#define RUSTCCL_CUDA 0
#else
#define RUSTCCL_HIP 0
#define RUSTCCL_CUDA 1
#endif

#if RUSTCCL_HIP
// hipRTC makes the runtime API and __half available without includes (its own copies of
// the headers: including the installed ones again redefines them). bfloat16 is handled on
// raw bits (elem.h), so no bf16 header is needed (ROCm 5.2 has no hip_bf16.h).
#if !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#endif
#else
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

#ifndef RUSTCCL_HAVE_FP8
#if RUSTCCL_CUDA && defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ > 11 || (__CUDACC_VER_MAJOR__ == 11 && __CUDACC_VER_MINOR__ >= 8))
#define RUSTCCL_HAVE_FP8 1
#else
#define RUSTCCL_HAVE_FP8 0
#endif
#endif

#if RUSTCCL_HAVE_FP8 && RUSTCCL_HIP
#error "rustccl: fp8 kernels are not available with HIP yet (build with RUSTCCL_HAVE_FP8=0)"
#endif
#if RUSTCCL_HAVE_FP8
#include <cuda_fp8.h>
#endif

// ---- Element types (ncclDataType_t order) --------------------------------
// NVRTC has no <stdint.h>, so fixed-width names are spelled with built-in types
// (char 8, int 32, long long 64 bits on every target we compile for).
typedef signed char rustccl_i8;
typedef unsigned char rustccl_u8;
typedef int rustccl_i32;
typedef unsigned int rustccl_u32;
typedef long long rustccl_i64;
typedef unsigned long long rustccl_u64;
typedef __half rustccl_f16;
#if RUSTCCL_HIP
typedef unsigned short rustccl_bf16;  // raw bits: the arithmetic is elem.h's
#else
typedef __nv_bfloat16 rustccl_bf16;
#endif
#if RUSTCCL_HAVE_FP8
typedef __nv_fp8_e4m3 rustccl_f8e4m3;
typedef __nv_fp8_e5m2 rustccl_f8e5m2;
#endif

// ---- Function qualifiers ---------------------------------------------------
#define RUSTCCL_DEVICE __device__ __forceinline__
// A device function called, not inlined: for slow paths whose inlined copies would take
// registers from the loops around them.
#define RUSTCCL_DEVICE_CALL __device__ __noinline__
#define RUSTCCL_KERNEL extern "C" __global__

// ---- Warp size and shuffles --------------------------------------------------
// AMD wavefronts are 64 lanes on CDNA (gfx9) and 32 on RDNA by default; the
// compiler states which through __AMDGCN_WAVEFRONT_SIZE.
#if RUSTCCL_HIP
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define RUSTCCL_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define RUSTCCL_WARP_SIZE 64
#endif
#define RUSTCCL_ALL(pred) __all(pred)
#define RUSTCCL_SHFL(v, lane) __shfl((v), (lane))
#define RUSTCCL_SHFL_XOR(v, mask) __shfl_xor((v), (mask))
#define RUSTCCL_SHFL_DOWN(v, delta) __shfl_down((v), (delta))
#else
#define RUSTCCL_WARP_SIZE 32
#define RUSTCCL_FULL_MASK 0xffffffffu
#define RUSTCCL_ALL(pred) __all_sync(RUSTCCL_FULL_MASK, (pred))
#define RUSTCCL_SHFL(v, lane) __shfl_sync(RUSTCCL_FULL_MASK, (v), (lane))
#define RUSTCCL_SHFL_XOR(v, mask) __shfl_xor_sync(RUSTCCL_FULL_MASK, (v), (mask))
#define RUSTCCL_SHFL_DOWN(v, delta) __shfl_down_sync(RUSTCCL_FULL_MASK, (v), (delta))
#endif

// ---- Fences and atomics --------------------------------------------------------
// Same spelling on both vendors today; kept behind macros so that a vendor
// difference (scopes, memory orders) is fixed in one place.
#define RUSTCCL_THREADFENCE() __threadfence()
#define RUSTCCL_THREADFENCE_BLOCK() __threadfence_block()
#define RUSTCCL_THREADFENCE_SYSTEM() __threadfence_system()
#define RUSTCCL_ATOMIC_ADD(ptr, v) atomicAdd((ptr), (v))
#define RUSTCCL_ATOMIC_ADD_SYSTEM(ptr, v) atomicAdd_system((ptr), (v))
#define RUSTCCL_ATOMIC_CAS(ptr, expected, desired) atomicCAS((ptr), (expected), (desired))
#define RUSTCCL_ATOMIC_EXCH(ptr, v) atomicExch((ptr), (v))

// Volatile access to a flag that another agent (GPU or CPU) writes or reads.
template <typename T>
RUSTCCL_DEVICE T rustccl_load_volatile(const T* ptr) {
  return *(const volatile T*)ptr;
}
template <typename T>
RUSTCCL_DEVICE void rustccl_store_volatile(T* ptr, T value) {
  *(volatile T*)ptr = value;
}

// Kernel parameters read in place (no per-thread copy) where the architecture allows it.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 700) && !RUSTCCL_HIP
#define RUSTCCL_GRID_CONSTANT __grid_constant__
#else
#define RUSTCCL_GRID_CONSTANT
#endif

// Publishing data to a consumer that polls a counter (on this GPU, a peer over NVLink, the
// host): a release fence at system scope before the counter's store.
RUSTCCL_DEVICE void rustccl_fence_release_sys() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 700) && !RUSTCCL_HIP
  asm volatile("fence.acq_rel.sys;" ::: "memory");
#else
  __threadfence_system();
#endif
}

// A 32-byte copy from global to shared memory that completes in the background where the
// architecture has asynchronous copies (sm_80+), waited for with rustccl_copy_wait; both
// addresses 16-byte aligned. Elsewhere a plain copy.
RUSTCCL_DEVICE void rustccl_copy32_async(void* shared_dst, const void* global_src) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800) && !RUSTCCL_HIP
  const unsigned s = (unsigned)__cvta_generic_to_shared(shared_dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(s), "l"(global_src) : "memory");
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(s + 16), "l"((const char*)global_src + 16) : "memory");
  asm volatile("cp.async.commit_group;" ::: "memory");
#else
  const uint4* src = (const uint4*)global_src;
  uint4* dst = (uint4*)shared_dst;
  dst[0] = src[0];
  dst[1] = src[1];
#endif
}
RUSTCCL_DEVICE void rustccl_copy_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800) && !RUSTCCL_HIP
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

#endif  // RUSTCCL_PORT_H
