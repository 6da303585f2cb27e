/* Abort, destroy and finalize racing collectives on another thread (host backend,
 * RUSTCCL_BACKEND=host). Each round makes a one-rank communicator, runs an AllReduce on it,
 * then starts AllReduces on one thread while another thread (or two) aborts, destroys or
 * finalizes it. Nothing may crash or hang, and every call must return one of the codes its
 * documentation allows. argv[1]: the number of rounds. Prints "N passed, M failed".
 *
 * With argv[1] "pair", it is one of two processes (RANK 0 or 1; NCCL_TEST_IDS: one unique id
 * in hex per round, comma-separated) sharing a two-rank communicator per round: both run
 * AllReduces on it while rank 0 aborts it from another thread; rank 1's AllReduces must end
 * with an error (the peer is gone), not hang. */
#include "test_util.h"

#include <pthread.h>
#include <unistd.h>

static pthread_mutex_t report = PTHREAD_MUTEX_INITIALIZER;

static void check(int cond, const char* what, int round, ncclResult_t r) {
  pthread_mutex_lock(&report);
  if (cond) {
    passed++;
  } else if (failed++ < 20) {
    printf("FAIL round %d: %s returned %d (%s)\n", round, what, (int)r, ncclGetLastError(NULL));
  }
  pthread_mutex_unlock(&report);
}

/* A call racing the end of its communicator runs on it, or is refused cleanly. */
static int allowed(ncclResult_t r) {
  return r == ncclSuccess || r == ncclInvalidArgument || r == ncclInvalidUsage || r == ncclRemoteError;
}

enum { ABORT, DESTROY, FINALIZE, ABORT_AND_DESTROY, KINDS };

struct round {
  int index, kind;
  ncclComm_t comm;
  volatile int started;
  float buf[256];
};

static void* collectives(void* arg) {
  struct round* r = (struct round*)arg;
  for (int i = 0; i < 200; i++) {
    ncclResult_t res = ncclAllReduce(r->buf, r->buf, 256, ncclFloat, ncclSum, r->comm, NULL);
    r->started = 1;
    check(allowed(res), "ncclAllReduce racing the end of its communicator", r->index, res);
    if (res != ncclSuccess) break;
  }
  r->started = 1;
  return NULL;
}

static void* ender(void* arg) {
  struct round* r = (struct round*)arg;
  while (!r->started) sched_yield();
  usleep((unsigned)(r->index % 7) * 10);
  ncclResult_t res;
  switch (r->kind) {
    case ABORT:
    case ABORT_AND_DESTROY:
      res = ncclCommAbort(r->comm);
      /* With ABORT_AND_DESTROY a destroy races this: one of them finds it gone. */
      check(res == ncclSuccess || (r->kind == ABORT_AND_DESTROY && res == ncclInvalidArgument), "ncclCommAbort", r->index, res);
      break;
    case DESTROY:
      res = ncclCommDestroy(r->comm);
      check(res == ncclSuccess, "ncclCommDestroy", r->index, res);
      break;
    default:
      res = ncclCommFinalize(r->comm);
      check(res == ncclSuccess, "ncclCommFinalize", r->index, res);
      break;
  }
  return NULL;
}

static void* second_destroy(void* arg) {
  struct round* r = (struct round*)arg;
  while (!r->started) sched_yield();
  ncclResult_t res = ncclCommDestroy(r->comm);
  check(res == ncclSuccess || res == ncclInvalidArgument, "ncclCommDestroy racing ncclCommAbort", r->index, res);
  return NULL;
}

static int pair(void) {
  rank = atoi(getenv("RANK"));
  nranks = 2;
  const char* ids = getenv("NCCL_TEST_IDS");
  int rounds = (int)((strlen(ids) + 1) / (2 * NCCL_UNIQUE_ID_BYTES + 1));
  for (int i = 0; i < rounds; i++) {
    struct round r;
    memset(&r, 0, sizeof r);
    r.index = i;
    r.kind = ABORT;
    ncclUniqueId id;
    hex_to_id(ids + i * (2 * NCCL_UNIQUE_ID_BYTES + 1), &id);
    ncclResult_t res = ncclCommInitRank(&r.comm, nranks, id, rank);
    check(res == ncclSuccess, "ncclCommInitRank", i, res);
    if (res != ncclSuccess) break;
    for (int k = 0; k < 256; k++) r.buf[k] = 1.0f;
    res = ncclAllReduce(r.buf, r.buf, 256, ncclFloat, ncclSum, r.comm, NULL);
    check(res == ncclSuccess && r.buf[0] == 2.0f, "first ncclAllReduce", i, res);
    if (rank == 0) {
      pthread_t a, b;
      pthread_create(&a, NULL, collectives, &r);
      pthread_create(&b, NULL, ender, &r);
      pthread_join(a, NULL);
      pthread_join(b, NULL);
    } else {
      /* Runs until the peer's abort ends an AllReduce: it must end with an error. */
      for (;;) {
        res = ncclAllReduce(r.buf, r.buf, 256, ncclFloat, ncclSum, r.comm, NULL);
        if (res != ncclSuccess) break;
      }
      check(res == ncclRemoteError || res == ncclInvalidUsage, "ncclAllReduce with the peer aborting", i, res);
      res = ncclCommAbort(r.comm);
      check(res == ncclSuccess, "ncclCommAbort after the peer's", i, res);
    }
  }
  return finish();
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "pair") == 0) return pair();
  int rounds = argc > 1 ? atoi(argv[1]) : 1000;
  for (int i = 0; i < rounds; i++) {
    struct round r;
    memset(&r, 0, sizeof r);
    r.index = i;
    r.kind = i % KINDS;
    ncclUniqueId id;
    ncclResult_t res = ncclGetUniqueId(&id);
    check(res == ncclSuccess, "ncclGetUniqueId", i, res);
    res = ncclCommInitRank(&r.comm, nranks, id, rank);
    check(res == ncclSuccess, "ncclCommInitRank", i, res);
    if (res != ncclSuccess) break;
    for (int k = 0; k < 256; k++) r.buf[k] = 1.0f;
    res = ncclAllReduce(r.buf, r.buf, 256, ncclFloat, ncclSum, r.comm, NULL);
    check(res == ncclSuccess && r.buf[255] == 1.0f, "first ncclAllReduce", i, res);
    pthread_t a, b, c;
    pthread_create(&a, NULL, collectives, &r);
    pthread_create(&b, NULL, ender, &r);
    if (r.kind == ABORT_AND_DESTROY) pthread_create(&c, NULL, second_destroy, &r);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    if (r.kind == ABORT_AND_DESTROY) pthread_join(c, NULL);
    if (r.kind == FINALIZE) {
      res = ncclCommDestroy(r.comm);
      check(res == ncclSuccess, "ncclCommDestroy after finalize", i, res);
    }
    /* The handle is gone now: using it is refused. */
    int n = 0;
    res = ncclCommCount(r.comm, &n);
    check(res == ncclInvalidArgument, "ncclCommCount on an ended communicator", i, res);
  }
  return finish();
}
