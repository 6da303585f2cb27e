/*
 * CTcp: a TCP network plugin written in C against NCCL's net plugin ABI, for rustccl's tests
 * (the C adapter, the loader, the conformance suite and the collective matrix run over it).
 *
 * It exports the tables `ncclNetPlugin_v11` and `ncclNetPlugin_v6` (only v6 with
 * -DCTCP_V6_ONLY). Other -D flags build the broken variants the loader tests need:
 *   CTCP_INIT_FAILS   init returns ncclSystemError
 *   CTCP_MALFORMED    the v11 table's `test` member is NULL
 *   CTCP_NULL_NAME    the v11 table's name is NULL
 *   CTCP_ONLY_V13     exports only `ncclNetPlugin_v13` (a version rustccl does not know)
 *   CTCP_OFFLOAD      device 0 reports a device-offload netDeviceType
 *   CTCP_COLLNET      also exports a `ncclCollNetPlugin_v11` symbol
 *
 * Design: one device (the IPv4 address of NCCL_SOCKET_IFNAME, else the first non-loopback
 * interface, else 127.0.0.1). listen/connect/accept never block (the connecting socket is kept
 * in the handle's bytes between connect calls, as NCCL's plugins do). Every message on a
 * connection is a 16-byte header (tag, size) and its payload. All sockets are non-blocking
 * and every call makes progress on every connection of the process, under one lock, so that a
 * process driving both ends of a connection never deadlocks. 32 requests per connection; a
 * receive of up to 8 buffers matches the messages by tag; a peer that goes away makes `test`
 * fail.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <net/if.h>
#include <arpa/inet.h>

/* ---- The parts of NCCL's ABI this plugin uses (values and layouts as NCCL defines them) ---- */

typedef int result_t;
enum { RC_OK = 0, RC_SYSTEM = 2, RC_INTERNAL = 3, RC_INVALID_ARG = 4, RC_INVALID_USAGE = 5, RC_REMOTE = 6 };
enum { LOG_WARN = 2, LOG_INFO = 3 };
#define SUBSYS_NET 0x10UL
#define PTR_HOST 1
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
typedef result_t (*profiler_cb_t)(void** event, int type, void* parent, int64_t plugin_id, void* ext);

typedef struct {
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support, speed, port;
  float latency;
  int max_comms, max_recvs;
} props_v6_t;

typedef struct {
  int ndevs;
  int devs[4];
} vdev_props_v11_t;

typedef struct {
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support, reg_is_global, force_flush, speed, port;
  float latency;
  int max_comms, max_recvs, net_device_type, net_device_version;
  vdev_props_v11_t vprops;
  size_t max_p2p_bytes, max_coll_bytes;
  int max_multi_request_size;
} props_v11_t;

typedef struct {
  int traffic_class;
} comm_config_t;

typedef struct {
  const char* name;
  result_t (*init)(logger_t);
  result_t (*devices)(int*);
  result_t (*get_properties)(int, props_v6_t*);
  result_t (*listen)(int, void*, void**);
  result_t (*connect)(int, void*, void**);
  result_t (*accept)(void*, void**);
  result_t (*reg_mr)(void*, void*, int, int, void**);
  result_t (*reg_mr_dma_buf)(void*, void*, size_t, int, uint64_t, int, void**);
  result_t (*dereg_mr)(void*, void*);
  result_t (*isend)(void*, void*, int, int, void*, void**);
  result_t (*irecv)(void*, int, void**, int*, int*, void**, void**);
  result_t (*iflush)(void*, int, void**, int*, void**, void**);
  result_t (*test)(void*, int*, int*);
  result_t (*close_send)(void*);
  result_t (*close_recv)(void*);
  result_t (*close_listen)(void*);
} net_v6_t;

typedef struct {
  const char* name;
  result_t (*init)(void**, uint64_t, comm_config_t*, logger_t, profiler_cb_t);
  result_t (*devices)(int*);
  result_t (*get_properties)(int, props_v11_t*);
  result_t (*listen)(void*, int, void*, void**);
  result_t (*connect)(void*, int, void*, void**, void**);
  result_t (*accept)(void*, void**, void**);
  result_t (*reg_mr)(void*, void*, size_t, int, void**);
  result_t (*reg_mr_dma_buf)(void*, void*, size_t, int, uint64_t, int, void**);
  result_t (*dereg_mr)(void*, void*);
  result_t (*isend)(void*, void*, size_t, int, void*, void*, void**);
  result_t (*irecv)(void*, int, void**, size_t*, int*, void**, void**, void**);
  result_t (*iflush)(void*, int, void**, int*, void**, void**);
  result_t (*test)(void*, int*, int*);
  result_t (*close_send)(void*);
  result_t (*close_recv)(void*);
  result_t (*close_listen)(void*);
  result_t (*get_device_mr)(void*, void*, void**);
  result_t (*irecv_consumed)(void*, int, void*);
  result_t (*make_vdevice)(int*, vdev_props_v11_t*);
  result_t (*finalize)(void*);
  result_t (*set_net_attr)(void*, void*);
} net_v11_t;

/* ---- State ---- */

#define MAX_REQS 32
#define MAX_RECVS 8
#define HANDLE_MAGIC 0x4354637048646c65ULL
#define CTX_MAGIC 0x43546370437478ULL

/* What a listener hands out (at most 128 bytes). `pending_fd` is the connecting socket + 1,
 * kept in the handle between the calls of one connect. */
struct handle {
  uint64_t magic;
  struct sockaddr_in addr;
  int pending_fd;
};

struct msg_header {
  int32_t tag;
  uint32_t reserved;
  uint64_t size;
};

struct comm;

struct request {
  struct comm* comm;
  int used, done, failed, n;
  char* data[MAX_RECVS];
  size_t size[MAX_RECVS], got[MAX_RECVS];
  int tag[MAX_RECVS], filled[MAX_RECVS];
};

struct comm {
  int fd, is_send, failed;
  struct comm *prev, *next;
  struct request reqs[MAX_REQS];
  int queue[MAX_REQS]; /* posted, not yet transferred, in order */
  int qhead, qlen;
  /* the message in transfer: header bytes done, payload bytes done, buffer index (receive) */
  struct msg_header hdr;
  size_t hdr_off, off;
  int buf;
};

struct listener {
  int fd;
};

struct ctx {
  uint64_t magic, comm_id;
  int traffic_class;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct comm* comms; /* every live connection, for progress */
static logger_t logger;
static struct sockaddr_in dev_addr;
static char dev_name[IF_NAMESIZE + 8] = "lo";
static int mhandle_token;

#define LOG(level, ...)                                                    \
  do {                                                                     \
    if (logger) logger(level, SUBSYS_NET, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

/* The address of the device: NCCL_SOCKET_IFNAME (a prefix, as NCCL matches it), else the first
 * non-loopback IPv4 interface, else loopback. */
static void pick_device(void) {
  const char* want = getenv("NCCL_SOCKET_IFNAME");
  if (want && (want[0] == '^' || want[0] == '=')) want = NULL;
  struct ifaddrs *all, *i;
  memset(&dev_addr, 0, sizeof dev_addr);
  dev_addr.sin_family = AF_INET;
  dev_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  strcpy(dev_name, "lo");
  if (getifaddrs(&all) != 0) return;
  for (i = all; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    int match = want ? strncmp(i->ifa_name, want, strlen(want)) == 0 : !(i->ifa_flags & IFF_LOOPBACK);
    if (match) {
      memcpy(&dev_addr, i->ifa_addr, sizeof dev_addr);
      strncpy(dev_name, i->ifa_name, IF_NAMESIZE);
      break;
    }
  }
  freeifaddrs(all);
}

static result_t common_init(int version) {
#ifdef CTCP_INIT_FAILS
  LOG(LOG_WARN, "CTcp: init fails on purpose (test build, net ABI v%d)", version);
  return RC_SYSTEM;
#endif
  pthread_mutex_lock(&lock);
  pick_device();
  pthread_mutex_unlock(&lock);
  LOG(LOG_INFO, "CTcp: net ABI v%d initialised on %s", version, dev_name);
  return RC_OK;
}

static result_t devices(int* n) {
  *n = 1;
  return RC_OK;
}

static void fill_common(int* ptr_support, int* speed, int* max_comms, int* max_recvs) {
  *ptr_support = PTR_HOST;
  *speed = 10000;
  *max_comms = 65536;
  *max_recvs = MAX_RECVS;
}

static result_t get_properties_v6(int dev, props_v6_t* p) {
  if (dev != 0) return RC_INVALID_ARG;
  memset(p, 0, sizeof *p);
  p->name = dev_name;
  p->pci_path = NULL;
  p->guid = 0x43746370;
  fill_common(&p->ptr_support, &p->speed, &p->max_comms, &p->max_recvs);
  return RC_OK;
}

__attribute__((unused)) static result_t get_properties_v11(int dev, props_v11_t* p) {
  if (dev != 0) return RC_INVALID_ARG;
  memset(p, 0, sizeof *p);
  p->name = dev_name;
  p->pci_path = NULL;
  p->guid = 0x43746370;
  fill_common(&p->ptr_support, &p->speed, &p->max_comms, &p->max_recvs);
#ifdef CTCP_OFFLOAD
  p->net_device_type = 1; /* UNPACK */
  p->net_device_version = 7;
#endif
  p->vprops.ndevs = 1;
  p->vprops.devs[0] = 0;
  p->max_p2p_bytes = (size_t)1 << 40;
  p->max_coll_bytes = (size_t)1 << 40;
  p->max_multi_request_size = 1;
  return RC_OK;
}

static void set_nonblocking_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static result_t listen_any(int dev, void* handle, void** listen_comm) {
  if (dev != 0) return RC_INVALID_ARG;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return RC_SYSTEM;
  struct sockaddr_in a = dev_addr;
  socklen_t len = sizeof a;
  a.sin_port = 0;
  if (bind(fd, (struct sockaddr*)&a, sizeof a) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, (struct sockaddr*)&a, &len) != 0) {
    LOG(LOG_WARN, "CTcp: listen on %s failed: %s", dev_name, strerror(errno));
    close(fd);
    return RC_SYSTEM;
  }
  struct handle* h = handle;
  memset(h, 0, sizeof *h);
  h->magic = HANDLE_MAGIC;
  h->addr = a;
  struct listener* l = calloc(1, sizeof *l);
  if (!l) {
    close(fd);
    return RC_SYSTEM;
  }
  l->fd = fd;
  *listen_comm = l;
  return RC_OK;
}

static struct comm* new_comm(int fd, int is_send) {
  struct comm* c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->fd = fd;
  c->is_send = is_send;
  for (int i = 0; i < MAX_REQS; i++) c->reqs[i].comm = c;
  pthread_mutex_lock(&lock);
  c->next = comms;
  if (comms) comms->prev = c;
  comms = c;
  pthread_mutex_unlock(&lock);
  return c;
}

static result_t connect_any(int dev, void* handle, void** send_comm) {
  struct handle* h = handle;
  *send_comm = NULL;
  if (dev != 0 || h->magic != HANDLE_MAGIC) return RC_INVALID_ARG;
  if (h->pending_fd == 0) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return RC_SYSTEM;
    if (connect(fd, (struct sockaddr*)&h->addr, sizeof h->addr) != 0 && errno != EINPROGRESS) {
      LOG(LOG_WARN, "CTcp: connect failed: %s", strerror(errno));
      close(fd);
      return RC_SYSTEM;
    }
    h->pending_fd = fd + 1;
  }
  int fd = h->pending_fd - 1;
  struct pollfd p = {.fd = fd, .events = POLLOUT};
  if (poll(&p, 1, 0) == 0) return RC_OK; /* not yet: call again */
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  h->pending_fd = 0;
  if (err != 0) {
    LOG(LOG_WARN, "CTcp: connect failed: %s", strerror(err));
    close(fd);
    return RC_SYSTEM;
  }
  set_nonblocking_nodelay(fd);
  struct comm* c = new_comm(fd, 1);
  if (!c) {
    close(fd);
    return RC_SYSTEM;
  }
  *send_comm = c;
  return RC_OK;
}

static result_t accept_any(void* listen_comm, void** recv_comm) {
  struct listener* l = listen_comm;
  *recv_comm = NULL;
  int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? RC_OK : RC_SYSTEM;
  set_nonblocking_nodelay(fd);
  struct comm* c = new_comm(fd, 0);
  if (!c) {
    close(fd);
    return RC_SYSTEM;
  }
  *recv_comm = c;
  return RC_OK;
}

static result_t reg_mr_any(void* comm, void* data, size_t size, int type, void** mhandle) {
  (void)data;
  (void)size;
  if (!comm || type != PTR_HOST) return RC_INVALID_ARG;
  *mhandle = &mhandle_token;
  return RC_OK;
}

static result_t dereg_mr(void* comm, void* mhandle) {
  return (comm && mhandle == &mhandle_token) ? RC_OK : RC_INVALID_ARG;
}

/* ---- Progress (called with the lock held) ---- */

static void fail_comm(struct comm* c, const char* why) {
  if (!c->failed) LOG(LOG_WARN, "CTcp: connection %s failed: %s", c->is_send ? "send" : "receive", why);
  c->failed = 1;
  for (int i = 0; i < c->qlen; i++) c->reqs[c->queue[(c->qhead + i) % MAX_REQS]].failed = 1;
  c->qlen = 0;
}

static void pop_done(struct comm* c) {
  c->reqs[c->queue[c->qhead]].done = 1;
  c->qhead = (c->qhead + 1) % MAX_REQS;
  c->qlen--;
  c->hdr_off = 0;
  c->off = 0;
}

/* Moves bytes until the socket would block. Returns 0, or -1 when the connection failed. */
static int io(struct comm* c, char* p, size_t want, size_t* done) {
  while (*done < want) {
    ssize_t n = c->is_send ? send(c->fd, p + *done, want - *done, MSG_NOSIGNAL) : recv(c->fd, p + *done, want - *done, 0);
    if (n > 0) {
      *done += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n < 0 && errno == EINTR) continue;
    fail_comm(c, n == 0 ? "the peer closed the connection" : strerror(errno));
    return -1;
  }
  return 0;
}

static void progress_send(struct comm* c) {
  while (c->qlen > 0 && !c->failed) {
    struct request* r = &c->reqs[c->queue[c->qhead]];
    if (c->hdr_off == 0 && c->off == 0) {
      c->hdr.tag = r->tag[0];
      c->hdr.reserved = 0;
      c->hdr.size = r->size[0];
    }
    if (io(c, (char*)&c->hdr, sizeof c->hdr, &c->hdr_off) < 0 || c->hdr_off < sizeof c->hdr) return;
    if (io(c, r->data[0], r->size[0], &c->off) < 0 || c->off < r->size[0]) return;
    r->got[0] = r->size[0];
    pop_done(c);
  }
}

static void progress_recv(struct comm* c) {
  while (c->qlen > 0 && !c->failed) {
    struct request* r = &c->reqs[c->queue[c->qhead]];
    if (c->hdr_off < sizeof c->hdr) {
      if (io(c, (char*)&c->hdr, sizeof c->hdr, &c->hdr_off) < 0 || c->hdr_off < sizeof c->hdr) return;
      c->buf = -1;
      for (int i = 0; i < r->n; i++)
        if (!r->filled[i] && r->tag[i] == c->hdr.tag) {
          c->buf = i;
          break;
        }
      if (c->buf < 0) return fail_comm(c, "a message arrived whose tag no posted receive buffer has");
      if (c->hdr.size > r->size[c->buf]) return fail_comm(c, "a message is larger than its receive buffer");
      c->off = 0;
    }
    if (io(c, r->data[c->buf], c->hdr.size, &c->off) < 0 || c->off < c->hdr.size) return;
    r->got[c->buf] = c->hdr.size;
    r->filled[c->buf] = 1;
    c->hdr_off = 0;
    c->off = 0;
    int all = 1;
    for (int i = 0; i < r->n; i++) all &= r->filled[i];
    if (all) pop_done(c);
  }
}

static void progress_all(void) {
  for (struct comm* c = comms; c; c = c->next) c->is_send ? progress_send(c) : progress_recv(c);
}

/* ---- Requests ---- */

static result_t post(struct comm* c, int is_send, int n, void** data, const size_t* sizes, const int* tags,
                     void** request) {
  *request = NULL;
  if (!c || c->is_send != is_send || n < 1 || n > MAX_RECVS) return RC_INVALID_ARG;
  pthread_mutex_lock(&lock);
  result_t rc = RC_OK;
  if (c->failed) {
    rc = RC_REMOTE;
  } else {
    for (int i = 0; i < MAX_REQS; i++) {
      struct request* r = &c->reqs[i];
      if (r->used) continue;
      memset(r, 0, sizeof *r);
      r->comm = c;
      r->used = 1;
      r->n = n;
      for (int b = 0; b < n; b++) {
        r->data[b] = data[b];
        r->size[b] = sizes[b];
        r->tag[b] = tags[b];
      }
      c->queue[(c->qhead + c->qlen) % MAX_REQS] = i;
      c->qlen++;
      *request = r;
      break;
    }
    progress_all();
  }
  pthread_mutex_unlock(&lock);
  return rc; /* *request NULL without error: all 32 in use, call again */
}

static result_t isend_any(void* send_comm, void* data, size_t size, int tag, void* mhandle, void** request) {
  if (mhandle != &mhandle_token) return RC_INVALID_ARG;
  return post(send_comm, 1, 1, &data, &size, &tag, request);
}

static result_t irecv_any(void* recv_comm, int n, void** data, const size_t* sizes, int* tags, void** mhandles,
                          void** request) {
  for (int i = 0; i < n; i++)
    if (mhandles[i] != &mhandle_token) return RC_INVALID_ARG;
  return post(recv_comm, 0, n, data, sizes, tags, request);
}

static result_t test(void* request, int* done, int* sizes) {
  struct request* r = request;
  pthread_mutex_lock(&lock);
  if (!r || !r->used) {
    pthread_mutex_unlock(&lock);
    return RC_INVALID_ARG;
  }
  progress_all();
  result_t rc = RC_OK;
  *done = 0;
  if (r->failed) {
    r->used = 0;
    rc = RC_REMOTE;
  } else if (r->done) {
    *done = 1;
    if (sizes)
      for (int i = 0; i < r->n; i++) sizes[i] = (int)r->got[i];
    r->used = 0;
  }
  pthread_mutex_unlock(&lock);
  return rc;
}

static result_t close_comm(void* comm) {
  struct comm* c = comm;
  if (!c) return RC_INVALID_ARG;
  pthread_mutex_lock(&lock);
  if (c->prev) c->prev->next = c->next;
  else comms = c->next;
  if (c->next) c->next->prev = c->prev;
  pthread_mutex_unlock(&lock);
  close(c->fd);
  free(c);
  return RC_OK;
}

static result_t close_listen(void* listen_comm) {
  struct listener* l = listen_comm;
  if (!l) return RC_INVALID_ARG;
  close(l->fd);
  free(l);
  return RC_OK;
}

/* ---- v6 ---- */

static result_t v6_init(logger_t log) {
  logger = log;
  return common_init(6);
}
static result_t v6_reg_mr(void* comm, void* data, int size, int type, void** mhandle) {
  return size < 0 ? RC_INVALID_ARG : reg_mr_any(comm, data, (size_t)size, type, mhandle);
}
static result_t v6_isend(void* comm, void* data, int size, int tag, void* mhandle, void** request) {
  return size < 0 ? RC_INVALID_ARG : isend_any(comm, data, (size_t)size, tag, mhandle, request);
}
static result_t v6_irecv(void* comm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request) {
  size_t s[MAX_RECVS];
  if (n < 1 || n > MAX_RECVS) return RC_INVALID_ARG;
  for (int i = 0; i < n; i++) {
    if (sizes[i] < 0) return RC_INVALID_ARG;
    s[i] = (size_t)sizes[i];
  }
  return irecv_any(comm, n, data, s, tags, mhandles, request);
}
static result_t v6_iflush(void* comm, int n, void** data, int* sizes, void** mhandles, void** request) {
  (void)comm, (void)n, (void)data, (void)sizes, (void)mhandles;
  *request = NULL; /* host memory: nothing to flush */
  return RC_OK;
}

__attribute__((visibility("default"))) const net_v6_t
#ifdef CTCP_ONLY_V13
    ncclNetPlugin_v13 =
#else
    ncclNetPlugin_v6 =
#endif
        {
            .name = "CTcp",
            .init = v6_init,
            .devices = devices,
            .get_properties = get_properties_v6,
            .listen = listen_any,
            .connect = connect_any,
            .accept = accept_any,
            .reg_mr = v6_reg_mr,
            .reg_mr_dma_buf = NULL,
            .dereg_mr = dereg_mr,
            .isend = v6_isend,
            .irecv = v6_irecv,
            .iflush = v6_iflush,
            .test = test,
            .close_send = close_comm,
            .close_recv = close_comm,
            .close_listen = close_listen,
};

/* ---- v11 ---- */

#if !defined(CTCP_V6_ONLY) && !defined(CTCP_ONLY_V13)
static result_t v11_init(void** ctx, uint64_t comm_id, comm_config_t* config, logger_t log, profiler_cb_t prof) {
  logger = log;
  /* The host's profiler callback must accept an event and hand back no handle. */
  void* event = (void*)1;
  if (!prof || prof(&event, 0, NULL, 0, NULL) != RC_OK || event != NULL) {
    LOG(LOG_WARN, "CTcp: the profiler callback given to init does not behave");
    return RC_INTERNAL;
  }
  result_t rc = common_init(11);
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
static int good_ctx(void* ctx) {
  return ctx && ((struct ctx*)ctx)->magic == CTX_MAGIC;
}
static result_t v11_listen(void* ctx, int dev, void* handle, void** listen_comm) {
  return good_ctx(ctx) ? listen_any(dev, handle, listen_comm) : RC_INTERNAL;
}
static result_t v11_connect(void* ctx, int dev, void* handle, void** send_comm, void** dev_comm) {
  if (!good_ctx(ctx) || !dev_comm || *dev_comm) return RC_INTERNAL; /* host only: no offload asked */
  return connect_any(dev, handle, send_comm);
}
static result_t v11_accept(void* listen_comm, void** recv_comm, void** dev_comm) {
  if (!dev_comm || *dev_comm) return RC_INTERNAL;
  return accept_any(listen_comm, recv_comm);
}
static result_t v11_isend(void* comm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request) {
  (void)phandle;
  return isend_any(comm, data, size, tag, mhandle, request);
}
static result_t v11_irecv(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles,
                          void** request) {
  (void)phandles;
  return irecv_any(comm, n, data, sizes, tags, mhandles, request);
}
static result_t v11_finalize(void* ctx) {
  if (!good_ctx(ctx)) return RC_INTERNAL;
  ((struct ctx*)ctx)->magic = 0;
  free(ctx);
  return RC_OK;
}

__attribute__((visibility("default"))) const net_v11_t ncclNetPlugin_v11 = {
#ifdef CTCP_NULL_NAME
    .name = NULL,
#else
    .name = "CTcp",
#endif
    .init = v11_init,
    .devices = devices,
    .get_properties = get_properties_v11,
    .listen = v11_listen,
    .connect = v11_connect,
    .accept = v11_accept,
    .reg_mr = reg_mr_any,
    .reg_mr_dma_buf = NULL,
    .dereg_mr = dereg_mr,
    .isend = v11_isend,
    .irecv = v11_irecv,
    .iflush = NULL,
#ifdef CTCP_MALFORMED
    .test = NULL,
#else
    .test = test,
#endif
    .close_send = close_comm,
    .close_recv = close_comm,
    .close_listen = close_listen,
    .get_device_mr = NULL,
    .irecv_consumed = NULL,
    .make_vdevice = NULL,
    .finalize = v11_finalize,
    .set_net_attr = NULL,
};
#endif

#ifdef CTCP_COLLNET
/* Only the symbol matters to the loader test: rustccl does not use CollNet. */
__attribute__((visibility("default"))) const struct {
  const char* name;
  void* functions[21];
} ncclCollNetPlugin_v11 = {.name = "CTcpColl"};
#endif
