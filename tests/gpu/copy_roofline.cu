// Roofline for the collective kernels' per-block figures (issue 12): a plain copy kernel,
// 16-byte loads and stores, 4 in flight per thread, 512 threads per block (the interpreter's
// block), run with 1..32 blocks; and cudaMemcpy device to device. Built on the GPU machine:
//   nvcc -O3 -arch=native -o copy_roofline tests/gpu/copy_roofline.cu && ./copy_roofline
#include <cstdio>
#include <cstdlib>
#include <chrono>
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

__global__ void empty_kernel(unsigned long long a, unsigned long long b) {
  if (a == 1 && b == 2 && threadIdx.x == 1234) printf("never\n");
}

// Host time per call of what every collective call costs at least: a kernel launch, a launch
// plus an event record, an 8-byte cudaMemcpyAsync (averaged over 500 calls, no sync between).
static void launch_floor() {
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  cudaEvent_t ev;
  CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  void *a, *b;
  CHECK(cudaMalloc(&a, 64));
  CHECK(cudaMalloc(&b, 64));
  const int n = 500;
  for (int mode = 0; mode < 3; ++mode) {
    for (int round = 0; round < 2; ++round) {
      CHECK(cudaStreamSynchronize(s));
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) {
        if (mode == 2) {
          CHECK(cudaMemcpyAsync(b, a, 8, cudaMemcpyDeviceToDevice, s));
        } else {
          empty_kernel<<<1, 512, 0, s>>>(i, 0);
          if (mode == 1) CHECK(cudaEventRecord(ev, s));
        }
      }
      const auto t1 = std::chrono::steady_clock::now();
      CHECK(cudaStreamSynchronize(s));
      if (round == 1) {
        const char* what[] = {"kernel launch", "kernel launch + event record", "cudaMemcpyAsync 8 B"};
        printf("host cost per call, %s: %.2f us\n", what[mode], std::chrono::duration<double, std::micro>(t1 - t0).count() / n);
      }
    }
  }
  CHECK(cudaGetLastError());
}

int main() {
  launch_floor();
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
