/* NCCL 2.29/2.30's host API on rustccl's libnccl.so.2 (host backend): parameters, the 2.30
 * ncclConfig_t, suspend/resume and memory statistics, the one-sided calls on a window, and (with
 * the argument "grow") growing a communicator. Each call's bad arguments are checked too: a
 * clear code, and a message in ncclGetLastError.
 *
 * Default mode: NRANKS processes with RANK, NRANKS, NCCL_TEST_ID and NCCL_TEST_ID2 (unique ids
 * in hex) and NCCL_CGA_CLUSTER_SIZE=300 in the environment.
 * "grow": NRANKS existing ranks (RANK < NRANKS) with NCCL_TEST_ID, and one new rank
 * (RANK == NRANKS); rank 0 writes the grow id in hex to the file NCCL_TEST_GROW_FILE, which the
 * new rank waits for. */
#include "test_util.h"

#include <stddef.h>
#include <unistd.h>

#define USAGE(call) CHECK((call) == ncclInvalidUsage, "%s should be ncclInvalidUsage (%s)", #call, ncclGetLastError(NULL))
#define SAYS(text) CHECK(strstr(ncclGetLastError(NULL), text) != NULL, "last error should say \"%s\": %s", text, ncclGetLastError(NULL))

static void test_version_and_codes(void) {
  int v = 0;
  OK(ncclGetVersion(&v));
  CHECK(v == NCCL_VERSION(2, 32, 3) && v == NCCL_VERSION_CODE, "version %d", v);
  CHECK(ncclTimeout == 8 && ncclNumResults == 9, "ncclTimeout %d", (int)ncclTimeout);
  CHECK(strstr(ncclGetErrorString(ncclTimeout), "timed out") != NULL, "string of ncclTimeout: %s", ncclGetErrorString(ncclTimeout));
  /* The 2.30 fields where 2.30.7 put them (api_2_32_test.c checks the 2.32.3 size). */
  CHECK(offsetof(ncclConfig_t, graphStreamOrdering) == 92, "2.30 config layout: graphStreamOrdering at %zu", offsetof(ncclConfig_t, graphStreamOrdering));
  CHECK(offsetof(ncclConfig_t, graphUsageMode) == 80, "graphUsageMode at %zu", offsetof(ncclConfig_t, graphUsageMode));
}

static void test_params(void) {
  ncclParamHandle_t h = NULL, s = NULL;
  OK(ncclParamBind(&h, "NCCL_CGA_CLUSTER_SIZE"));
  int8_t i8 = 0;
  int16_t i16 = 0;
  int32_t i32 = 0;
  int64_t i64 = 0;
  uint8_t u8 = 0;
  uint16_t u16 = 0;
  uint32_t u32 = 0;
  uint64_t u64 = 0;
  OK(ncclParamGetI16(h, &i16));
  OK(ncclParamGetI32(h, &i32));
  OK(ncclParamGetI64(h, &i64));
  OK(ncclParamGetU16(h, &u16));
  OK(ncclParamGetU32(h, &u32));
  OK(ncclParamGetU64(h, &u64));
  CHECK(i16 == 300 && i32 == 300 && i64 == 300 && u16 == 300 && u32 == 300 && u64 == 300, "NCCL_CGA_CLUSTER_SIZE=300 read as %d", (int)i32);
  INVALID(ncclParamGetI8(h, &i8));
  SAYS("does not fit in i8");
  INVALID(ncclParamGetU8(h, &u8));
  INVALID(ncclParamGetI32(h, NULL));
  SAYS("out is NULL");
  INVALID(ncclParamGetI32(NULL, &i32));
  SAYS("handle is NULL");
  INVALID(ncclParamGetI32((ncclParamHandle_t)&i32, &i32));
  SAYS("not a parameter handle");
  const char* text = NULL;
  INVALID(ncclParamGetStr(h, &text));
  SAYS("integer parameter");
  /* Raw value: an int64_t. */
  int64_t raw = 0;
  int len = 0;
  OK(ncclParamGet(h, &raw, sizeof raw, &len));
  CHECK(len == 8 && raw == 300, "raw %lld len %d", (long long)raw, len);
  len = 0;
  INVALID(ncclParamGet(h, &raw, 4, &len));
  CHECK(len == 8, "too small a buffer says the size needed: %d", len);
  INVALID(ncclParamGet(h, &raw, 8, NULL));
  /* A string parameter. */
  OK(ncclParamBind(&s, "NCCL_SOCKET_IFNAME"));
  OK(ncclParamGetStr(s, &text));
  CHECK(text && strcmp(text, "lo") == 0, "NCCL_SOCKET_IFNAME %s", text ? text : "(null)");
  INVALID(ncclParamGetI64(s, &i64));
  SAYS("string parameter");
  char buf[16];
  OK(ncclParamGet(s, buf, sizeof buf, &len));
  CHECK(len == 3 && strcmp(buf, "lo") == 0, "raw string len %d", len);
  /* Defaults, and values set later. */
  ncclParamHandle_t p2p = NULL;
  OK(ncclParamBind(&p2p, "NCCL_P2P_DISABLE"));
  OK(ncclParamGetI32(p2p, &i32));
  CHECK(i32 == 0, "NCCL_P2P_DISABLE default %d", i32);
  setenv("NCCL_P2P_DISABLE", "abc", 1);
  INVALID(ncclParamGetI32(p2p, &i32));
  SAYS("NCCL_P2P_DISABLE=\"abc\"");
  unsetenv("NCCL_P2P_DISABLE");
  /* Unknown keys and NULL pointers. */
  ncclParamHandle_t none = (ncclParamHandle_t)&len;
  INVALID(ncclParamBind(&none, "NCCL_NO_SUCH_PARAM"));
  SAYS("NCCL_NO_SUCH_PARAM");
  CHECK(none == (ncclParamHandle_t)&len, "a failed bind leaves *out alone");
  INVALID(ncclParamBind(NULL, "NCCL_DEBUG"));
  INVALID(ncclParamBind(&none, NULL));
  SAYS("key is NULL");
  /* Key-based access. */
  const char* value = NULL;
  int vlen = -1;
  OK(ncclParamGetParameter("NCCL_CGA_CLUSTER_SIZE", &value, &vlen));
  CHECK(value && strcmp(value, "300") == 0 && vlen == 3, "by key: %s (%d)", value ? value : "(null)", vlen);
  OK(ncclParamGetParameter("NCCL_NET", &value, &vlen));
  CHECK(value && value[0] == '\0' && vlen == 0, "an unset string is empty: %d", vlen);
  INVALID(ncclParamGetParameter("NCCL_NO_SUCH_PARAM", &value, &vlen));
  INVALID(ncclParamGetParameter("NCCL_DEBUG", NULL, &vlen));
  /* Key lists: published ones, then all. */
  const char** keys = NULL;
  int nkeys = 0, shm = 0, backend = 0;
  OK(ncclParamGetAllParameterKeys(&keys, &nkeys));
  for (int i = 0; i < nkeys; i++) shm |= strcmp(keys[i], "NCCL_SHM_DISABLE") == 0, backend |= strcmp(keys[i], "RUSTCCL_BACKEND") == 0;
  CHECK(nkeys > 10 && shm && !backend, "published keys: %d, NCCL_SHM_DISABLE %d, RUSTCCL_BACKEND %d", nkeys, shm, backend);
  setenv("NCCL_PARAM_DUMP_ALL", "true", 1);
  int nall = 0;
  OK(ncclParamGetAllParameterKeys(&keys, &nall));
  backend = 0;
  for (int i = 0; i < nall; i++) backend |= strcmp(keys[i], "RUSTCCL_BACKEND") == 0;
  CHECK(nall > nkeys && backend, "all keys: %d", nall);
  ncclParamDumpAll();
  unsetenv("NCCL_PARAM_DUMP_ALL");
  INVALID(ncclParamGetAllParameterKeys(NULL, &nall));
  INVALID(ncclParamGetAllParameterKeys(&keys, NULL));
}

/* The 2.30 config's fields, and an older caller's smaller one. */
static ncclComm_t test_config(ncclUniqueId id1, ncclUniqueId id2) {
  ncclComm_t c = NULL;
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.graphUsageMode = 5;
  INVALID(ncclCommInitRankConfig(&c, nranks, id1, rank, &bad));
  SAYS("graphUsageMode");
  ncclConfig_t unordered = NCCL_CONFIG_INITIALIZER;
  unordered.graphStreamOrdering = 0; /* with graph mixing (graphUsageMode 2 by default): refused */
  INVALID(ncclCommInitRankConfig(&c, nranks, id1, rank, &unordered));
  SAYS("graphStreamOrdering");
  ncclConfig_t rma = NCCL_CONFIG_INITIALIZER;
  rma.numRmaCtx = -1;
  INVALID(ncclCommInitRankConfig(&c, nranks, id1, rank, &rma));

  /* A 2.28 caller: its struct ends before graphUsageMode, whatever lies after is not read. */
  ncclConfig_t old = NCCL_CONFIG_INITIALIZER;
  old.size = offsetof(ncclConfig_t, graphUsageMode);
  old.version = NCCL_VERSION(2, 28, 9);
  old.graphUsageMode = 99;
  old.graphStreamOrdering = 42;
  OK(ncclCommInitRankConfig(&c, nranks, id1, rank, &old));
  float x = 1.0f;
  OK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, c, NULL));
  CHECK(x == (float)nranks, "all-reduce on the 2.28-config comm %f", x);
  OK(ncclCommDestroy(c));

  /* Every 2.30 field set: accepted (rustccl does not act on them; logged once). */
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.graphUsageMode = 1;
  cfg.numRmaCtx = 2;
  cfg.maxP2pPeers = 1;
  cfg.graphStreamOrdering = 0;
  c = NULL;
  OK(ncclCommInitRankConfig(&c, nranks, id2, rank, &cfg));
  return c;
}

static uint64_t stat(ncclComm_t comm, ncclCommMemStat_t s) {
  uint64_t v = 12345;
  OK(ncclCommMemStats(comm, s, &v));
  return v;
}

static void test_suspend(ncclComm_t comm) {
  /* Reduces of 256 KiB to each rank in turn: above the host backend's board of small
     collectives and never a single copy between the ranks' buffers, so every rank makes the
     FIFOs it receives on. */
  const size_t n = 65536;
  float* a = (float*)calloc(n, sizeof(float));
  for (int root = 0; root < nranks; root++) {
    for (size_t i = 0; i < n; i++) a[i] = (float)(rank + 1);
    OK(ncclReduce(a, a, n, ncclFloat, ncclSum, root, comm, NULL));
    CHECK(rank != root || a[n - 1] == (float)(nranks * (nranks + 1) / 2), "reduce to %d before suspend %f", root, a[n - 1]);
  }

  uint64_t v;
  INVALID(ncclCommMemStats(comm, ncclStatGpuMemTotal, NULL));
  SAYS("value is NULL");
  INVALID(ncclCommMemStats(comm, (ncclCommMemStat_t)9, &v));
  SAYS("ncclCommMemStat_t");
  INVALID(ncclCommMemStats(NULL, ncclStatGpuMemTotal, &v));
  uint64_t held = stat(comm, ncclStatGpuMemSuspend), kept = stat(comm, ncclStatGpuMemPersist);
  uint64_t total = stat(comm, ncclStatGpuMemTotal);
  CHECK(total == held + kept, "total %llu = %llu + %llu", (unsigned long long)total, (unsigned long long)held, (unsigned long long)kept);
  CHECK(stat(comm, ncclStatGpuMemSuspended) == 0, "not suspended yet");
  /* With peers, the FIFOs the all-reduce made are held. */
  CHECK(nranks == 1 || held > 0, "FIFO memory held: %llu", (unsigned long long)held);

  INVALID(ncclCommSuspend(comm, 0x6));
  SAYS("NCCL_SUSPEND_MEM");
  USAGE(ncclCommResume(comm));
  SAYS("not suspended");
  INVALID(ncclCommSuspend(NULL, NCCL_SUSPEND_MEM));

  OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  CHECK(stat(comm, ncclStatGpuMemSuspended) == 1, "suspended");
  CHECK(stat(comm, ncclStatGpuMemSuspend) == 0, "nothing suspendable held while suspended");
  CHECK(stat(comm, ncclStatGpuMemTotal) == kept, "total while suspended: the persistent part");
  CHECK(nranks == 1 || stat(comm, ncclStatGpuMemTotal) < total, "memory dropped");
  USAGE(ncclAllReduce(a, a, n, ncclFloat, ncclSum, comm, NULL));
  CHECK(strstr(ncclGetLastError(comm), "suspended") != NULL, "the comm's last error says why: %s", ncclGetLastError(comm));
  USAGE(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  SAYS("suspended");

  OK(ncclCommResume(comm));
  CHECK(stat(comm, ncclStatGpuMemSuspended) == 0, "resumed");
  CHECK(nranks == 1 || stat(comm, ncclStatGpuMemSuspend) == held, "FIFOs made again: %llu", (unsigned long long)stat(comm, ncclStatGpuMemSuspend));
  for (size_t i = 0; i < n; i++) a[i] = (float)(rank + 2);
  OK(ncclAllReduce(a, a, n, ncclFloat, ncclSum, comm, NULL));
  CHECK(a[0] == (float)(nranks * (nranks + 3) / 2) && a[n - 1] == a[0], "all-reduce after resume %f", a[0]);
  /* A flags-0 suspend suspends nothing (as NCCL). */
  OK(ncclCommSuspend(comm, 0));
  CHECK(stat(comm, ncclStatGpuMemSuspended) == 0, "flags 0 suspends nothing");
  free(a);
}

/* One-sided operations (2.29) on a symmetric window: rounds of a ring of puts with signals
 * and waits (bytes exact; a rank alone puts to itself), a signal without data, and the bad
 * arguments (each ncclInvalidArgument with a message, nothing sent). */
static void test_one_sided(ncclComm_t comm) {
  enum { BYTES = 1 << 20, COUNT = 1024, RECV = 65536, ROUNDS = 3 };
  int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
  void* buf = NULL;
  ncclWindow_t win = NULL;
  OK(ncclMemAlloc(&buf, BYTES));
  OK(ncclCommWindowRegister(comm, buf, BYTES, &win, NCCL_WIN_COLL_SYMMETRIC));
  float* f = (float*)buf;
  for (int round = 0; round < ROUNDS; round++) {
    for (int i = 0; i < COUNT; i++) f[i] = (float)(rank * 100000 + round * 10000 + i);
    OK(ncclPutSignal(buf, COUNT, ncclFloat, right, win, RECV + round * COUNT * 4, 0, 0, 0, comm, NULL));
    ncclWaitSignalDesc_t d = {1, left, 0, 0};
    OK(ncclWaitSignal(1, &d, comm, NULL));
    const float* got = (const float*)((char*)buf + RECV + round * COUNT * 4);
    int exact = 1;
    for (int i = 0; i < COUNT; i++) exact &= got[i] == (float)(left * 100000 + round * 10000 + i);
    CHECK(exact, "round %d: rank %d's put arrived as %f %f", round, left, got[0], got[COUNT - 1]);
  }
  OK(ncclSignal(right, 0, 0, 0, comm, NULL));
  ncclWaitSignalDesc_t one = {1, left, 0, 0};
  OK(ncclWaitSignal(1, &one, comm, NULL));

  float x = 0;
  INVALID(ncclPutSignal(buf, 1, ncclFloat, right, win, RECV, 0, 0, 1, comm, NULL));
  SAYS("flags");
  INVALID(ncclPutSignal(buf, 1, ncclFloat, right, win, RECV, 1, 0, 0, comm, NULL));
  SAYS("signal index 1");
  INVALID(ncclSignal(right, 0, 1, 0, comm, NULL));
  SAYS("context 1");
  INVALID(ncclPutSignal(buf, 1, ncclFloat, nranks, win, RECV, 0, 0, 0, comm, NULL));
  SAYS("out of range");
  INVALID(ncclPutSignal(buf, 1, ncclFloat, right, NULL, RECV, 0, 0, 0, comm, NULL));
  INVALID(ncclPutSignal(NULL, 1, ncclFloat, right, win, RECV, 0, 0, 0, comm, NULL));
  INVALID(ncclPutSignal(buf, 2, ncclFloat, right, win, BYTES - 4, 0, 0, 0, comm, NULL));
  SAYS("past the end of the peer window");
  INVALID(ncclPutSignal(&x, 1, ncclFloat, right, win, RECV, 0, 0, 0, comm, NULL));
  SAYS("NCCL_WIN_COLL_SYMMETRIC");
  ncclWaitSignalDesc_t zero = {0, left, 0, 0};
  INVALID(ncclWaitSignal(1, &zero, comm, NULL));
  SAYS("opCnt");
  INVALID(ncclWaitSignal(0, &one, comm, NULL));
  INVALID(ncclWaitSignal(1, NULL, comm, NULL));
  /* Nothing was sent by the bad calls: one more round matches. */
  OK(ncclSignal(right, 0, 0, 0, comm, NULL));
  OK(ncclWaitSignal(1, &one, comm, NULL));
  OK(ncclCommWindowDeregister(comm, win));
  OK(ncclMemFree(buf));
  /* Not a window. */
  void* p = &x;
  INVALID(ncclWinGetUserPtr(comm, NULL, &p));
  CHECK(p == NULL, "no user pointer");
}

/* Two (NRANKS) ranks grow to NRANKS+1: the new one is RANK == NRANKS. */
static int run_grow(void) {
  ncclUniqueId id, gid;
  read_rank_env("NCCL_TEST_ID", &id);
  const char* file = getenv("NCCL_TEST_GROW_FILE");
  int old_n = nranks, new_n = nranks + 1;
  ncclComm_t grown = NULL, g = NULL;
  if (rank < old_n) {
    ncclComm_t comm = NULL;
    OK(ncclCommInitRank(&comm, old_n, id, rank));
    /* Bad arguments: refused before anything (local), or by every rank alike (collective). */
    INVALID(ncclCommGrow(comm, new_n, NULL, 0, &g, NULL));
    SAYS("rank -1");
    INVALID(ncclCommGrow(comm, new_n, NULL, -1, NULL, NULL));
    INVALID(ncclCommGetUniqueId(comm, NULL));
    INVALID(ncclCommGrow(comm, old_n, NULL, -1, &g, NULL));
    SAYS("must be larger");
    CHECK(g == NULL, "no communicator from a failed grow");
    USAGE(ncclCommGrow(comm, new_n, NULL, -1, &g, NULL));
    SAYS("ncclCommGetUniqueId");
    if (rank == 0) {
      OK(ncclCommGetUniqueId(comm, &gid));
      ncclUniqueId again;
      USAGE(ncclCommGetUniqueId(comm, &again));
      SAYS("not been used yet");
      char tmp[4096];
      snprintf(tmp, sizeof tmp, "%s.tmp", file);
      FILE* f = fopen(tmp, "w");
      for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) fprintf(f, "%02x", (unsigned char)gid.internal[i]);
      fclose(f);
      rename(tmp, file);
    }
    OK(ncclCommGrow(comm, new_n, rank == 0 ? &gid : NULL, -1, &grown, NULL));
    /* The old communicator still works. */
    float x = 1.0f;
    OK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL));
    CHECK(x == (float)old_n, "old comm after grow %f", x);
    OK(ncclCommDestroy(comm));
  } else {
    /* The new rank: the id arrives through the file. */
    char hex[2 * NCCL_UNIQUE_ID_BYTES + 1] = {0};
    for (int tries = 0; tries < 6000; tries++) {
      FILE* f = fopen(file, "r");
      if (f) {
        size_t got = fread(hex, 1, sizeof hex - 1, f);
        fclose(f);
        if (got == sizeof hex - 1) break;
      }
      usleep(10000);
    }
    hex_to_id(hex, &gid);
    INVALID(ncclCommGrow(NULL, new_n, NULL, rank, &g, NULL));
    SAYS("uniqueId is NULL");
    INVALID(ncclCommGrow(NULL, new_n, &gid, new_n, &g, NULL));
    SAYS("out of range");
    OK(ncclCommGrow(NULL, new_n, &gid, rank, &grown, NULL));
  }
  int count = 0, me = -1;
  OK(ncclCommCount(grown, &count));
  OK(ncclCommUserRank(grown, &me));
  CHECK(count == new_n && me == rank, "grown comm: count %d rank %d", count, me);
  float v = (float)(rank + 1);
  OK(ncclAllReduce(&v, &v, 1, ncclFloat, ncclSum, grown, NULL));
  CHECK(v == (float)(new_n * (new_n + 1) / 2), "all-reduce on the grown comm %f", v);
  int mine = rank * 10, all[16] = {0};
  OK(ncclAllGather(&mine, all, 1, ncclInt32, grown, NULL));
  int ordered = 1;
  for (int r = 0; r < new_n; r++) ordered &= all[r] == r * 10;
  CHECK(ordered, "old ranks first, in their order, then the new one: %d %d %d", all[0], all[1], all[2]);
  OK(ncclCommDestroy(grown));
  return finish();
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "grow") == 0) return run_grow();
  ncclUniqueId id1, id2;
  read_rank_env("NCCL_TEST_ID", &id1);
  hex_to_id(getenv("NCCL_TEST_ID2"), &id2);
  test_version_and_codes();
  test_params();
  ncclComm_t comm = test_config(id1, id2);
  test_suspend(comm);
  test_one_sided(comm);
  OK(ncclCommDestroy(comm));
  return finish();
}
