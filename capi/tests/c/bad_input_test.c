/* Bad inputs that must fail cleanly (host backend, RUSTCCL_BACKEND=host): counts whose byte
 * size overflows or cannot be a buffer, argument errors inside a group, the last error of a
 * communicator, a PreMulSum operator used with another type. Run as NRANKS processes with
 * RANK, NRANKS and NCCL_TEST_ID (the unique id in hex) in the environment. Prints one line per
 * failed check and a closing "N passed, M failed" line. */
#include "test_util.h"

#include <stdint.h>

/* Every rank makes the same calls, so a check that wrongly succeeded on one rank and not on
 * another shows up as a failure (or a hang) rather than as silently wrong data. */
static void test_overflow(ncclComm_t comm) {
  float a[64] = {0}, b[64 * 8] = {0};
  const size_t wraps = (SIZE_MAX / 4) + 2; /* x 4 bytes wraps around to 4 */
  INVALID(ncclAllReduce(a, b, wraps, ncclFloat, ncclSum, comm, NULL));
  CHECK(strstr(ncclGetLastError(NULL), "count") != NULL, "the overflow message names the count: %s", ncclGetLastError(NULL));
  INVALID(ncclBroadcast(a, b, wraps, ncclFloat, 0, comm, NULL));
  INVALID(ncclReduce(a, b, wraps, ncclFloat, ncclSum, 0, comm, NULL));
  INVALID(ncclSend(a, wraps, ncclFloat, (rank + 1) % nranks, comm, NULL));
  INVALID(ncclRecv(b, wraps, ncclFloat, (rank + nranks - 1) % nranks, comm, NULL));
  /* x 8 bytes fits, but not x nranks: the AllGather output, the ReduceScatter input. */
  const size_t per_rank = nranks > 1 ? SIZE_MAX / 8 / (size_t)nranks + 1 : SIZE_MAX / 8 + 1;
  INVALID(ncclAllGather(a, b, per_rank, ncclDouble, comm, NULL));
  INVALID(ncclReduceScatter(a, b, per_rank, ncclDouble, ncclSum, comm, NULL));
  INVALID(ncclAlltoAll(a, b, per_rank, ncclDouble, comm, NULL));
  INVALID(ncclGather(a, b, per_rank, ncclDouble, 0, comm, NULL));
  INVALID(ncclScatter(a, b, per_rank, ncclDouble, 0, comm, NULL));
  /* Sizes that do not overflow but that no buffer can have: past the end of the address space. */
  const size_t huge = SIZE_MAX / 8;
  INVALID(ncclAllReduce(a, b, huge, ncclFloat, ncclSum, comm, NULL));
  INVALID(ncclAllGather(a, b, (size_t)1 << 60 >> 2, ncclFloat, comm, NULL));
  /* The communicator still works. */
  for (int i = 0; i < 64; i++) a[i] = 1.0f;
  OK(ncclAllReduce(a, b, 64, ncclFloat, ncclSum, comm, NULL));
  CHECK(b[0] == (float)nranks && b[63] == (float)nranks, "AllReduce after the refused ones: %f", b[0]);
}

/* Any argument error inside a group fails the group: nothing in it runs. */
static void test_group(ncclComm_t comm) {
  float a[16] = {0}, b[16] = {0};
  const char* bad[] = {"data type", "operator", "overflowing count", "NULL buffer"};
  for (int k = 0; k < 4; k++) {
    for (int i = 0; i < 16; i++) a[i] = 1.0f, b[i] = -1.0f;
    OK(ncclGroupStart());
    OK(ncclAllReduce(a, b, 16, ncclFloat, ncclSum, comm, NULL));
    ncclResult_t r;
    if (k == 0) r = ncclAllReduce(a, a, 16, (ncclDataType_t)99, ncclSum, comm, NULL);
    else if (k == 1) r = ncclAllReduce(a, a, 16, ncclFloat, (ncclRedOp_t)77, comm, NULL);
    else if (k == 2) r = ncclAllReduce(a, a, SIZE_MAX / 2 + 1, ncclFloat, ncclSum, comm, NULL);
    else r = ncclAllReduce(NULL, a, 16, ncclFloat, ncclSum, comm, NULL);
    CHECK(r == ncclInvalidArgument, "bad %s in a group -> %d", bad[k], r);
    r = ncclGroupEnd();
    CHECK(r == ncclInvalidArgument, "ncclGroupEnd after a bad %s -> %d (must fail the group)", bad[k], r);
    CHECK(b[0] == -1.0f && b[15] == -1.0f, "bad %s: the group's other AllReduce ran (%f)", bad[k], b[0]);
  }
  /* A group after the failed ones runs normally. */
  for (int i = 0; i < 16; i++) a[i] = 1.0f;
  OK(ncclGroupStart());
  OK(ncclAllReduce(a, b, 16, ncclFloat, ncclSum, comm, NULL));
  OK(ncclGroupEnd());
  CHECK(b[0] == (float)nranks, "group after the failed ones: %f", b[0]);
}

/* ncclGetLastError(comm) is the latest error concerning that communicator. */
static void test_last_error(ncclComm_t comm) {
  float a[4] = {0};
  INVALID(ncclAllReduce(NULL, a, 4, ncclFloat, ncclSum, comm, NULL));
  CHECK(strstr(ncclGetLastError(comm), "NULL") != NULL, "after a NULL buffer: %s", ncclGetLastError(comm));
  INVALID(ncclAllReduce(a, a, 4, (ncclDataType_t)99, ncclSum, comm, NULL));
  CHECK(strstr(ncclGetLastError(comm), "data type 99") != NULL, "after a bad type: %s", ncclGetLastError(comm));
  INVALID(ncclAllReduce(a, a, 4, ncclFloat, (ncclRedOp_t)77, comm, NULL));
  CHECK(strstr(ncclGetLastError(comm), "operator 77") != NULL, "after a bad op: %s", ncclGetLastError(comm));
  INVALID(ncclAllReduce(a, a, SIZE_MAX / 2 + 1, ncclFloat, ncclSum, comm, NULL));
  CHECK(strstr(ncclGetLastError(comm), "count") != NULL, "after an overflowing count: %s", ncclGetLastError(comm));
  INVALID(ncclCommCount(comm, NULL));
  CHECK(strstr(ncclGetLastError(comm), "count is NULL") != NULL, "after a NULL count: %s", ncclGetLastError(comm));
  /* A failure with no communicator shows in the process-wide last error. */
  INVALID(ncclGetVersion(NULL));
  CHECK(strstr(ncclGetLastError(NULL), "version is NULL") != NULL, "NULL comm: %s", ncclGetLastError(NULL));
}

/* A PreMulSum operator is made for one data type. */
static void test_premulsum_type(ncclComm_t comm) {
  float two = 2.0f;
  ncclRedOp_t pm;
  OK(ncclRedOpCreatePreMulSum(&pm, &two, ncclFloat, ncclScalarHostImmediate, comm));
  int ia[8], ib[8];
  for (int i = 0; i < 8; i++) ia[i] = 1, ib[i] = -1;
  INVALID(ncclAllReduce(ia, ib, 8, ncclInt32, pm, comm, NULL));
  CHECK(strstr(ncclGetLastError(comm), "float32") != NULL || strstr(ncclGetLastError(comm), "Float32") != NULL,
        "the message names the operator's type: %s", ncclGetLastError(comm));
  CHECK(ib[0] == -1, "the int32 AllReduce ran with a float32 PreMulSum (%d)", ib[0]);
  INVALID(ncclReduceScatter(ia, ib, 1, ncclInt32, pm, comm, NULL));
  float fa[8], fb[8];
  for (int i = 0; i < 8; i++) fa[i] = 1.0f;
  OK(ncclAllReduce(fa, fb, 8, ncclFloat, pm, comm, NULL));
  CHECK(fb[0] == 2.0f * (float)nranks, "float32 PreMulSum: %f", fb[0]);
  OK(ncclRedOpDestroy(pm, comm));
}

int main(void) {
  ncclUniqueId id;
  read_rank_env("NCCL_TEST_ID", &id);
  ncclComm_t comm = NULL;
  OK(ncclCommInitRank(&comm, nranks, id, rank));
  test_overflow(comm);
  test_group(comm);
  test_last_error(comm);
  test_premulsum_type(comm);
  OK(ncclCommDestroy(comm));
  return finish();
}
