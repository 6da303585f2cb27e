/* Collectives on symmetric-memory windows, written against NCCL's nccl.h alone (the standard
 * 2.27/2.28 API: ncclMemAlloc, ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC,
 * ncclAllReduce/ncclAllGather/ncclReduceScatter on window buffers, ncclCommWindowDeregister),
 * so that the same source builds against NVIDIA's header and against rustccl's.
 *
 * Two builds of this one source:
 *   - with -DWITH_CUDA, against NVIDIA's nccl.h and the CUDA runtime (tests/gpu/symmetric.sh on
 *     the GPU machine): buffers are device memory, filled and read with cudaMemcpy, and the
 *     collectives run on a cudaStream_t that is synchronized before reading;
 *   - without it, against rustccl's capi/include/nccl.h on its host backend
 *     (RUSTCCL_BACKEND=host; capi/tests/c_sym_nccl_header.rs in CI): ncclMemAlloc gives host
 *     memory, filled and read with memcpy, and the stream is NULL.
 *
 * Run as NRANKS processes with RANK and NRANKS set, and NCCL_COMM_ID=host:port: every rank
 * calls ncclGetUniqueId and gets the same id (rank 0 starts the root there at init), so no id
 * has to be passed around. (NCCL_COMM_ID may be left out with one rank.)
 *
 * Every buffer lies in one window (ncclMemAlloc, registered with NCCL_WIN_COLL_SYMMETRIC). For
 * int32 and float32 (values whose sums are exact in any order): all_reduce of 1, 1000 and 1<<20
 * elements, all_gather and reduce_scatter of 1000 and 1<<18 elements per rank, each out of
 * place and in place (in place: all_gather's send = recv + rank*count, reduce_scatter's
 * recv = send + rank*count). Outputs are poisoned first; each case checks the output exactly,
 * that the poisoned guard after the output is untouched, and (out of place) that the input is
 * unchanged. Prints "RESULT sym_nccl_header rank R ok N checks", or FAIL lines and
 * "RESULT sym_nccl_header rank R FAIL: F of N checks failed" and exits 1. A failing NCCL or
 * CUDA call prints a FAIL line with the error string and exits 1 at once. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef WITH_CUDA
#include <cuda_runtime.h>
#endif
#include "nccl.h"

#ifndef NCCL_WIN_COLL_SYMMETRIC
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#endif

static int rank = 0, nranks = 1, checks = 0, failures = 0;
static ncclComm_t comm = NULL;

#define NCCL_CHECK(call)                                                                                 \
  do {                                                                                                   \
    ncclResult_t r_ = (call);                                                                            \
    if (r_ != ncclSuccess) {                                                                             \
      printf("FAIL sym_nccl_header rank %d %s:%d: %s -> %s (%s)\n", rank, __FILE__, __LINE__, #call,     \
             ncclGetErrorString(r_), ncclGetLastError(comm));                                            \
      fflush(stdout);                                                                                    \
      exit(1);                                                                                           \
    }                                                                                                    \
  } while (0)

#ifdef WITH_CUDA
#define CUDA_CHECK(call)                                                                                 \
  do {                                                                                                   \
    cudaError_t e_ = (call);                                                                             \
    if (e_ != cudaSuccess) {                                                                             \
      printf("FAIL sym_nccl_header rank %d %s:%d: %s -> %s (%s)\n", rank, __FILE__, __LINE__, #call,     \
             cudaGetErrorName(e_), cudaGetErrorString(e_));                                              \
      fflush(stdout);                                                                                    \
      exit(1);                                                                                           \
    }                                                                                                    \
  } while (0)

static cudaStream_t stream;
static void setup_device(void) {
  CUDA_CHECK(cudaSetDevice(0)); /* the ranks share one GPU (under MPS) */
  CUDA_CHECK(cudaStreamCreate(&stream));
}
static void teardown_device(void) { CUDA_CHECK(cudaStreamDestroy(stream)); }
/* Host image -> window buffer, complete before any rank's collective can read it. */
static void put(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());
}
static void get(void* dst, const void* src, size_t bytes) { CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost)); }
/* Waits for the collectives enqueued on the stream. */
static void settle(void) {
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaGetLastError());
}
#else
/* rustccl's host backend: window memory is host memory; a NULL stream (calls complete on
 * return). */
static cudaStream_t stream = NULL;
static void setup_device(void) {}
static void teardown_device(void) {}
static void put(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
static void get(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
static void settle(void) {}
#endif

#define GUARD_WORDS 1024u /* poisoned words checked after every output */
#define POISON 0xA5A5A5A5u

typedef enum { KIND_INT32, KIND_FLOAT32 } kind_t;

static const char* kind_name(kind_t k) { return k == KIND_INT32 ? "int32" : "float32"; }
static ncclDataType_t kind_type(kind_t k) { return k == KIND_INT32 ? ncclInt32 : ncclFloat32; }

/* Rank r's input element i, as its 32 bits: int32 in [-2^19, 2^19), float32 a multiple of 1/4
 * in [-250, 250] (sums of up to thousands of ranks stay exact, in any order). */
static uint32_t input(kind_t k, int r, size_t i) {
  if (k == KIND_INT32) {
    uint32_t h = ((uint32_t)i * 2654435761u) ^ ((uint32_t)(r + 1) * 0x85EBCA6Bu);
    int32_t v = (int32_t)(h & 0xFFFFFu) - 0x80000;
    uint32_t bits;
    memcpy(&bits, &v, 4);
    return bits;
  } else {
    float v = (float)((int)((i * 7u + (size_t)r * 13u + (i >> 10) * 3u) % 2001u) - 1000) * 0.25f;
    uint32_t bits;
    memcpy(&bits, &v, 4);
    return bits;
  }
}

/* The sum over every rank of element i. */
static uint32_t summed(kind_t k, size_t i) {
  uint32_t bits;
  if (k == KIND_INT32) {
    int64_t s = 0;
    for (int r = 0; r < nranks; r++) {
      int32_t v;
      bits = input(k, r, i);
      memcpy(&v, &bits, 4);
      s += v;
    }
    int32_t v = (int32_t)s;
    memcpy(&bits, &v, 4);
  } else {
    float s = 0.0f;
    for (int r = 0; r < nranks; r++) {
      float v;
      bits = input(k, r, i);
      memcpy(&v, &bits, 4);
      s += v;
    }
    memcpy(&bits, &s, 4);
  }
  return bits;
}

/* Whether two elements are equal: integers by their bits, floats by value. */
static int same(kind_t k, uint32_t got, uint32_t want) {
  if (k == KIND_INT32) return got == want;
  float g, w;
  memcpy(&g, &got, 4);
  memcpy(&w, &want, 4);
  return g == w;
}

static void show(kind_t k, uint32_t bits, char* out, size_t n) {
  if (k == KIND_INT32) {
    int32_t v;
    memcpy(&v, &bits, 4);
    snprintf(out, n, "%d (0x%08x)", (int)v, (unsigned)bits);
  } else {
    float v;
    memcpy(&v, &bits, 4);
    snprintf(out, n, "%g (0x%08x)", (double)v, (unsigned)bits);
  }
}

/* The window: one buffer from ncclMemAlloc every case lays its buffers out in, and host
 * images of it. */
static char* win_buf = NULL; /* device memory under WITH_CUDA, else host memory */
static size_t win_bytes = 0;
static uint32_t* image = NULL; /* what is written into the window */
static uint32_t* back = NULL;  /* what is read back */

static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

/* One check: counts it, and on a mismatch prints the case, what and the first few wrong
 * elements. `want` gives element i's expected bits (NULL: POISON). */
typedef uint32_t (*want_fn)(kind_t k, size_t i, const void* ctx);

static void check_words(const char* what, const char* name, kind_t k, const uint32_t* got, size_t n, want_fn want,
                        const void* ctx) {
  size_t bad = 0;
  checks++;
  for (size_t i = 0; i < n; i++) {
    uint32_t w = want ? want(k, i, ctx) : POISON;
    int ok = want ? same(k, got[i], w) : got[i] == w;
    if (!ok) {
      if (bad < 3) {
        char gs[48], ws[48];
        show(k, got[i], gs, sizeof gs);
        show(k, w, ws, sizeof ws);
        printf("FAIL sym_nccl_header rank %d: %s %s: element %zu is %s, expected %s\n", rank, name, what, i, gs, ws);
      }
      bad++;
    }
  }
  if (bad) {
    failures++;
    printf("FAIL sym_nccl_header rank %d: %s %s: %zu of %zu elements wrong\n", rank, name, what, bad, n);
  }
}

/* Expected values. */
struct from_rank { int r; size_t base; };
static uint32_t want_input(kind_t k, size_t i, const void* ctx) {
  const struct from_rank* f = (const struct from_rank*)ctx;
  return input(k, f->r, f->base + i);
}
static uint32_t want_sum(kind_t k, size_t i, const void* ctx) {
  return summed(k, *(const size_t*)ctx + i);
}
/* all_gather: element i of the output is element i % count of rank i / count's input. */
static uint32_t want_gathered(kind_t k, size_t i, const void* ctx) {
  size_t count = *(const size_t*)ctx;
  return input(k, (int)(i / count), i % count);
}

/* Elements at word offset `at` of the window (bounds checked). */
static void* win_at(size_t at) { return win_buf + at * 4; }
static void need(size_t words, const char* name) {
  if (words * 4 > win_bytes) {
    printf("FAIL sym_nccl_header rank %d: %s needs %zu bytes, the window has %zu\n", rank, name, words * 4, win_bytes);
    fflush(stdout);
    exit(1);
  }
}

static void case_all_reduce(kind_t k, size_t count, int in_place) {
  char name[96];
  snprintf(name, sizeof name, "all_reduce %s count %zu %s", kind_name(k), count, in_place ? "in place" : "out of place");
  size_t send = 0, recv = in_place ? 0 : round_up(count, 1024), end = recv + count + GUARD_WORDS;
  need(end, name);
  struct from_rank mine = {rank, 0};
  for (size_t i = 0; i < end; i++) image[i] = POISON;
  for (size_t i = 0; i < count; i++) image[send + i] = input(k, rank, i);
  put(win_buf, image, end * 4);
  NCCL_CHECK(ncclAllReduce(win_at(send), win_at(recv), count, kind_type(k), ncclSum, comm, stream));
  settle();
  get(back, win_buf, end * 4);
  size_t zero = 0;
  check_words("result", name, k, back + recv, count, want_sum, &zero);
  check_words("guard after the result", name, k, back + recv + count, GUARD_WORDS, NULL, NULL);
  if (!in_place) check_words("input (must be unchanged)", name, k, back + send, count, want_input, &mine);
}

static void case_all_gather(kind_t k, size_t count, int in_place) {
  char name[96];
  snprintf(name, sizeof name, "all_gather %s count %zu %s", kind_name(k), count, in_place ? "in place" : "out of place");
  size_t total = count * (size_t)nranks;
  size_t recv = in_place ? 0 : round_up(count, 1024);
  size_t send = in_place ? recv + (size_t)rank * count : 0;
  size_t end = recv + total + GUARD_WORDS;
  need(end, name);
  struct from_rank mine = {rank, 0};
  for (size_t i = 0; i < end; i++) image[i] = POISON;
  for (size_t i = 0; i < count; i++) image[send + i] = input(k, rank, i);
  put(win_buf, image, end * 4);
  NCCL_CHECK(ncclAllGather(win_at(send), win_at(recv), count, kind_type(k), comm, stream));
  settle();
  get(back, win_buf, end * 4);
  check_words("result", name, k, back + recv, total, want_gathered, &count);
  check_words("guard after the result", name, k, back + recv + total, GUARD_WORDS, NULL, NULL);
  if (!in_place) check_words("input (must be unchanged)", name, k, back + send, count, want_input, &mine);
}

static void case_reduce_scatter(kind_t k, size_t count, int in_place) {
  char name[96];
  snprintf(name, sizeof name, "reduce_scatter %s count %zu %s", kind_name(k), count,
           in_place ? "in place" : "out of place");
  size_t total = count * (size_t)nranks;
  size_t send = 0;
  size_t recv = in_place ? (size_t)rank * count : round_up(total, 1024);
  size_t end = (in_place ? total : recv + count) + GUARD_WORDS;
  size_t guard = end - GUARD_WORDS;
  need(end, name);
  struct from_rank mine = {rank, 0};
  for (size_t i = 0; i < end; i++) image[i] = POISON;
  for (size_t i = 0; i < total; i++) image[send + i] = input(k, rank, i);
  put(win_buf, image, end * 4);
  NCCL_CHECK(ncclReduceScatter(win_at(send), win_at(recv), count, kind_type(k), ncclSum, comm, stream));
  settle();
  get(back, win_buf, end * 4);
  size_t first = (size_t)rank * count;
  check_words("result", name, k, back + recv, count, want_sum, &first);
  check_words("guard after the buffers", name, k, back + guard, GUARD_WORDS, NULL, NULL);
  if (!in_place) check_words("input (must be unchanged)", name, k, back + send, total, want_input, &mine);
}

int main(void) {
  const char* r = getenv("RANK");
  const char* n = getenv("NRANKS");
  if (!r || !n) {
    printf("FAIL sym_nccl_header: set RANK and NRANKS (and NCCL_COMM_ID=host:port with more than one rank)\n");
    return 1;
  }
  rank = atoi(r);
  nranks = atoi(n);
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    printf("FAIL sym_nccl_header: RANK %d, NRANKS %d\n", rank, nranks);
    return 1;
  }
  if (nranks > 1 && !getenv("NCCL_COMM_ID")) {
    printf("FAIL sym_nccl_header rank %d: set NCCL_COMM_ID=host:port (every rank derives the unique id from it)\n", rank);
    return 1;
  }
  setup_device();

  /* With NCCL_COMM_ID set, every rank gets the same id from ncclGetUniqueId. */
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  NCCL_CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  int version = 0;
  NCCL_CHECK(ncclGetVersion(&version));
  printf("sym_nccl_header rank %d of %d: library version %d, header NCCL_VERSION_CODE %d\n", rank, nranks, version,
         (int)NCCL_VERSION_CODE);

  /* One window big enough for the largest case: all_reduce out of place of 1<<20 elements
   * (two 4 MiB buffers), all_gather / reduce_scatter of 1<<18 per rank (nranks + 1 MiB). */
  size_t words = (size_t)2 << 20;
  size_t ag_words = ((size_t)nranks + 1) * ((size_t)1 << 18);
  if (ag_words > words) words = ag_words;
  words += 2 * GUARD_WORDS;
  win_bytes = round_up(words * 4, 4096);
  image = (uint32_t*)malloc(win_bytes);
  back = (uint32_t*)malloc(win_bytes);
  if (!image || !back) {
    printf("FAIL sym_nccl_header rank %d: malloc of %zu bytes\n", rank, win_bytes);
    return 1;
  }
  NCCL_CHECK(ncclMemAlloc((void**)&win_buf, win_bytes));
  ncclWindow_t win = NULL;
  NCCL_CHECK(ncclCommWindowRegister(comm, win_buf, win_bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
  checks++;
  if (win == NULL) {
    failures++;
    printf("FAIL sym_nccl_header rank %d: ncclCommWindowRegister gave no window\n", rank);
  }

  static const size_t ar_counts[] = {1, 1000, (size_t)1 << 20};
  static const size_t ag_counts[] = {1000, (size_t)1 << 18};
  for (int k = KIND_INT32; k <= KIND_FLOAT32; k++) {
    for (int in_place = 0; in_place <= 1; in_place++) {
      for (size_t c = 0; c < sizeof ar_counts / sizeof ar_counts[0]; c++) case_all_reduce((kind_t)k, ar_counts[c], in_place);
      for (size_t c = 0; c < sizeof ag_counts / sizeof ag_counts[0]; c++) {
        case_all_gather((kind_t)k, ag_counts[c], in_place);
        case_reduce_scatter((kind_t)k, ag_counts[c], in_place);
      }
    }
  }

  NCCL_CHECK(ncclCommWindowDeregister(comm, win));
  NCCL_CHECK(ncclMemFree(win_buf));
  NCCL_CHECK(ncclCommDestroy(comm));
  comm = NULL;
  teardown_device();
  free(image);
  free(back);
  if (failures) {
    printf("RESULT sym_nccl_header rank %d FAIL: %d of %d checks failed\n", rank, failures, checks);
    return 1;
  }
  printf("RESULT sym_nccl_header rank %d ok %d checks\n", rank, checks);
  return 0;
}
