/* Exercises rustccl's libnccl.so.2 through its C header, on the host backend
 * (RUSTCCL_BACKEND=host): run as NRANKS processes with RANK, NRANKS and NCCL_TEST_ID (the
 * unique id in hex) in the environment. Prints one line per failed check and a closing
 * "N passed, M failed" line. */
/* OK() checks what a call settles to: see settle() below. */
#define TEST_SETTLE(result) settle(result)
#include "test_util.h"

#include <stddef.h>

/* The communicator under test is non-blocking: its operations return ncclInProgress and
 * complete in the background. settle() waits for that, as an NCCL caller would. */
static ncclComm_t nonblocking = NULL;

static ncclResult_t settle(ncclResult_t r) {
  if (r != ncclInProgress || nonblocking == NULL) return r;
  ncclResult_t st = ncclInProgress;
  while (st == ncclInProgress) {
    if (ncclCommGetAsyncError(nonblocking, &st) != ncclSuccess) return ncclInternalError;
  }
  return st;
}

static float* fbuf(size_t n) { return (float*)calloc(n, sizeof(float)); }

static void test_errors(void) {
  int v = 0;
  OK(ncclGetVersion(&v));
  /* NCCL 2.32.3: the library's number, and the header's (known when the program compiles). */
  CHECK(v == 23203 && v == NCCL_VERSION_CODE, "ncclGetVersion %d, NCCL_VERSION_CODE %d", v, (int)NCCL_VERSION_CODE);
  _Static_assert(NCCL_VERSION_CODE == 23203, "nccl.h says NCCL 2.32.3");
  _Static_assert(NCCL_MAJOR == 2 && NCCL_MINOR == 32 && NCCL_PATCH == 3, "NCCL_MAJOR.MINOR.PATCH 2.32.3");
  _Static_assert(NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH) == NCCL_VERSION_CODE, "NCCL_VERSION of the parts");
  _Static_assert(NCCL_VERSION(2, 8, 4) == 2804 && NCCL_VERSION(2, 9, 0) == 20900, "NCCL_VERSION's two formulas");
  CHECK(strcmp(NCCL_SUFFIX, "") == 0, "NCCL_SUFFIX \"%s\"", NCCL_SUFFIX);
  {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    CHECK(config.version == 23203, "NCCL_CONFIG_INITIALIZER's version %u", config.version);
  }
  CHECK(v >= NCCL_VERSION(2, 27, 0) && v >= NCCL_VERSION(2, 28, 0) && v >= NCCL_VERSION(2, 31, 2) && v < NCCL_VERSION(2, 33, 0),
        "a program picking windows (2.27), the device API (2.28) and 2.29-2.32's calls by version finds them");
  CHECK(ncclGetVersion(NULL) == ncclInvalidArgument, "NULL version");
  CHECK(strlen(ncclGetLastError(NULL)) > 0, "last error after a failure");
  CHECK(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "string of ncclSuccess");
  CHECK(strcmp(ncclGetErrorString(ncclInProgress), "NCCL operation in progress") == 0, "string of InProgress");
  for (int c = 0; c <= ncclNumResults; c++) CHECK(ncclGetErrorString((ncclResult_t)c) != NULL, "string of %d", c);
  CHECK(strcmp(ncclGetErrorString(ncclNumResults), "unknown result code") == 0, "unknown code");
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclComm_t c;
  CHECK(ncclCommInitRank(NULL, 1, id, 0) == ncclInvalidArgument, "NULL newcomm");
  CHECK(ncclCommInitRank(&c, 1, id, 0) == ncclInvalidArgument, "zeroed (foreign) unique id");
  CHECK(ncclCommDestroy((ncclComm_t)&id) == ncclInvalidArgument, "destroy of a non-communicator");
  CHECK(ncclCommDestroy(NULL) == ncclSuccess, "destroy(NULL) is a no-op");
}

static void test_collectives(ncclComm_t comm) {
  const size_t n = 1001;
  float *a = fbuf(n * nranks), *b = fbuf(n * nranks);
  int ok;
  /* AllReduce, out of place and in place. */
  for (size_t i = 0; i < n; i++) a[i] = (float)(rank + 1) * (float)(i % 13);
  OK(ncclAllReduce(a, b, n, ncclFloat, ncclSum, comm, NULL));
  ok = 1;
  for (size_t i = 0; i < n; i++) ok &= b[i] == (float)(nranks * (nranks + 1) / 2) * (float)(i % 13);
  CHECK(ok, "AllReduce sum");
  OK(ncclAllReduce(a, a, n, ncclFloat, ncclMax, comm, NULL));
  ok = 1;
  for (size_t i = 0; i < n; i++) ok &= a[i] == (float)nranks * (float)(i % 13);
  CHECK(ok, "AllReduce max in place");
  /* PreMulSum with a host scalar: sum of 2*(rank+1). */
  float two = 2.0f;
  ncclRedOp_t pm;
  OK(ncclRedOpCreatePreMulSum(&pm, &two, ncclFloat, ncclScalarHostImmediate, comm));
  for (size_t i = 0; i < n; i++) a[i] = (float)(rank + 1);
  OK(ncclAllReduce(a, b, n, ncclFloat, pm, comm, NULL));
  CHECK(b[0] == (float)(nranks * (nranks + 1)) && b[n - 1] == b[0], "PreMulSum %f", b[0]);
  OK(ncclRedOpDestroy(pm, comm));
  CHECK(ncclRedOpDestroy(pm, comm) == ncclInvalidArgument, "double RedOpDestroy");
  CHECK(ncclAllReduce(a, b, n, ncclFloat, (ncclRedOp_t)77, comm, NULL) == ncclInvalidArgument, "unknown op");
  CHECK(ncclAllReduce(a, b, n, (ncclDataType_t)99, ncclSum, comm, NULL) == ncclInvalidArgument, "bad type");
  CHECK(ncclAllReduce(NULL, b, n, ncclFloat, ncclSum, comm, NULL) == ncclInvalidArgument, "NULL sendbuff");
  OK(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, comm, NULL));
  /* Broadcast from the last rank; Bcast in place from 0. */
  for (size_t i = 0; i < n; i++) a[i] = (float)(rank * 1000 + i);
  OK(ncclBroadcast(a, b, n, ncclFloat, nranks - 1, comm, NULL));
  CHECK(b[5] == (float)((nranks - 1) * 1000 + 5), "Broadcast");
  OK(ncclBcast(a, n, ncclFloat, 0, comm, NULL));
  CHECK(a[7] == 7.0f, "Bcast");
  CHECK(ncclBroadcast(a, b, n, ncclFloat, nranks, comm, NULL) == ncclInvalidArgument, "root out of range");
  /* Reduce to rank 1 (or 0). */
  int root = nranks > 1 ? 1 : 0;
  int* ia = (int*)calloc(n, sizeof(int));
  int* ib = (int*)calloc(n, sizeof(int));
  for (size_t i = 0; i < n; i++) ia[i] = rank + (int)i;
  OK(ncclReduce(ia, ib, n, ncclInt32, ncclSum, root, comm, NULL));
  if (rank == root) CHECK(ib[3] == nranks * (nranks - 1) / 2 + 3 * nranks, "Reduce %d", ib[3]);
  /* AllGather and ReduceScatter. */
  for (size_t i = 0; i < n; i++) a[i] = (float)rank;
  OK(ncclAllGather(a, b, n, ncclFloat, comm, NULL));
  ok = 1;
  for (int r = 0; r < nranks; r++) ok &= b[r * n] == (float)r && b[r * n + n - 1] == (float)r;
  CHECK(ok, "AllGather");
  for (size_t i = 0; i < n * nranks; i++) a[i] = 1.0f;
  OK(ncclReduceScatter(a, b, n, ncclFloat, ncclSum, comm, NULL));
  CHECK(b[0] == (float)nranks && b[n - 1] == (float)nranks, "ReduceScatter");
  /* AlltoAll, Gather, Scatter. */
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < n; i++) a[r * n + i] = (float)(rank * 100 + r);
  OK(ncclAlltoAll(a, b, n, ncclFloat, comm, NULL));
  ok = 1;
  for (int r = 0; r < nranks; r++) ok &= b[r * n + 1] == (float)(r * 100 + rank);
  CHECK(ok, "AlltoAll");
  for (size_t i = 0; i < n; i++) a[i] = (float)rank;
  OK(ncclGather(a, b, n, ncclFloat, 0, comm, NULL));
  if (rank == 0) CHECK(b[(nranks - 1) * n] == (float)(nranks - 1), "Gather");
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < n; i++) a[r * n + i] = (float)(r + 10);
  OK(ncclScatter(a, b, n, ncclFloat, 0, comm, NULL));
  CHECK(b[2] == (float)(rank + 10), "Scatter");
  /* Send/Recv around the ring inside a group, with an ncclMemAlloc buffer. */
  float* m = NULL;
  OK(ncclMemAlloc((void**)&m, n * sizeof(float)));
  for (size_t i = 0; i < n; i++) a[i] = (float)rank;
  OK(ncclGroupStart());
  OK(ncclSend(a, n, ncclFloat, (rank + 1) % nranks, comm, NULL));
  OK(ncclRecv(m, n, ncclFloat, (rank + nranks - 1) % nranks, comm, NULL));
  OK(ncclGroupEnd());
  CHECK(m[0] == (float)((rank + nranks - 1) % nranks), "Send/Recv ring %f", m[0]);
  OK(ncclMemFree(m));
  CHECK(ncclMemFree(m) == ncclInvalidArgument, "double MemFree");
  /* Nested groups: two all-reduces in one outer group. */
  for (size_t i = 0; i < n; i++) a[i] = 1.0f, b[i] = 2.0f;
  OK(ncclGroupStart());
  OK(ncclGroupStart());
  OK(ncclAllReduce(a, a, n, ncclFloat, ncclSum, comm, NULL));
  OK(ncclGroupEnd());
  OK(ncclAllReduce(b, b, n, ncclFloat, ncclSum, comm, NULL));
  OK(ncclGroupEnd());
  CHECK(a[0] == (float)nranks && b[0] == (float)(2 * nranks), "nested group");
  CHECK(ncclGroupEnd() == ncclInvalidUsage, "GroupEnd without GroupStart");
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  OK(ncclGroupStart());
  OK(ncclAllReduce(a, a, n, ncclFloat, ncclSum, comm, NULL));
  OK(ncclGroupSimulateEnd(&sim));
  CHECK(nranks == 1 || sim.estimatedTime > 0.0f, "simulated time %f", sim.estimatedTime);
  CHECK(a[0] == (float)nranks, "GroupSimulateEnd runs nothing");
  /* Registration and windows. */
  void* h = NULL;
  OK(ncclCommRegister(comm, a, n * sizeof(float), &h));
  OK(ncclAllReduce(a, a, n, ncclFloat, ncclSum, comm, NULL));
  OK(ncclCommDeregister(comm, h));
  /* Windows: only of ncclMemAlloc memory; collectives run on window buffers. */
  ncclWindow_t w = NULL;
  CHECK(ncclCommWindowRegister(comm, a, 4096, &w, NCCL_WIN_DEFAULT) == ncclInvalidArgument, "window of malloc memory refused");
  CHECK(w == NULL, "no window written after a refusal");
  OK(ncclCommWindowRegister(comm, NULL, 4096, &w, NCCL_WIN_DEFAULT));
  CHECK(w == NULL, "a NULL buffer registers nothing (as NCCL)");
  float* sym = NULL;
  OK(ncclMemAlloc((void**)&sym, 2 * 4096 + n * sizeof(float)));
  OK(ncclCommWindowRegister(comm, sym, n * sizeof(float), &w, NCCL_WIN_COLL_SYMMETRIC));
  CHECK(w != NULL, "a window");
  void* user = NULL;
  OK(ncclWinGetUserPtr(comm, w, &user));
  CHECK(user == (void*)sym, "window user pointer %p, buffer %p", user, (void*)sym);
  for (size_t i = 0; i < n; i++) sym[i] = (float)(rank + 1);
  OK(ncclAllReduce(sym, sym, n, ncclFloat, ncclSum, comm, NULL));
  CHECK(sym[0] == (float)(nranks * (nranks + 1) / 2) && sym[n - 1] == sym[0], "all-reduce in a window: %f", sym[0]);
  /* Every rank's window through this process's pointers to it, once every rank has its
   * result (a rank takes part in the next collective only after finishing this one). */
  OK(ncclAllReduce(b, b, 1, ncclFloat, ncclSum, comm, NULL));
  for (int p = 0; p < nranks; p++) {
    void* pp = NULL;
    OK(ncclGetPeerDevicePointer(w, sizeof(float), p, &pp));
    CHECK(pp != NULL && *(float*)pp == sym[1], "rank %d's window through its pointer", p);
  }
  void* self_view = NULL;
  OK(ncclGetLsaDevicePointer(w, 0, rank, &self_view));
  CHECK(self_view != (void*)sym, "a second view of the own window");
  *(float*)self_view = -1.0f;
  CHECK(sym[0] == -1.0f, "a store through the second view lands in the buffer");
  void* none = &w;
  CHECK(ncclGetPeerDevicePointer(w, 0, nranks, &none) == ncclInvalidArgument && none == NULL, "peer out of range");
  CHECK(ncclGetPeerDevicePointer(w, n * sizeof(float) + 1, 0, &none) == ncclInvalidArgument, "offset past the window");
  CHECK(ncclGetLsaDevicePointer(NULL, 0, 0, &none) == ncclInvalidArgument, "pointer of no window");
  CHECK(ncclCommWindowRegister(comm, (char*)sym + 100, 4096, &w, NCCL_WIN_DEFAULT) == ncclInvalidArgument, "misaligned window refused");
  OK(ncclCommWindowDeregister(comm, w));
  CHECK(ncclCommWindowDeregister(comm, w) == ncclInvalidArgument, "second deregistration refused");
  CHECK(ncclWinGetUserPtr(comm, w, &user) == ncclInvalidArgument, "user pointer of a deregistered window refused");
  OK(ncclCommWindowDeregister(comm, NULL));
  /* Inside a group, registrations run (and write the handle) when the group ends. */
  ncclWindow_t g1 = NULL, g2 = NULL;
  OK(ncclGroupStart());
  OK(ncclCommWindowRegister(comm, sym, 4096, &g1, NCCL_WIN_DEFAULT));
  OK(ncclGroupStart());
  OK(ncclCommWindowRegister(comm, (char*)sym + 4096, 4096, &g2, NCCL_WIN_COLL_SYMMETRIC));
  OK(ncclGroupEnd());
  CHECK(g1 == NULL && g2 == NULL, "handles written before the outermost group ended");
  OK(ncclAllReduce(sym, sym, 4, ncclFloat, ncclSum, comm, NULL));
  OK(ncclGroupEnd());
  CHECK(g1 != NULL && g2 != NULL && g1 != g2, "handles written at the group's end");
  OK(ncclWinGetUserPtr(comm, g2, &user));
  CHECK(user == (void*)((char*)sym + 4096), "deferred window's user pointer");
  OK(ncclCommWindowDeregister(comm, g2));
  OK(ncclCommWindowDeregister(comm, g1));
  OK(ncclMemFree(sym));
  free(a), free(b), free(ia), free(ib);
}

int main(void) {
  ncclUniqueId id;
  read_rank_env("NCCL_TEST_ID", &id);
  test_errors();

  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0x1234;
  ncclComm_t comm = NULL;
  CHECK(ncclCommInitRankConfig(&comm, nranks, id, rank, &bad) == ncclInvalidArgument, "bad config magic");
  CHECK(ncclCommInitRank(&comm, 0, id, 0) == ncclInvalidArgument, "nranks 0");
  CHECK(ncclCommInitRank(&comm, nranks, id, nranks) == ncclInvalidArgument, "rank out of range");

  /* An older caller's smaller config (2.17's fields end at netName): honoured up to its size. */
  {
    ncclConfig_t old = NCCL_CONFIG_INITIALIZER;
    old.size = offsetof(ncclConfig_t, splitShare);
    old.version = NCCL_VERSION(2, 17, 1);
    old.splitShare = 77; /* beyond its size: must not be read */
    ncclComm_t oc = NULL;
    OK(ncclCommInitRankConfig(&oc, nranks, id, rank, &old));
    int oc_n = 0;
    OK(ncclCommCount(oc, &oc_n));
    CHECK(oc_n == nranks, "old-config comm size %d", oc_n);
    OK(ncclCommDestroy(oc));
  }
  /* The root of the id above served that communicator; the next one needs a fresh id. */
  hex_to_id(getenv("NCCL_TEST_ID2"), &id);

  /* Non-blocking init, polled. */
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &cfg);
  CHECK(r == ncclSuccess || r == ncclInProgress, "non-blocking init -> %d", r);
  ncclResult_t st = ncclInProgress;
  while (st == ncclInProgress) {
    if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) break;
  }
  CHECK(st == ncclSuccess, "async init result %d", st);
  int count = -1, me = -1, dev = -1;
  OK(ncclCommCount(comm, &count));
  OK(ncclCommUserRank(comm, &me));
  OK(ncclCommCuDevice(comm, &dev));
  CHECK(count == nranks && me == rank && dev == 0, "count %d rank %d dev %d", count, me, dev);
  CHECK(ncclCommCount(comm, NULL) == ncclInvalidArgument, "NULL count");

  nonblocking = comm;
  test_collectives(comm);

  /* Split by parity, key reverses the order. */
  ncclComm_t half = NULL;
  /* The child inherits the parent's (non-blocking) config: poll it. */
  r = ncclCommSplit(comm, rank % 2, -rank, &half, NULL);
  CHECK(r == ncclSuccess || r == ncclInProgress, "split -> %d", r);
  st = ncclInProgress;
  while (st == ncclInProgress) ncclCommGetAsyncError(half, &st);
  CHECK(st == ncclSuccess, "split child init %d", st);
  int hn = 0, hr = 0;
  OK(ncclCommCount(half, &hn));
  OK(ncclCommUserRank(half, &hr));
  CHECK(hn == (nranks + 1 - rank % 2) / 2, "split size %d", hn);
  float x = 1.0f;
  nonblocking = half;
  OK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, half, NULL));
  CHECK(x == (float)hn, "all-reduce on the split comm %f", x);
  nonblocking = comm;
  OK(ncclCommDestroy(half));
  ncclComm_t none = (ncclComm_t)1;
  OK(ncclCommSplit(comm, NCCL_SPLIT_NOCOLOR, 0, &none, NULL));
  CHECK(none == NULL, "NOCOLOR gives NULL");

  OK(ncclCommFinalize(comm));
  CHECK(ncclCommFinalize(comm) == ncclInvalidArgument, "double finalize");
  CHECK(strstr(ncclGetLastError(comm), "finalized") != NULL, "last error of the comm: %s", ncclGetLastError(comm));
  OK(ncclCommDestroy(comm));
  CHECK(ncclCommDestroy(comm) == ncclInvalidArgument, "destroy twice");
  CHECK(ncclCommCount(comm, &count) == ncclInvalidArgument, "use after destroy");

  return finish();
}
