/*
 * CTcp's exported `ncclNetPlugin_vN` tables: each version's layouts and signatures (as NCCL's
 * net_vN.h headers define them), wrapped around the core (ctcp.c).
 *
 * Which tables a build exports:
 *   (default)           `ncclNetPlugin_v11` and `ncclNetPlugin_v6`
 *   -DCTCP_V6_ONLY      only v6
 *   -DCTCP_NEWEST=N     only vN, N in 7..12: each version's own table, as a plugin built
 *                       against that header exports it
 * and the broken or special variants the loader tests need:
 *   CTCP_INIT_FAILS     init returns ncclSystemError
 *   CTCP_MALFORMED      the v11 table's `test` member is NULL
 *   CTCP_NULL_NAME      the v11 table's name is NULL
 *   CTCP_ONLY_V13       exports only `ncclNetPlugin_v13` (a version rustccl does not know)
 *   CTCP_OFFLOAD        device 0 reports a device-offload netDeviceType (v11)
 *   CTCP_COLLNET        also exports a `ncclCollNetPlugin_v11` symbol
 *   CTCP_NO_VDEVICE     the v9+ tables' makeVDevice is NULL
 *   CTCP_ASYNC_SETUP    nccl-fastsocket's setup and completion (see ctcp.c): connect returns
 *                       no comm at first and connects in the background, accept blocks
 *                       until a peer connected, test never writes sizes
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctcp.h"

#pragma GCC diagnostic ignored "-Wunused-function"

#if defined(CTCP_NEWEST)
#define EXPORTS(v) (CTCP_NEWEST == (v))
#elif defined(CTCP_V6_ONLY) || defined(CTCP_ONLY_V13)
#define EXPORTS(v) ((v) == 6)
#else
#define EXPORTS(v) ((v) == 6 || (v) == 11)
#endif

#ifdef CTCP_NO_VDEVICE
#define VDEV(f) NULL
#else
#define VDEV(f) f
#endif

#define EXPORT __attribute__((visibility("default")))
#define CTX_MAGIC 0x43546370437478ULL

/* ---- Layouts ---- */

typedef struct {
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support, speed, port;
  float latency;
  int max_comms, max_recvs;
} props_v6_t;

typedef struct {
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support, speed, port;
  float latency;
  int max_comms, max_recvs, net_device_type, net_device_version;
} props_v7_t;

typedef struct {
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support, reg_is_global, speed, port;
  float latency;
  int max_comms, max_recvs, net_device_type, net_device_version;
} props_v8_t;

typedef struct {
  int ndevs;
  int devs[4];
} vprops4_t;

typedef struct {
  int ndevs;
  int devs[8];
} vprops8_t;

/* v9 and v10 */
typedef struct {
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support, reg_is_global, force_flush, speed, port;
  float latency;
  int max_comms, max_recvs, net_device_type, net_device_version;
  vprops4_t vprops;
  size_t max_p2p_bytes, max_coll_bytes;
} props_v9_t;

typedef struct {
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support, reg_is_global, force_flush, speed, port;
  float latency;
  int max_comms, max_recvs, net_device_type, net_device_version;
  vprops4_t vprops;
  size_t max_p2p_bytes, max_coll_bytes;
  int max_multi_request_size;
} props_v11_t;

typedef struct {
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support, reg_is_global, force_flush, speed, port;
  float latency;
  int max_comms, max_recvs, net_device_type, net_device_version;
  vprops8_t vprops;
  size_t max_p2p_bytes, max_coll_bytes;
  int max_multi_request_size;
  int16_t rail_id, plane_id;
} props_v12_t;

typedef struct {
  int traffic_class;
} comm_config_t;

typedef void* P;
typedef struct {
  const char* name;
  result_t (*init)(logger_t);
  result_t (*devices)(int*);
  result_t (*get_properties)(int, props_v6_t*);
  result_t (*listen)(int, P, P*);
  result_t (*connect)(int, P, P*);
  result_t (*accept)(P, P*);
  result_t (*reg_mr)(P, P, int, int, P*);
  result_t (*reg_mr_dma_buf)(P, P, size_t, int, uint64_t, int, P*);
  result_t (*dereg_mr)(P, P);
  result_t (*isend)(P, P, int, int, P, P*);
  result_t (*irecv)(P, int, P*, int*, int*, P*, P*);
  result_t (*iflush)(P, int, P*, int*, P*, P*);
  result_t (*test)(P, int*, int*);
  result_t (*close_send)(P);
  result_t (*close_recv)(P);
  result_t (*close_listen)(P);
} net_v6_t;

/* v7..v12 share this shape; the macro arguments are the members whose types change. */
#define NET_TABLE(tname, init_args, props_t, listen_args, connect_args, regmr_size_t, isend_args, irecv_args, tail) \
  typedef struct {                                                                                                 \
    const char* name;                                                                                              \
    result_t (*init) init_args;                                                                                    \
    result_t (*devices)(int*);                                                                                     \
    result_t (*get_properties)(int, props_t*);                                                                     \
    result_t (*listen) listen_args;                                                                                \
    result_t (*connect) connect_args;                                                                              \
    result_t (*accept)(P, P*, P*);                                                                                 \
    result_t (*reg_mr)(P, P, regmr_size_t, int, P*);                                                               \
    result_t (*reg_mr_dma_buf)(P, P, size_t, int, uint64_t, int, P*);                                              \
    result_t (*dereg_mr)(P, P);                                                                                    \
    result_t (*isend) isend_args;                                                                                  \
    result_t (*irecv) irecv_args;                                                                                  \
    result_t (*iflush)(P, int, P*, int*, P*, P*);                                                                  \
    result_t (*test)(P, int*, int*);                                                                               \
    result_t (*close_send)(P);                                                                                     \
    result_t (*close_recv)(P);                                                                                     \
    result_t (*close_listen)(P);                                                                                   \
    result_t (*get_device_mr)(P, P, P*);                                                                           \
    result_t (*irecv_consumed)(P, int, P);                                                                         \
    tail                                                                                                           \
  } tname;

#define ISEND_INT (P, P, int, int, P, P*)
#define IRECV_INT (P, int, P*, int*, int*, P*, P*)
#define ISEND_SIZE (P, P, size_t, int, P, P*)
#define IRECV_SIZE (P, int, P*, size_t*, int*, P*, P*)
#define ISEND_PROF (P, P, size_t, int, P, P, P*)
#define IRECV_PROF (P, int, P*, size_t*, int*, P*, P*, P*)
#define INIT_CTX (P*, uint64_t, comm_config_t*, logger_t, profiler_cb_t)

NET_TABLE(net_v7_t, (logger_t), props_v7_t, (int, P, P*), (int, P, P*, P*), int, ISEND_INT, IRECV_INT, )
NET_TABLE(net_v8_t, (logger_t), props_v8_t, (int, P, P*), (int, P, P*, P*), size_t, ISEND_INT, IRECV_INT, )
NET_TABLE(net_v9_t, (logger_t), props_v9_t, (int, P, P*), (int, P, P*, P*), size_t, ISEND_SIZE, IRECV_SIZE,
          result_t (*make_vdevice)(int*, vprops4_t*);)
NET_TABLE(net_v10_t, (logger_t, profiler_cb_t), props_v9_t, (int, P, P*), (int, comm_config_t*, P, P*, P*), size_t,
          ISEND_PROF, IRECV_PROF, result_t (*make_vdevice)(int*, vprops4_t*);)
NET_TABLE(net_v11_t, INIT_CTX, props_v11_t, (P, int, P, P*), (P, int, P, P*, P*), size_t, ISEND_PROF, IRECV_PROF,
          result_t (*make_vdevice)(int*, vprops4_t*); result_t (*finalize)(P); result_t (*set_net_attr)(P, P);)
NET_TABLE(net_v12_t, INIT_CTX, props_v12_t, (P, int, P, P*), (P, int, P, P*, P*), size_t, ISEND_PROF, IRECV_PROF,
          result_t (*make_vdevice)(int*, vprops8_t*); result_t (*finalize)(P); result_t (*set_net_attr)(P, P);)

/* LP64 sizes of NCCL's tables and property structs. */
_Static_assert(sizeof(net_v6_t) == 17 * sizeof(P), "v6 table");
_Static_assert(sizeof(net_v7_t) == 19 * sizeof(P) && sizeof(net_v8_t) == 19 * sizeof(P), "v7/v8 tables");
_Static_assert(sizeof(net_v9_t) == 20 * sizeof(P) && sizeof(net_v10_t) == 20 * sizeof(P), "v9/v10 tables");
_Static_assert(sizeof(net_v11_t) == 22 * sizeof(P) && sizeof(net_v12_t) == 22 * sizeof(P), "v11/v12 tables");
_Static_assert(sizeof(props_v7_t) == 56 && sizeof(props_v8_t) == 64 && sizeof(props_v9_t) == 104, "v7..v9 props");
_Static_assert(sizeof(props_v11_t) == 112 && sizeof(props_v12_t) == 128, "v11/v12 props");

/* ---- Shared wrappers ---- */

static result_t devices(int* n) {
  *n = ctcp_ndevs();
  return RC_OK;
}

/* Fills the members every version's properties have. */
#define FILL_BASE(p, d)                 \
  do {                                  \
    memset(p, 0, sizeof *(p));          \
    (p)->name = (d).name;               \
    (p)->pci_path = NULL;               \
    (p)->guid = (d).guid;               \
    (p)->ptr_support = (d).ptr_support; \
    (p)->speed = (d).speed;             \
    (p)->max_comms = (d).max_comms;     \
    (p)->max_recvs = (d).max_recvs;     \
  } while (0)

/* ... and those of v9 and later. */
#define FILL_V9(p, d)                                                  \
  do {                                                                 \
    (p)->vprops.ndevs = (d).ndevs;                                     \
    for (int i_ = 0; i_ < (d).ndevs; i_++) (p)->vprops.devs[i_] = (d).devs[i_]; \
    (p)->max_p2p_bytes = (size_t)1 << 40;                              \
    (p)->max_coll_bytes = (size_t)1 << 40;                             \
  } while (0)

#define GET_PROPS(fname, props_t, extra)     \
  static result_t fname(int dev, props_t* p) { \
    struct ctcp_dev d;                         \
    result_t rc = ctcp_dev(dev, &d);           \
    if (rc != RC_OK) return rc;                \
    FILL_BASE(p, d);                           \
    extra;                                     \
    return RC_OK;                              \
  }

GET_PROPS(props_v6, props_v6_t, )
GET_PROPS(props_v7, props_v7_t, )
GET_PROPS(props_v8, props_v8_t, )
GET_PROPS(props_v9, props_v9_t, FILL_V9(p, d))
GET_PROPS(props_v11, props_v11_t, FILL_V9(p, d); p->max_multi_request_size = 1;
#ifdef CTCP_OFFLOAD
          if (dev == 0) {
            p->net_device_type = 1; /* UNPACK */
            p->net_device_version = 7;
          }
#endif
)
GET_PROPS(props_v12, props_v12_t, FILL_V9(p, d); p->max_multi_request_size = 1;
          p->rail_id = (int16_t)(d.ndevs == 1 ? d.devs[0] : -1); p->plane_id = -1)

static result_t vdev4(int* d, vprops4_t* p) {
  return p ? ctcp_make_vdevice(d, p->ndevs, p->devs, 4) : RC_INVALID_ARG;
}
static result_t vdev8(int* d, vprops8_t* p) {
  return p ? ctcp_make_vdevice(d, p->ndevs, p->devs, 8) : RC_INVALID_ARG;
}

/* int-sized calls (v6..v8) */
static result_t reg_mr_int(P comm, P data, int size, int type, P* mh) {
  return size < 0 ? RC_INVALID_ARG : ctcp_reg_mr(comm, data, (size_t)size, type, mh);
}
static result_t isend_int(P comm, P data, int size, int tag, P mh, P* req) {
  return size < 0 ? RC_INVALID_ARG : ctcp_isend(comm, data, (size_t)size, tag, mh, req);
}
static result_t irecv_int(P comm, int n, P* data, int* sizes, int* tags, P* mhs, P* req) {
  size_t s[MAX_RECVS];
  if (n < 1 || n > MAX_RECVS) return RC_INVALID_ARG;
  for (int i = 0; i < n; i++) {
    if (sizes[i] < 0) return RC_INVALID_ARG;
    s[i] = (size_t)sizes[i];
  }
  return ctcp_irecv(comm, n, data, s, tags, mhs, req);
}
static result_t iflush_none(P comm, int n, P* data, int* sizes, P* mhs, P* req) {
  (void)comm, (void)n, (void)data, (void)sizes, (void)mhs;
  *req = NULL; /* host memory: nothing to flush */
  return RC_OK;
}
static result_t irecv_size(P comm, int n, P* data, size_t* sizes, int* tags, P* mhs, P* req) {
  return ctcp_irecv(comm, n, data, sizes, tags, mhs, req);
}
/* v10+: with profiler handles, which this plugin ignores */
/* v10: NCCL gives every connect of a communicator the same config, alive until the net is
 * finalized, so a plugin may keep it. The first one is kept, and every later connect, send
 * and receive checks that it still reads the traffic class it read then. */
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static const comm_config_t* kept_config;
static int kept_traffic_class;

static void check_kept_config(const comm_config_t* config, const char* call) {
  pthread_mutex_lock(&kept_lock);
  if (!kept_config && config) {
    kept_config = config;
    kept_traffic_class = config->traffic_class;
  }
  int same = !kept_config || kept_config->traffic_class == kept_traffic_class;
  pthread_mutex_unlock(&kept_lock);
  if (!same) {
    fprintf(stderr, "CTcp: at %s, the config the first v10 connect was given no longer reads the same\n", call);
    fflush(stderr);
    abort();
  }
}

static result_t isend_prof(P comm, P data, size_t size, int tag, P mh, P phandle, P* req) {
  (void)phandle;
  check_kept_config(NULL, "isend");
  return ctcp_isend(comm, data, size, tag, mh, req);
}
static result_t irecv_prof(P comm, int n, P* data, size_t* sizes, int* tags, P* mhs, P* phandles, P* req) {
  (void)phandles;
  check_kept_config(NULL, "irecv");
  return ctcp_irecv(comm, n, data, sizes, tags, mhs, req);
}

/* v7+: the host asks for no device offload, so the handle storage must hold NULL. */
static result_t connect_v7(int dev, P handle, P* send_comm, P* dev_comm) {
  if (!dev_comm || *dev_comm) return RC_INTERNAL;
  return ctcp_connect(dev, handle, send_comm);
}
static result_t accept_v7(P listen_comm, P* recv_comm, P* dev_comm) {
  if (!dev_comm || *dev_comm) return RC_INTERNAL;
  return ctcp_accept(listen_comm, recv_comm);
}

/* v10+: the host's profiler callback must accept an event and hand back no handle. */
static int good_profiler(profiler_cb_t prof) {
  void* event = (void*)1;
  if (prof && prof(&event, 0, NULL, 0, NULL) == RC_OK && event == NULL) return 1;
  LOG(LOG_WARN, "CTcp: the profiler callback given to init does not behave");
  return 0;
}

static result_t init_v6(logger_t log) {
  ctcp_logger = log;
  return ctcp_init(6);
}
static result_t init_v7(logger_t log) {
  ctcp_logger = log;
  return ctcp_init(7);
}
static result_t init_v8(logger_t log) {
  ctcp_logger = log;
  return ctcp_init(8);
}
static result_t init_v9(logger_t log) {
  ctcp_logger = log;
  return ctcp_init(9);
}
static result_t init_v10(logger_t log, profiler_cb_t prof) {
  ctcp_logger = log;
  return good_profiler(prof) ? ctcp_init(10) : RC_INTERNAL;
}
static result_t connect_v10(int dev, comm_config_t* config, P handle, P* send_comm, P* dev_comm) {
  if (!config) return RC_INTERNAL;
  check_kept_config(config, "connect");
  return connect_v7(dev, handle, send_comm, dev_comm);
}

/* v11+: a context per communicator */
struct ctx {
  uint64_t magic, comm_id;
  int traffic_class;
};
static result_t init_ctx(int version, P* ctx, uint64_t comm_id, comm_config_t* config, logger_t log, profiler_cb_t prof) {
  ctcp_logger = log;
  if (!good_profiler(prof)) return RC_INTERNAL;
  result_t rc = ctcp_init(version);
  if (rc != RC_OK) return rc;
  struct ctx* c = calloc(1, sizeof *c);
  if (!c) return RC_SYSTEM;
  c->magic = CTX_MAGIC;
  c->comm_id = comm_id;
  c->traffic_class = config ? config->traffic_class : -1;
  LOG(LOG_INFO, "CTcp: context for comm %llx, traffic class %d", (unsigned long long)comm_id, c->traffic_class);
  *ctx = c;
  return RC_OK;
}
static result_t init_v11(P* ctx, uint64_t comm_id, comm_config_t* config, logger_t log, profiler_cb_t prof) {
  return init_ctx(11, ctx, comm_id, config, log, prof);
}
static result_t init_v12(P* ctx, uint64_t comm_id, comm_config_t* config, logger_t log, profiler_cb_t prof) {
  return init_ctx(12, ctx, comm_id, config, log, prof);
}
static int good_ctx(P ctx) {
  return ctx && ((struct ctx*)ctx)->magic == CTX_MAGIC;
}
static result_t listen_ctx(P ctx, int dev, P handle, P* listen_comm) {
  return good_ctx(ctx) ? ctcp_listen(dev, handle, listen_comm) : RC_INTERNAL;
}
static result_t connect_ctx(P ctx, int dev, P handle, P* send_comm, P* dev_comm) {
  return good_ctx(ctx) ? connect_v7(dev, handle, send_comm, dev_comm) : RC_INTERNAL;
}
static result_t finalize_ctx(P ctx) {
  if (!good_ctx(ctx)) return RC_INTERNAL;
  ((struct ctx*)ctx)->magic = 0;
  free(ctx);
  return RC_OK;
}

/* ---- The tables ---- */

#define COMMON_TAIL                        \
  .reg_mr_dma_buf = NULL, .dereg_mr = ctcp_dereg_mr, .test = ctcp_test, \
  .close_send = ctcp_close_comm, .close_recv = ctcp_close_comm, .close_listen = ctcp_close_listen

#if EXPORTS(6)
EXPORT const net_v6_t
#ifdef CTCP_ONLY_V13
    ncclNetPlugin_v13 =
#else
    ncclNetPlugin_v6 =
#endif
        {.name = "CTcp", .init = init_v6, .devices = devices, .get_properties = props_v6, .listen = ctcp_listen,
         .connect = ctcp_connect, .accept = ctcp_accept, .reg_mr = reg_mr_int, .isend = isend_int,
         .irecv = irecv_int, .iflush = iflush_none, COMMON_TAIL};
#endif

#if EXPORTS(7)
EXPORT const net_v7_t ncclNetPlugin_v7 = {
    .name = "CTcp", .init = init_v7, .devices = devices, .get_properties = props_v7, .listen = ctcp_listen,
    .connect = connect_v7, .accept = accept_v7, .reg_mr = reg_mr_int, .isend = isend_int, .irecv = irecv_int,
    .iflush = iflush_none, COMMON_TAIL};
#endif

#if EXPORTS(8)
EXPORT const net_v8_t ncclNetPlugin_v8 = {
    .name = "CTcp", .init = init_v8, .devices = devices, .get_properties = props_v8, .listen = ctcp_listen,
    .connect = connect_v7, .accept = accept_v7, .reg_mr = ctcp_reg_mr, .isend = isend_int, .irecv = irecv_int,
    .iflush = iflush_none, COMMON_TAIL};
#endif

#if EXPORTS(9)
EXPORT const net_v9_t ncclNetPlugin_v9 = {
    .name = "CTcp", .init = init_v9, .devices = devices, .get_properties = props_v9, .listen = ctcp_listen,
    .connect = connect_v7, .accept = accept_v7, .reg_mr = ctcp_reg_mr, .isend = ctcp_isend, .irecv = irecv_size,
    .iflush = iflush_none, .make_vdevice = VDEV(vdev4), COMMON_TAIL};
#endif

#if EXPORTS(10)
EXPORT const net_v10_t ncclNetPlugin_v10 = {
    .name = "CTcp", .init = init_v10, .devices = devices, .get_properties = props_v9, .listen = ctcp_listen,
    .connect = connect_v10, .accept = accept_v7, .reg_mr = ctcp_reg_mr, .isend = isend_prof, .irecv = irecv_prof,
    .iflush = NULL, .make_vdevice = VDEV(vdev4), COMMON_TAIL};
#endif

#if EXPORTS(11)
EXPORT const net_v11_t ncclNetPlugin_v11 = {
#ifdef CTCP_NULL_NAME
    .name = NULL,
#else
    .name = "CTcp",
#endif
    .init = init_v11, .devices = devices, .get_properties = props_v11, .listen = listen_ctx,
    .connect = connect_ctx, .accept = accept_v7, .reg_mr = ctcp_reg_mr, .reg_mr_dma_buf = NULL,
    .dereg_mr = ctcp_dereg_mr, .isend = isend_prof, .irecv = irecv_prof, .iflush = NULL,
#ifdef CTCP_MALFORMED
    .test = NULL,
#else
    .test = ctcp_test,
#endif
    .close_send = ctcp_close_comm, .close_recv = ctcp_close_comm, .close_listen = ctcp_close_listen,
    .make_vdevice = VDEV(vdev4), .finalize = finalize_ctx, .set_net_attr = NULL};
#endif

#if EXPORTS(12)
EXPORT const net_v12_t ncclNetPlugin_v12 = {
    .name = "CTcp", .init = init_v12, .devices = devices, .get_properties = props_v12, .listen = listen_ctx,
    .connect = connect_ctx, .accept = accept_v7, .reg_mr = ctcp_reg_mr, .isend = isend_prof, .irecv = irecv_prof,
    .iflush = NULL, .make_vdevice = VDEV(vdev8), .finalize = finalize_ctx, COMMON_TAIL};
#endif

#ifdef CTCP_COLLNET
/* Only the symbol matters to the loader test: rustccl does not use CollNet. */
EXPORT const struct {
  const char* name;
  void* functions[21];
} ncclCollNetPlugin_v11 = {.name = "CTcpColl"};
#endif
