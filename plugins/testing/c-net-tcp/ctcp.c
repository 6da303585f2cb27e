/*
 * CTcp: a TCP network plugin written in C against NCCL's net plugin ABI, for rustccl's tests
 * (the C adapter, the loader, the conformance suite and the collective matrix run over it).
 * This file is the core; ctcp_tables.c holds the exported tables and says which -D flags
 * choose them.
 *
 * Design: two physical devices (ctcp.h), and virtual devices made by makeVDevice (v9+) that
 * fuse them: a virtual device spreads its listeners over its members in turn (each listen uses
 * the next member's address), and reports its members in its properties. listen/connect/accept
 * never block (the connecting socket is kept in the handle's bytes between connect calls, as
 * NCCL's plugins do). Every message on a connection is a 16-byte header (tag, size) and its
 * payload. All sockets are non-blocking and every call makes progress on every connection of
 * the process, under one lock, so that a process driving both ends of a connection never
 * deadlocks. 32 requests per connection; a receive of up to 8 buffers matches the messages by
 * tag; a peer that goes away makes `test` fail.
 *
 * CTCP_ASYNC_SETUP builds the connection setup and completion that Google's nccl-fastsocket
 * has (and NCCL's proxy copes with): connect returns no comm for its first calls and connects
 * in a background thread, accept BLOCKS until a peer has connected (for at most
 * ACCEPT_WAIT_S seconds, then fails, so that a caller that accepts before its own sends have
 * connected fails instead of hanging), and test never writes the sizes received.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <net/if.h>
#include <arpa/inet.h>

#include "ctcp.h"

/* ---- State ---- */

#define MAX_REQS 32
#define MAX_RECVS 8
#define HANDLE_MAGIC 0x4354637048646c65ULL

/* What a listener hands out (at most 128 bytes). `pending_fd` is the connecting socket + 1,
 * kept in the handle between the calls of one connect. */
struct handle {
  uint64_t magic;
  struct sockaddr_in addr;
  int pending_fd;
  struct async_connect* async; /* CTCP_ASYNC_SETUP: the background connect, between calls */
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

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct comm* comms; /* every live connection, for progress */
logger_t ctcp_logger;
static int mhandle_token;

struct device {
  char name[64];
  struct sockaddr_in addr; /* physical devices only */
  int ndevs, devs[MAX_MEMBERS];
  unsigned next; /* virtual devices: the member the next listen uses */
};
#define MAX_VDEVS 4
static struct device devs[NPHYS + MAX_VDEVS];
static int ndevs_total; /* 0 until init */

static void set_loopback(struct device* d, const char* name) {
  memset(d, 0, sizeof *d);
  d->addr.sin_family = AF_INET;
  d->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  snprintf(d->name, sizeof d->name, "%s", name);
}

/* Device 0: NCCL_SOCKET_IFNAME (a prefix, as NCCL matches it), else the first non-loopback
 * IPv4 interface, else loopback. Device 1: loopback. Called with the lock held. */
static void pick_devices(void) {
  if (ndevs_total) return; /* once per process: virtual devices persist across inits */
  set_loopback(&devs[0], "lo");
  set_loopback(&devs[1], "ctcp-lo");
  const char* want = getenv("NCCL_SOCKET_IFNAME");
  if (want && (want[0] == '^' || want[0] == '=')) want = NULL;
  struct ifaddrs *all, *i;
  if (getifaddrs(&all) == 0) {
    for (i = all; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
      int match = want ? strncmp(i->ifa_name, want, strlen(want)) == 0 : !(i->ifa_flags & IFF_LOOPBACK);
      if (match) {
        memcpy(&devs[0].addr, i->ifa_addr, sizeof devs[0].addr);
        snprintf(devs[0].name, sizeof devs[0].name, "%s", i->ifa_name);
        break;
      }
    }
    freeifaddrs(all);
  }
  for (int d = 0; d < NPHYS; d++) {
    devs[d].ndevs = 1;
    devs[d].devs[0] = d;
  }
  ndevs_total = NPHYS;
}

result_t ctcp_init(int version) {
#ifdef CTCP_INIT_FAILS
  LOG(LOG_WARN, "CTcp: init fails on purpose (test build, net ABI v%d)", version);
  return RC_SYSTEM;
#endif
  pthread_mutex_lock(&lock);
  pick_devices();
  pthread_mutex_unlock(&lock);
  LOG(LOG_INFO, "CTcp: net ABI v%d initialised on %s", version, devs[0].name);
  return RC_OK;
}

int ctcp_ndevs(void) {
  pthread_mutex_lock(&lock);
  int n = ndevs_total;
  pthread_mutex_unlock(&lock);
  return n;
}

result_t ctcp_dev(int dev, struct ctcp_dev* p) {
  memset(p, 0, sizeof *p);
  pthread_mutex_lock(&lock);
  int ok = dev >= 0 && dev < ndevs_total;
  if (ok) {
    p->name = devs[dev].name;
    p->ndevs = devs[dev].ndevs;
    memcpy(p->devs, devs[dev].devs, sizeof p->devs);
  }
  pthread_mutex_unlock(&lock);
  if (!ok) return RC_INVALID_ARG;
  p->guid = 0x43746370 + (uint64_t)dev;
  p->ptr_support = PTR_HOST;
  p->speed = 10000 * p->ndevs;
  p->max_comms = 65536;
  p->max_recvs = MAX_RECVS;
  return RC_OK;
}

result_t ctcp_make_vdevice(int* d, int n, const int* members, int max) {
  if (!d || !members || n < 1 || n > max || n > MAX_MEMBERS) return RC_INVALID_ARG;
  for (int i = 0; i < n; i++) {
    if (members[i] < 0 || members[i] >= NPHYS) return RC_INVALID_ARG;
    for (int j = 0; j < i; j++)
      if (members[j] == members[i]) return RC_INVALID_ARG;
  }
  pthread_mutex_lock(&lock);
  if (ndevs_total == 0 || ndevs_total == NPHYS + MAX_VDEVS) {
    pthread_mutex_unlock(&lock);
    return ndevs_total ? RC_INVALID_USAGE : RC_INTERNAL;
  }
  struct device* v = &devs[ndevs_total];
  memset(v, 0, sizeof *v);
  v->ndevs = n;
  char name[sizeof v->name] = "";
  for (int i = 0; i < n; i++) {
    v->devs[i] = members[i];
    if (i) strncat(name, "+", sizeof name - strlen(name) - 1);
    strncat(name, devs[members[i]].name, sizeof name - strlen(name) - 1);
  }
  memcpy(v->name, name, sizeof name);
  *d = ndevs_total++;
  pthread_mutex_unlock(&lock);
  LOG(LOG_INFO, "CTcp: made virtual device %d (%s) of %d devices", *d, v->name, n);
  return RC_OK;
}

/* The address a listener on `dev` binds: a virtual device's members take turns. Called with
 * the lock held; -1 for an unknown device. */
static int listen_addr(int dev, struct sockaddr_in* a, const char** name) {
  if (dev < 0 || dev >= ndevs_total) return -1;
  struct device* d = &devs[dev];
  int phys = dev < NPHYS ? dev : d->devs[d->next++ % (unsigned)d->ndevs];
  if (dev >= NPHYS && d->next <= (unsigned)d->ndevs)
    LOG(LOG_INFO, "CTcp: virtual device %d (%s) listens on its member %d (%s)", dev, d->name, phys, devs[phys].name);
  *a = devs[phys].addr;
  *name = devs[phys].name;
  return 0;
}

static void set_nonblocking_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

result_t ctcp_listen(int dev, void* handle, void** listen_comm) {
  struct sockaddr_in a;
  const char* name;
  pthread_mutex_lock(&lock);
  int bad = listen_addr(dev, &a, &name);
  pthread_mutex_unlock(&lock);
  if (bad) return RC_INVALID_ARG;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return RC_SYSTEM;
  socklen_t len = sizeof a;
  a.sin_port = 0;
  if (bind(fd, (struct sockaddr*)&a, sizeof a) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, (struct sockaddr*)&a, &len) != 0) {
    LOG(LOG_WARN, "CTcp: listen on %s failed: %s", name, strerror(errno));
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

/* A connected socket becomes this side's comm (TCP_NODELAY, in the progress list); the
 * socket is closed if that fails. */
static result_t adopt_socket(int fd, int is_send, void** comm) {
  set_nonblocking_nodelay(fd);
  struct comm* c = new_comm(fd, is_send);
  if (!c) {
    close(fd);
    return RC_SYSTEM;
  }
  *comm = c;
  return RC_OK;
}

#ifdef CTCP_ASYNC_SETUP
/* Calls of connect that return no comm, at least (then: until the background connect is done). */
#define ASYNC_NULL_CALLS 3
/* How long accept blocks waiting for a peer before it fails. */
#define ACCEPT_WAIT_S 10

struct async_connect {
  struct sockaddr_in addr;
  int calls, done, fd, err;
};

static void* connect_in_background(void* arg) {
  struct async_connect* a = arg;
  int err = 0;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); /* blocking, as fastsocket's */
  if (fd < 0) {
    err = errno;
  } else if (connect(fd, (struct sockaddr*)&a->addr, sizeof a->addr) != 0) {
    err = errno;
    close(fd);
    fd = -1;
  }
  pthread_mutex_lock(&lock);
  a->fd = fd;
  a->err = err;
  a->done = 1;
  pthread_mutex_unlock(&lock);
  return NULL;
}

/* Starts the background connect at the first call; gives the comm once it is done and
 * ASYNC_NULL_CALLS calls have returned none. */
static result_t async_connect(struct handle* h, void** send_comm) {
  if (!h->async) {
    struct async_connect* a = calloc(1, sizeof *a);
    if (!a) return RC_SYSTEM;
    a->addr = h->addr;
    pthread_t t;
    if (pthread_create(&t, NULL, connect_in_background, a) != 0) {
      free(a);
      return RC_SYSTEM;
    }
    pthread_detach(t);
    h->async = a;
  }
  struct async_connect* a = h->async;
  pthread_mutex_lock(&lock);
  int ready = ++a->calls > ASYNC_NULL_CALLS && a->done;
  pthread_mutex_unlock(&lock);
  if (!ready) return RC_OK; /* not yet: call again */
  h->async = NULL;
  int fd = a->fd, err = a->err;
  free(a);
  if (fd < 0) {
    LOG(LOG_WARN, "CTcp: connect failed: %s", strerror(err));
    return RC_SYSTEM;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return adopt_socket(fd, 1, send_comm);
}

/* Blocks until a peer connects (ACCEPT_WAIT_S at most). */
static result_t wait_for_peer(struct listener* l) {
  struct pollfd p = {.fd = l->fd, .events = POLLIN};
  int n;
  while ((n = poll(&p, 1, ACCEPT_WAIT_S * 1000)) < 0 && errno == EINTR) {
  }
  if (n > 0) return RC_OK;
  LOG(LOG_WARN, "CTcp: accept waited %d s and no peer connected (this test build's accept blocks, as "
                "nccl-fastsocket's: the caller must connect its sends before it accepts)",
      ACCEPT_WAIT_S);
  return RC_SYSTEM;
}
#endif

result_t ctcp_connect(int dev, void* handle, void** send_comm) {
  struct handle* h = handle;
  *send_comm = NULL;
  if (dev < 0 || dev >= ctcp_ndevs() || h->magic != HANDLE_MAGIC) return RC_INVALID_ARG;
#ifdef CTCP_ASYNC_SETUP
  return async_connect(h, send_comm);
#endif
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
  return adopt_socket(fd, 1, send_comm);
}

result_t ctcp_accept(void* listen_comm, void** recv_comm) {
  struct listener* l = listen_comm;
  *recv_comm = NULL;
#ifdef CTCP_ASYNC_SETUP
  result_t waited = wait_for_peer(l);
  if (waited != RC_OK) return waited;
#endif
  int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? RC_OK : RC_SYSTEM;
  return adopt_socket(fd, 0, recv_comm);
}

result_t ctcp_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  (void)data;
  (void)size;
  if (!comm || type != PTR_HOST) return RC_INVALID_ARG;
  *mhandle = &mhandle_token;
  return RC_OK;
}

result_t ctcp_dereg_mr(void* comm, void* mhandle) {
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

result_t ctcp_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void** request) {
  if (mhandle != &mhandle_token) return RC_INVALID_ARG;
  return post(send_comm, 1, 1, &data, &size, &tag, request);
}

result_t ctcp_irecv(void* recv_comm, int n, void** data, const size_t* sizes, int* tags, void** mhandles,
                          void** request) {
  for (int i = 0; i < n; i++)
    if (mhandles[i] != &mhandle_token) return RC_INVALID_ARG;
  return post(recv_comm, 0, n, data, sizes, tags, request);
}

result_t ctcp_test(void* request, int* done, int* sizes) {
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
#ifdef CTCP_ASYNC_SETUP /* that build never says how much arrived, as nccl-fastsocket */
    (void)sizes;
#else
    if (sizes)
      for (int i = 0; i < r->n; i++) sizes[i] = (int)r->got[i];
#endif
    r->used = 0;
  }
  pthread_mutex_unlock(&lock);
  return rc;
}

/* A receive connection closed with receives still posted: NCCL never does that (it posts a
 * receive only for a step of an operation), and some vendors' plugins leak or invalidate
 * them. Said as a warning; with CTCP_CHECK_CLOSE=1 in the environment the process aborts,
 * so that tests see it. */
static void check_close(struct comm* c) {
  int inflight = 0;
  for (int i = 0; i < MAX_REQS; i++) inflight += c->reqs[i].used != 0;
  if (c->is_send || inflight == 0) return;
  LOG(LOG_WARN, "CTcp: closing a receive connection with %d receives in flight", inflight);
  const char* strict = getenv("CTCP_CHECK_CLOSE");
  if (strict && strcmp(strict, "1") == 0) {
    fprintf(stderr, "CTcp: CTCP_CHECK_CLOSE=1: a receive connection was closed with %d receives in flight\n", inflight);
    abort();
  }
}

result_t ctcp_close_comm(void* comm) {
  struct comm* c = comm;
  if (!c) return RC_INVALID_ARG;
  pthread_mutex_lock(&lock);
  check_close(c);
  if (c->prev) c->prev->next = c->next;
  else comms = c->next;
  if (c->next) c->next->prev = c->prev;
  pthread_mutex_unlock(&lock);
  close(c->fd);
  free(c);
  return RC_OK;
}

result_t ctcp_close_listen(void* listen_comm) {
  struct listener* l = listen_comm;
  if (!l) return RC_INVALID_ARG;
  close(l->fd);
  free(l);
  return RC_OK;
}

