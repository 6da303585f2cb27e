/* A tuner for NCCL's C tuner ABI, written for rustccl's loader tests and compiled by them at
 * test time (cc -shared -fPIC). One source, one ABI version per build:
 *
 *   -DTUNER_VERSION=2..6   which ncclTunerPlugin_vN table to export (default 5)
 *   -DTUNER_INIT_FAILS     init returns ncclInternalError (the loader must skip the tuner)
 *   -DTUNER_NULL_COLL_INFO the table's getCollInfo is NULL (the loader must refuse it)
 *
 * Rule: an AllReduce of at most RUSTCCL_C_TUNER_MAX_BYTES bytes (default 65536) runs as
 * TREE/LL on RUSTCCL_C_TUNER_CHANNELS channels (default 2); everything else is left to the
 * host. The v5/v6 init also raises one of the tuner constants, which rustccl reports as
 * ignored, and keeps the nvlDomainInfo and constants pointers it is given (NCCL's live as long
 * as the communicator): every later call checks that they still read what they read at init,
 * and aborts with a message if not. The declarations below are this file's own, laid out as NCCL's plugin headers
 * define them. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TUNER_VERSION
#define TUNER_VERSION 5
#endif

typedef int result_t; /* ncclResult_t */
enum { OK = 0, INTERNAL = 3 };
enum { FUNC_ALLREDUCE = 4 };
enum { ALGO_TREE = 0, ALGO_COUNT = 7 };
enum { PROTO_LL = 0, PROTO_COUNT = 3 };
enum { LOG_INFO = 3 };
#define SUBSYS_TUNING 0x40UL

typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

typedef struct {
  int domains, minRanks, maxRanks;
} nvl_info_t;

typedef struct {
  double base[ALGO_COUNT][PROTO_COUNT];
  double hw[3][ALGO_COUNT][PROTO_COUNT];
  double bws[5][4][3];
} constants_t;

struct state {
  size_t maxBytes;
  int channels;
  /* v5+: init's pointers, kept, and what they read at the end of init. */
  const nvl_info_t* nvl;
  const constants_t* constants;
  nvl_info_t nvlSeen;
  constants_t constantsSeen;
};

static void check_kept(const struct state* s, const char* call) {
  if ((s->nvl && memcmp(s->nvl, &s->nvlSeen, sizeof s->nvlSeen) != 0) ||
      (s->constants && memcmp(s->constants, &s->constantsSeen, sizeof s->constantsSeen) != 0)) {
    fprintf(stderr, "c-tuner: at %s, the nvlDomainInfo or constants init was given no longer read the same\n", call);
    fflush(stderr);
    abort();
  }
}

__attribute__((unused)) static size_t env_size(const char* name, size_t dflt) {
  const char* v = getenv(name);
  return v && *v ? (size_t)strtoull(v, NULL, 0) : dflt;
}

static result_t start(size_t nRanks, size_t nNodes, logger_t log, void** ctx) {
#ifdef TUNER_INIT_FAILS
  if (log) log(LOG_INFO, SUBSYS_TUNING, __FILE__, __LINE__, "c-tuner: failing init on purpose");
  (void)nRanks; (void)nNodes; (void)ctx;
  return INTERNAL;
#else
  struct state* s = malloc(sizeof *s);
  if (!s) return INTERNAL;
  s->maxBytes = env_size("RUSTCCL_C_TUNER_MAX_BYTES", 65536);
  s->channels = (int)env_size("RUSTCCL_C_TUNER_CHANNELS", 2);
  s->nvl = NULL;
  s->constants = NULL;
  *ctx = s;
  if (log)
    log(LOG_INFO, SUBSYS_TUNING, __FILE__, __LINE__, "c-tuner: v%d init for %zu ranks on %zu nodes, AllReduce <= %zu B -> TREE/LL x %d",
        TUNER_VERSION, nRanks, nNodes, s->maxBytes, s->channels);
  return OK;
#endif
}

static int in_range(void* ctx, int coll, size_t nBytes) {
  struct state* s = ctx;
  return coll == FUNC_ALLREDUCE && nBytes <= s->maxBytes;
}

/* v3+: the table is the address of a float[numAlgo][numProto] array. */
__attribute__((unused)) static result_t edit_table(void* ctx, int coll, size_t nBytes, float** table, int numAlgo, int numProto, int* nChannels) {
  check_kept(ctx, "getCollInfo");
  if (!in_range(ctx, coll, nBytes) || numAlgo <= ALGO_TREE || numProto <= PROTO_LL) return OK;
  float* cost = (float*)table;
  float* entry = &cost[ALGO_TREE * numProto + PROTO_LL];
  if (*entry >= 0.0f) *entry = 0.0f;
  *nChannels = ((struct state*)ctx)->channels;
  return OK;
}

static result_t stop(void* ctx) {
  check_kept(ctx, "finalize");
  free(ctx);
  return OK;
}

#if TUNER_VERSION <= 4
static result_t init_old(size_t nRanks, size_t nNodes, logger_t log, void** ctx) { return start(nRanks, nNodes, log, ctx); }
#else
static result_t init_new(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, logger_t log, nvl_info_t* nvl,
                         constants_t* constants) {
  (void)commId;
  result_t r = start(nRanks, nNodes, log, ctx);
  if (r == OK && log && nvl)
    log(LOG_INFO, SUBSYS_TUNING, __FILE__, __LINE__, "c-tuner: %d NVLink domains of %d..%d ranks", nvl->domains, nvl->minRanks,
        nvl->maxRanks);
  if (constants) constants->base[ALGO_TREE][PROTO_LL] += 1.0;
  if (r == OK) {
    struct state* s = *ctx;
    s->nvl = nvl;
    s->constants = constants;
    if (nvl) s->nvlSeen = *nvl;
    if (constants) s->constantsSeen = *constants;
  }
  return r;
}
#endif

#if TUNER_VERSION == 2
static result_t coll_info_v2(void* ctx, int coll, size_t nBytes, int collNet, int nvls, int numPipeOps, int* algo, int* proto,
                             int* nChannels) {
  (void)collNet; (void)nvls; (void)numPipeOps;
  if (!in_range(ctx, coll, nBytes)) return OK;
  *algo = ALGO_TREE;
  *proto = PROTO_LL;
  *nChannels = ((struct state*)ctx)->channels;
  return OK;
}
struct { const char* name; void* init; void* getCollInfo; void* destroy; } ncclTunerPlugin_v2 = {
    "c-tuner", (void*)init_old, (void*)coll_info_v2, (void*)stop};
#elif TUNER_VERSION == 3
static result_t coll_info_v3(void* ctx, int coll, size_t nBytes, int numPipeOps, float** table, int numAlgo, int numProto,
                             int* nChannels) {
  (void)numPipeOps;
  return edit_table(ctx, coll, nBytes, table, numAlgo, numProto, nChannels);
}
struct { const char* name; void* init; void* getCollInfo; void* destroy; } ncclTunerPlugin_v3 = {
    "c-tuner", (void*)init_old, (void*)coll_info_v3, (void*)stop};
#else
__attribute__((unused)) static result_t coll_info_v4(void* ctx, int coll, size_t nBytes, int numPipeOps, float** table, int numAlgo, int numProto,
                             int regBuff, int* nChannels) {
  (void)numPipeOps; (void)regBuff;
  return edit_table(ctx, coll, nBytes, table, numAlgo, numProto, nChannels);
}
#ifdef TUNER_NULL_COLL_INFO
#define COLL_INFO_V4 NULL
#else
#define COLL_INFO_V4 (void*)coll_info_v4
#endif
#if TUNER_VERSION == 4
struct { const char* name; void* init; void* getCollInfo; void* destroy; } ncclTunerPlugin_v4 = {
    "c-tuner", (void*)init_old, COLL_INFO_V4, (void*)stop};
#elif TUNER_VERSION == 5
struct { const char* name; void* init; void* getCollInfo; void* finalize; } ncclTunerPlugin_v5 = {
    "c-tuner", (void*)init_new, COLL_INFO_V4, (void*)stop};
#else
/* v6: getChunkSize left NULL (optional). */
struct { const char* name; void* init; void* getCollInfo; void* finalize; void* getChunkSize; } ncclTunerPlugin_v6 = {
    "c-tuner", (void*)init_new, COLL_INFO_V4, (void*)stop, NULL};
#endif
#endif
