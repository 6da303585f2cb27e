/* A C profiler plugin of NCCL's profiler ABI v7 (NCCL 2.32), for rustccl's test of the
 * per-call profiler tag (ncclCollConfig_t::userProfilerTag, v7's userTag).
 *
 * It exports ncclProfiler_v7 (name "c-tagger") and ncclProfiler_v6 (name "c-tagger-v6"): a
 * host that prefers the newest version, as NCCL does, takes v7. Both ask for CollApi, P2pApi,
 * Coll, P2p and v7's KernelPhase, and write one line per API / Coll / P2p event to the file
 * named by RUSTCCL_C_PROFILER_OUT, suffixed with ".<rank>":
 *   "init v<version> rank <rank>" at init,
 *   "<CollApi|P2pApi|Coll|P2p> <func> <count> <tag>" at each start (tag "-" through v6,
 *     which has no tag), and "KernelPhase" for any KernelPhase event (rustccl sends none),
 *   "finalize" at finalize.
 *
 * The declarations below are this file's own, written from the layout NCCL's v7 header
 * defines: type, parent, rank, then a union whose collApi member is {func, count, datatype,
 * root, stream, graphCaptured, userTag}, p2pApi {func, count, datatype, stream,
 * graphCaptured, userTag}, coll {seqNumber, func, sendBuff, recvBuff, count, root, datatype,
 * nChannels, nWarps, algo, proto, parentGroup, kernelVariant, isSymColl, userTag} and p2p
 * {func, buff, datatype, count, peer, nChannels, parentGroup, userTag}; v6's members are
 * the same without the fields after parentGroup / graphCaptured. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int result_t; /* ncclResult_t: 0 = success, 3 = internal error */
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

enum {
  COLL = 1 << 1,
  P2P = 1 << 2,
  COLL_API = 1 << 9,
  P2P_API = 1 << 10,
  KERNEL_PHASE = 1 << 15,
};

struct coll_api {
  const char* func;
  size_t count;
  const char* datatype;
  int root;
  void* stream;
  bool graph_captured;
  uint64_t user_tag; /* v7 */
};

struct p2p_api {
  const char* func;
  size_t count;
  const char* datatype;
  void* stream;
  bool graph_captured;
  uint64_t user_tag; /* v7 */
};

struct coll {
  uint64_t seq;
  const char* func;
  const void* send;
  void* recv;
  size_t count;
  int root;
  const char* datatype;
  uint8_t channels;
  uint8_t warps;
  const char* algo;
  const char* proto;
  void* group;
  const char* kernel_variant; /* v7 */
  bool is_sym_coll;           /* v7 */
  uint64_t user_tag;          /* v7 */
};

struct p2p {
  const char* func;
  void* buff;
  const char* datatype;
  size_t count;
  int peer;
  uint8_t channels;
  void* group;
  uint64_t user_tag; /* v7 */
};

struct descr {
  uint64_t type;
  void* parent;
  int rank;
  union {
    struct coll_api coll_api;
    struct p2p_api p2p_api;
    struct coll coll;
    struct p2p p2p;
    uint64_t room[16];
  } u;
};

_Static_assert(offsetof(struct coll_api, user_tag) == 48, "collApi.userTag");
_Static_assert(offsetof(struct p2p_api, user_tag) == 40, "p2pApi.userTag");
_Static_assert(offsetof(struct coll, kernel_variant) == 88, "coll.kernelVariant");
_Static_assert(offsetof(struct coll, user_tag) == 104, "coll.userTag");
_Static_assert(offsetof(struct p2p, user_tag) == 48, "p2p.userTag");
_Static_assert(offsetof(struct descr, u) == 24, "the union");

struct context {
  FILE* out;
  int version;
};

static result_t init(void** ctx, int version, int* mask, int rank) {
  const char* base = getenv("RUSTCCL_C_PROFILER_OUT");
  if (base == NULL) return 3;
  char path[4096];
  snprintf(path, sizeof path, "%s.%d", base, rank);
  struct context* c = calloc(1, sizeof *c);
  if (c == NULL || (c->out = fopen(path, "a")) == NULL) return 3;
  c->version = version;
  fprintf(c->out, "init v%d rank %d\n", version, rank);
  *ctx = c;
  *mask = COLL_API | P2P_API | COLL | P2P | KERNEL_PHASE;
  return 0;
}

static result_t init_v7(void** ctx, uint64_t comm_id, int* mask, const char* name, int nnodes, int nranks, int rank,
                        logger_t log) {
  (void)comm_id, (void)name, (void)nnodes, (void)nranks, (void)log;
  return init(ctx, 7, mask, rank);
}

static result_t init_v6(void** ctx, uint64_t comm_id, int* mask, const char* name, int nnodes, int nranks, int rank,
                        logger_t log) {
  (void)comm_id, (void)name, (void)nnodes, (void)nranks, (void)log;
  return init(ctx, 6, mask, rank);
}

/* Prints the tag of a v7 descriptor, "-" for v6 (which has none). */
static void line(struct context* c, const char* type, const char* func, size_t count, uint64_t tag) {
  if (c->version >= 7) {
    fprintf(c->out, "%s %s %zu %llu\n", type, func ? func : "(null)", count, (unsigned long long)tag);
  } else {
    fprintf(c->out, "%s %s %zu -\n", type, func ? func : "(null)", count);
  }
  fflush(c->out);
}

static result_t start_event(void* ctx, void** handle, struct descr* d) {
  struct context* c = ctx;
  *handle = NULL;
  switch (d->type) {
    case COLL_API: line(c, "CollApi", d->u.coll_api.func, d->u.coll_api.count, d->u.coll_api.user_tag); break;
    case P2P_API: line(c, "P2pApi", d->u.p2p_api.func, d->u.p2p_api.count, d->u.p2p_api.user_tag); break;
    case COLL: line(c, "Coll", d->u.coll.func, d->u.coll.count, d->u.coll.user_tag); break;
    case P2P: line(c, "P2p", d->u.p2p.func, d->u.p2p.count, d->u.p2p.user_tag); break;
    case KERNEL_PHASE: fprintf(c->out, "KernelPhase\n"); break;
    default: break;
  }
  return 0;
}

static result_t stop_event(void* handle) {
  (void)handle;
  return 0;
}

static result_t record_event_state(void* handle, int state, void* args) {
  (void)handle, (void)state, (void)args;
  return 0;
}

static result_t finalize(void* ctx) {
  struct context* c = ctx;
  fprintf(c->out, "finalize\n");
  fclose(c->out);
  free(c);
  return 0;
}

struct table {
  const char* name;
  result_t (*init)(void**, uint64_t, int*, const char*, int, int, int, logger_t);
  result_t (*start_event)(void*, void**, struct descr*);
  result_t (*stop_event)(void*);
  result_t (*record_event_state)(void*, int, void*);
  result_t (*finalize)(void*);
};

const struct table ncclProfiler_v7 = {"c-tagger", init_v7, start_event, stop_event, record_event_state, finalize};
const struct table ncclProfiler_v6 = {"c-tagger-v6", init_v6, start_event, stop_event, record_event_state, finalize};
