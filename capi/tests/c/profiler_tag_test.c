/* The per-call profiler tag (ncclCollConfig_t::userProfilerTag) as a C caller sets it: an
 * ncclAllReduceConfig of 1000 floats tagged 42, then a plain ncclAllReduce of 2000 floats,
 * a send / receive of 300 floats to the next rank, and one group of two
 * ncclAllReduceConfig calls of 500 and 600 floats tagged 7 and 8 (results checked). Run as NRANKS
 * processes with RANK, NRANKS and NCCL_TEST_ID (the unique id in hex) under a profiler
 * plugin (NCCL_PROFILER_PLUGIN): the harness (c_profiler_tag.rs) reads what the plugin saw.
 * Prints a closing "N passed, M failed" line. */
#include "test_util.h"

static float a[2000], b[2000];

static void fill(float* x, size_t n, float v) {
  for (size_t i = 0; i < n; i++) x[i] = v;
}

int main(void) {
  ncclUniqueId id;
  read_rank_env("NCCL_TEST_ID", &id);
  ncclComm_t comm;
  OK(ncclCommInitRank(&comm, nranks, id, rank));
  float me = (float)(rank + 1), sum = (float)(nranks * (nranks + 1) / 2);

  ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;
  c.userProfilerTag = 42;
  fill(a, 1000, me), fill(b, 1000, 0);
  OK(ncclAllReduceConfig(a, b, 1000, ncclFloat, ncclSum, comm, NULL, &c));
  CHECK(b[0] == sum && b[999] == sum, "tagged AllReduce: %f", b[0]);

  fill(a, 2000, me), fill(b, 2000, 0);
  OK(ncclAllReduce(a, b, 2000, ncclFloat, ncclSum, comm, NULL));
  CHECK(b[0] == sum && b[1999] == sum, "plain AllReduce: %f", b[0]);

  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  fill(a, 300, me), fill(b, 300, 0);
  OK(ncclGroupStart());
  OK(ncclSend(a, 300, ncclFloat, next, comm, NULL));
  OK(ncclRecv(b, 300, ncclFloat, prev, comm, NULL));
  OK(ncclGroupEnd());
  CHECK(b[0] == (float)(prev + 1) && b[299] == (float)(prev + 1), "recv from %d: %f", prev, b[0]);

  /* Each call of a group keeps its own tag. */
  ncclCollConfig_t c7 = NCCL_COLLCONFIG_INITIALIZER, c8 = NCCL_COLLCONFIG_INITIALIZER;
  c7.userProfilerTag = 7, c8.userProfilerTag = 8;
  fill(a, 1100, me), fill(b, 1100, 0);
  OK(ncclGroupStart());
  OK(ncclAllReduceConfig(a, b, 500, ncclFloat, ncclSum, comm, NULL, &c7));
  OK(ncclAllReduceConfig(a + 500, b + 500, 600, ncclFloat, ncclSum, comm, NULL, &c8));
  OK(ncclGroupEnd());
  CHECK(b[0] == sum && b[1099] == sum, "grouped AllReduces: %f %f", b[0], b[1099]);

  OK(ncclCommDestroy(comm));
  return finish();
}
