// A test double of ROCm's libamdhip64 (the HIP runtime with ROCm 5's hipRTC inside it),
// served by CUDA: the calls rustccl's hip backend makes, each forwarded to the CUDA runtime,
// driver or NVRTC. With it, the hip backend's host code (memory and IPC bookkeeping, streams,
// events, device switching, module loading, launches, capture) runs on an NVIDIA GPU: the
// kernels are the same sources compiled by NVRTC instead of hipRTC (the options translated
// below), so what this checks is the backend's use of the API, not AMD's hardware.
//
// Build (tests/gpu/hip_on_cuda.sh does it on the GPU machine):
//   gcc -shared -fPIC -O2 hip_on_cuda.c -I$CUDA/include -L$CUDA/lib64 -lcudart -lcuda -lnvrtc
// Environment: HIPSHIM_SM (default sm_90), HIPSHIM_CUDA_INCLUDE (default
// /usr/local/cuda/include).
#include <cuda.h>
#include <cuda_runtime.h>
#include <nvrtc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int hipError_t;
typedef struct { char reserved[64]; } hipIpcMemHandle_t;

// ---- the runtime ------------------------------------------------------------------------

// CUDA's runtime error codes are HIP's for every code the backend tells apart (600 not ready,
// 704 peer access already enabled); a driver error is returned as it is (not zero).
#define RT(x) return (hipError_t)(x)

hipError_t hipInit(unsigned flags) { RT(cuInit(flags) == CUDA_SUCCESS ? 0 : 100); }
// ROCm 5.2's version: the backend then reads pointer attributes with ROCm 5's numbering.
hipError_t hipRuntimeGetVersion(int* v) { *v = 50221153; return 0; }
hipError_t hipGetDeviceCount(int* n) { RT(cudaGetDeviceCount(n)); }
hipError_t hipGetDevice(int* d) { RT(cudaGetDevice(d)); }
hipError_t hipSetDevice(int d) { RT(cudaSetDevice(d)); }
hipError_t hipDeviceGetName(char* name, int len, int dev) {
  CUdevice d;
  CUresult r = cuDeviceGet(&d, dev);
  if (r != CUDA_SUCCESS) return (hipError_t)r;
  RT(cuDeviceGetName(name, len, d));
}
// ROCm 5's hipDeviceProp_t: the name first, gcnArchName at byte 396 (the backend finds the
// target by content).
hipError_t hipGetDeviceProperties(void* prop, int dev) {
  memset(prop, 0, 792);
  hipError_t r = hipDeviceGetName((char*)prop, 256, dev);
  if (r) return r;
  strcpy((char*)prop + 396, "gfx90a:sramecc+:xnack-");
  return 0;
}
hipError_t hipDeviceCanAccessPeer(int* can, int a, int b) { RT(cudaDeviceCanAccessPeer(can, a, b)); }
hipError_t hipDeviceEnablePeerAccess(int peer, unsigned flags) { RT(cudaDeviceEnablePeerAccess(peer, flags)); }
hipError_t hipMemGetInfo(size_t* free, size_t* total) { RT(cudaMemGetInfo(free, total)); }
hipError_t hipExtMallocWithFlags(void** p, size_t n, unsigned flags) { (void)flags; RT(cudaMalloc(p, n)); }
hipError_t hipFree(void* p) { RT(cudaFree(p)); }
hipError_t hipHostMalloc(void** p, size_t n, unsigned flags) {
  (void)flags;
  RT(cudaHostAlloc(p, n, cudaHostAllocMapped | cudaHostAllocPortable));
}
hipError_t hipHostFree(void* p) { RT(cudaFreeHost(p)); }
hipError_t hipHostGetDevicePointer(void** d, void* h, unsigned flags) { RT(cudaHostGetDevicePointer(d, h, flags)); }
hipError_t hipHostRegister(void* p, size_t n, unsigned flags) { RT(cudaHostRegister(p, n, flags & 3)); }
hipError_t hipHostUnregister(void* p) { RT(cudaHostUnregister(p)); }
hipError_t hipMemcpyAsync(void* d, const void* s, size_t n, int kind, cudaStream_t st) {
  RT(cudaMemcpyAsync(d, s, n, (enum cudaMemcpyKind)kind, st));
}
hipError_t hipMemsetD8Async(void* d, unsigned char v, size_t n, cudaStream_t st) { RT(cudaMemsetAsync(d, v, n, st)); }
hipError_t hipMemGetAddressRange(void** base, size_t* size, void* p) {
  RT(cuMemGetAddressRange((CUdeviceptr*)base, size, (CUdeviceptr)p));
}
// ROCm 5's hipPointerAttribute_t and memory types (host 0, device 1).
typedef struct {
  int type;
  int device;
  void* device_pointer;
  void* host_pointer;
  int managed;
  unsigned flags;
} HipPointerAttributes;
hipError_t hipPointerGetAttributes(void* out, const void* p) {
  struct cudaPointerAttributes a;
  cudaError_t r = cudaPointerGetAttributes(&a, p);
  if (r != cudaSuccess) return (hipError_t)r;
  if (a.type == cudaMemoryTypeUnregistered) return 1;  // hipErrorInvalidValue
  HipPointerAttributes* o = (HipPointerAttributes*)out;
  o->type = a.type == cudaMemoryTypeHost ? 0 : 1;
  o->device = a.device;
  o->device_pointer = a.devicePointer;
  o->host_pointer = a.hostPointer;
  o->managed = a.type == cudaMemoryTypeManaged;
  o->flags = 0;
  return 0;
}
hipError_t hipStreamCreateWithFlags(cudaStream_t* s, unsigned flags) { RT(cudaStreamCreateWithFlags(s, flags)); }
hipError_t hipStreamDestroy(cudaStream_t s) { RT(cudaStreamDestroy(s)); }
hipError_t hipStreamSynchronize(cudaStream_t s) { RT(cudaStreamSynchronize(s)); }
hipError_t hipStreamQuery(cudaStream_t s) { RT(cudaStreamQuery(s)); }
hipError_t hipStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) { RT(cudaStreamWaitEvent(s, e, flags)); }
hipError_t hipStreamGetCaptureInfo(cudaStream_t s, int* status, unsigned long long* id) {
  enum cudaStreamCaptureStatus st;
  cudaError_t r = cudaStreamIsCapturing(s, &st);
  *status = (int)st;
  *id = 0;
  RT(r);
}
hipError_t hipThreadExchangeStreamCaptureMode(int* mode) {
  RT(cudaThreadExchangeStreamCaptureMode((enum cudaStreamCaptureMode*)mode));
}
hipError_t hipStreamWriteValue32(cudaStream_t s, void* p, uint32_t v, unsigned flags) {
  (void)flags;
  RT(cuStreamWriteValue32((CUstream)s, (CUdeviceptr)p, v, 0));
}
hipError_t hipStreamWaitValue32(cudaStream_t s, void* p, uint32_t v, unsigned flags, uint32_t mask) {
  (void)flags;
  (void)mask;
  RT(cuStreamWaitValue32((CUstream)s, (CUdeviceptr)p, v, CU_STREAM_WAIT_VALUE_GEQ));
}
hipError_t hipEventCreateWithFlags(cudaEvent_t* e, unsigned flags) { RT(cudaEventCreateWithFlags(e, flags)); }
hipError_t hipEventRecord(cudaEvent_t e, cudaStream_t s) { RT(cudaEventRecord(e, s)); }
hipError_t hipEventQuery(cudaEvent_t e) { RT(cudaEventQuery(e)); }
hipError_t hipEventSynchronize(cudaEvent_t e) { RT(cudaEventSynchronize(e)); }
hipError_t hipEventDestroy(cudaEvent_t e) { RT(cudaEventDestroy(e)); }
hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t* h, void* p) { RT(cudaIpcGetMemHandle((cudaIpcMemHandle_t*)h, p)); }
hipError_t hipIpcOpenMemHandle(void** p, hipIpcMemHandle_t h, unsigned flags) {
  (void)flags;
  cudaIpcMemHandle_t c;
  memcpy(&c, &h, sizeof c);
  RT(cudaIpcOpenMemHandle(p, c, cudaIpcMemLazyEnablePeerAccess));
}
hipError_t hipIpcCloseMemHandle(void* p) { RT(cudaIpcCloseMemHandle(p)); }
hipError_t hipModuleLoadData(CUmodule* m, const void* image) {
  cudaError_t r = cudaFree(0);  // the current device's primary context, current on this thread
  if (r != cudaSuccess) return (hipError_t)r;
  RT(cuModuleLoadData(m, image));
}
hipError_t hipModuleGetFunction(CUfunction* f, CUmodule m, const char* name) { RT(cuModuleGetFunction(f, m, name)); }
hipError_t hipModuleLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                 unsigned shared, cudaStream_t s, void** params, void** extra) {
  RT(cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, (CUstream)s, params, extra));
}
const char* hipGetErrorName(hipError_t e) { return cudaGetErrorName((cudaError_t)e); }
const char* hipGetErrorString(hipError_t e) { return cudaGetErrorString((cudaError_t)e); }

// ---- hipRTC (inside libamdhip64 in ROCm 5) ------------------------------------------------

int hiprtcVersion(int* major, int* minor) { return nvrtcVersion(major, minor); }
const char* hiprtcGetErrorString(int r) { return nvrtcGetErrorString((nvrtcResult)r); }
int hiprtcCreateProgram(nvrtcProgram* p, const char* src, const char* name, int n, const char** headers,
                        const char** names) {
  return nvrtcCreateProgram(p, src, name, n, headers, names);
}
int hiprtcDestroyProgram(nvrtcProgram* p) { return nvrtcDestroyProgram(p); }
// hipRTC's options in NVRTC's words: the AMD target becomes the GPU's sm, -O3 goes (NVRTC
// optimises by default), the C++ standard and floating-point contraction are renamed.
int hiprtcCompileProgram(nvrtcProgram p, int n, const char** options) {
  const char** out = calloc(n + 2, sizeof *out);
  // Per call: compiles run on several threads at once.
  char arch[64], include[4096];
  const char* sm = getenv("HIPSHIM_SM");
  const char* inc = getenv("HIPSHIM_CUDA_INCLUDE");
  snprintf(arch, sizeof arch, "--gpu-architecture=%s", sm ? sm : "sm_90");
  snprintf(include, sizeof include, "-I%s", inc ? inc : "/usr/local/cuda/include");
  int m = 0;
  for (int i = 0; i < n; ++i) {
    if (!strncmp(options[i], "--offload-arch=", 15)) out[m++] = arch;
    else if (!strcmp(options[i], "-O3")) continue;
    else if (!strcmp(options[i], "-std=c++17")) out[m++] = "--std=c++17";
    else if (!strcmp(options[i], "-ffp-contract=off")) out[m++] = "--fmad=false";
    else out[m++] = options[i];
  }
  out[m++] = include;
  int r = nvrtcCompileProgram(p, m, out);
  free(out);
  return r;
}
int hiprtcGetProgramLogSize(nvrtcProgram p, size_t* n) { return nvrtcGetProgramLogSize(p, n); }
int hiprtcGetProgramLog(nvrtcProgram p, char* log) { return nvrtcGetProgramLog(p, log); }
int hiprtcGetCodeSize(nvrtcProgram p, size_t* n) { return nvrtcGetCUBINSize(p, n); }
int hiprtcGetCode(nvrtcProgram p, char* code) { return nvrtcGetCUBIN(p, code); }
