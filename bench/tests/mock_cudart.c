/* A stand-in for libcudart.so, for the C-ABI driver's tests of -G: "device" memory is host
 * memory, the one stream is a fixed handle (MOCK_STREAM, which tests/mock_nccl.c is told to
 * expect), and the graph functions check their arguments and the order of the calls
 * (begin capture, end, instantiate, launches, destroy) and count them. At exit it prints
 * the counts on stderr:
 *   mock cudart: begin B end E instantiate I launch L exec-destroy X destroy D live G bad K
 * where live is the graphs and instances never destroyed and bad the calls out of order or
 * with wrong arguments (the first one is also printed). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOCK_STREAM ((void*)(uintptr_t)0x5157ea)
#define ERR_INVALID 1 /* cudaErrorInvalidValue */

static int capturing = 0;
static long nBegin, nEnd, nInst, nLaunch, nExecDestroy, nDestroy, live, bad;

static int wrong(const char* why) {
  if (bad++ == 0) fprintf(stderr, "mock cudart: wrong call: %s\n", why);
  return ERR_INVALID;
}

__attribute__((destructor)) static void report(void) {
  fprintf(stderr, "mock cudart: begin %ld end %ld instantiate %ld launch %ld exec-destroy %ld destroy %ld live %ld bad %ld\n",
          nBegin, nEnd, nInst, nLaunch, nExecDestroy, nDestroy, live, bad);
}

const char* cudaGetErrorString(int e) { return e == 0 ? "no error" : "invalid value (mock)"; }
int cudaGetDeviceCount(int* n) { *n = 1; return 0; }
int cudaSetDevice(int d) { return d == 0 ? 0 : wrong("cudaSetDevice: no such device"); }
int cudaMalloc(void** p, size_t n) {
  if (capturing) return wrong("cudaMalloc during a capture");
  *p = calloc(1, n ? n : 1);
  return *p ? 0 : 2;
}
int cudaFree(void* p) { if (capturing) return wrong("cudaFree during a capture"); free(p); return 0; }
int cudaMemcpy(void* d, const void* s, size_t n, int kind) {
  (void)kind;
  if (capturing) return wrong("cudaMemcpy during a capture");
  memmove(d, s, n);
  return 0;
}
int cudaMemset(void* d, int v, size_t n) {
  if (capturing) return wrong("cudaMemset during a capture");
  memset(d, v, n);
  return 0;
}
int cudaStreamCreate(void** s) { *s = MOCK_STREAM; return 0; }
int cudaStreamDestroy(void* s) { return s == MOCK_STREAM ? 0 : wrong("cudaStreamDestroy: unknown stream"); }
int cudaStreamSynchronize(void* s) {
  if (s != MOCK_STREAM) return wrong("cudaStreamSynchronize: unknown stream");
  return capturing ? wrong("cudaStreamSynchronize during a capture") : 0;
}
int cudaDeviceSynchronize(void) { return capturing ? wrong("cudaDeviceSynchronize during a capture") : 0; }

int cudaStreamBeginCapture(void* s, int mode) {
  nBegin++;
  if (s != MOCK_STREAM) return wrong("cudaStreamBeginCapture: unknown stream");
  if (mode != 1) return wrong("cudaStreamBeginCapture: mode is not cudaStreamCaptureModeThreadLocal");
  if (capturing) return wrong("cudaStreamBeginCapture: already capturing");
  capturing = 1;
  return 0;
}
int cudaStreamEndCapture(void* s, void** graph) {
  nEnd++;
  if (s != MOCK_STREAM) return wrong("cudaStreamEndCapture: unknown stream");
  if (!capturing) return wrong("cudaStreamEndCapture: not capturing");
  capturing = 0;
  *graph = malloc(16);
  live++;
  return 0;
}
int cudaGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long flags) {
  nInst++;
  if (graph == NULL || flags != 0) return wrong("cudaGraphInstantiateWithFlags: bad arguments");
  if (capturing) return wrong("cudaGraphInstantiateWithFlags during a capture");
  *exec = malloc(16);
  live++;
  return 0;
}
int cudaGraphLaunch(void* exec, void* s) {
  nLaunch++;
  if (exec == NULL || s != MOCK_STREAM) return wrong("cudaGraphLaunch: bad arguments");
  return capturing ? wrong("cudaGraphLaunch during a capture") : 0;
}
int cudaGraphExecDestroy(void* exec) {
  nExecDestroy++;
  if (exec == NULL) return wrong("cudaGraphExecDestroy: NULL");
  free(exec);
  live--;
  return 0;
}
int cudaGraphDestroy(void* graph) {
  nDestroy++;
  if (graph == NULL) return wrong("cudaGraphDestroy: NULL");
  free(graph);
  live--;
  return 0;
}
