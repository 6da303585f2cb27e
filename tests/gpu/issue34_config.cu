/* Issue 34 item 2 on a GPU: the eight nccl*Config collectives with minCTAs, maxCTAs,
 * algSelection, userProfilerTag and a launchCompletionEvent, eagerly and under CUDA graph
 * capture (PyTorch's way: capture once in thread-local mode, replay several times with new
 * data in the captured buffers). Built by tests/gpu/issue34_config.sh with nvcc against
 * capi/include/nccl.h and rustccl's libnccl.so, run as NRANKS processes (RANK, NRANKS,
 * NCCL_COMM_ID=host:port: every rank's ncclGetUniqueId gives the same id) on one GPU,
 * RUSTCCL_BACKEND=cuda; SEED (the same on every rank) seeds the data.
 *
 * Every operation has its own buffers and its own event. Each round gives every rank fresh
 * data (integers -8..8 as floats, so sums are exact whatever the order), runs the eight calls
 * on a non-blocking stream, then for each call waits on its event only (cudaEventSynchronize,
 * not the stream) and copies the result with a synchronous cudaMemcpy (the legacy stream does
 * not wait for a non-blocking one): the result must already be the reference, i.e. the event
 * completes after the operation. cudaEventQuery must then say cudaSuccess.
 *
 * Prints "RESULT issue34_config rank R: eager <ok>/<n>, graph <replays> replays <ok>/<n>,
 * events <ok>/<n>" and exits 1 when a check failed (FAIL lines); a failing CUDA or NCCL call
 * prints its error and exits 2. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nccl.h"

#define CUDA(call)                                                                              \
  do {                                                                                          \
    cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) {                                                                    \
      printf("ERROR rank %d %s:%d: %s: %s\n", rank, __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(2);                                                                                  \
    }                                                                                           \
  } while (0)
#define NCCL(call)                                                                              \
  do {                                                                                          \
    ncclResult_t r_ = (call);                                                                   \
    if (r_ != ncclSuccess) {                                                                    \
      printf("ERROR rank %d %s:%d: %s: %s (%s)\n", rank, __FILE__, __LINE__, #call, ncclGetErrorString(r_), \
             ncclGetLastError(NULL));                                                           \
      exit(2);                                                                                  \
    }                                                                                           \
  } while (0)

enum { kOps = 8, kCount = 4096, kReplays = 4 };
static const char* kNames[kOps] = {"AllReduce", "Broadcast", "Reduce", "AllGather",
                                   "ReduceScatter", "AlltoAll", "Gather", "Scatter"};

static int rank, nranks, failures;
static unsigned seed;
static cudaStream_t stream;
static ncclComm_t comm;
static float* sendbuf[kOps];
static float* recvbuf[kOps];
static cudaEvent_t events[kOps];
static float* host; /* one operation's result */

/* Rank r's element j of operation op in round `round`: an integer -8..8. */
static float value(int r, int round, int op, size_t j) {
  uint64_t x = ((uint64_t)seed << 32) ^ ((uint64_t)r << 48) ^ ((uint64_t)round << 40) ^ ((uint64_t)op << 36) ^ j;
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
  return (float)((int)(x % 17) - 8);
}

static int roots[kOps] = {0, 1, 0, 0, 0, 0, 1, 0};

/* Elements of op's send and receive buffers. */
static size_t send_elems(int op) { return (op == 4 || op == 5 || op == 7) ? (size_t)kCount * nranks : (size_t)kCount; }
static size_t recv_elems(int op) { return (op == 3 || op == 5 || op == 6) ? (size_t)kCount * nranks : (size_t)kCount; }

/* What op's receive buffer must hold on this rank (false: nothing is defined here). */
static bool expected(int op, int round, size_t i, float* out) {
  int root = roots[op] % nranks;
  size_t blk = i / kCount, j = i % kCount;
  float s = 0;
  switch (op) {
    case 0: for (int r = 0; r < nranks; r++) s += value(r, round, op, i); *out = s; return true;
    case 1: *out = value(root, round, op, i); return true;
    case 2: if (rank != root) return false; for (int r = 0; r < nranks; r++) s += value(r, round, op, i); *out = s; return true;
    case 3: *out = value((int)blk, round, op, j); return true;
    case 4: for (int r = 0; r < nranks; r++) s += value(r, round, op, (size_t)rank * kCount + i); *out = s; return true;
    case 5: *out = value((int)blk, round, op, (size_t)rank * kCount + j); return true;
    case 6: if (rank != root) return false; *out = value((int)blk, round, op, j); return true;
    default: *out = value(root, round, op, (size_t)rank * kCount + i); return true;
  }
}

/* Writes this rank's data of `round` into every send buffer (on the stream). */
static void fill(int round) {
  static float* staged[kOps];
  for (int op = 0; op < kOps; op++) {
    size_t n = send_elems(op);
    if (staged[op] == NULL) CUDA(cudaMallocHost((void**)&staged[op], n * sizeof(float)));
    for (size_t i = 0; i < n; i++) staged[op][i] = value(rank, round, op, i);
    CUDA(cudaMemcpyAsync(sendbuf[op], staged[op], n * sizeof(float), cudaMemcpyHostToDevice, stream));
    CUDA(cudaMemsetAsync(recvbuf[op], 0xff, recv_elems(op) * sizeof(float), stream)); /* NaN */
  }
  CUDA(cudaStreamSynchronize(stream));
}

/* The eight configured calls on the stream; tags 100 + op. */
static void enqueue(void) {
  for (int op = 0; op < kOps; op++) {
    ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;
    c.minCTAs = 1;
    c.maxCTAs = 2;
    /* AlltoAll, Gather and Scatter have no algorithm names (a forced one is refused). */
    c.algSelection = op < 5 ? "RING" : NULL;
    c.userProfilerTag = 100 + op;
    c.launchCompletionEvent = events[op];
    int root = roots[op] % nranks;
    const void* s = sendbuf[op];
    void* r = recvbuf[op];
    switch (op) {
      case 0: NCCL(ncclAllReduceConfig(s, r, kCount, ncclFloat, ncclSum, comm, stream, &c)); break;
      case 1: NCCL(ncclBroadcastConfig(s, r, kCount, ncclFloat, root, comm, stream, &c)); break;
      case 2: NCCL(ncclReduceConfig(s, r, kCount, ncclFloat, ncclSum, root, comm, stream, &c)); break;
      case 3: NCCL(ncclAllGatherConfig(s, r, kCount, ncclFloat, comm, stream, &c)); break;
      case 4: NCCL(ncclReduceScatterConfig(s, r, kCount, ncclFloat, ncclSum, comm, stream, &c)); break;
      case 5: NCCL(ncclAlltoAllConfig(s, r, kCount, ncclFloat, comm, stream, &c)); break;
      case 6: NCCL(ncclGatherConfig(s, r, kCount, ncclFloat, root, comm, stream, &c)); break;
      default: NCCL(ncclScatterConfig(s, r, kCount, ncclFloat, root, comm, stream, &c)); break;
    }
  }
}

/* Waits on each operation's event alone, then checks its result; returns how many were
 * right, and counts the events that then report complete in *events_ok. */
static int check(int round, const char* how, int* events_ok) {
  int ok = 0;
  for (int op = 0; op < kOps; op++) {
    CUDA(cudaEventSynchronize(events[op]));
    if (cudaEventQuery(events[op]) == cudaSuccess) {
      (*events_ok)++;
    } else {
      printf("FAIL rank %d %s round %d %s: the event is not complete after cudaEventSynchronize\n", rank, how, round, kNames[op]);
      failures++;
    }
    size_t n = recv_elems(op), wrong = 0, first = 0;
    CUDA(cudaMemcpy(host, recvbuf[op], n * sizeof(float), cudaMemcpyDeviceToHost));
    float want = 0;
    for (size_t i = 0; i < n; i++) {
      if (expected(op, round, i, &want) && host[i] != want) {
        if (wrong++ == 0) first = i;
      }
    }
    if (wrong == 0) {
      ok++;
    } else {
      expected(op, round, first, &want);
      printf("FAIL rank %d %s round %d %s: %zu of %zu wrong once its event completed (first at %zu: %f, want %f)\n",
             rank, how, round, kNames[op], wrong, n, first, host[first], want);
      failures++;
    }
  }
  return ok;
}

int main(void) {
  rank = atoi(getenv("RANK"));
  nranks = atoi(getenv("NRANKS"));
  seed = getenv("SEED") ? (unsigned)atoi(getenv("SEED")) : 1u;
  CUDA(cudaSetDevice(0));
  CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ncclUniqueId id;
  NCCL(ncclGetUniqueId(&id));
  NCCL(ncclCommInitRank(&comm, nranks, id, rank));
  for (int op = 0; op < kOps; op++) {
    CUDA(cudaMalloc((void**)&sendbuf[op], send_elems(op) * sizeof(float)));
    CUDA(cudaMalloc((void**)&recvbuf[op], recv_elems(op) * sizeof(float)));
    CUDA(cudaEventCreateWithFlags(&events[op], cudaEventDisableTiming));
  }
  CUDA(cudaMallocHost((void**)&host, (size_t)kCount * nranks * sizeof(float)));
  int round = 0, events_ok = 0;

  /* Eagerly, two rounds. */
  int eager_ok = 0;
  for (int i = 0; i < 2; i++, round++) {
    fill(round);
    enqueue();
    eager_ok += check(round, "eager", &events_ok);
  }

  /* Captured once, replayed with new data each time. */
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  enqueue();
  CUDA(cudaStreamEndCapture(stream, &graph));
  CUDA(cudaGraphInstantiate(&exec, graph, 0));
  int graph_ok = 0;
  for (int i = 0; i < kReplays; i++, round++) {
    fill(round);
    CUDA(cudaGraphLaunch(exec, stream));
    graph_ok += check(round, "graph", &events_ok);
  }
  CUDA(cudaStreamSynchronize(stream));
  CUDA(cudaGraphExecDestroy(exec));
  CUDA(cudaGraphDestroy(graph));

  /* Eagerly again after the graph. */
  fill(round);
  enqueue();
  eager_ok += check(round, "eager after graph", &events_ok);
  CUDA(cudaStreamSynchronize(stream));

  NCCL(ncclCommDestroy(comm));
  printf("RESULT issue34_config rank %d: eager %d/%d, graph %d replays %d/%d, events %d/%d%s\n", rank, eager_ok, 3 * kOps,
         kReplays, graph_ok, kReplays * kOps, events_ok, (3 + kReplays) * kOps, failures ? " FAILED" : "");
  return failures ? 1 : 0;
}
