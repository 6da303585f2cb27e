/* A one-rank stand-in for libnccl.so.2, for the C-ABI driver's tests: it checks the
 * arguments the benchmark passes (types, operators, roots, peers, the by-value unique id, the
 * NULL stream of --host-memory or the mock runtime's, PreMulSum's scalar) and copies, which is what every operation
 * does on one rank. MOCK_NCCL_FAIL=<function name> makes that function fail. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct mockComm { int nranks, rank, nextOp; } *ncclComm_t;

static int depth = 0;
static struct { int isSend; void* buf; size_t count; int type; } q[4096];
static int nq = 0;
static const char* lastError = "";

static size_t tsize(int t) {
  switch (t) {
    case 0: case 1: case 10: case 11: return 1;
    case 6: case 9: return 2;
    case 2: case 3: case 7: return 4;
    case 4: case 5: case 8: return 8;
  }
  return 0;
}

static int fail(const char* fn, const char* why) {
  lastError = why;
  (void)fn;
  return 4; /* ncclInvalidArgument */
}

static int forced(const char* fn) {
  const char* f = getenv("MOCK_NCCL_FAIL");
  if (f && strcmp(f, fn) == 0) { lastError = "forced failure"; return 1; }
  return 0;
}

/* The stream every call must come on: NULL (--host-memory), or MOCK_NCCL_STREAM (hex) when
 * the benchmark runs on the mock CUDA runtime (tests/mock_cudart.c). */
static void* expectedStream(void) {
  const char* s = getenv("MOCK_NCCL_STREAM");
  return s ? (void*)(uintptr_t)strtoull(s, NULL, 16) : NULL;
}

#define CHECK(fn, t, c, st) do { \
    if (forced(fn)) return 3; \
    if (tsize(t) == 0) return fail(fn, "bad datatype"); \
    if ((c) == NULL || (c)->nranks != 1) return fail(fn, "bad communicator"); \
    if ((st) != expectedStream()) return fail(fn, "stream is not the expected one"); \
  } while (0)

static int checkOp(ncclComm_t c, int op) { return op >= 0 && op < c->nextOp ? 0 : fail("op", "bad operator"); }

static int copy(const void* s, void* r, size_t bytes) {
  if (bytes && (s == NULL || r == NULL)) return fail("copy", "NULL buffer");
  if (bytes && s != r) memmove(r, s, bytes);
  return 0;
}

int ncclGetVersion(int* v) { *v = 23203; return 0; }
const char* ncclGetErrorString(int r) { return r == 0 ? "no error" : r == 3 ? "internal error (mock)" : "invalid argument (mock)"; }
const char* ncclGetLastError(ncclComm_t c) { (void)c; return lastError; }

int ncclGetUniqueId(ncclUniqueId* id) {
  for (int i = 0; i < 128; i++) id->internal[i] = (char)(i * 5 + 1);
  return 0;
}

int ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (forced("ncclCommInitRank")) return 3;
  for (int i = 0; i < 128; i++)
    if (id.internal[i] != (char)(i * 5 + 1)) return fail("init", "the unique id changed on its way");
  if (nranks != 1 || rank != 0) return fail("init", "the mock has one rank");
  *comm = calloc(1, sizeof(**comm));
  (*comm)->nranks = 1;
  (*comm)->nextOp = 5;
  return 0;
}

int ncclCommDestroy(ncclComm_t c) { free(c); return 0; }
int ncclCommUserRank(ncclComm_t c, int* r) { *r = c->rank; return 0; }

int ncclAllReduce(const void* s, void* r, size_t n, int t, int op, ncclComm_t c, void* st) {
  CHECK("ncclAllReduce", t, c, st);
  if (checkOp(c, op)) return 4;
  return copy(s, r, n * tsize(t));
}
int ncclAllGather(const void* s, void* r, size_t n, int t, ncclComm_t c, void* st) {
  CHECK("ncclAllGather", t, c, st);
  return copy(s, r, n * tsize(t));
}
int ncclReduceScatter(const void* s, void* r, size_t n, int t, int op, ncclComm_t c, void* st) {
  CHECK("ncclReduceScatter", t, c, st);
  if (checkOp(c, op)) return 4;
  return copy(s, r, n * tsize(t));
}
int ncclBroadcast(const void* s, void* r, size_t n, int t, int root, ncclComm_t c, void* st) {
  CHECK("ncclBroadcast", t, c, st);
  if (root != 0) return fail("bcast", "bad root");
  return copy(s, r, n * tsize(t));
}
int ncclReduce(const void* s, void* r, size_t n, int t, int op, int root, ncclComm_t c, void* st) {
  CHECK("ncclReduce", t, c, st);
  if (checkOp(c, op)) return 4;
  if (root != 0) return fail("reduce", "bad root");
  return copy(s, r, n * tsize(t));
}

static int flush(void) {
  int sends[4096], recvs[4096], ns = 0, nr = 0;
  for (int i = 0; i < nq; i++) {
    if (q[i].isSend) sends[ns++] = i; else recvs[nr++] = i;
  }
  nq = 0;
  if (ns != nr) return fail("group", "unmatched send/recv");
  for (int i = 0; i < ns; i++) {
    int a = sends[i], b = recvs[i];
    if (q[a].count != q[b].count || q[a].type != q[b].type) return fail("group", "send/recv mismatch");
    int rc = copy(q[a].buf, q[b].buf, q[a].count * tsize(q[a].type));
    if (rc) return rc;
  }
  return 0;
}

static int p2p(int isSend, const char* fn, const void* buf, size_t n, int t, int peer, ncclComm_t c, void* st) {
  CHECK(fn, t, c, st);
  if (peer != 0) return fail(fn, "bad peer");
  if (nq >= 4096) return fail(fn, "too many");
  q[nq].isSend = isSend; q[nq].buf = (void*)buf; q[nq].count = n; q[nq].type = t; nq++;
  return depth ? 0 : flush();
}
int ncclSend(const void* s, size_t n, int t, int peer, ncclComm_t c, void* st) { return p2p(1, "ncclSend", s, n, t, peer, c, st); }
int ncclRecv(void* r, size_t n, int t, int peer, ncclComm_t c, void* st) { return p2p(0, "ncclRecv", r, n, t, peer, c, st); }

int ncclGroupStart(void) { depth++; return 0; }
int ncclGroupEnd(void) {
  if (depth == 0) return 5;
  return --depth == 0 ? flush() : 0;
}

int ncclRedOpCreatePreMulSum(int* op, void* scalar, int t, int residence, ncclComm_t c) {
  if (residence != 1) return fail("premulsum", "not ncclScalarHostImmediate");
  if (tsize(t) == 0) return fail("premulsum", "bad datatype");
  /* Rank 0's scalar is 1, in the operation's type. */
  static const uint64_t one[12] = {1, 1, 1, 1, 1, 1, 0x3c00, 0x3f800000, 0x3ff0000000000000ull, 0x3f80, 0x38, 0x3c};
  uint64_t v = 0;
  memcpy(&v, scalar, tsize(t));
  if (v != one[t]) return fail("premulsum", "the scalar is not 1 in the operation's type");
  *op = c->nextOp++;
  return 0;
}
int ncclRedOpDestroy(int op, ncclComm_t c) { return op >= 5 && op < c->nextOp ? 0 : 4; }
