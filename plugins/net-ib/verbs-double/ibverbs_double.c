/*
 * ibverbs_double.c - a userspace stand-in for libibverbs.so.1, for tests without RDMA hardware.
 *
 * One RoCE-like device whose RC queue pairs talk to their peers (other processes, or this one)
 * over TCP. Written from the verbs API's documented behaviour (verbs.h and the ibv_* man
 * pages), against the system's <infiniband/verbs.h> so that every struct layout and the
 * inline calls through ibv_context.ops are the real library's. README.md says what is
 * modelled and what is not.
 *
 * Layout of this file:
 *   1. process state, environment knobs, small helpers (byte buffers, the wire header)
 *   2. device, context, port, GID table
 *   3. PD, MR (the key table), CQ and completion channels
 *   4. QP: create / modify (the state machine; RTR opens the TCP link) / query / destroy
 *   5. posting: post_send serialises the request onto the link, post_recv queues buffers
 *   6. the progress thread: accepts links, applies incoming requests (rkey, bounds and access
 *      checks), answers with ACK / READ_RESP, turns answers into requester completions, and
 *      moves a QP to ERR (flushing its work) on an error answer or EOF.
 *   7. async events: the IBV_DOUBLE_ASYNC_EVENT knob raises them, each context queues them for
 *      ibv_get_async_event, ibv_ack_async_event lets their effect (QPs to ERR, ...) happen.
 *
 * Locking: one process lock (G.lock) guards QPs, MRs and links; each CQ has its own lock so
 * that a polling thread does not contend with the progress thread for long. Order: G.lock,
 * then a CQ lock. Links are freed only by the progress thread.
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* verbs.h wraps these in function-like macros (inline helpers that call the exported symbol);
 * the definitions below are those exported symbols. */
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

/* Not in verbs.h: Debian's library exports it as IBVERBS_PRIVATE_34 (rdma-core's driver.h). */
enum ibv_gid_type_sysfs { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };
int ibv_query_gid_type(struct ibv_context *ctx, uint8_t port_num, unsigned int index,
		       enum ibv_gid_type_sysfs *type);

/* ------------------------------------------------------------------------------------------ */
/* 1. Process state, knobs, helpers                                                            */
/* ------------------------------------------------------------------------------------------ */

#define DBL_GID_COUNT 4        /* fe80 v1, fe80 v2, ::ffff:ip v1, ::ffff:ip v2 (mlx5's order) */
#define DBL_MAX_DEVICES 16     /* IBV_DOUBLE_DEVICES: dbl_0 .. dbl_15 */
#define DBL_MAX_PORTS 4        /* IBV_DOUBLE_PORTS: ports of each device */
#define DBL_MAX_QPS 65536      /* QPN: listener port offset << 16 | slot */
#define DBL_PORT_TRIES 256     /* listeners take base .. base+255 */
#define DBL_MAX_INLINE 512
#define DBL_MAX_SGE 16
#define DBL_MAX_WR 16384
#define DBL_MAX_CQE 262144
#define DBL_READ_CHUNK (256 * 1024)

struct dbl_mr {
	struct ibv_mr mr;
	uint64_t iova;          /* the address remote peers use for byte 0 of the region */
	int access;             /* enum ibv_access_flags */
	void *map;              /* ibv_reg_dmabuf_mr: the double's mapping of the fd, unmapped at */
	size_t map_len;         /* dereg (NULL for ibv_reg_mr) */
	struct dbl_mr *next;
};

struct dbl_cq {
	struct ibv_cq cq;
	pthread_mutex_t lock;
	struct ibv_wc *ring;
	int cap, head, count;
	bool armed;             /* ibv_req_notify_cq called: the next completion raises an event */
	bool overrun_reported;
	bool error;             /* IBV_EVENT_CQ_ERR raised: takes no more completions */
	unsigned events_reported; /* async events naming it read by ibv_get_async_event */
};

/* A send-queue entry: posted, waiting for its answer (or for its turn to fail). */
struct dbl_swr {
	uint64_t wr_id;
	enum ibv_wc_opcode opcode;
	bool signaled;
	uint32_t len;
	enum ibv_wc_status preset;  /* != SUCCESS: completes with this status when at the head */
	int num_sge;                /* RDMA_READ: where the answer's bytes go */
	struct ibv_sge sge[DBL_MAX_SGE];
	struct dbl_swr *next;
};

struct dbl_rwr {
	uint64_t wr_id;
	int num_sge;
	struct ibv_sge sge[DBL_MAX_SGE];
	struct dbl_rwr *next;
};

struct dbuf {
	char *p;
	size_t off, len, cap;   /* live bytes are p[off .. len) */
};

/* IBV_DOUBLE_REORDER: a plain RDMA write acknowledged but not yet placed. The target is looked up
 * again when it is placed, so a region deregistered meanwhile is not written. */
struct dbl_deferred {
	struct ibv_pd *pd;
	uint32_t rkey, len;
	uint64_t addr;
	char *bytes;
};

/* A TCP link. A QP pair shares one link; a QP connected to itself uses a socketpair (two links,
 * both owned by it). Requests go out on qp->link; answers go back on the link a request came in. */
struct dbl_link {
	int fd;                 /* -1: placeholder, waiting for the peer to connect */
	struct dbl_qp *qp;      /* NULL: accepted, its HELLO not matched yet */
	struct dbuf out, in;
	bool stalled;           /* head message needs a receive WR and none is posted (RNR) */
	struct timespec stall_since;
	struct dbl_deferred *deferred; /* IBV_DOUBLE_REORDER: acknowledged writes not placed yet */
	int ndeferred;
	struct timespec deferred_since;
	bool rnr_nak;           /* IBV_DOUBLE_RNR: the head request was NAKed, retried after a while */
	struct timespec rnr_since;
	bool dead;              /* to be closed and freed by the progress thread */
	struct dbl_link *next;
};

struct dbl_qp {
	struct ibv_qp qp;
	struct ibv_qp_attr attr;        /* what modify_qp set */
	struct ibv_qp_cap cap;
	bool sq_sig_all;
	uint32_t remote_ip;             /* network order, from RTR's GRH dgid */
	bool unreachable;               /* dgid not IPv4-mapped or connect failed: sends fail */
	bool doomed;                    /* a WR in the send queue will fail: later ones flush */
	struct timespec rtr_time;
	struct dbl_link *link;
	struct dbl_swr *sq_head, *sq_tail;
	int sq_count;
	struct dbl_rwr *rq_head, *rq_tail;
	int rq_count;
	unsigned events_reported;       /* async events naming it read by ibv_get_async_event */
};

/* An async event queued on a context, not read yet. */
struct dbl_event {
	struct ibv_async_event ev;
	struct dbl_event *next;
};

/* An open device. async_fd is the read end of a pipe whose write end is cmd_fd: one byte per
 * queued event, so the fd polls readable exactly when ibv_get_async_event has something. */
struct dbl_context {
	struct ibv_context ctx;
	struct dbl_event *events, *events_tail;
	int readers;            /* threads inside ibv_get_async_event */
	bool closed;            /* ibv_close_device ran: the last reader frees the context */
	struct dbl_context *next;
};

/* IBV_DOUBLE_ASYNC_EVENT kinds: the event, what its element is, what it does to the device. */
enum dbl_scope { ON_DEVICE, ON_PORT, ON_QP, ON_CQ };
enum dbl_effect { FX_NONE, FX_DEVICE_FATAL, FX_PORT_DOWN, FX_PORT_UP, FX_QP_ERR, FX_CQ_ERR };
struct dbl_async_kind {
	const char *name;
	enum ibv_event_type type;
	enum dbl_scope scope;
	enum dbl_effect effect;
};

/* A raised event whose effect waits until every context that queued it has acked it. */
struct dbl_pending {
	const struct dbl_async_kind *kind;
	uint32_t qpn;           /* ON_QP: the QP the event names */
	struct ibv_cq *cq;      /* ON_CQ: the CQ it names */
	int unacked;
	struct timespec raised;
	struct dbl_pending *next;
};

#define DBL_MAX_ASYNC 16        /* kinds in IBV_DOUBLE_ASYNC_EVENT */
#define DBL_EFFECT_MS 500.0     /* an event's effect happens at the latest this long after it */

/* Wire header; payload of `len` bytes follows for WRITE*, SEND*, READ_RESP. Host byte order:
 * both ends run this library on the same kind of machine. */
enum { M_HELLO = 1, M_WRITE, M_WRITE_IMM, M_SEND, M_SEND_IMM, M_READ, M_ACK, M_READ_RESP, M_BYE };
struct dbl_msg {
	uint8_t type;
	uint8_t status;         /* ACK / READ_RESP: enum ibv_wc_status for the requester */
	uint8_t rnr_retry;      /* requests: the requester QP's rnr_retry (7 = retry for ever) */
	uint8_t reserved;
	uint32_t imm;           /* as posted (already big-endian) */
	uint32_t rkey;
	uint32_t len;
	uint64_t addr;
	uint32_t src_qpn, dst_qpn;
};

static struct {
	pthread_once_t once;
	pthread_mutex_t lock;
	struct ibv_device devs[DBL_MAX_DEVICES];
	int ndevs;              /* IBV_DOUBLE_DEVICES, default 1 */
	int nports;             /* IBV_DOUBLE_PORTS: ports of each device, default 1 */
	uint32_t ip;            /* network order; every port of every device answers on it */
	int port_base;
	int port_index;         /* listener port = port_base + port_index */
	int listen_fd;
	int wake[2];
	bool started;
	pthread_t thread;
	struct dbl_qp *qps[DBL_MAX_QPS];
	int next_qp_slot;
	struct dbl_mr *mrs;
	uint32_t next_key;
	struct dbl_link *links;
	long fail_after;        /* IBV_DOUBLE_FAIL_AFTER: -1 off */
	long posted;            /* send WRs posted so far in this process */
	enum ibv_wc_status fail_status;
	unsigned delay_us;      /* IBV_DOUBLE_DELAY_US: responder sleeps this long per request */
	bool reorder;           /* IBV_DOUBLE_REORDER: plain writes placed late, in reverse order */
	int connect_timeout_ms; /* IBV_DOUBLE_CONNECT_TIMEOUT_MS */
	bool dmabuf;            /* IBV_DOUBLE_DMABUF (1): ibv_reg_dmabuf_mr maps the fd; 0: EOPNOTSUPP */
	bool verbose;
	long rnr_left;          /* IBV_DOUBLE_RNR: receive-consuming requests still to NAK once */
	long rnr_given;
	bool reorder_reported;
	struct dbl_context *ctxs; /* open contexts (async events go to them) */
	const struct dbl_async_kind *async[DBL_MAX_ASYNC]; /* IBV_DOUBLE_ASYNC_EVENT, in order */
	int async_count, async_next;
	char *async_trigger;    /* IBV_DOUBLE_ASYNC_TRIGGER: raise the next kind when it exists */
	bool async_armed;       /* the trigger file appeared; the kind waits for its element */
	struct dbl_pending *pending;
	bool port_down;         /* port_err raised (port_active undoes it) */
	bool stats;             /* IBV_DOUBLE_STATS: print the counters below at exit */
	/* Data moved by this process's verbs calls (atomics: posters and the progress thread). */
	unsigned long long writes_posted, write_bytes_posted;  /* RDMA_WRITE(_WITH_IMM) posted */
	unsigned long long writes_placed, write_bytes_placed;  /* peers' RDMA writes placed here */
	unsigned long long reads_posted, read_bytes_posted;    /* RDMA_READ posted */
	unsigned long long sends_posted, send_bytes_posted;    /* SEND(_WITH_IMM) posted */
} G = { .once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER, .listen_fd = -1 };

static void dbl_log(const char *fmt, ...)
{
	if (!G.verbose)
		return;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "ibverbs-double[%d]: ", (int)getpid());
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* Always printed: something a test author must see (bad configuration, misuse). */
static void dbl_warn(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "ibverbs-double[%d]: ", (int)getpid());
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static long env_long(const char *name, long dflt)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return dflt;
	char *end;
	long x = strtol(v, &end, 0);
	if (*end) {
		dbl_warn("%s=%s is not a number; using %ld", name, v, dflt);
		return dflt;
	}
	return x;
}

/* IBV_DOUBLE_STATS: one more request of `bytes` in a counter pair. */
static void stat_add(unsigned long long *count, unsigned long long *bytes, size_t n)
{
	__atomic_fetch_add(count, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(bytes, (unsigned long long)n, __ATOMIC_RELAXED);
}

static void count_posted(int type, size_t bytes)
{
	if (type == M_WRITE || type == M_WRITE_IMM)
		stat_add(&G.writes_posted, &G.write_bytes_posted, bytes);
	else if (type == M_READ)
		stat_add(&G.reads_posted, &G.read_bytes_posted, bytes);
	else
		stat_add(&G.sends_posted, &G.send_bytes_posted, bytes);
}

/* IBV_DOUBLE_STATS=1: what this process moved through verbs calls, printed at exit (or when the
 * library is unloaded), so that a test can tell that a program's bytes went through RDMA. */
__attribute__((destructor)) static void print_stats(void)
{
	if (!G.stats)
		return;
	fprintf(stderr,
		"ibverbs-double[%d]: stats: RDMA writes posted %llu (%llu bytes), placed here %llu (%llu bytes); "
		"RDMA reads posted %llu (%llu bytes); sends posted %llu (%llu bytes)\n",
		(int)getpid(), G.writes_posted, G.write_bytes_posted, G.writes_placed, G.write_bytes_placed,
		G.reads_posted, G.read_bytes_posted, G.sends_posted, G.send_bytes_posted);
}

static void wake_progress(void)
{
	char c = 0;
	if (G.wake[1] >= 0 && write(G.wake[1], &c, 1) < 0 && errno != EAGAIN)
		dbl_log("wake: %s", strerror(errno));
}

static int dbuf_reserve(struct dbuf *b, size_t more)
{
	if (b->off && b->off == b->len)
		b->off = b->len = 0;
	if (b->len + more <= b->cap)
		return 0;
	if (b->off) { /* compact first */
		memmove(b->p, b->p + b->off, b->len - b->off);
		b->len -= b->off;
		b->off = 0;
		if (b->len + more <= b->cap)
			return 0;
	}
	size_t cap = b->cap ? b->cap : 4096;
	while (cap < b->len + more)
		cap *= 2;
	char *p = realloc(b->p, cap);
	if (!p)
		return ENOMEM;
	b->p = p;
	b->cap = cap;
	return 0;
}

static size_t dbuf_size(const struct dbuf *b) { return b->len - b->off; }

static void dbuf_free(struct dbuf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

static void set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); /* fails on a socketpair: fine */
}

/* ------------------------------------------------------------------------------------------ */
/* 2. Device, context, port, GID table                                                         */
/* ------------------------------------------------------------------------------------------ */

static void async_parse_knobs(void);
static void async_progress(void);
static void async_forget_object(struct dbl_qp *q, struct ibv_cq *cq);

static void global_init(void)
{
	const char *name = getenv("IBV_DOUBLE_NAME");
	const char *ip = getenv("IBV_DOUBLE_IP");
	if (!ip || !*ip)
		ip = "127.0.0.1";
	struct in_addr a;
	if (inet_pton(AF_INET, ip, &a) != 1) {
		dbl_warn("IBV_DOUBLE_IP=%s is not an IPv4 address; using 127.0.0.1", ip);
		inet_pton(AF_INET, "127.0.0.1", &a);
	}
	G.ip = a.s_addr;
	G.verbose = env_long("IBV_DOUBLE_VERBOSE", 0) != 0;
	G.stats = env_long("IBV_DOUBLE_STATS", 0) != 0;
	G.port_base = (int)env_long("IBV_DOUBLE_PORT", 19000);
	G.fail_after = env_long("IBV_DOUBLE_FAIL_AFTER", -1);
	G.fail_status = (enum ibv_wc_status)env_long("IBV_DOUBLE_FAIL_STATUS", IBV_WC_RETRY_EXC_ERR);
	G.delay_us = (unsigned)env_long("IBV_DOUBLE_DELAY_US", 0);
	G.reorder = env_long("IBV_DOUBLE_REORDER", 0) != 0;
	G.connect_timeout_ms = (int)env_long("IBV_DOUBLE_CONNECT_TIMEOUT_MS", 10000);
	G.ndevs = (int)env_long("IBV_DOUBLE_DEVICES", 1);
	if (G.ndevs < 1 || G.ndevs > DBL_MAX_DEVICES) {
		dbl_warn("IBV_DOUBLE_DEVICES=%d is outside 1..%d; using 1", G.ndevs, DBL_MAX_DEVICES);
		G.ndevs = 1;
	}
	G.nports = (int)env_long("IBV_DOUBLE_PORTS", 1);
	if (G.nports < 1 || G.nports > DBL_MAX_PORTS) {
		dbl_warn("IBV_DOUBLE_PORTS=%d is outside 1..%d; using 1", G.nports, DBL_MAX_PORTS);
		G.nports = 1;
	}
	G.dmabuf = env_long("IBV_DOUBLE_DMABUF", 1) != 0;
	G.rnr_left = env_long("IBV_DOUBLE_RNR", 0);
	async_parse_knobs();
	G.next_key = 0x1000;
	G.next_qp_slot = 2; /* QPN 0 and 1 are special in IB */
	G.wake[0] = G.wake[1] = -1;

	for (int i = 0; i < G.ndevs; i++) {
		struct ibv_device *d = &G.devs[i];
		d->node_type = IBV_NODE_CA;
		d->transport_type = IBV_TRANSPORT_IB;
		if (i == 0 && name && *name)
			snprintf(d->name, sizeof(d->name), "%s", name);
		else
			snprintf(d->name, sizeof(d->name), "dbl_%d", i);
		snprintf(d->dev_name, sizeof(d->dev_name), "uverbs_dbl%d", i);
		snprintf(d->dev_path, sizeof(d->dev_path), "/nonexistent/ibverbs-double/uverbs_dbl%d", i);
		snprintf(d->ibdev_path, sizeof(d->ibdev_path), "/nonexistent/ibverbs-double/%s", d->name);
	}
}

/* The index of one of the double's devices, or -1. */
static int dev_index(const struct ibv_device *device)
{
	for (int i = 0; i < G.ndevs; i++)
		if (device == &G.devs[i])
			return i;
	return -1;
}

/* A device's node GUID (host order): locally administered, made from the address and the device
 * index, so stable, distinct per IP and per device, and shared by the ports of one device (as
 * the ports of one HCA share its node GUID). Device 0's is the one a single-device double had. */
static uint64_t dev_guid(int index)
{
	return ((0x0200dbffULL - (uint64_t)index) << 32) | ntohl(G.ip);
}

static uint64_t ctx_guid(const struct ibv_context *ctx)
{
	int i = ctx ? dev_index(ctx->device) : -1;
	return dev_guid(i < 0 ? 0 : i);
}

static bool port_ok(unsigned port_num) { return port_num >= 1 && port_num <= (unsigned)G.nports; }

struct ibv_device **ibv_get_device_list(int *num_devices)
{
	pthread_once(&G.once, global_init);
	struct ibv_device **l = calloc((size_t)G.ndevs + 1, sizeof(*l));
	if (!l) {
		errno = ENOMEM;
		return NULL;
	}
	for (int i = 0; i < G.ndevs; i++)
		l[i] = &G.devs[i];
	if (num_devices)
		*num_devices = G.ndevs;
	return l;
}

void ibv_free_device_list(struct ibv_device **list) { free(list); }

const char *ibv_get_device_name(struct ibv_device *device) { return device->name; }

__be64 ibv_get_device_guid(struct ibv_device *device)
{
	int i = dev_index(device);
	return htobe64(dev_guid(i < 0 ? 0 : i));
}

int ibv_get_device_index(struct ibv_device *device)
{
	return dev_index(device);
}

static void *progress_main(void *arg);

/* The listener and the progress thread start with the first opened context. */
static int start_progress_locked(void)
{
	if (G.started)
		return 0;
	for (int i = 0; i < DBL_PORT_TRIES; i++) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return errno;
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = G.ip,
					  .sin_port = htons((uint16_t)(G.port_base + i)) };
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(fd, 128) == 0) {
			set_nonblock(fd);
			G.listen_fd = fd;
			G.port_index = i;
			break;
		}
		close(fd);
	}
	if (G.listen_fd < 0) {
		dbl_warn("no free TCP port in %d..%d on the double's address (IBV_DOUBLE_IP); "
			 "set IBV_DOUBLE_PORT to a free range", G.port_base, G.port_base + DBL_PORT_TRIES - 1);
		return EADDRINUSE;
	}
	if (pipe2(G.wake, O_NONBLOCK | O_CLOEXEC) != 0)
		return errno;
	int rc = pthread_create(&G.thread, NULL, progress_main, NULL);
	if (rc)
		return rc;
	pthread_detach(G.thread);
	G.started = true;
	dbl_log("%d device(s) of %d port(s) listening on port %d", G.ndevs, G.nports,
		G.port_base + G.port_index);
	return 0;
}

static int dbl_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int dbl_req_notify_cq(struct ibv_cq *cq, int solicited_only);
static int dbl_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int dbl_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

static int dbl_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	(void)srq;
	*bad = wr;
	return EOPNOTSUPP;
}

static struct ibv_mw *dbl_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	(void)pd; (void)type;
	errno = EOPNOTSUPP;
	return NULL;
}

static int dbl_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *bind)
{
	(void)qp; (void)mw; (void)bind;
	return EOPNOTSUPP;
}

static int dbl_dealloc_mw(struct ibv_mw *mw)
{
	(void)mw;
	return EOPNOTSUPP;
}

/* abi_compat stays NULL (not __VERBS_ABI_IS_EXTENDED): the header's inline helpers then see no
 * verbs_context and use the exported functions (ibv_query_port) or return EOPNOTSUPP
 * (ibv_query_device_ex, ibv_create_cq_ex, ...), as with a provider of the old ABI. */
struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	pthread_once(&G.once, global_init);
	if (dev_index(device) < 0) {
		errno = ENODEV;
		return NULL;
	}
	pthread_mutex_lock(&G.lock);
	int rc = start_progress_locked();
	pthread_mutex_unlock(&G.lock);
	if (rc) {
		errno = rc;
		return NULL;
	}
	struct dbl_context *c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	struct ibv_context *ctx = &c->ctx;
	int async[2];
	if (pipe2(async, O_CLOEXEC) != 0) {
		free(c);
		return NULL;
	}
	ctx->device = device;
	ctx->cmd_fd = async[1];    /* the async events' pipe: one byte per queued event */
	ctx->async_fd = async[0];  /* blocking, as the real one (programs may set O_NONBLOCK) */
	ctx->num_comp_vectors = 1;
	pthread_mutex_init(&ctx->mutex, NULL);
	ctx->abi_compat = NULL;
	ctx->ops.poll_cq = dbl_poll_cq;
	ctx->ops.req_notify_cq = dbl_req_notify_cq;
	ctx->ops.post_send = dbl_post_send;
	ctx->ops.post_recv = dbl_post_recv;
	ctx->ops.post_srq_recv = dbl_post_srq_recv;
	ctx->ops.alloc_mw = dbl_alloc_mw;
	ctx->ops.bind_mw = dbl_bind_mw;
	ctx->ops.dealloc_mw = dbl_dealloc_mw;
	pthread_mutex_lock(&G.lock);
	c->next = G.ctxs;
	G.ctxs = c;
	pthread_mutex_unlock(&G.lock);
	return ctx;
}

static void async_drop_queue_locked(struct dbl_context *c);

/* Closing the write end of the events' pipe wakes a thread blocked in ibv_get_async_event on
 * this context (it reads EOF and returns -1, errno EBADF); the last such reader frees the
 * context, so none touches freed memory. Queued events are dropped (their effects happen). */
int ibv_close_device(struct ibv_context *ctx)
{
	struct dbl_context *c = (struct dbl_context *)ctx;
	pthread_mutex_lock(&G.lock);
	for (struct dbl_context **pp = &G.ctxs; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	async_drop_queue_locked(c);
	c->closed = true;
	close(ctx->cmd_fd);
	bool last = c->readers == 0;
	pthread_mutex_unlock(&G.lock);
	if (last) {
		close(ctx->async_fd);
		pthread_mutex_destroy(&ctx->mutex);
		free(c);
	}
	return 0;
}

static void async_reported_locked(const struct ibv_async_event *ev);

/* The next queued event of this context. Blocks while there is none (unless the program made
 * async_fd non-blocking: then -1 with errno EAGAIN), as the real call does. */
int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event)
{
	struct dbl_context *c = (struct dbl_context *)ctx;
	pthread_mutex_lock(&G.lock);
	c->readers++;
	int rc = -1, err = EBADF;
	while (!c->closed) {
		pthread_mutex_unlock(&G.lock);
		char b;
		ssize_t r = read(ctx->async_fd, &b, 1);
		int e = errno;
		pthread_mutex_lock(&G.lock);
		if (r < 0 && e == EINTR)
			continue;
		if (r < 0) {
			err = e;
			break;
		}
		if (r == 0 || c->closed)
			break; /* EOF: the context was closed */
		struct dbl_event *q = c->events;
		if (!q)
			continue; /* its event was dropped (the object it named was destroyed) */
		c->events = q->next;
		if (!c->events)
			c->events_tail = NULL;
		*event = q->ev;
		free(q);
		async_reported_locked(event);
		rc = 0;
		break;
	}
	c->readers--;
	bool last = c->closed && c->readers == 0;
	pthread_mutex_unlock(&G.lock);
	if (last) {
		close(ctx->async_fd);
		pthread_mutex_destroy(&ctx->mutex);
		free(c);
	}
	if (rc)
		errno = err;
	return rc;
}

int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a)
{
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "ibverbs-double-1");
	a->node_guid = htobe64(ctx_guid(ctx));
	a->sys_image_guid = htobe64(ctx_guid(ctx));
	a->max_mr_size = UINT64_MAX;
	a->page_size_cap = 0xfffff000;
	a->vendor_id = 0;  /* not a real vendor: tools must not pick vendor-specific paths */
	a->vendor_part_id = 0;
	a->hw_ver = 1;
	a->max_qp = DBL_MAX_QPS - 2;
	a->max_qp_wr = DBL_MAX_WR;
	a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
	a->max_sge = DBL_MAX_SGE;
	a->max_sge_rd = DBL_MAX_SGE;
	a->max_cq = 65536;
	a->max_cqe = DBL_MAX_CQE;
	a->max_mr = 1 << 24;
	a->max_pd = 1 << 24;
	a->max_qp_rd_atom = 16;
	a->max_qp_init_rd_atom = 16;
	a->max_res_rd_atom = 1 << 20;
	a->atomic_cap = IBV_ATOMIC_NONE;
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 16;
	a->phys_port_cnt = (uint8_t)G.nports;
	return 0;
}

static void fill_port(struct ibv_port_attr *p)
{
	memset(p, 0, sizeof(*p));
	p->state = G.port_down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
	p->max_mtu = IBV_MTU_4096;
	p->active_mtu = IBV_MTU_4096;
	p->gid_tbl_len = DBL_GID_COUNT;
	p->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
	p->max_msg_sz = 1U << 30;
	p->pkey_tbl_len = 1;
	p->lid = 0;              /* Ethernet: no LID, routes by GID */
	p->max_vl_num = 4;
	p->active_width = 2;     /* 4X */
	p->active_speed = 32;    /* EDR (25 Gb/s a lane): 100 Gb/s */
	p->phys_state = G.port_down ? 2 : 5; /* Polling (after port_err) or LinkUp */
	p->link_layer = IBV_LINK_LAYER_ETHERNET;
}

/* The exported ibv_query_port is the compat entry: the caller's struct may be the old, shorter
 * one (_compat_ibv_port_attr, which ends at `flags`), so only that much is written. verbs.h's
 * inline ibv_query_port zeroes the whole struct before calling it. */
int ibv_query_port(struct ibv_context *ctx, uint8_t port_num, struct _compat_ibv_port_attr *out)
{
	(void)ctx;
	if (!port_ok(port_num))
		return EINVAL;
	struct ibv_port_attr p;
	fill_port(&p);
	memcpy(out, &p, offsetof(struct ibv_port_attr, port_cap_flags2));
	return 0;
}

/* A port's GID table, in the order mlx5 shows for one IPv4 address: every port of every device
 * has one, on the same IPv4 (IBV_DOUBLE_IP); the link-local entries carry the port's GUID (the
 * device's, plus the port number less one). */
static bool gid_entry(const struct ibv_context *ctx, unsigned port_num, unsigned index,
		      union ibv_gid *gid, enum ibv_gid_type *type)
{
	if (!port_ok(port_num) || index >= DBL_GID_COUNT)
		return false;
	memset(gid, 0, sizeof(*gid));
	if (index < 2) { /* fe80::<port guid> */
		gid->raw[0] = 0xfe;
		gid->raw[1] = 0x80;
		uint64_t g = htobe64(ctx_guid(ctx) + port_num - 1);
		memcpy(&gid->raw[8], &g, 8);
	} else {         /* ::ffff:a.b.c.d */
		gid->raw[10] = 0xff;
		gid->raw[11] = 0xff;
		memcpy(&gid->raw[12], &G.ip, 4);
	}
	*type = (index % 2) ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
	return true;
}

int ibv_query_gid(struct ibv_context *ctx, uint8_t port_num, int index, union ibv_gid *gid)
{
	enum ibv_gid_type t;
	if (index < 0 || !gid_entry(ctx, port_num, (unsigned)index, gid, &t))
		return -1;
	return 0;
}

int _ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port_num, uint32_t gid_index,
		      struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	if (flags || entry_size < sizeof(*entry))
		return EINVAL;
	enum ibv_gid_type t;
	if (!gid_entry(ctx, port_num, gid_index, &entry->gid, &t))
		return ENODATA;
	entry->gid_index = gid_index;
	entry->port_num = port_num;
	entry->gid_type = t;
	entry->ndev_ifindex = 1;
	return 0;
}

ssize_t _ibv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries,
			     size_t max_entries, uint32_t flags, size_t entry_size)
{
	if (flags || entry_size < sizeof(*entries))
		return -EINVAL;
	size_t total = (size_t)G.nports * DBL_GID_COUNT; /* every port's table, port by port */
	if (max_entries < total)
		return -EINVAL;
	for (uint32_t p = 1; p <= (uint32_t)G.nports; p++)
		for (uint32_t i = 0; i < DBL_GID_COUNT; i++)
			_ibv_query_gid_ex(ctx, p, i, &entries[(p - 1) * DBL_GID_COUNT + i], 0,
					  sizeof(*entries));
	return (ssize_t)total;
}

/* Private in Debian's library (IBVERBS_PRIVATE_34); type 0 = IB/RoCE v1, 1 = RoCE v2. */
int ibv_query_gid_type(struct ibv_context *ctx, uint8_t port_num, unsigned int index,
		       enum ibv_gid_type_sysfs *type)
{
	union ibv_gid gid;
	enum ibv_gid_type t;
	if (!gid_entry(ctx, port_num, index, &gid, &t))
		return -1;
	*type = t == IBV_GID_TYPE_ROCE_V2 ? IBV_GID_TYPE_SYSFS_ROCE_V2 : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
	return 0;
}

int ibv_query_pkey(struct ibv_context *ctx, uint8_t port_num, int index, __be16 *pkey)
{
	(void)ctx;
	if (!port_ok(port_num) || index != 0)
		return -1;
	*pkey = htobe16(0xffff);
	return 0;
}

int ibv_get_pkey_index(struct ibv_context *ctx, uint8_t port_num, __be16 pkey)
{
	(void)ctx;
	return (port_ok(port_num) && be16toh(pkey) == 0xffff) ? 0 : -1;
}

/* ------------------------------------------------------------------------------------------ */
/* 3. PD, MR, CQ, completion channels                                                          */
/* ------------------------------------------------------------------------------------------ */

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
	struct ibv_pd *pd = calloc(1, sizeof(*pd));
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->context = ctx;
	return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
				unsigned int access)
{
	/* Remote write or atomic without local write is invalid (ibv_reg_mr(3)). */
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE)) {
		errno = EINVAL;
		return NULL;
	}
	if (!addr && length) {
		errno = EINVAL;
		return NULL;
	}
	struct dbl_mr *m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = length;
	m->iova = iova;
	m->access = (int)access;
	pthread_mutex_lock(&G.lock);
	/* Keys: a counter in the high bits and a varying low byte, so a stale key rarely matches. */
	uint32_t key = (G.next_key++ << 8) | (uint32_t)((uintptr_t)m >> 4 & 0xff);
	m->mr.lkey = m->mr.rkey = key;
	m->mr.handle = key;
	m->next = G.mrs;
	G.mrs = m;
	pthread_mutex_unlock(&G.lock);
	dbl_log("reg_mr %p+%zu iova 0x%llx access 0x%x key 0x%x", addr, length,
		(unsigned long long)iova, access, key);
	return &m->mr;
}

struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
			       int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned int)access);
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

/* A dma-buf stands for device memory the process cannot touch by address: the double maps the fd
 * itself (MAP_SHARED, so the pages are the fd's) and makes that mapping the region, addressed by
 * peers through `iova`. Any mmap-able fd serves (a memfd in tests); a real dma-buf exporter may
 * refuse mmap, which only a GPU machine shows. fd -1 is EBADF, as the kernel answers, so NCCL's
 * probe (fd -1: EOPNOTSUPP / EPROTONOSUPPORT = unsupported) reads "supported";
 * IBV_DOUBLE_DMABUF=0 answers EOPNOTSUPP, as a kernel without dma-buf support. */
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova,
				 int fd, int access)
{
	pthread_once(&G.once, global_init);
	if (!G.dmabuf) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (fd < 0) {
		errno = EBADF;
		return NULL;
	}
	struct stat st;
	if (fstat(fd, &st) != 0)
		return NULL; /* EBADF */
	if (!length || offset > (uint64_t)st.st_size || length > (uint64_t)st.st_size - offset) {
		dbl_log("reg_dmabuf_mr fd %d: offset %llu + %zu bytes is outside its %lld bytes", fd,
			(unsigned long long)offset, length, (long long)st.st_size);
		errno = EINVAL;
		return NULL;
	}
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t lead = offset % page;
	size_t map_len = length + lead;
	char *map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)(offset - lead));
	if (map == MAP_FAILED)
		return NULL; /* errno from mmap: ENODEV (not mappable), EACCES (not read-write), ... */
	struct ibv_mr *mr = ibv_reg_mr_iova2(pd, map + lead, length, iova, (unsigned int)access);
	if (!mr) {
		int err = errno;
		munmap(map, map_len);
		errno = err;
		return NULL;
	}
	struct dbl_mr *m = (struct dbl_mr *)mr;
	m->map = map;
	m->map_len = map_len;
	dbl_log("reg_dmabuf_mr fd %d offset %llu length %zu iova 0x%llx key 0x%x", fd,
		(unsigned long long)offset, length, (unsigned long long)iova, mr->lkey);
	return mr;
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	pthread_mutex_lock(&G.lock);
	for (struct dbl_mr **pp = &G.mrs; *pp; pp = &(*pp)->next) {
		if (&(*pp)->mr == mr) {
			struct dbl_mr *m = *pp;
			*pp = m->next;
			pthread_mutex_unlock(&G.lock);
			if (m->map)
				munmap(m->map, m->map_len);
			free(m);
			return 0;
		}
	}
	pthread_mutex_unlock(&G.lock);
	return EINVAL;
}

static struct dbl_mr *mr_by_key(uint32_t key)
{
	for (struct dbl_mr *m = G.mrs; m; m = m->next)
		if (m->mr.lkey == key)
			return m;
	return NULL;
}

/* Local side of an SGE: the lkey's region must hold [addr, addr+len) (local addresses). */
static bool sge_ok(struct ibv_pd *pd, const struct ibv_sge *s, bool needs_local_write)
{
	if (s->length == 0)
		return true;
	struct dbl_mr *m = mr_by_key(s->lkey);
	if (!m || m->mr.pd != pd)
		return false;
	uintptr_t lo = (uintptr_t)m->mr.addr, hi = lo + m->mr.length;
	if (s->addr < lo || s->addr > hi || s->length > hi - s->addr)
		return false;
	return !needs_local_write || (m->access & IBV_ACCESS_LOCAL_WRITE);
}

/* Remote side: rkey, protection domain, bounds (in the region's iova space), access. Returns the
 * local address to touch, or NULL. */
static char *remote_target(struct ibv_pd *pd, uint32_t rkey, uint64_t addr, uint32_t len, int need)
{
	struct dbl_mr *m = mr_by_key(rkey);
	if (!m || m->mr.pd != pd || !(m->access & need))
		return NULL;
	if (addr < m->iova || addr - m->iova > m->mr.length || len > m->mr.length - (addr - m->iova))
		return NULL;
	return (char *)m->mr.addr + (addr - m->iova);
}

/* A completion channel is a pipe: an armed CQ writes its pointer when a completion arrives. */
struct dbl_channel {
	struct ibv_comp_channel ch;
	int write_fd;
};

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx)
{
	struct dbl_channel *c = calloc(1, sizeof(*c));
	int fds[2];
	if (!c || pipe2(fds, O_CLOEXEC) != 0) {
		free(c);
		errno = ENOMEM;
		return NULL;
	}
	c->ch.context = ctx;
	c->ch.fd = fds[0];
	c->write_fd = fds[1];
	return &c->ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	struct dbl_channel *c = (struct dbl_channel *)ch;
	close(c->ch.fd);
	close(c->write_fd);
	free(c);
	return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	(void)comp_vector;
	if (cqe < 1 || cqe > DBL_MAX_CQE) {
		errno = EINVAL;
		return NULL;
	}
	struct dbl_cq *c = calloc(1, sizeof(*c));
	if (!c || !(c->ring = calloc((size_t)cqe + 1, sizeof(struct ibv_wc)))) {
		free(c);
		errno = ENOMEM;
		return NULL;
	}
	c->cap = cqe + 1;
	pthread_mutex_init(&c->lock, NULL);
	c->cq.context = ctx;
	c->cq.channel = channel;
	c->cq.cq_context = cq_context;
	c->cq.cqe = cqe;
	pthread_mutex_init(&c->cq.mutex, NULL);
	pthread_cond_init(&c->cq.cond, NULL);
	return &c->cq;
}

/* As the real library: destroying a QP or CQ waits until every async event that named it and
 * was read (`reported`) has been acked; `*acked` is the object's count of acks, under its
 * `mutex`, which count_ack bumps, waking the destroy through `cond`. */
static void wait_acked(pthread_mutex_t *mutex, pthread_cond_t *cond, const uint32_t *acked,
		       unsigned reported)
{
	pthread_mutex_lock(mutex);
	while (*acked != reported)
		pthread_cond_wait(cond, mutex);
	pthread_mutex_unlock(mutex);
}

static void count_ack(pthread_mutex_t *mutex, pthread_cond_t *cond, uint32_t *acked)
{
	pthread_mutex_lock(mutex);
	(*acked)++;
	pthread_cond_broadcast(cond);
	pthread_mutex_unlock(mutex);
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
	struct dbl_cq *c = (struct dbl_cq *)cq;
	pthread_mutex_lock(&G.lock);
	for (int i = 0; i < DBL_MAX_QPS; i++) {
		struct dbl_qp *q = G.qps[i];
		if (q && (q->qp.send_cq == cq || q->qp.recv_cq == cq)) {
			pthread_mutex_unlock(&G.lock);
			return EBUSY;
		}
	}
	async_forget_object(NULL, cq);
	pthread_mutex_unlock(&G.lock);
	wait_acked(&cq->mutex, &cq->cond, &cq->async_events_completed, c->events_reported);
	free(c->ring);
	pthread_mutex_destroy(&c->lock);
	free(c);
	return 0;
}

int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	(void)cq; (void)cqe;
	return EOPNOTSUPP;
}

static void cq_push(struct ibv_cq *cq, const struct ibv_wc *wc)
{
	struct dbl_cq *c = (struct dbl_cq *)cq;
	bool notify = false;
	pthread_mutex_lock(&c->lock);
	if (c->error) {
		/* IBV_EVENT_CQ_ERR: the CQ takes no more completions. */
	} else if (c->count == c->cap) {
		if (!c->overrun_reported)
			dbl_warn("CQ %p overrun (%d entries): completions are lost; size the CQ for all "
				 "outstanding work", (void *)cq, cq->cqe);
		c->overrun_reported = true;
	} else {
		c->ring[(c->head + c->count) % c->cap] = *wc;
		c->count++;
	}
	if (c->armed && cq->channel) {
		c->armed = false;
		notify = true;
	}
	pthread_mutex_unlock(&c->lock);
	if (notify) {
		struct ibv_cq *p = cq;
		if (write(((struct dbl_channel *)cq->channel)->write_fd, &p, sizeof(p)) != sizeof(p))
			dbl_warn("completion event lost: %s", strerror(errno));
	}
}

static int dbl_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct dbl_cq *c = (struct dbl_cq *)cq;
	int k = 0;
	pthread_mutex_lock(&c->lock);
	while (k < n && c->count) {
		wc[k++] = c->ring[c->head];
		c->head = (c->head + 1) % c->cap;
		c->count--;
	}
	pthread_mutex_unlock(&c->lock);
	/* Busy pollers would otherwise starve the progress threads that produce their completions
	 * on a small machine (a CPU that is all pollers makes each round trip a scheduler slice). */
	if (k == 0)
		sched_yield();
	return k;
}

static int dbl_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	(void)solicited_only;
	struct dbl_cq *c = (struct dbl_cq *)cq;
	pthread_mutex_lock(&c->lock);
	c->armed = true;
	pthread_mutex_unlock(&c->lock);
	return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
	struct ibv_cq *p;
	if (read(ch->fd, &p, sizeof(p)) != sizeof(p))
		return -1;
	*cq = p;
	*cq_context = p->cq_context;
	return 0;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_mutex_unlock(&cq->mutex);
}

/* ------------------------------------------------------------------------------------------ */
/* 4. QP                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static struct dbl_qp *qp_by_num(uint32_t qpn)
{
	if ((int)(qpn >> 16) != G.port_index)
		return NULL;
	return G.qps[qpn & 0xffff];
}

static void complete(struct dbl_qp *q, struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status st,
		     enum ibv_wc_opcode op, uint32_t len, uint32_t imm, bool with_imm)
{
	struct ibv_wc wc;
	memset(&wc, 0, sizeof(wc));
	wc.wr_id = wr_id;
	wc.status = st;
	wc.opcode = op;
	wc.byte_len = len;
	wc.imm_data = imm;
	wc.wc_flags = with_imm ? IBV_WC_WITH_IMM : 0;
	wc.qp_num = q->qp.qp_num;
	wc.src_qp = q->attr.dest_qp_num;
	wc.vendor_err = st == IBV_WC_SUCCESS ? 0 : 0xdb;
	cq_push(cq, &wc);
}

static void link_kill(struct dbl_link *l)
{
	if (!l)
		return;
	l->dead = true;
	l->qp = NULL;
}

static int link_queue(struct dbl_link *l, const struct dbl_msg *m, const void *payload, size_t n);
static void link_flush(struct dbl_link *l);

/* Every link of q goes. `graceful` (the application destroyed, reset or errored the QP) tells the
 * peer first with a BYE: like hardware, the peer's QP then stays as it is and only its next
 * request fails (IBV_WC_RETRY_EXC_ERR). Without BYE the peer sees a bare EOF, which the double
 * treats as a dead peer process: its QP goes to ERR and flushes (see link_read). */
static void qp_drop_links(struct dbl_qp *q, bool graceful)
{
	if (graceful && q->link && q->link->fd >= 0 && !q->link->dead) {
		struct dbl_msg bye = { .type = M_BYE, .src_qpn = q->qp.qp_num };
		if (link_queue(q->link, &bye, NULL, 0) == 0)
			link_flush(q->link); /* best effort: if it cannot go now, the peer sees EOF */
	}
	for (struct dbl_link *l = G.links; l; l = l->next)
		if (l->qp == q)
			link_kill(l);
	q->link = NULL;
	wake_progress();
}

/* The QP enters ERR: outstanding send and receive WRs complete with IBV_WC_WR_FLUSH_ERR (every
 * one, signaled or not), and its link closes, so the peer's QP follows into ERR. */
static void qp_to_err_how(struct dbl_qp *q, const char *why, bool graceful)
{
	if (q->qp.state != IBV_QPS_ERR)
		dbl_log("QP 0x%x -> ERR: %s", q->qp.qp_num, why);
	q->qp.state = IBV_QPS_ERR;
	q->attr.qp_state = IBV_QPS_ERR;
	while (q->sq_head) {
		struct dbl_swr *w = q->sq_head;
		q->sq_head = w->next;
		complete(q, q->qp.send_cq, w->wr_id, IBV_WC_WR_FLUSH_ERR, w->opcode, 0, 0, false);
		free(w);
	}
	q->sq_tail = NULL;
	q->sq_count = 0;
	while (q->rq_head) {
		struct dbl_rwr *w = q->rq_head;
		q->rq_head = w->next;
		complete(q, q->qp.recv_cq, w->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, false);
		free(w);
	}
	q->rq_tail = NULL;
	q->rq_count = 0;
	q->doomed = false;
	qp_drop_links(q, graceful);
}

/* An error the double detected (error answer, EOF, bad local access): no BYE, so the peer's QP
 * goes to ERR too, as a responder does after a NAK. */
static void qp_to_err(struct dbl_qp *q, const char *why)
{
	qp_to_err_how(q, why, false);
}

/* Send WRs that were doomed when posted (bad lkey, injected fault, unreachable peer) complete in
 * order once they reach the head of the send queue; the first moves the QP to ERR. The error is
 * local, so the peer is told goodbye (its QP stays as it is, as on hardware). */
static void sq_complete_preset(struct dbl_qp *q)
{
	struct dbl_swr *w = q->sq_head;
	if (!w || w->preset == IBV_WC_SUCCESS)
		return;
	q->sq_head = w->next;
	if (!q->sq_head)
		q->sq_tail = NULL;
	q->sq_count--;
	complete(q, q->qp.send_cq, w->wr_id, w->preset, w->opcode, 0, 0, false);
	enum ibv_wc_status st = w->preset;
	free(w);
	qp_to_err_how(q, ibv_wc_status_str(st), true);
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
	if (ia->qp_type != IBV_QPT_RC) {
		errno = EOPNOTSUPP; /* the double models RC only */
		return NULL;
	}
	if (ia->srq) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!ia->send_cq || !ia->recv_cq || ia->cap.max_send_wr > DBL_MAX_WR ||
	    ia->cap.max_recv_wr > DBL_MAX_WR || ia->cap.max_send_sge > DBL_MAX_SGE ||
	    ia->cap.max_recv_sge > DBL_MAX_SGE || ia->cap.max_inline_data > DBL_MAX_INLINE) {
		errno = EINVAL;
		return NULL;
	}
	/* The PD and the CQs of a QP belong to one device (one context). */
	if (ia->send_cq->context != pd->context || ia->recv_cq->context != pd->context) {
		dbl_warn("create_qp: the CQs and the PD belong to different device contexts");
		errno = EINVAL;
		return NULL;
	}
	struct dbl_qp *q = calloc(1, sizeof(*q));
	if (!q) {
		errno = ENOMEM;
		return NULL;
	}
	q->qp.context = pd->context;
	q->qp.qp_context = ia->qp_context;
	q->qp.pd = pd;
	q->qp.send_cq = ia->send_cq;
	q->qp.recv_cq = ia->recv_cq;
	q->qp.qp_type = IBV_QPT_RC;
	q->qp.state = IBV_QPS_RESET;
	pthread_mutex_init(&q->qp.mutex, NULL);
	pthread_cond_init(&q->qp.cond, NULL);
	q->cap = ia->cap;
	q->cap.max_send_sge = q->cap.max_send_sge ? q->cap.max_send_sge : 1;
	q->cap.max_recv_sge = q->cap.max_recv_sge ? q->cap.max_recv_sge : 1;
	q->cap.max_inline_data = DBL_MAX_INLINE;
	q->sq_sig_all = ia->sq_sig_all != 0;
	q->attr.qp_state = IBV_QPS_RESET;
	pthread_mutex_lock(&G.lock);
	int slot = -1;
	for (int i = 0; i < DBL_MAX_QPS - 2; i++) {
		int s = 2 + (G.next_qp_slot - 2 + i) % (DBL_MAX_QPS - 2);
		if (!G.qps[s]) {
			slot = s;
			break;
		}
	}
	if (slot < 0) {
		pthread_mutex_unlock(&G.lock);
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	G.next_qp_slot = slot + 1;
	q->qp.qp_num = ((uint32_t)G.port_index << 16) | (uint32_t)slot;
	q->qp.handle = q->qp.qp_num;
	G.qps[slot] = q;
	pthread_mutex_unlock(&G.lock);
	ia->cap = q->cap;
	dbl_log("create_qp 0x%x on %s", q->qp.qp_num, pd->context->device->name);
	return &q->qp;
}

struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	(void)qp;
	return NULL; /* no extended send API (ibv_wr_*) in the double */
}

static bool ipv4_of_gid(const union ibv_gid *g, uint32_t *ip)
{
	static const uint8_t prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
	if (memcmp(g->raw, prefix, sizeof(prefix)) != 0)
		return false;
	memcpy(ip, &g->raw[12], 4);
	return true;
}

static int connect_timed(uint32_t ip, int port, int timeout_ms)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = ip,
				  .sin_port = htons((uint16_t)port) };
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS)
		goto fail;
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	if (poll(&p, 1, timeout_ms) != 1)
		goto fail;
	int err = 0;
	socklen_t el = sizeof(err);
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err)
		goto fail;
	return fd;
fail:
	close(fd);
	return -1;
}

static struct dbl_link *link_new(int fd, struct dbl_qp *q)
{
	struct dbl_link *l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->fd = fd;
	l->qp = q;
	l->next = G.links;
	G.links = l;
	return l;
}

static int link_queue(struct dbl_link *l, const struct dbl_msg *m, const void *payload, size_t n)
{
	if (dbuf_reserve(&l->out, sizeof(*m) + n))
		return ENOMEM;
	memcpy(l->out.p + l->out.len, m, sizeof(*m));
	l->out.len += sizeof(*m);
	if (n) {
		memcpy(l->out.p + l->out.len, payload, n);
		l->out.len += n;
	}
	return 0;
}

/* Non-blocking write of what is queued; EAGAIN leaves the rest for the progress thread. */
static void link_flush(struct dbl_link *l)
{
	while (l->fd >= 0 && !l->dead && dbuf_size(&l->out)) {
		ssize_t w = send(l->fd, l->out.p + l->out.off, dbuf_size(&l->out), MSG_NOSIGNAL);
		if (w > 0) {
			l->out.off += (size_t)w;
			continue;
		}
		if (w < 0 && (errno == EAGAIN || errno == EINTR))
			wake_progress();
		else if (l->qp)
			qp_to_err(l->qp, "link write failed");
		else
			link_kill(l);
		return;
	}
}

/* RTR: open the link to the peer named by the dgid's IPv4 and dest_qp_num. The side with the
 * smaller (IPv4, QPN) connects and says HELLO; the other waits with a placeholder link that the
 * progress thread fills when the HELLO arrives. A QP connected to itself gets a socketpair. */
static int qp_open_link(struct dbl_qp *q)
{
	uint32_t rip;
	if (!ipv4_of_gid(&q->attr.ah_attr.grh.dgid, &rip)) {
		dbl_log("QP 0x%x: dgid is not IPv4-mapped (link-local?): unreachable", q->qp.qp_num);
		q->unreachable = true;
		return 0;
	}
	q->remote_ip = rip;
	uint32_t rqpn = q->attr.dest_qp_num;
	uint64_t me = ((uint64_t)ntohl(G.ip) << 32) | q->qp.qp_num;
	uint64_t peer = ((uint64_t)ntohl(rip) << 32) | rqpn;
	if (me == peer) {
		int sv[2];
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
			return errno;
		set_nonblock(sv[0]);
		set_nonblock(sv[1]);
		q->link = link_new(sv[0], q);
		link_new(sv[1], q);
	} else if (me < peer) {
		int port = G.port_base + (int)(rqpn >> 16);
		pthread_mutex_unlock(&G.lock);
		int fd = connect_timed(rip, port, G.connect_timeout_ms);
		pthread_mutex_lock(&G.lock);
		if (fd < 0) {
			dbl_log("QP 0x%x: connect to port %d failed: peer unreachable", q->qp.qp_num, port);
			q->unreachable = true;
			return 0;
		}
		set_nonblock(fd);
		q->link = link_new(fd, q);
		struct dbl_msg h = { .type = M_HELLO, .src_qpn = q->qp.qp_num, .dst_qpn = rqpn };
		link_queue(q->link, &h, NULL, 0);
		link_flush(q->link);
	} else {
		q->link = link_new(-1, q);
	}
	if (!q->link)
		return ENOMEM;
	wake_progress();
	return 0;
}

#define REQ_INIT (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
#define REQ_RTR (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | \
		 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
#define REQ_RTS (IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | \
		 IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)

static void copy_attrs(struct ibv_qp_attr *dst, const struct ibv_qp_attr *a, int mask)
{
	if (mask & IBV_QP_ACCESS_FLAGS) dst->qp_access_flags = a->qp_access_flags;
	if (mask & IBV_QP_PKEY_INDEX) dst->pkey_index = a->pkey_index;
	if (mask & IBV_QP_PORT) dst->port_num = a->port_num;
	if (mask & IBV_QP_AV) dst->ah_attr = a->ah_attr;
	if (mask & IBV_QP_PATH_MTU) dst->path_mtu = a->path_mtu;
	if (mask & IBV_QP_DEST_QPN) dst->dest_qp_num = a->dest_qp_num;
	if (mask & IBV_QP_RQ_PSN) dst->rq_psn = a->rq_psn;
	if (mask & IBV_QP_SQ_PSN) dst->sq_psn = a->sq_psn;
	if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) dst->max_dest_rd_atomic = a->max_dest_rd_atomic;
	if (mask & IBV_QP_MAX_QP_RD_ATOMIC) dst->max_rd_atomic = a->max_rd_atomic;
	if (mask & IBV_QP_MIN_RNR_TIMER) dst->min_rnr_timer = a->min_rnr_timer;
	if (mask & IBV_QP_TIMEOUT) dst->timeout = a->timeout;
	if (mask & IBV_QP_RETRY_CNT) dst->retry_cnt = a->retry_cnt;
	if (mask & IBV_QP_RNR_RETRY) dst->rnr_retry = a->rnr_retry;
}

static void qp_reset(struct dbl_qp *q)
{
	while (q->sq_head) {
		struct dbl_swr *w = q->sq_head;
		q->sq_head = w->next;
		free(w);
	}
	while (q->rq_head) {
		struct dbl_rwr *w = q->rq_head;
		q->rq_head = w->next;
		free(w);
	}
	q->sq_tail = NULL;
	q->rq_tail = NULL;
	q->sq_count = q->rq_count = 0;
	q->unreachable = false;
	q->doomed = false;
	qp_drop_links(q, true);
	memset(&q->attr, 0, sizeof(q->attr));
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	struct dbl_qp *q = (struct dbl_qp *)qp;
	int rc = 0;
	pthread_mutex_lock(&G.lock);
	enum ibv_qp_state cur = qp->state;
	enum ibv_qp_state next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
	int required = 0;
	if (next == IBV_QPS_RESET || next == IBV_QPS_ERR)
		required = IBV_QP_STATE;
	else if (next == IBV_QPS_INIT && (cur == IBV_QPS_RESET || cur == IBV_QPS_INIT))
		required = cur == IBV_QPS_RESET ? REQ_INIT : 0;
	else if (next == IBV_QPS_RTR && cur == IBV_QPS_INIT)
		required = REQ_RTR;
	else if (next == IBV_QPS_RTS && cur == IBV_QPS_RTR)
		required = REQ_RTS;
	else if (next == IBV_QPS_RTS && cur == IBV_QPS_RTS)
		required = 0;
	else {
		dbl_warn("modify_qp 0x%x: transition %d -> %d is not valid for RC", qp->qp_num, cur, next);
		rc = EINVAL;
		goto out;
	}
	if ((mask & required) != required) {
		dbl_warn("modify_qp 0x%x to state %d: attribute mask 0x%x lacks 0x%x", qp->qp_num, next,
			 mask, required & ~mask);
		rc = EINVAL;
		goto out;
	}
	if ((mask & IBV_QP_PORT) && !port_ok(a->port_num)) {
		dbl_warn("modify_qp 0x%x: port %d does not exist (the device has %d)", qp->qp_num,
			 a->port_num, G.nports);
		rc = EINVAL;
		goto out;
	}
	if (next == IBV_QPS_RTR && cur == IBV_QPS_INIT) {
		/* RoCE: addressing is by GRH only; the sgid must exist. */
		if (!a->ah_attr.is_global || a->ah_attr.grh.sgid_index >= DBL_GID_COUNT) {
			dbl_warn("modify_qp 0x%x to RTR: RoCE needs ah_attr.is_global=1 and a valid "
				 "grh.sgid_index (0..%d)", qp->qp_num, DBL_GID_COUNT - 1);
			rc = EINVAL;
			goto out;
		}
	}
	if (next == IBV_QPS_RESET) {
		qp_reset(q);
	} else if (next == IBV_QPS_ERR) {
		qp_to_err_how(q, "modify_qp(ERR)", true);
	} else {
		copy_attrs(&q->attr, a, mask);
		if (next == IBV_QPS_RTR && cur == IBV_QPS_INIT) {
			clock_gettime(CLOCK_MONOTONIC, &q->rtr_time);
			rc = qp_open_link(q);
			if (rc)
				goto out;
		}
	}
	qp->state = next;
	q->attr.qp_state = next;
out:
	pthread_mutex_unlock(&G.lock);
	return rc;
}

int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *ia)
{
	(void)mask;
	struct dbl_qp *q = (struct dbl_qp *)qp;
	pthread_mutex_lock(&G.lock);
	*a = q->attr;
	a->qp_state = qp->state;
	a->cur_qp_state = qp->state;
	a->cap = q->cap;
	a->path_mig_state = IBV_MIG_MIGRATED;
	memset(ia, 0, sizeof(*ia));
	ia->qp_context = qp->qp_context;
	ia->send_cq = qp->send_cq;
	ia->recv_cq = qp->recv_cq;
	ia->cap = q->cap;
	ia->qp_type = IBV_QPT_RC;
	ia->sq_sig_all = q->sq_sig_all;
	pthread_mutex_unlock(&G.lock);
	return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
	struct dbl_qp *q = (struct dbl_qp *)qp;
	pthread_mutex_lock(&G.lock);
	async_forget_object(q, NULL);
	pthread_mutex_unlock(&G.lock);
	wait_acked(&qp->mutex, &qp->cond, &qp->events_completed, q->events_reported);
	pthread_mutex_lock(&G.lock);
	qp_reset(q);
	G.qps[qp->qp_num & 0xffff] = NULL;
	pthread_mutex_unlock(&G.lock);
	pthread_mutex_destroy(&qp->mutex);
	pthread_cond_destroy(&qp->cond);
	free(q);
	return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* 5. Posting                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static const char *wr_opcode_name(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE: return "RDMA_WRITE";
	case IBV_WR_RDMA_WRITE_WITH_IMM: return "RDMA_WRITE_WITH_IMM";
	case IBV_WR_SEND: return "SEND";
	case IBV_WR_SEND_WITH_IMM: return "SEND_WITH_IMM";
	case IBV_WR_RDMA_READ: return "RDMA_READ";
	default: return "?";
	}
}

static int post_one_send(struct dbl_qp *q, struct ibv_send_wr *wr)
{
	static const struct { int msg; enum ibv_wc_opcode wc; } ops[] = {
		[IBV_WR_RDMA_WRITE] = { M_WRITE, IBV_WC_RDMA_WRITE },
		[IBV_WR_RDMA_WRITE_WITH_IMM] = { M_WRITE_IMM, IBV_WC_RDMA_WRITE },
		[IBV_WR_SEND] = { M_SEND, IBV_WC_SEND },
		[IBV_WR_SEND_WITH_IMM] = { M_SEND_IMM, IBV_WC_SEND },
		[IBV_WR_RDMA_READ] = { M_READ, IBV_WC_RDMA_READ },
	};
	if ((unsigned)wr->opcode >= sizeof(ops) / sizeof(ops[0]) || !ops[wr->opcode].msg)
		return EINVAL;
	if (wr->num_sge < 0 || wr->num_sge > (int)q->cap.max_send_sge)
		return EINVAL;
	bool is_read = wr->opcode == IBV_WR_RDMA_READ;
	bool inl = (wr->send_flags & IBV_SEND_INLINE) && !is_read;
	uint64_t total = 0;
	for (int i = 0; i < wr->num_sge; i++)
		total += wr->sg_list[i].length;
	if (total > (1U << 30) || (inl && total > q->cap.max_inline_data))
		return EINVAL;
	if (q->qp.state == IBV_QPS_ERR) { /* accepted, and flushed at once */
		complete(q, q->qp.send_cq, wr->wr_id, IBV_WC_WR_FLUSH_ERR, ops[wr->opcode].wc, 0, 0, false);
		return 0;
	}
	if (q->qp.state != IBV_QPS_RTS)
		return EINVAL;
	if (q->sq_count >= (int)q->cap.max_send_wr)
		return ENOMEM;
	/* Room for the request first, so that an ENOMEM leaves nothing half posted. */
	size_t payload = is_read ? 0 : total;
	if (q->link && dbuf_reserve(&q->link->out, sizeof(struct dbl_msg) + payload))
		return ENOMEM;

	struct dbl_swr *w = calloc(1, sizeof(*w));
	if (!w)
		return ENOMEM;
	w->wr_id = wr->wr_id;
	w->opcode = ops[wr->opcode].wc;
	w->signaled = q->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
	w->len = (uint32_t)total;
	if (!inl)
		for (int i = 0; i < wr->num_sge; i++)
			if (!sge_ok(q->qp.pd, &wr->sg_list[i], is_read))
				w->preset = IBV_WC_LOC_PROT_ERR;
	if (is_read) {
		w->num_sge = wr->num_sge;
		memcpy(w->sge, wr->sg_list, sizeof(struct ibv_sge) * (size_t)wr->num_sge);
	}
	G.posted++;
	if (G.fail_after >= 0 && G.posted > G.fail_after) {
		dbl_log("IBV_DOUBLE_FAIL_AFTER=%ld: WR %ld fails", G.fail_after, G.posted);
		w->preset = G.fail_status;
	}
	if ((q->unreachable || !q->link) && w->preset == IBV_WC_SUCCESS)
		w->preset = IBV_WC_RETRY_EXC_ERR;
	/* Requests behind a doomed one are never sent: answers are matched to the queue in order. */
	if (q->doomed)
		w->preset = IBV_WC_WR_FLUSH_ERR;
	if (w->preset != IBV_WC_SUCCESS)
		q->doomed = true;

	if (q->sq_tail)
		q->sq_tail->next = w;
	else
		q->sq_head = w;
	q->sq_tail = w;
	q->sq_count++;
	if (w->preset != IBV_WC_SUCCESS) {
		sq_complete_preset(q);
		return 0;
	}

	/* The request, with the payload gathered now: the double reads the source at post time. */
	struct dbl_msg m = { .type = (uint8_t)ops[wr->opcode].msg, .len = (uint32_t)total,
			     .rnr_retry = q->attr.rnr_retry, .src_qpn = q->qp.qp_num,
			     .dst_qpn = q->attr.dest_qp_num };
	if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr->opcode == IBV_WR_SEND_WITH_IMM)
		m.imm = wr->imm_data;
	if (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM) {
		m.addr = wr->wr.rdma.remote_addr;
		m.rkey = wr->wr.rdma.rkey;
	}
	count_posted(m.type, total);
	struct dbl_link *l = q->link;
	memcpy(l->out.p + l->out.len, &m, sizeof(m));
	l->out.len += sizeof(m);
	for (int i = 0; !is_read && i < wr->num_sge; i++) {
		memcpy(l->out.p + l->out.len, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
		l->out.len += wr->sg_list[i].length;
	}
	link_flush(l);
	dbl_log("QP 0x%x (%s:%d) posts %s of %u bytes rkey 0x%x to QP 0x%x", q->qp.qp_num,
		q->qp.context->device->name, q->attr.port_num, wr_opcode_name(wr->opcode),
		(unsigned)total, m.rkey, m.dst_qpn);
	return 0;
}

static int dbl_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct dbl_qp *q = (struct dbl_qp *)qp;
	int rc = 0;
	pthread_mutex_lock(&G.lock);
	for (; wr; wr = wr->next) {
		rc = post_one_send(q, wr);
		if (rc) {
			*bad = wr;
			break;
		}
	}
	pthread_mutex_unlock(&G.lock);
	return rc;
}

static int dbl_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct dbl_qp *q = (struct dbl_qp *)qp;
	int rc = 0;
	pthread_mutex_lock(&G.lock);
	for (; wr; wr = wr->next) {
		if (qp->state == IBV_QPS_RESET || wr->num_sge < 0 ||
		    wr->num_sge > (int)q->cap.max_recv_sge) {
			rc = EINVAL;
		} else if (qp->state == IBV_QPS_ERR) {
			complete(q, qp->recv_cq, wr->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, false);
			continue;
		} else if (q->rq_count >= (int)q->cap.max_recv_wr) {
			rc = ENOMEM;
		}
		struct dbl_rwr *r = rc ? NULL : calloc(1, sizeof(*r));
		if (!rc && !r)
			rc = ENOMEM;
		if (rc) {
			*bad = wr;
			break;
		}
		r->wr_id = wr->wr_id;
		r->num_sge = wr->num_sge;
		memcpy(r->sge, wr->sg_list, sizeof(struct ibv_sge) * (size_t)wr->num_sge);
		if (q->rq_tail)
			q->rq_tail->next = r;
		else
			q->rq_head = r;
		q->rq_tail = r;
		q->rq_count++;
	}
	pthread_mutex_unlock(&G.lock);
	wake_progress(); /* a link may be stalled waiting for this receive */
	return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* 6. Progress thread                                                                          */
/* ------------------------------------------------------------------------------------------ */

static struct dbl_rwr *rq_pop(struct dbl_qp *q)
{
	struct dbl_rwr *r = q->rq_head;
	if (r) {
		q->rq_head = r->next;
		if (!q->rq_head)
			q->rq_tail = NULL;
		q->rq_count--;
	}
	return r;
}

static void answer(struct dbl_link *l, uint8_t type, enum ibv_wc_status st, const void *p,
		   uint32_t n)
{
	struct dbl_msg a = { .type = type, .status = (uint8_t)st, .len = n };
	if (link_queue(l, &a, p, n) == 0)
		link_flush(l);
}

/* Scatter `n` bytes into a receive WR's SGEs; false if they do not fit or an lkey is bad. */
static bool scatter(struct dbl_qp *q, const struct ibv_sge *sge, int num_sge, const char *src,
		    uint32_t n, enum ibv_wc_status *err)
{
	uint64_t room = 0;
	for (int i = 0; i < num_sge; i++) {
		if (!sge_ok(q->qp.pd, &sge[i], true)) {
			*err = IBV_WC_LOC_PROT_ERR;
			return false;
		}
		room += sge[i].length;
	}
	if (room < n) {
		*err = IBV_WC_LOC_LEN_ERR;
		return false;
	}
	for (int i = 0; i < num_sge && n; i++) {
		uint32_t k = sge[i].length < n ? sge[i].length : n;
		memcpy((void *)(uintptr_t)sge[i].addr, src, k);
		src += k;
		n -= k;
	}
	return true;
}

#define DBL_REORDER_MAX 64        /* deferred writes a link holds at most */
#define DBL_REORDER_WINDOW_MS 2.0 /* and for at most this long */

/* Places the deferred writes of l, the last received first: what adaptive routing may do to
 * the data of writes that no completion has ordered yet. */
static void place_deferred(struct dbl_link *l)
{
	if (l->ndeferred > 1 && !G.reorder_reported) {
		G.reorder_reported = true;
		dbl_warn("IBV_DOUBLE_REORDER: %d writes placed in reverse order (said once)", l->ndeferred);
	}
	for (int i = l->ndeferred - 1; i >= 0; i--) {
		struct dbl_deferred *d = &l->deferred[i];
		char *t = remote_target(d->pd, d->rkey, d->addr, d->len, IBV_ACCESS_REMOTE_WRITE);
		if (t)
			memcpy(t, d->bytes, d->len);
		free(d->bytes);
	}
	free(l->deferred);
	l->deferred = NULL;
	l->ndeferred = 0;
}

static bool defer_write(struct dbl_link *l, struct dbl_qp *q, const struct dbl_msg *m,
			const char *payload)
{
	if (l->ndeferred == DBL_REORDER_MAX)
		place_deferred(l);
	if (!l->deferred && !(l->deferred = calloc(DBL_REORDER_MAX, sizeof(*l->deferred))))
		return false;
	char *copy = malloc(m->len);
	if (!copy)
		return false;
	memcpy(copy, payload, m->len);
	if (l->ndeferred == 0)
		clock_gettime(CLOCK_MONOTONIC, &l->deferred_since);
	l->deferred[l->ndeferred++] = (struct dbl_deferred){ .pd = q->qp.pd, .rkey = m->rkey,
							     .len = m->len, .addr = m->addr,
							     .bytes = copy };
	return true;
}

/* A request from the peer (responder side). Returns false if it must wait for a receive WR. */
static bool handle_request(struct dbl_link *l, struct dbl_qp *q, const struct dbl_msg *m,
			   const char *payload)
{
	bool needs_recv = m->type == M_WRITE_IMM || m->type == M_SEND || m->type == M_SEND_IMM;
	if (q->qp.state != IBV_QPS_RTR && q->qp.state != IBV_QPS_RTS) {
		/* A responder in ERR drops packets; the requester would time out. */
		answer(l, M_ACK, IBV_WC_RETRY_EXC_ERR, NULL, 0);
		return true;
	}
	if (needs_recv && !q->rq_head)
		return false; /* RNR: link_process decides how long it waits */
	/* Writes, sends and reads are ordered after every earlier write: deferred ones land now. */
	if (l->ndeferred && m->type != M_WRITE)
		place_deferred(l);
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	int need = 0;
	if (m->type == M_WRITE || m->type == M_WRITE_IMM)
		need = IBV_ACCESS_REMOTE_WRITE;
	else if (m->type == M_READ)
		need = IBV_ACCESS_REMOTE_READ;
	char *target = NULL;
	if (need && !(q->attr.qp_access_flags & need)) {
		st = IBV_WC_REM_INV_REQ_ERR;
	} else if (need && m->len) {
		target = remote_target(q->qp.pd, m->rkey, m->addr, m->len, need);
		if (!target)
			st = IBV_WC_REM_ACCESS_ERR;
	}
	if (st != IBV_WC_SUCCESS) {
		dbl_log("QP 0x%x: request type %d rkey 0x%x addr 0x%llx len %u: %s", q->qp.qp_num,
			m->type, m->rkey, (unsigned long long)m->addr, m->len, ibv_wc_status_str(st));
		answer(l, m->type == M_READ ? M_READ_RESP : M_ACK, st, NULL, 0);
		return true;
	}
	switch (m->type) {
	case M_WRITE:
	case M_WRITE_IMM:
		stat_add(&G.writes_placed, &G.write_bytes_placed, m->len);
		if (G.reorder && m->type == M_WRITE && m->len && defer_write(l, q, m, payload))
			;
		else if (m->len)
			memcpy(target, payload, m->len);
		if (m->type == M_WRITE_IMM) {
			struct dbl_rwr *r = rq_pop(q);
			complete(q, q->qp.recv_cq, r->wr_id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM,
				 m->len, m->imm, true);
			free(r);
		}
		answer(l, M_ACK, IBV_WC_SUCCESS, NULL, 0);
		break;
	case M_SEND:
	case M_SEND_IMM: {
		struct dbl_rwr *r = rq_pop(q);
		enum ibv_wc_status err = IBV_WC_SUCCESS;
		bool ok = scatter(q, r->sge, r->num_sge, payload, m->len, &err);
		complete(q, q->qp.recv_cq, r->wr_id, err, IBV_WC_RECV, m->len, m->imm, m->type == M_SEND_IMM);
		free(r);
		answer(l, M_ACK, ok ? IBV_WC_SUCCESS : IBV_WC_REM_INV_REQ_ERR, NULL, 0);
		if (!ok)
			qp_to_err(q, "receive buffer error");
		break;
	}
	case M_READ:
		dbl_log("QP 0x%x: RDMA read of %u bytes at 0x%llx rkey 0x%x", q->qp.qp_num, m->len,
			(unsigned long long)m->addr, m->rkey);
		answer(l, M_READ_RESP, IBV_WC_SUCCESS, target, m->len);
		break;
	}
	return true;
}

/* An answer from the peer (requester side): completes the head of the send queue. */
static void handle_answer(struct dbl_qp *q, const struct dbl_msg *m, const char *payload)
{
	struct dbl_swr *w = q->sq_head;
	if (!w) {
		dbl_warn("QP 0x%x: answer with no outstanding request (protocol error)", q->qp.qp_num);
		qp_to_err(q, "protocol error");
		return;
	}
	q->sq_head = w->next;
	if (!q->sq_head)
		q->sq_tail = NULL;
	q->sq_count--;
	enum ibv_wc_status st = (enum ibv_wc_status)m->status;
	if (st == IBV_WC_SUCCESS && m->type == M_READ_RESP) {
		enum ibv_wc_status err = IBV_WC_SUCCESS;
		if (!scatter(q, w->sge, w->num_sge, payload, m->len, &err))
			st = err;
	}
	if (st != IBV_WC_SUCCESS || w->signaled)
		complete(q, q->qp.send_cq, w->wr_id, st, w->opcode, w->len, 0, false);
	free(w);
	if (st != IBV_WC_SUCCESS)
		qp_to_err(q, ibv_wc_status_str(st));
	else
		sq_complete_preset(q);
}

/* The first message on an accepted link names the QP pair; attach it to that QP's placeholder. */
static bool handle_hello(struct dbl_link *l, const struct dbl_msg *m)
{
	struct dbl_qp *q = m->type == M_HELLO ? qp_by_num(m->dst_qpn) : NULL;
	if (!q) {
		dbl_log("HELLO for unknown QP 0x%x: closing", m->dst_qpn);
		link_kill(l);
		return false;
	}
	if (q->qp.state == IBV_QPS_ERR) {
		link_kill(l);
		return false;
	}
	if (q->qp.state != IBV_QPS_RTR && q->qp.state != IBV_QPS_RTS)
		return false; /* not connected yet on this side: wait for its RTR */
	struct dbl_link *ph = q->link;
	if (q->attr.dest_qp_num != m->src_qpn || !ph || ph->fd >= 0) {
		dbl_log("HELLO from QP 0x%x for QP 0x%x does not match its RTR: closing", m->src_qpn,
			m->dst_qpn);
		link_kill(l);
		return false;
	}
	/* Requests posted before the peer connected move to the real link. */
	if (dbuf_size(&ph->out)) {
		if (dbuf_reserve(&l->out, dbuf_size(&ph->out)) == 0) {
			memcpy(l->out.p + l->out.len, ph->out.p + ph->out.off, dbuf_size(&ph->out));
			l->out.len += dbuf_size(&ph->out);
		}
	}
	link_kill(ph);
	l->qp = q;
	q->link = l;
	link_flush(l);
	dbl_log("QP 0x%x linked with QP 0x%x", q->qp.qp_num, m->src_qpn);
	return true;
}

/* The peer destroyed (or reset, or errored) its QP. Hardware would not tell us: our requests
 * would time out after their retries. So outstanding requests fail with IBV_WC_RETRY_EXC_ERR
 * (QP to ERR), and if none is outstanding the QP stays as it is, its receives still posted, and
 * the next request fails the same way. */
static void peer_left(struct dbl_link *l, struct dbl_qp *q)
{
	dbl_log("QP 0x%x: peer QP 0x%x is gone (BYE)", q->qp.qp_num, q->attr.dest_qp_num);
	link_kill(l);
	if (q->link == l)
		q->link = NULL;
	q->unreachable = true;
	if (q->sq_head) {
		q->sq_head->preset = IBV_WC_RETRY_EXC_ERR;
		sq_complete_preset(q);
	}
}

/* Handle every complete message buffered on l, in order; stop at one that must wait. */
static double elapsed_ms(const struct timespec *t0);

/* How long a requester with `rnr_retry` (< 7) keeps retrying against this responder: each retry
 * waits the responder's min_rnr_timer (IB's encoding: 0 = 655.36 ms, 1..31 = 0.01..491.52 ms). */
static double rnr_budget_ms(const struct dbl_qp *q, unsigned rnr_retry)
{
	static const double timer_ms[32] = {
		655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28,
		1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96, 61.44, 81.92, 122.88,
		163.84, 245.76, 327.68, 491.52,
	};
	return (rnr_retry + 1) * timer_ms[q->attr.min_rnr_timer & 31];
}

/* IBV_DOUBLE_RNR: the next N requests that consume a receive (write with immediate, send) are
 * NAKed once as if none were posted, whether one is or not: the requester waits the responder's
 * min_rnr_timer and sends again; with rnr_retry 0 it fails at once (IBV_WC_RNR_RETRY_EXC_ERR).
 * True while the head request waits; *failed when it was answered with that error. */
static bool rnr_injected(struct dbl_link *l, struct dbl_qp *q, const struct dbl_msg *m, bool *failed)
{
	*failed = false;
	if (m->type != M_WRITE_IMM && m->type != M_SEND && m->type != M_SEND_IMM)
		return false;
	if (l->rnr_nak) {
		if (elapsed_ms(&l->rnr_since) < rnr_budget_ms(q, 0))
			return true;
		l->rnr_nak = false; /* the retry: handled as any request */
		return false;
	}
	if (G.rnr_left <= 0 || (q->qp.state != IBV_QPS_RTR && q->qp.state != IBV_QPS_RTS))
		return false;
	G.rnr_left--;
	G.rnr_given++;
	if (G.rnr_left == 0)
		dbl_warn("IBV_DOUBLE_RNR: all %ld receiver-not-ready NAKs given", G.rnr_given);
	if (m->rnr_retry == 0) {
		answer(l, M_ACK, IBV_WC_RNR_RETRY_EXC_ERR, NULL, 0);
		*failed = true;
		return false;
	}
	l->rnr_nak = true;
	clock_gettime(CLOCK_MONOTONIC, &l->rnr_since);
	l->stall_since = l->rnr_since; /* a real RNR wait after it counts from here */
	return true;
}

static void link_process(struct dbl_link *l)
{
	bool was_stalled = l->stalled;
	l->stalled = false;
	while (!l->dead && dbuf_size(&l->in) >= sizeof(struct dbl_msg)) {
		struct dbl_msg m;
		memcpy(&m, l->in.p + l->in.off, sizeof(m));
		bool has_payload = m.type == M_WRITE || m.type == M_WRITE_IMM || m.type == M_SEND ||
				   m.type == M_SEND_IMM || m.type == M_READ_RESP;
		size_t need = sizeof(m) + (has_payload ? m.len : 0);
		if (dbuf_size(&l->in) < need)
			return;
		const char *payload = l->in.p + l->in.off + sizeof(m);
		if (!l->qp) {
			if (!handle_hello(l, &m))
				return;
			l->in.off += need;
			continue;
		}
		struct dbl_qp *q = l->qp;
		if (m.type == M_BYE) {
			peer_left(l, q);
			return;
		}
		if (m.type == M_ACK || m.type == M_READ_RESP) {
			handle_answer(q, &m, payload);
		} else {
			bool rnr_failed;
			if (rnr_injected(l, q, &m, &rnr_failed)) {
				l->stalled = true;
				return;
			}
			if (rnr_failed) {
				l->in.off += need;
				continue;
			}
			if (G.delay_us && !was_stalled) { /* a slow responder; l is not freed meanwhile */
				pthread_mutex_unlock(&G.lock);
				usleep(G.delay_us);
				pthread_mutex_lock(&G.lock);
				if (l->dead || !l->qp)
					return;
				q = l->qp;
			}
			if (!handle_request(l, q, &m, payload)) {
				/* No receive posted (RNR). rnr_retry 7 waits for ever; fewer retries run
				 * out and the requester gets IBV_WC_RNR_RETRY_EXC_ERR. */
				if (!was_stalled) {
					clock_gettime(CLOCK_MONOTONIC, &l->stall_since);
				} else if (m.rnr_retry < 7 &&
					   elapsed_ms(&l->stall_since) > rnr_budget_ms(q, m.rnr_retry)) {
					answer(l, M_ACK, IBV_WC_RNR_RETRY_EXC_ERR, NULL, 0);
					l->in.off += need;
					continue;
				}
				l->stalled = true;
				return;
			}
		}
		l->in.off += need;
	}
}

static void link_read(struct dbl_link *l)
{
	for (int round = 0; round < 16; round++) {
		if (dbuf_reserve(&l->in, DBL_READ_CHUNK))
			return;
		ssize_t r = recv(l->fd, l->in.p + l->in.len, l->in.cap - l->in.len, 0);
		if (r > 0) {
			l->in.len += (size_t)r;
			if ((size_t)r < DBL_READ_CHUNK)
				break;
			continue;
		}
		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			break;
		/* EOF or reset: the peer process or its QP is gone. */
		link_process(l); /* what arrived before the EOF still counts */
		place_deferred(l);
		if (l->qp)
			qp_to_err(l->qp, r == 0 ? "peer closed the link (EOF)" : "link error");
		link_kill(l);
		return;
	}
	link_process(l);
}

static double elapsed_ms(const struct timespec *t0)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) * 1e3 + (double)(now.tv_nsec - t0->tv_nsec) / 1e6;
}

static void *progress_main(void *arg)
{
	(void)arg;
	struct pollfd *pfd = NULL;
	struct dbl_link **who = NULL;
	size_t cap = 0;
	pthread_mutex_lock(&G.lock);
	for (;;) {
		/* Free dead links; placeholders whose peer never connected fail their sends. */
		for (struct dbl_link **pp = &G.links; *pp;) {
			struct dbl_link *l = *pp;
			if (l->dead) {
				*pp = l->next;
				if (l->fd >= 0)
					close(l->fd);
				place_deferred(l);
				dbuf_free(&l->in);
				dbuf_free(&l->out);
				free(l);
				continue;
			}
			if (l->fd < 0 && l->qp && l->qp->sq_head &&
			    elapsed_ms(&l->qp->rtr_time) > G.connect_timeout_ms) {
				l->qp->sq_head->preset = IBV_WC_RETRY_EXC_ERR;
				sq_complete_preset(l->qp);
			}
			pp = &l->next;
		}
		size_t n = 2;
		for (struct dbl_link *l = G.links; l; l = l->next)
			n++;
		if (n > cap) {
			cap = n * 2;
			pfd = realloc(pfd, cap * sizeof(*pfd));
			who = realloc(who, cap * sizeof(*who));
		}
		pfd[0] = (struct pollfd){ .fd = G.wake[0], .events = POLLIN };
		pfd[1] = (struct pollfd){ .fd = G.listen_fd, .events = POLLIN };
		n = 2;
		bool any_deferred = false;
		for (struct dbl_link *l = G.links; l; l = l->next) {
			any_deferred |= l->ndeferred > 0 || l->rnr_nak;
			if (l->fd < 0)
				continue;
			/* A stalled link is not read (flow control) but its EOF is still seen. */
			short ev = l->stalled ? POLLRDHUP : POLLIN;
			if (dbuf_size(&l->out))
				ev |= POLLOUT;
			pfd[n] = (struct pollfd){ .fd = l->fd, .events = ev };
			who[n++] = l;
		}
		pthread_mutex_unlock(&G.lock);
		poll(pfd, n, any_deferred ? 1 : 100);
		pthread_mutex_lock(&G.lock);
		if (pfd[0].revents) {
			char buf[256];
			while (read(G.wake[0], buf, sizeof(buf)) > 0)
				;
		}
		if (pfd[1].revents & POLLIN) {
			int fd;
			while ((fd = accept4(G.listen_fd, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
				set_nonblock(fd);
				link_new(fd, NULL);
			}
		}
		for (size_t i = 2; i < n; i++) {
			struct dbl_link *l = who[i];
			if (l->dead)
				continue;
			if (pfd[i].revents & POLLOUT)
				link_flush(l);
			if (!l->dead && (pfd[i].revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)))
				link_read(l);
		}
		/* Deferred writes land at the latest DBL_REORDER_WINDOW_MS after the first. */
		for (struct dbl_link *l = G.links; l; l = l->next)
			if (l->ndeferred && elapsed_ms(&l->deferred_since) >= DBL_REORDER_WINDOW_MS)
				place_deferred(l);
		async_progress();
		/* Retry what waited: stalled links (a receive may have been posted) and HELLOs whose
		 * QP has reached RTR since. */
		for (struct dbl_link *l = G.links; l; l = l->next)
			if (!l->dead && l->fd >= 0 && dbuf_size(&l->in))
				link_process(l);
	}
	return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* 7. Async events                                                                             */
/* ------------------------------------------------------------------------------------------ */

/* IBV_DOUBLE_ASYNC_EVENT's kinds. A QP kind names the QP of this process in RTS with the lowest
 * QP number; cq_err names that QP's send CQ. Effects, as hardware has them: device_fatal and
 * port_err take every QP of the process to ERR; qp_* take their QP to ERR; cq_err puts the CQ in
 * error (it takes no more completions) and takes the QPs that use it to ERR; port_active undoes
 * port_err's port state; the others change nothing. */
static const struct dbl_async_kind async_kinds[] = {
	{ "device_fatal", IBV_EVENT_DEVICE_FATAL, ON_DEVICE, FX_DEVICE_FATAL },
	{ "port_err", IBV_EVENT_PORT_ERR, ON_PORT, FX_PORT_DOWN },
	{ "port_active", IBV_EVENT_PORT_ACTIVE, ON_PORT, FX_PORT_UP },
	{ "lid_change", IBV_EVENT_LID_CHANGE, ON_PORT, FX_NONE },
	{ "pkey_change", IBV_EVENT_PKEY_CHANGE, ON_PORT, FX_NONE },
	{ "gid_change", IBV_EVENT_GID_CHANGE, ON_PORT, FX_NONE },
	{ "sm_change", IBV_EVENT_SM_CHANGE, ON_PORT, FX_NONE },
	{ "client_reregister", IBV_EVENT_CLIENT_REREGISTER, ON_PORT, FX_NONE },
	{ "qp_fatal", IBV_EVENT_QP_FATAL, ON_QP, FX_QP_ERR },
	{ "qp_req_err", IBV_EVENT_QP_REQ_ERR, ON_QP, FX_QP_ERR },
	{ "qp_access_err", IBV_EVENT_QP_ACCESS_ERR, ON_QP, FX_QP_ERR },
	{ "comm_est", IBV_EVENT_COMM_EST, ON_QP, FX_NONE },
	{ "cq_err", IBV_EVENT_CQ_ERR, ON_CQ, FX_CQ_ERR },
};

static void async_parse_knobs(void)
{
	const char *trigger = getenv("IBV_DOUBLE_ASYNC_TRIGGER");
	if (trigger && *trigger)
		G.async_trigger = strdup(trigger);
	const char *v = getenv("IBV_DOUBLE_ASYNC_EVENT");
	if (!v || !*v)
		return;
	char *list = strdup(v), *save = NULL;
	for (char *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
		const struct dbl_async_kind *k = NULL;
		for (size_t i = 0; i < sizeof(async_kinds) / sizeof(async_kinds[0]); i++)
			if (!strcmp(name, async_kinds[i].name))
				k = &async_kinds[i];
		if (!k) {
			dbl_warn("IBV_DOUBLE_ASYNC_EVENT: unknown kind '%s' ignored (kinds: device_fatal, "
				 "port_err, port_active, lid_change, pkey_change, gid_change, sm_change, "
				 "client_reregister, qp_fatal, qp_req_err, qp_access_err, comm_est, cq_err)",
				 name);
		} else if (G.async_count < DBL_MAX_ASYNC) {
			G.async[G.async_count++] = k;
		}
	}
	free(list);
}

static bool is_qp_event(enum ibv_event_type t)
{
	return t == IBV_EVENT_QP_FATAL || t == IBV_EVENT_QP_REQ_ERR || t == IBV_EVENT_QP_ACCESS_ERR ||
	       t == IBV_EVENT_COMM_EST || t == IBV_EVENT_SQ_DRAINED || t == IBV_EVENT_PATH_MIG ||
	       t == IBV_EVENT_PATH_MIG_ERR || t == IBV_EVENT_QP_LAST_WQE_REACHED;
}

static void qp_to_err_if_live(struct dbl_qp *q, const char *why)
{
	if (q && q->qp.state != IBV_QPS_RESET && q->qp.state != IBV_QPS_ERR)
		qp_to_err_how(q, why, true); /* the peer's QP stays: its next request fails */
}

/* An event's effect (G.lock held). QPs go to ERR as after a local error: the peer is told
 * goodbye, so its QP stays as it is and its next request fails (IBV_WC_RETRY_EXC_ERR), as when a
 * NIC stops answering. */
static void async_apply(const struct dbl_pending *p)
{
	const char *why = p->kind->name;
	switch (p->kind->effect) {
	case FX_NONE:
		break;
	case FX_PORT_UP:
		G.port_down = false;
		break;
	case FX_PORT_DOWN:
		G.port_down = true; /* and every QP is on port 1: */
		__attribute__((fallthrough));
	case FX_DEVICE_FATAL:
		for (int i = 2; i < DBL_MAX_QPS; i++)
			qp_to_err_if_live(G.qps[i], why);
		break;
	case FX_QP_ERR:
		qp_to_err_if_live(qp_by_num(p->qpn), why);
		break;
	case FX_CQ_ERR: {
		struct dbl_cq *c = (struct dbl_cq *)p->cq;
		pthread_mutex_lock(&c->lock);
		c->error = true;
		pthread_mutex_unlock(&c->lock);
		for (int i = 2; i < DBL_MAX_QPS; i++) {
			struct dbl_qp *q = G.qps[i];
			if (q && (q->qp.send_cq == p->cq || q->qp.recv_cq == p->cq))
				qp_to_err_if_live(q, why);
		}
		break;
	}
	}
}

static void pending_unlink(struct dbl_pending *p)
{
	for (struct dbl_pending **pp = &G.pending; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			free(p);
			return;
		}
	}
}

static bool pending_names(const struct dbl_pending *p, const struct ibv_async_event *ev)
{
	if (p->kind->type != ev->event_type)
		return false;
	if (p->kind->scope == ON_QP)
		return ev->element.qp && ev->element.qp->qp_num == p->qpn;
	if (p->kind->scope == ON_CQ)
		return ev->element.cq == p->cq;
	return true;
}

/* One queued copy of `ev` is done with (acked, or dropped unread): its effect happens when it
 * was the last. G.lock held. */
static void pending_done_locked(const struct ibv_async_event *ev)
{
	for (struct dbl_pending *p = G.pending; p; p = p->next) {
		if (p->unacked > 0 && pending_names(p, ev)) {
			if (--p->unacked == 0) {
				async_apply(p);
				pending_unlink(p);
			}
			return;
		}
	}
}

/* ibv_get_async_event read `ev`: the object it names counts it, so that its destroy waits for
 * the ack (the real library's events_reported). G.lock held. */
static void async_reported_locked(const struct ibv_async_event *ev)
{
	if (is_qp_event(ev->event_type)) {
		struct dbl_qp *q = (struct dbl_qp *)ev->element.qp;
		pthread_mutex_lock(&q->qp.mutex);
		q->events_reported++;
		pthread_mutex_unlock(&q->qp.mutex);
	} else if (ev->event_type == IBV_EVENT_CQ_ERR) {
		struct dbl_cq *c = (struct dbl_cq *)ev->element.cq;
		pthread_mutex_lock(&c->cq.mutex);
		c->events_reported++;
		pthread_mutex_unlock(&c->cq.mutex);
	}
}

void ibv_ack_async_event(struct ibv_async_event *event)
{
	pthread_mutex_lock(&G.lock);
	pending_done_locked(event);
	pthread_mutex_unlock(&G.lock);
	if (is_qp_event(event->event_type)) {
		struct ibv_qp *qp = event->element.qp;
		count_ack(&qp->mutex, &qp->cond, &qp->events_completed);
	} else if (event->event_type == IBV_EVENT_CQ_ERR) {
		struct ibv_cq *cq = event->element.cq;
		count_ack(&cq->mutex, &cq->cond, &cq->async_events_completed);
	}
}

static bool event_names(const struct ibv_async_event *ev, struct dbl_qp *q, struct ibv_cq *cq)
{
	if (q && is_qp_event(ev->event_type))
		return ev->element.qp == &q->qp;
	return cq && ev->event_type == IBV_EVENT_CQ_ERR && ev->element.cq == cq;
}

/* Drops the queued events of c that `keep` rejects (all when keep is NULL); G.lock held. Their
 * bytes stay in the pipe: a reader that finds no event reads again. */
static void async_drop_where(struct dbl_context *c, struct dbl_qp *q, struct ibv_cq *cq, bool all)
{
	struct dbl_event **pp = &c->events;
	c->events_tail = NULL;
	while (*pp) {
		struct dbl_event *e = *pp;
		if (all || event_names(&e->ev, q, cq)) {
			*pp = e->next;
			if (all)
				pending_done_locked(&e->ev); /* never to be acked */
			free(e);
			continue;
		}
		c->events_tail = e;
		pp = &e->next;
	}
}

static void async_drop_queue_locked(struct dbl_context *c)
{
	async_drop_where(c, NULL, NULL, true);
}

/* The QP or CQ is being destroyed (G.lock held): unread events that name it go (as the kernel
 * drops them) and so do their pending effects. */
static void async_forget_object(struct dbl_qp *q, struct ibv_cq *cq)
{
	for (struct dbl_context *c = G.ctxs; c; c = c->next)
		async_drop_where(c, q, cq, false);
	for (struct dbl_pending *p = G.pending, *next; p; p = next) {
		next = p->next;
		if ((q && p->kind->scope == ON_QP && p->qpn == q->qp.qp_num) ||
		    (cq && p->kind->scope == ON_CQ && p->cq == cq))
			pending_unlink(p);
	}
}

static int async_queue(struct dbl_context *c, const struct ibv_async_event *ev)
{
	struct dbl_event *e = calloc(1, sizeof(*e));
	if (!e)
		return ENOMEM;
	e->ev = *ev;
	char b = 1;
	if (write(c->ctx.cmd_fd, &b, 1) != 1) {
		free(e);
		return errno;
	}
	if (c->events_tail)
		c->events_tail->next = e;
	else
		c->events = e;
	c->events_tail = e;
	return 0;
}

/* Raises kind k (G.lock held); false while a QP or CQ kind has no QP in RTS to name. */
static bool async_raise(const struct dbl_async_kind *k)
{
	struct ibv_async_event ev;
	memset(&ev, 0, sizeof(ev));
	ev.event_type = k->type;
	struct dbl_qp *q = NULL;
	if (k->scope == ON_QP || k->scope == ON_CQ) {
		for (int i = 2; i < DBL_MAX_QPS && !q; i++)
			if (G.qps[i] && G.qps[i]->qp.state == IBV_QPS_RTS)
				q = G.qps[i];
		if (!q)
			return false;
	}
	struct dbl_pending *p = calloc(1, sizeof(*p));
	if (!p)
		return false;
	p->kind = k;
	if (k->scope == ON_QP) {
		ev.element.qp = &q->qp;
		p->qpn = q->qp.qp_num;
	} else if (k->scope == ON_CQ) {
		ev.element.cq = q->qp.send_cq;
		p->cq = q->qp.send_cq;
	} else if (k->scope == ON_PORT) {
		ev.element.port_num = 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &p->raised);
	for (struct dbl_context *c = G.ctxs; c; c = c->next)
		if ((!q || &c->ctx == q->qp.context) && async_queue(c, &ev) == 0)
			p->unacked++;
	if (q)
		dbl_warn("IBV_DOUBLE_ASYNC_EVENT: %s raised on QP 0x%x (%s)", k->name, q->qp.qp_num,
			 k->scope == ON_CQ ? "its send CQ" : "the QP");
	else
		dbl_warn("IBV_DOUBLE_ASYNC_EVENT: %s raised on %s", k->name,
			 k->scope == ON_PORT ? "port 1" : "the device");
	if (p->unacked == 0) { /* no open context: nobody to tell */
		async_apply(p);
		free(p);
	} else {
		p->next = G.pending;
		G.pending = p;
	}
	return true;
}

/* From the progress thread (G.lock held): effects that waited long enough happen; the trigger
 * file, once it exists, raises the next kind and is removed (create it again for the next). */
static void async_progress(void)
{
	for (struct dbl_pending *p = G.pending, *next; p; p = next) {
		next = p->next;
		if (elapsed_ms(&p->raised) >= DBL_EFFECT_MS) {
			async_apply(p);
			pending_unlink(p);
		}
	}
	while (G.async_next < G.async_count) {
		if (G.async_trigger && !G.async_armed) {
			if (access(G.async_trigger, F_OK) != 0)
				return;
			G.async_armed = true;
		}
		if (!async_raise(G.async[G.async_next]))
			return; /* waits for a QP in RTS */
		G.async_next++;
		G.async_armed = false;
		if (G.async_trigger) {
			unlink(G.async_trigger);
			return; /* one kind per appearance of the file */
		}
	}
}
