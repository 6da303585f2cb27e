/* What the C test programs share: the pass/fail counters and the CHECK, OK and INVALID
 * macros that count (a failed check prints one line naming its file and line), the
 * process's rank and communicator size, a unique id read from hex, and the closing
 * "rank R: N passed, M failed" line the Rust harness looks for.
 *
 * A program whose calls may return ncclInProgress defines TEST_SETTLE(result) before
 * including this header: OK() checks the result it settles to. */
#ifndef RUSTCCL_TEST_UTIL_H
#define RUSTCCL_TEST_UTIL_H

#include "nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed = 0, failed = 0, rank = 0, nranks = 1;

#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (cond) {                                                       \
      passed++;                                                       \
    } else {                                                          \
      failed++;                                                       \
      printf("rank %d FAIL %s:%d: ", rank, __FILE__, __LINE__);       \
      printf(__VA_ARGS__);                                            \
      printf("\n");                                                   \
    }                                                                 \
  } while (0)

#ifndef TEST_SETTLE
#define TEST_SETTLE(result) (result)
#endif

#define OK(call) CHECK(TEST_SETTLE(call) == ncclSuccess, "%s -> error (%s)", #call, ncclGetLastError(NULL))
#define INVALID(call) CHECK((call) == ncclInvalidArgument, "%s should be ncclInvalidArgument (%s)", #call, ncclGetLastError(NULL))

/* The unique id a test harness passed as 2 hex digits per byte. */
static inline void hex_to_id(const char* hex, ncclUniqueId* id) {
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
    unsigned v;
    sscanf(hex + 2 * i, "%2x", &v);
    id->internal[i] = (char)v;
  }
}

/* Sets rank and nranks from RANK and NRANKS, and reads the unique id in the environment
 * variable id_var. */
static inline void read_rank_env(const char* id_var, ncclUniqueId* id) {
  rank = atoi(getenv("RANK"));
  nranks = atoi(getenv("NRANKS"));
  hex_to_id(getenv(id_var), id);
}

/* Prints the closing line; the process's exit status: 0 when no check failed. */
static inline int finish(void) {
  printf("rank %d: %d passed, %d failed\n", rank, passed, failed);
  return failed == 0 ? 0 : 1;
}

#endif
