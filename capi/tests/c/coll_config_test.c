/* The nccl*Config collectives (NCCL 2.31 / 2.32) on the host backend: ncclCollConfig_t's
 * layout, each of the eight calls with good configs (results checked) and bad ones (refused
 * with ncclInvalidArgument and a message, nothing enqueued, a group not spoiled). Run as
 * NRANKS processes with RANK, NRANKS and NCCL_TEST_ID (the unique id in hex). The harness
 * (c_coll_config.rs) reads the COLL trace the calls log to check that the algorithm and
 * channels asked for are the planner's. Prints a closing "N passed, M failed" line. */
#include "test_util.h"

#include <stdint.h>

/* The layout of NCCL 2.32's struct, at compile time and at run time. */
_Static_assert(sizeof(ncclCollConfig_t) == 72, "ncclCollConfig_t is 72 bytes");
_Static_assert(offsetof(ncclCollConfig_t, ext) == 16, "ext");
_Static_assert(offsetof(ncclCollConfig_t, minCTAs) == 24, "minCTAs");
_Static_assert(offsetof(ncclCollConfig_t, cgaClusterSize) == 36, "cgaClusterSize");
_Static_assert(offsetof(ncclCollConfig_t, algSelection) == 40, "algSelection");
_Static_assert(offsetof(ncclCollConfig_t, forceAlgSelection) == 48, "forceAlgSelection");
_Static_assert(offsetof(ncclCollConfig_t, CTAPolicy) == 52, "CTAPolicy");
_Static_assert(offsetof(ncclCollConfig_t, userProfilerTag) == 56, "userProfilerTag");
_Static_assert(offsetof(ncclCollConfig_t, launchCompletionEvent) == 64, "launchCompletionEvent");

#define N 1024
#define BIG (2 * 1024 * 1024) /* floats: 8 MiB, two channels on the host backend */

static void test_initializer(void) {
  ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;
  CHECK(c.size == 72 && c.magic == 0xcafebeef && c.version == NCCL_VERSION_CODE, "header %zu %#x %u", c.size, c.magic, c.version);
  CHECK(c.ext == NULL && c.minCTAs == INT_MIN && c.maxCTAs == INT_MIN && c.nvlsCTAs == INT_MIN && c.cgaClusterSize == INT_MIN,
        "unset resource fields");
  CHECK(c.algSelection == NULL && c.forceAlgSelection == 1 && c.CTAPolicy == INT_MIN, "selection defaults");
  CHECK(c.userProfilerTag == 0 && c.launchCompletionEvent == NULL, "tag and event");
}

static void fill(float* x, size_t n, float v) {
  for (size_t i = 0; i < n; i++) x[i] = v;
}

/* Every call with a good config gives the plain call's result. */
static void test_good(ncclComm_t comm) {
  static float a[N * 8], b[N * 8];
  float me = (float)(rank + 1), sum = (float)(nranks * (nranks + 1) / 2);
  ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;

  /* AllReduce on the tree (traced as TREE), then on one ring channel of LL128. */
  c.algSelection = "TREE";
  fill(a, N, me), fill(b, N, 0);
  OK(ncclAllReduceConfig(a, b, N, ncclFloat, ncclSum, comm, NULL, &c));
  CHECK(b[0] == sum && b[N - 1] == sum, "AllReduceConfig TREE: %f", b[0]);
  c.algSelection = "ring_ll128";
  c.maxCTAs = 1;
  OK(ncclAllReduceConfig(a, b, N, ncclFloat, ncclSum, comm, NULL, &c));
  CHECK(b[0] == sum, "AllReduceConfig RING_LL128: %f", b[0]);
  c.maxCTAs = INT_MIN;
  c.algSelection = "RING";

  fill(b, N, 0);
  if (rank == 0) fill(a, N, 42);
  OK(ncclBroadcastConfig(a, b, N, ncclFloat, 0, comm, NULL, &c));
  CHECK(b[0] == 42 && b[N - 1] == 42, "BroadcastConfig: %f", b[0]);

  fill(a, N, me), fill(b, N, 0);
  OK(ncclReduceConfig(a, b, N, ncclFloat, ncclSum, nranks - 1, comm, NULL, &c));
  CHECK(rank != nranks - 1 || b[0] == sum, "ReduceConfig at the root: %f", b[0]);

  fill(a, N, me), fill(b, N * nranks, 0);
  OK(ncclAllGatherConfig(a, b, N, ncclFloat, comm, NULL, &c));
  for (int r = 0; r < nranks; r++) CHECK(b[r * N] == (float)(r + 1), "AllGatherConfig block %d: %f", r, b[r * N]);

  fill(a, N * nranks, me), fill(b, N, 0);
  OK(ncclReduceScatterConfig(a, b, N, ncclFloat, ncclSum, comm, NULL, &c));
  CHECK(b[0] == sum && b[N - 1] == sum, "ReduceScatterConfig: %f", b[0]);

  /* AlltoAll, Gather and Scatter have no algorithm names: the rest of the config applies. */
  ncclCollConfig_t p = NCCL_COLLCONFIG_INITIALIZER;
  p.userProfilerTag = 7;
  for (int r = 0; r < nranks; r++) fill(a + r * N, N, (float)(rank * 10 + r));
  fill(b, N * nranks, -1);
  OK(ncclAlltoAllConfig(a, b, N, ncclFloat, comm, NULL, &p));
  for (int r = 0; r < nranks; r++) CHECK(b[r * N] == (float)(r * 10 + rank), "AlltoAllConfig from %d: %f", r, b[r * N]);

  fill(a, N, me), fill(b, N * nranks, 0);
  OK(ncclGatherConfig(a, b, N, ncclFloat, 0, comm, NULL, &p));
  if (rank == 0)
    for (int r = 0; r < nranks; r++) CHECK(b[r * N] == (float)(r + 1), "GatherConfig block %d: %f", r, b[r * N]);

  for (int r = 0; r < nranks; r++) fill(a + r * N, N, (float)(100 + r));
  fill(b, N, 0);
  OK(ncclScatterConfig(a, b, N, ncclFloat, 0, comm, NULL, &p));
  CHECK(b[0] == (float)(100 + rank), "ScatterConfig: %f", b[0]);

  /* A NULL config is the plain call; a 2.31 config (64 bytes, no event) is accepted. */
  fill(a, N, me);
  OK(ncclAllReduceConfig(a, b, N, ncclFloat, ncclSum, comm, NULL, NULL));
  CHECK(b[0] == sum, "AllReduceConfig with NULL: %f", b[0]);
  ncclCollConfig_t old = NCCL_COLLCONFIG_INITIALIZER;
  old.size = 64;
  OK(ncclAllReduceConfig(a, b, N, ncclFloat, ncclSum, comm, NULL, &old));

  /* Fields rustccl does not honour are accepted (and said once at INFO), twice over. */
  ncclConfigExt_t ext = {NULL, {1234, 1}, {5}};
  ncclCollConfig_t u = NCCL_COLLCONFIG_INITIALIZER;
  u.nvlsCTAs = 2, u.cgaClusterSize = 4, u.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY, u.ext = &ext;
  for (int k = 0; k < 2; k++) {
    fill(b, N, 0);
    OK(ncclAllReduceConfig(a, b, N, ncclFloat, ncclSum, comm, NULL, &u));
    CHECK(b[0] == sum, "AllReduceConfig with unhonoured fields: %f", b[0]);
  }
  /* An impossible selection that is not forced falls back to automatic selection. */
  ncclCollConfig_t soft = NCCL_COLLCONFIG_INITIALIZER;
  soft.algSelection = "TREE";
  soft.forceAlgSelection = 0;
  fill(a, N, me), fill(b, N * nranks, 0);
  OK(ncclAllGatherConfig(a, b, N, ncclFloat, comm, NULL, &soft));
  CHECK(b[(nranks - 1) * N] == (float)nranks, "AllGatherConfig TREE unforced: %f", b[(nranks - 1) * N]);
  soft.algSelection = "RING";
  OK(ncclAlltoAllConfig(a, b, N, ncclFloat, comm, NULL, &soft));
}

/* 8 MiB all-reduces: the plain one on the host backend's two channels (traced as "2 ch"),
 * with maxCTAs 1 on one (traced as "1 ch"). */
static void test_channels(ncclComm_t comm) {
  float* a = malloc(sizeof(float) * BIG);
  float* b = malloc(sizeof(float) * BIG);
  fill(a, BIG, 1);
  ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;
  c.maxCTAs = 1;
  OK(ncclAllReduceConfig(a, b, BIG, ncclFloat, ncclSum, comm, NULL, &c));
  CHECK(b[0] == (float)nranks && b[BIG - 1] == (float)nranks, "8 MiB on one channel: %f", b[BIG - 1]);
  c.maxCTAs = INT_MIN;
  c.minCTAs = 2;
  OK(ncclAllReduceConfig(a, b, BIG, ncclFloat, ncclSum, comm, NULL, &c));
  CHECK(b[BIG - 1] == (float)nranks, "8 MiB on two channels: %f", b[BIG - 1]);
  free(a);
  free(b);
}

/* A bad config: ncclInvalidArgument, the reason in ncclGetLastError(comm). */
#define BAD(call, words)                                                                             \
  do {                                                                                               \
    INVALID(call);                                                                                   \
    CHECK(strstr(ncclGetLastError(comm), words) != NULL, "%s: last error \"%s\" lacks \"%s\"", #call, \
          ncclGetLastError(comm), words);                                                            \
  } while (0)

static void test_bad(ncclComm_t comm) {
  static float a[N * 8], b[N * 8];
  ncclCollConfig_t c;
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER, c.size = 8;
  BAD(ncclAllReduceConfig(a, b, N, ncclFloat, ncclSum, comm, NULL, &c), "size is 8");
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER, c.size = 63;
  BAD(ncclBroadcastConfig(a, b, N, ncclFloat, 0, comm, NULL, &c), "size is 63");
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER, c.magic = 0;
  BAD(ncclReduceConfig(a, b, N, ncclFloat, ncclSum, 0, comm, NULL, &c), "magic");
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER, c.forceAlgSelection = 2;
  BAD(ncclAllGatherConfig(a, b, N, ncclFloat, comm, NULL, &c), "forceAlgSelection is 2");
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER, c.CTAPolicy = 4;
  BAD(ncclReduceScatterConfig(a, b, N, ncclFloat, ncclSum, comm, NULL, &c), "CTAPolicy is 4");
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER, c.CTAPolicy = -1;
  BAD(ncclAlltoAllConfig(a, b, N, ncclFloat, comm, NULL, &c), "CTAPolicy is -1");
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER, c.algSelection = "WARP";
  BAD(ncclAllReduceConfig(a, b, N, ncclFloat, ncclSum, comm, NULL, &c), "\"WARP\" is not an algorithm name");
  c.algSelection = "RING+TREE";
  BAD(ncclAllReduceConfig(a, b, N, ncclFloat, ncclSum, comm, NULL, &c), "selects nothing");
  c.algSelection = "TREE";
  BAD(ncclAllGatherConfig(a, b, N, ncclFloat, comm, NULL, &c), "names no algorithm that AllGather has");
  c.algSelection = "NVLS";
  BAD(ncclAllReduceConfig(a, b, N, ncclFloat, ncclSum, comm, NULL, &c), "does not plan");
  c.algSelection = "RING";
  BAD(ncclGatherConfig(a, b, N, ncclFloat, 0, comm, NULL, &c), "names no algorithm that Gather has");
  BAD(ncclScatterConfig(a, b, N, ncclFloat, 0, comm, NULL, &c), "names no algorithm that Scatter has");
  BAD(ncclAlltoAllConfig(a, b, N, ncclFloat, comm, NULL, &c), "names no algorithm that AlltoAll has");
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER, c.launchCompletionEvent = (cudaEvent_t)0x1000;
  BAD(ncclAllReduceConfig(a, b, N, ncclFloat, ncclSum, comm, NULL, &c), "host backend");

  /* A bad config inside a group is refused alone: the group's other operation runs. */
  float me = (float)(rank + 1), sum = (float)(nranks * (nranks + 1) / 2);
  fill(a, N, me), fill(b, N, -1);
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER, c.magic = 1;
  OK(ncclGroupStart());
  OK(ncclAllReduce(a, b, N, ncclFloat, ncclSum, comm, NULL));
  INVALID(ncclAllReduceConfig(a, a, N, ncclFloat, ncclSum, comm, NULL, &c));
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER, c.algSelection = "PAT";
  INVALID(ncclAllReduceConfig(a, a, N, ncclFloat, ncclSum, comm, NULL, &c));
  OK(ncclGroupEnd());
  CHECK(b[0] == sum && b[N - 1] == sum, "the group with refused configs: %f", b[0]);
  CHECK(a[0] == me, "a refused config enqueued nothing: %f", a[0]);
  /* Good configs in a group run with it. */
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER, c.algSelection = "RING";
  fill(b, N * nranks, 0);
  OK(ncclGroupStart());
  OK(ncclAllReduceConfig(a, b, N, ncclFloat, ncclSum, comm, NULL, &c));
  OK(ncclAllGatherConfig(a, b + N, N, ncclFloat, comm, NULL, &c));
  OK(ncclGroupEnd());
  CHECK(b[0] == sum && b[N + (nranks - 1) * N] == (float)nranks, "a group of configured calls: %f %f", b[0], b[N + (nranks - 1) * N]);
  /* A bad config with a NULL communicator is still the config's error (checked first). */
  c = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER, c.magic = 0;
  INVALID(ncclAllReduceConfig(a, b, N, ncclFloat, ncclSum, NULL, NULL, &c));
  CHECK(strstr(ncclGetLastError(NULL), "magic") != NULL, "NULL comm, bad magic: %s", ncclGetLastError(NULL));
  /* The pncclXxx aliases are the same calls. */
  fill(a, N, me);
  OK(pncclAllReduceConfig(a, b, N, ncclFloat, ncclSum, comm, NULL, NULL));
  CHECK(b[0] == sum, "pncclAllReduceConfig: %f", b[0]);
}

int main(void) {
  ncclUniqueId id;
  read_rank_env("NCCL_TEST_ID", &id);
  ncclComm_t comm;
  OK(ncclCommInitRank(&comm, nranks, id, rank));
  test_initializer();
  test_good(comm);
  test_channels(comm);
  test_bad(comm);
  OK(ncclCommDestroy(comm));
  return finish();
}
