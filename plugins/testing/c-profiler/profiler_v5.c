/* A C profiler plugin of NCCL's profiler ABI v5, for rustccl's loader tests.
 *
 * It asks for every event type, counts the events started and stopped per type (atomically:
 * events come from any thread) and the group API states, checks each stopped handle, and at
 * finalize writes the counts to the file named by RUSTCCL_C_PROFILER_OUT, suffixed with
 * ".<rank>". Built with -DPROFILER_INIT_FAILS its init fails.
 *
 * Built with -DPROFILER_NULL_CONTEXT its init succeeds with a NULL context (as NVIDIA's NCCL
 * Inspector does when it is switched off) and asks for every event: NCCL then never calls it
 * again for that communicator, so any later call aborts the process with a message.
 *
 * Built with -DPROFILER_KEEPS_POINTERS it keeps, instead of copying, what NCCL lets a plugin
 * keep: the commName pointer given to init (NCCL's lives as long as the communicator) and the
 * name strings of event descriptors (NCCL's are static). Each event checks at stop that its
 * strings still read what they read at start; at finalize it writes the name read through
 * the kept commName pointer, and the first Coll's strings read through their pointers.
 *
 * The declarations below are this file's own, written from the layout NCCL's v5 header
 * defines (type, parent, rank, then a union whose collective member starts with the sequence
 * number, function name, buffers, count, root, data type, channels, warps, algorithm,
 * protocol and parent group). */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int result_t; /* ncclResult_t: 0 = success, 3 = internal error */
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

struct coll_part {
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
};

/* CollApi, P2pApi and P2p start with the function name and have the data type's name
 * third. */
struct named_part {
  const char* func;
  const void* second;
  const char* datatype;
};

struct descr {
  uint64_t type;
  void* parent;
  int rank;
  union {
    struct coll_part coll;
    struct named_part named;
    uint64_t room[16];
  } u;
};

union state_args {
  size_t trans_size;
  int appended;
  void* data;
  uint64_t timer;
};

#define TYPES 12
#define MAGIC 0x5eed5eedu

static long started[TYPES], stopped[TYPES], bad_stops, named_colls, group_states[2];

#define KEPT 4

struct event {
  unsigned magic;
  int type_bit;
#ifdef PROFILER_KEEPS_POINTERS
  const char* kept[KEPT]; /* pointers from the descriptor */
  char copy[KEPT][64];    /* what they read at start */
#endif
};

struct context {
  int rank;
#ifdef PROFILER_KEEPS_POINTERS
  const char* comm_name;         /* init's pointer, not a copy */
  const char* first_coll[KEPT];  /* the first Coll's func, datatype, algo, proto */
#endif
};

#ifdef PROFILER_NULL_CONTEXT
static void called_after_null_context(const char* what) {
  fprintf(stderr, "c-profiler: %s called for a communicator whose init returned a NULL context\n", what);
  fflush(stderr);
  abort();
}
#endif

#ifdef PROFILER_KEEPS_POINTERS
static long bad_strings, kept_strings;

static void keep_strings(struct context* c, struct event* e, const struct descr* d) {
  memset(e->kept, 0, sizeof e->kept);
  if (d->type == 2) {
    const char* s[KEPT] = {d->u.coll.func, d->u.coll.datatype, d->u.coll.algo, d->u.coll.proto};
    memcpy(e->kept, s, sizeof s);
    if (!c->first_coll[0]) memcpy(c->first_coll, s, sizeof s);
  } else if (d->type == 4 || d->type == 512 || d->type == 1024) {
    e->kept[0] = d->u.named.func;
    e->kept[1] = d->u.named.datatype;
  }
  for (int i = 0; i < KEPT; i++)
    if (e->kept[i]) snprintf(e->copy[i], sizeof e->copy[i], "%s", e->kept[i]);
}

static void check_strings(const struct event* e) {
  for (int i = 0; i < KEPT; i++) {
    if (!e->kept[i]) continue;
    __atomic_fetch_add(&kept_strings, 1, __ATOMIC_RELAXED);
    if (strncmp(e->kept[i], e->copy[i], sizeof e->copy[i]) != 0) __atomic_fetch_add(&bad_strings, 1, __ATOMIC_RELAXED);
  }
}
#endif

static int bit_index(uint64_t type) {
  for (int i = 0; i < TYPES; i++)
    if (type == (1ull << i)) return i;
  return -1;
}

static result_t init(void** ctx, uint64_t comm_id, int* mask, const char* comm_name, int nnodes, int nranks,
                     int rank, logger_t log) {
  (void)comm_id;
  (void)nnodes;
#ifdef PROFILER_INIT_FAILS
  (void)ctx; (void)mask; (void)comm_name; (void)nranks; (void)rank; (void)log;
  return 3;
#elif defined(PROFILER_NULL_CONTEXT)
  (void)comm_name; (void)nranks;
  *ctx = NULL;
  *mask = 0x7fff;
  if (log) log(3, 1ul << 15, __FILE__, __LINE__, "c-profiler: init rank %d returns a NULL context", rank);
  return 0;
#else
  struct context* c = calloc(1, sizeof *c);
  if (!c) return 3;
  c->rank = rank;
#ifdef PROFILER_KEEPS_POINTERS
  c->comm_name = comm_name;
#endif
  *ctx = c;
  /* Every type NCCL's v6 has: the host cuts it to what v5 knows. */
  *mask = 0x7fff;
  if (log) log(3, 1ul << 15, __FILE__, __LINE__, "c-profiler: init rank %d of %d (%s)", rank, nranks,
               comm_name ? comm_name : "?");
  return 0;
#endif
}

static result_t start_event(void* ctx, void** handle, struct descr* d) {
#ifdef PROFILER_NULL_CONTEXT
  called_after_null_context("startEvent");
#endif
  (void)ctx;
  *handle = NULL;
  int i = bit_index(d->type);
  if (i < 0) return 0;
  if (d->type == 2 && d->u.coll.func && d->u.coll.algo && d->u.coll.proto && d->u.coll.datatype &&
      strcmp(d->u.coll.datatype, "ncclInt32") == 0 && d->u.coll.group)
    __atomic_fetch_add(&named_colls, 1, __ATOMIC_RELAXED);
  struct event* e = malloc(sizeof *e);
  if (!e) return 0;
  e->magic = MAGIC;
  e->type_bit = i;
#ifdef PROFILER_KEEPS_POINTERS
  keep_strings(ctx, e, d);
#endif
  __atomic_fetch_add(&started[i], 1, __ATOMIC_RELAXED);
  *handle = e;
  return 0;
}

static result_t stop_event(void* handle) {
#ifdef PROFILER_NULL_CONTEXT
  called_after_null_context("stopEvent");
#endif
  struct event* e = handle;
  if (!e || e->magic != MAGIC) {
    __atomic_fetch_add(&bad_stops, 1, __ATOMIC_RELAXED);
    return 0;
  }
#ifdef PROFILER_KEEPS_POINTERS
  check_strings(e);
#endif
  e->magic = 0;
  __atomic_fetch_add(&stopped[e->type_bit], 1, __ATOMIC_RELAXED);
  free(e);
  return 0;
}

static result_t record_state(void* handle, int state, union state_args* args) {
#ifdef PROFILER_NULL_CONTEXT
  called_after_null_context("recordEventState");
#endif
  (void)args;
  struct event* e = handle;
  if (!e || e->magic != MAGIC) {
    __atomic_fetch_add(&bad_stops, 1, __ATOMIC_RELAXED);
    return 0;
  }
  if (state == 23) __atomic_fetch_add(&group_states[0], 1, __ATOMIC_RELAXED);
  if (state == 24) __atomic_fetch_add(&group_states[1], 1, __ATOMIC_RELAXED);
  return 0;
}

static const char* names[TYPES] = {"Group", "Coll", "P2p", "ProxyOp", "ProxyStep", "ProxyCtrl",
                                   "KernelCh", "NetPlugin", "GroupApi", "CollApi", "P2pApi", "KernelLaunch"};

static result_t finalize(void* ctx) {
#ifdef PROFILER_NULL_CONTEXT
  called_after_null_context("finalize");
#endif
  struct context* c = ctx;
  const char* out = getenv("RUSTCCL_C_PROFILER_OUT");
  if (out && *out) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", out, c->rank);
    FILE* f = fopen(path, "w");
    if (f) {
      for (int i = 0; i < TYPES; i++)
        fprintf(f, "%s %ld %ld\n", names[i], __atomic_load_n(&started[i], __ATOMIC_RELAXED),
                __atomic_load_n(&stopped[i], __ATOMIC_RELAXED));
      fprintf(f, "bad %ld\n", __atomic_load_n(&bad_stops, __ATOMIC_RELAXED));
      fprintf(f, "named_colls %ld\n", __atomic_load_n(&named_colls, __ATOMIC_RELAXED));
      fprintf(f, "group_states %ld %ld\n", group_states[0], group_states[1]);
#ifdef PROFILER_KEEPS_POINTERS
      /* Read through the pointers kept since init and since the first Coll started. */
      fprintf(f, "comm_name %.200s\n", c->comm_name ? c->comm_name : "(null)");
      fprintf(f, "first_coll");
      for (int i = 0; i < KEPT; i++) fprintf(f, " %.60s", c->first_coll[i] ? c->first_coll[i] : "(null)");
      fprintf(f, "\nstrings %ld %ld\n", kept_strings, bad_strings);
#endif
      fclose(f);
    }
  }
  free(c);
  return 0;
}

struct table {
  const char* name;
  result_t (*init)(void**, uint64_t, int*, const char*, int, int, int, logger_t);
  result_t (*start_event)(void*, void**, struct descr*);
  result_t (*stop_event)(void*);
  result_t (*record_event_state)(void*, int, union state_args*);
  result_t (*finalize)(void*);
};

__attribute__((visibility("default"))) struct table ncclProfiler_v5 = {
#if defined(PROFILER_INIT_FAILS)
    "c-counter-broken",
#elif defined(PROFILER_NULL_CONTEXT)
    "c-null-context",
#else
    "c-counter",
#endif
    init, start_event, stop_event, record_state, finalize};
