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
 * Built with -DPROFILER_COLL_P2P_ONLY it asks for Coll, P2p and KernelCh only (the mask of NCCL's
 * Inspector; KernelCh events come only when their own bit is asked for, as in NCCL) and does
 * what the Inspector and NCCL's example profiler (mask Coll | P2p) rely on: each Coll /
 * P2p must start under a CollApi / P2pApi event it was given (NCCL starts the API events
 * whenever a descendant type is in the mask), and an operation counts as completed when all
 * its channels' KernelCh events stopped, each with a nonzero start timer and a KernelChStop
 * timer not before it. It frees no event (a parent may be named after it stopped) and writes
 * at finalize: "ops <started> <completed>", "parents <ok> <bad>", "channels <started> <ok>
 * <bad>", "unplanned <Colls that name algorithm "Unknown">".
 *
 * Built with -DPROFILER_PROXY_OPS it asks for what Google's CoMMA profiler (v4) asks for,
 * Group | Coll | P2p | ProxyOp | ProxyStep, and completes an operation CoMMA's way: when a
 * ProxyOp under it stops (CoMMA's daemon ends an operation only there, else reclaims it at a
 * timeout). A ProxyOp counts if its parent is a Coll / P2p of this plugin still running, its
 * pid is this process's, it names a channel of its parent and at least one step, and (a send)
 * a ProxyStep under it stopped before it (CoMMA's send ops report through their steps).
 * It writes, besides "ops <started> <completed>" and "parents <ok> <bad>", "proxyops
 * <started> <ok> <bad>".
 *
 * The declarations below are this file's own, written from the layout NCCL's v5 header
 * defines (type, parent, rank, then a union whose collective member starts with the sequence
 * number, function name, buffers, count, root, data type, channels, warps, algorithm,
 * protocol and parent group). */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(PROFILER_COLL_P2P_ONLY) || defined(PROFILER_PROXY_OPS)
#define TRACKS_OPS
#endif

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

/* P2p: function, buffer, data type, count, peer, channels. */
struct p2p_part {
  const char* func;
  void* buff;
  const char* datatype;
  size_t count;
  int peer;
  uint8_t channels;
};

struct kernel_ch_part {
  uint8_t channel;
  uint64_t timer;
};

/* ProxyOp: pid, channel, peer, steps, chunk size, direction. */
struct proxy_op_part {
  int pid;
  uint8_t channel;
  int peer;
  int steps;
  int chunk_size;
  int is_send;
};

struct descr {
  uint64_t type;
  void* parent;
  int rank;
  union {
    struct coll_part coll;
    struct named_part named;
    struct p2p_part p2p;
    struct kernel_ch_part kernel_ch;
    struct proxy_op_part proxy_op;
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
#ifdef TRACKS_OPS
  int stopped;
  struct event* parent;       /* KernelCh, ProxyOp: its Coll / P2p; ProxyStep: its ProxyOp */
  int channels, channels_done; /* Coll / P2p: channels it names, channels completed */
  uint64_t start_timer, stop_timer; /* KernelCh */
  int proxy_done;             /* Coll / P2p: ProxyOps stopped under it */
  int is_send, steps_done;    /* ProxyOp: a send; ProxySteps stopped under it */
#endif
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

#ifdef TRACKS_OPS
static long ops_completed, parents_ok, parents_bad, channels_ok, channels_bad, unplanned;
static long proxy_ok, proxy_bad;

/* An event this plugin handed out (never freed), or NULL. */
static struct event* ours(void* h) {
  struct event* e = h;
  return e && e->magic == MAGIC ? e : NULL;
}

/* Checks a starting Coll / P2p's parent, or a KernelCh's; fills the event. */
static void check_start(struct event* e, const struct descr* d) {
  struct event* p = ours(d->parent);
  e->stopped = 0;
  e->parent = NULL;
  e->channels = e->channels_done = 0;
  e->start_timer = e->stop_timer = 0;
  e->proxy_done = e->is_send = e->steps_done = 0;
  if (d->type == 2 || d->type == 4) {
    int want = d->type == 2 ? 9 : 10; /* CollApi, P2pApi */
    __atomic_fetch_add(p && p->type_bit == want ? &parents_ok : &parents_bad, 1, __ATOMIC_RELAXED);
    e->channels = d->type == 2 ? d->u.coll.channels : d->u.p2p.channels;
    /* A way around the planner names no algorithm (the board of small collectives): NCCL's
     * "Unknown"; an empty name would kill profilers that read its last byte (CoMMA). */
    if (d->type == 2 && d->u.coll.algo && strcmp(d->u.coll.algo, "Unknown") == 0)
      __atomic_fetch_add(&unplanned, 1, __ATOMIC_RELAXED);
  } else if (d->type == 64) {
    int ok = p && (p->type_bit == 1 || p->type_bit == 2) && !p->stopped && d->u.kernel_ch.timer != 0 &&
             d->u.kernel_ch.channel < p->channels;
    if (ok) {
      e->parent = p;
      e->start_timer = d->u.kernel_ch.timer;
    } else {
      __atomic_fetch_add(&channels_bad, 1, __ATOMIC_RELAXED);
    }
  } else if (d->type == 8) {
    const struct proxy_op_part* o = &d->u.proxy_op;
    int ok = p && (p->type_bit == 1 || p->type_bit == 2) && !p->stopped && o->pid == (int)getpid() &&
             o->channel < p->channels && o->steps > 0;
    if (ok) {
      e->parent = p;
      e->is_send = o->is_send;
    } else {
      __atomic_fetch_add(&proxy_bad, 1, __ATOMIC_RELAXED);
    }
  } else if (d->type == 16) {
    if (p && p->type_bit == 3 && !p->stopped) e->parent = p;
  }
}

/* A ProxyStep stopped: its ProxyOp has one more. */
static void step_stopped(struct event* e) {
  if (e->parent) __atomic_fetch_add(&e->parent->steps_done, 1, __ATOMIC_RELAXED);
}

/* A ProxyOp stopped: its operation completed, CoMMA's way (a send needs a step first). */
static void proxy_op_stopped(struct event* e) {
  if (!e->parent) return;
  if (e->is_send && __atomic_load_n(&e->steps_done, __ATOMIC_RELAXED) == 0) {
    __atomic_fetch_add(&proxy_bad, 1, __ATOMIC_RELAXED);
    return;
  }
  __atomic_fetch_add(&proxy_ok, 1, __ATOMIC_RELAXED);
#ifdef PROFILER_PROXY_OPS
  if (__atomic_add_fetch(&e->parent->proxy_done, 1, __ATOMIC_RELAXED) == 1)
    __atomic_fetch_add(&ops_completed, 1, __ATOMIC_RELAXED);
#endif
}

/* A KernelCh stopped: with its timers right, its operation has one more channel done. */
static void channel_stopped(struct event* e) {
  if (!e->parent) return;
  if (e->stop_timer == 0 || e->stop_timer < e->start_timer) {
    __atomic_fetch_add(&channels_bad, 1, __ATOMIC_RELAXED);
    return;
  }
  __atomic_fetch_add(&channels_ok, 1, __ATOMIC_RELAXED);
#ifdef PROFILER_COLL_P2P_ONLY
  if (__atomic_add_fetch(&e->parent->channels_done, 1, __ATOMIC_RELAXED) == e->parent->channels)
    __atomic_fetch_add(&ops_completed, 1, __ATOMIC_RELAXED);
#endif
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
#ifdef PROFILER_COLL_P2P_ONLY
  *mask = 2 | 4 | 64; /* Coll | P2p | KernelCh: NCCL's Inspector's */
#elif defined(PROFILER_PROXY_OPS)
  *mask = 1 | 2 | 4 | 8 | 16; /* Group | Coll | P2p | ProxyOp | ProxyStep: CoMMA's */
#else
  /* Every type NCCL's v6 has: the host cuts it to what v5 knows. */
  *mask = 0x7fff;
#endif
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
#ifdef TRACKS_OPS
  check_start(e, d);
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
#ifdef TRACKS_OPS
  if (__atomic_exchange_n(&e->stopped, 1, __ATOMIC_RELAXED)) {
    __atomic_fetch_add(&bad_stops, 1, __ATOMIC_RELAXED);
    return 0;
  }
  if (e->type_bit == 6) channel_stopped(e);
  if (e->type_bit == 4) step_stopped(e);
  if (e->type_bit == 3) proxy_op_stopped(e);
  __atomic_fetch_add(&stopped[e->type_bit], 1, __ATOMIC_RELAXED);
  return 0;
#else
  e->magic = 0;
  __atomic_fetch_add(&stopped[e->type_bit], 1, __ATOMIC_RELAXED);
  free(e);
  return 0;
#endif
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
#ifdef TRACKS_OPS
  if (state == 22 && args) e->stop_timer = args->timer; /* KernelChStop */
#endif
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
#ifdef TRACKS_OPS
      fprintf(f, "ops %ld %ld\n", started[1] + started[2], ops_completed);
      fprintf(f, "parents %ld %ld\n", parents_ok, parents_bad);
      fprintf(f, "channels %ld %ld %ld\n", started[6], channels_ok, channels_bad);
      fprintf(f, "unplanned %ld\n", unplanned);
      fprintf(f, "proxyops %ld %ld %ld\n", started[3], proxy_ok, proxy_bad);
#endif
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
#elif defined(PROFILER_COLL_P2P_ONLY)
    "c-coll-p2p",
#elif defined(PROFILER_PROXY_OPS)
    "c-proxy-ops",
#else
    "c-counter",
#endif
    init, start_event, stop_event, record_state, finalize};
