// Roofline for the collective kernels' per-block figures (issue 12): a plain copy kernel,
// 16-byte loads and stores, 4 in flight per thread, 512 threads per block (the interpreter's
// block), run with 1..32 blocks; and cudaMemcpy device to device. Built on the GPU machine:
//   nvcc -O3 -arch=native -o copy_roofline tests/gpu/copy_roofline.cu && ./copy_roofline
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e = (x);                                                           \
    if (e != cudaSuccess) {                                                        \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)

__global__ void __launch_bounds__(512) copy16(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

int main() {
  const size_t bytes = 256ull << 20;
  void *src, *dst;
  CHECK(cudaMalloc(&src, bytes));
  CHECK(cudaMalloc(&dst, bytes));
  CHECK(cudaMemset(src, 1, bytes));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  const int blocks[] = {1, 2, 4, 8, 16, 32};
  for (int nb : blocks) {
    const size_t n = (nb < 8 ? bytes / 8 : bytes) / 16;  // fewer bytes for few blocks
    copy16<<<nb, 512>>>((const uint4*)src, (uint4*)dst, n);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(a));
    const int iters = 5;
    for (int k = 0; k < iters; ++k) copy16<<<nb, 512>>>((const uint4*)src, (uint4*)dst, n);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    const double gbs = (double)n * 16 * iters / (ms * 1e-3) / 1e9;
    printf("copy kernel %2d blocks x 512 threads: %8.1f GB/s copied (%6.1f GB/s per block)\n", nb, gbs, gbs / nb);
  }
  CHECK(cudaEventRecord(a));
  for (int k = 0; k < 5; ++k) CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  printf("cudaMemcpy device to device: %8.1f GB/s copied\n", (double)bytes * 5 / (ms * 1e-3) / 1e9);
  return 0;
}
