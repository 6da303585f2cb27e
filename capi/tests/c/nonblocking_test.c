/* Non-blocking communicators through the C API, on the host backend (RUSTCCL_BACKEND=host):
 * run as 2 processes with RANK, NRANKS and NCCL_TEST_ID (the unique id in hex) in the
 * environment. Operations on a communicator made with config.blocking = 0 return
 * ncclInProgress and complete in the background (the caller's host buffers stay in use until
 * then); a group may not mix blocking and non-blocking communicators; a stuck operation is
 * abandoned with ncclCommAbort from the same thread, promptly. Prints one line per failed check
 * and a closing "N passed, M failed" line. */
#define _POSIX_C_SOURCE 199309L
#include "test_util.h"

#include <time.h>

#define QUEUED(call) CHECK((call) == ncclInProgress, "%s did not return ncclInProgress (%s)", #call, ncclGetLastError(NULL))

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* Polls the asynchronous error until it is no longer ncclInProgress (at most 60 s). */
static ncclResult_t wait_comm(ncclComm_t comm) {
  ncclResult_t st = ncclInProgress;
  double deadline = now_s() + 60.0;
  while (st == ncclInProgress && now_s() < deadline) {
    if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) return ncclInternalError;
  }
  return st;
}

int main(void) {
  ncclUniqueId id;
  read_rank_env("NCCL_TEST_ID", &id);
  const size_t n = 100003;
  int *a = (int*)calloc(n, sizeof(int)), *b = (int*)calloc(n, sizeof(int));
  int *c = (int*)calloc(n, sizeof(int)), *d = (int*)calloc(n, sizeof(int));
  int ok;

  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &cfg);
  CHECK(r == ncclSuccess || r == ncclInProgress, "init -> %d", r);
  CHECK(wait_comm(comm) == ncclSuccess, "init completes");

  /* One AllReduce on plain host buffers: InProgress, then the data. */
  for (size_t i = 0; i < n; i++) a[i] = (rank + 1) * (int)(i % 101);
  int sum1 = nranks * (nranks + 1) / 2;
  QUEUED(ncclAllReduce(a, b, n, ncclInt32, ncclSum, comm, NULL));
  CHECK(wait_comm(comm) == ncclSuccess, "AllReduce completes");
  ok = 1;
  for (size_t i = 0; i < n; i++) ok &= b[i] == sum1 * (int)(i % 101);
  CHECK(ok, "AllReduce result");

  /* Three in a row on the same buffers, each on the previous result, with an argument error
   * returned at once meanwhile. */
  QUEUED(ncclAllReduce(a, b, n, ncclInt32, ncclSum, comm, NULL));
  QUEUED(ncclAllReduce(b, c, n, ncclInt32, ncclSum, comm, NULL));
  QUEUED(ncclAllReduce(c, c, n, ncclInt32, ncclSum, comm, NULL));
  CHECK(ncclBroadcast(a, b, n, ncclInt32, nranks, comm, NULL) == ncclInvalidArgument, "bad root at once");
  CHECK(wait_comm(comm) == ncclSuccess, "queued AllReduces complete");
  ok = 1;
  for (size_t i = 0; i < n; i++) ok &= b[i] == sum1 * (int)(i % 101) && c[i] == sum1 * nranks * nranks * (int)(i % 101);
  CHECK(ok, "queued AllReduces ran in call order");

  /* Two groups queued in a row (inside a group calls return ncclSuccess; the end
   * ncclInProgress): AllReduce max and Broadcast from the last rank, then a Send/Recv ring
   * whose receive overwrites the first group's input. */
  for (size_t i = 0; i < n; i++) d[i] = rank * 1000 + (int)(i % 7);
  OK(ncclGroupStart());
  OK(ncclAllReduce(a, b, n, ncclInt32, ncclMax, comm, NULL));
  OK(ncclBroadcast(d, c, n, ncclInt32, nranks - 1, comm, NULL));
  QUEUED(ncclGroupEnd());
  OK(ncclGroupStart());
  OK(ncclSend(d, n, ncclInt32, (rank + 1) % nranks, comm, NULL));
  OK(ncclRecv(a, n, ncclInt32, (rank + nranks - 1) % nranks, comm, NULL));
  QUEUED(ncclGroupEnd());
  CHECK(wait_comm(comm) == ncclSuccess, "groups complete");
  ok = 1;
  for (size_t i = 0; i < n; i++) ok &= b[i] == nranks * (int)(i % 101) && c[i] == (nranks - 1) * 1000 + (int)(i % 7);
  CHECK(ok, "group AllReduce max and Broadcast");
  ok = 1;
  for (size_t i = 0; i < n; i++) ok &= a[i] == ((rank + nranks - 1) % nranks) * 1000 + (int)(i % 7);
  CHECK(ok, "group Send/Recv");

  /* Blocking and non-blocking in one group: refused, and nothing runs. */
  ncclConfig_t bcfg = NCCL_CONFIG_INITIALIZER;
  bcfg.blocking = 1;
  ncclComm_t blk = NULL;
  r = ncclCommSplit(comm, 0, rank, &blk, &bcfg);
  CHECK(r == ncclSuccess && blk != NULL, "blocking split -> %d", r);
  for (size_t i = 0; i < n; i++) b[i] = -1;
  OK(ncclGroupStart());
  OK(ncclAllReduce(a, b, n, ncclInt32, ncclSum, blk, NULL));
  CHECK(ncclAllReduce(a, b, n, ncclInt32, ncclSum, comm, NULL) == ncclInvalidUsage, "mixing refused");
  CHECK(strstr(ncclGetLastError(NULL), "blocking and non-blocking") != NULL, "message: %s", ncclGetLastError(NULL));
  CHECK(ncclGroupEnd() == ncclInvalidUsage, "the mixed group fails");
  CHECK(b[0] == -1 && b[n - 1] == -1, "the mixed group ran nothing");
  OK(ncclCommDestroy(blk));

  /* A non-blocking child that rank 1 never uses: rank 0's AllReduce is stuck (connecting),
   * and abort from the same thread ends it promptly. */
  ncclComm_t child = NULL;
  r = ncclCommSplit(comm, 0, rank, &child, NULL); /* inherits the non-blocking config */
  CHECK(r == ncclSuccess || r == ncclInProgress, "split -> %d", r);
  CHECK(wait_comm(child) == ncclSuccess, "split completes");
  if (rank == 0) {
    QUEUED(ncclAllReduce(a, b, n, ncclInt32, ncclSum, child, NULL));
    sleep_ms(300);
    ncclResult_t st = ncclSuccess;
    OK(ncclCommGetAsyncError(child, &st));
    CHECK(st == ncclInProgress, "stuck operation: async error %d", st);
    double t0 = now_s();
    OK(ncclCommAbort(child));
    double took = now_s() - t0;
    CHECK(took < 1.0, "abort took %.3f s", took);
    printf("rank 0: abort took %.0f ms\n", took * 1000.0);
  } else {
    /* Never calls on the child: rank 0's abort shows as a failed peer. */
    ncclResult_t st = ncclSuccess;
    double deadline = now_s() + 30.0;
    while (st == ncclSuccess && now_s() < deadline) {
      OK(ncclCommGetAsyncError(child, &st));
      sleep_ms(5);
    }
    CHECK(st == ncclRemoteError, "the peer's abort: async error %d", st);
    OK(ncclCommAbort(child));
  }

  /* The parent still works; finalize behind a queued operation may itself be in progress. */
  for (size_t i = 0; i < n; i++) a[i] = 1;
  QUEUED(ncclAllReduce(a, d, n, ncclInt32, ncclSum, comm, NULL));
  r = ncclCommFinalize(comm);
  CHECK(r == ncclSuccess || r == ncclInProgress, "finalize -> %d", r);
  CHECK(wait_comm(comm) == ncclSuccess, "finalize completes");
  CHECK(d[0] == nranks && d[n - 1] == nranks, "AllReduce before finalize %d", d[0]);
  OK(ncclCommDestroy(comm));

  free(a), free(b), free(c), free(d);
  return finish();
}
