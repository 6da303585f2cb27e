/*
 * double_test.c - checks the verbs double with a program written for real verbs.
 *
 * Built against the system's <infiniband/verbs.h> and libibverbs; run with
 * LD_LIBRARY_PATH=<dir of the double>. Two processes (this one and a forked child) each open the
 * device, connect RC QPs to each other (QPN/GID/rkey exchanged over pipes, as a real program does
 * over its own socket) and check:
 *   basic      write-with-imm (receiver's opcode, imm, byte_len, data), RDMA read, send-with-imm
 *              inline, an unsignaled write (no completion), a bad rkey -> IBV_WC_REM_ACCESS_ERR
 *              then flush, out-of-bounds -> IBV_WC_REM_ACCESS_ERR, the peer killed with work
 *              outstanding -> IBV_WC_WR_FLUSH_ERR for every WR, within a bound; the peer
 *              destroying its QP -> ours stays RTS with its receive posted (as on hardware)
 *              and its next send fails with IBV_WC_RETRY_EXC_ERR.
 *   fail-after IBV_DOUBLE_FAIL_AFTER=1: the second WR fails, the third is flushed.
 *   delay      IBV_DOUBLE_DELAY_US=200000 on the responder: a write completes no sooner.
 *   reorder    IBV_DOUBLE_REORDER=1 on the responder: of two plain writes to the same bytes,
 *              posted together, the later lands first (so the earlier one's bytes stay), and
 *              a write-with-imm still finds every earlier write placed at its completion.
 *   rnr        rnr_retry 1 and no receive posted at the peer: IBV_WC_RNR_RETRY_EXC_ERR after
 *              the retries (2 x min_rnr_timer 20 = 20 ms); with rnr_retry 7 the send waits
 *              until a receive is posted, then completes. IBV_DOUBLE_RNR=2 at the responder:
 *              the next two sends are NAKed once though a receive is posted, and complete.
 *   devices    IBV_DOUBLE_DEVICES=2 IBV_DOUBLE_PORTS=2: two devices dbl_0, dbl_1 (index, distinct
 *              node GUIDs, two ACTIVE ports each with its GID table, no port 3); a QP whose CQ
 *              is another device's is refused; a write-with-imm from a QP on dbl_0 port 2 to
 *              one on dbl_1 port 2 lands, and the same write with the rkey of a region of
 *              another device's PD (at the peer) gives IBV_WC_REM_ACCESS_ERR.
 *   dmabuf     the responder registers the second page of a memfd (a dma-buf's stand-in) with
 *              ibv_reg_dmabuf_mr at an iova of its choosing; a write-with-imm to that iova
 *              lands in the memfd, seen through the responder's own mapping; fd -1 is EBADF
 *              (NCCL's probe reads "supported"); dereg unmaps the double's mapping.
 *   async      IBV_DOUBLE_ASYNC_EVENT with IBV_DOUBLE_ASYNC_TRIGGER, each case in a process of
 *              its own with its QPs connected to themselves: nothing before the trigger
 *              (EAGAIN), then the event's type and element, the trigger file removed, the
 *              effect only after the ack (device_fatal, port_err: every QP to ERR, the posted
 *              receive flushed, port_err's port DOWN and port_active's ACTIVE again; qp_fatal:
 *              the lowest-numbered QP in RTS only; cq_err: its send CQ, its QPs to ERR and no
 *              completion after), an unread event's effect after 500 ms anyway, ibv_destroy_qp
 *              waiting for the ack of an event it read, and ibv_close_device waking a thread
 *              blocked in ibv_get_async_event.
 * Prints PASS/FAIL per check; exits 0 only if all pass. Every wait is bounded (5 s).
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BUF_SIZE (64 * 1024)
#define NQP 5 /* A: data, B: bad rkey, C: out of bounds, D: peer killed, E: peer destroys its QP */
enum { QA, QB, QC, QD, QE };
#define WAIT_MS 5000

struct info {
	uint32_t qpn[NQP];
	uint32_t rkey;
	uint32_t rkey_other;    /* "devices": a region on a PD of the other device */
	uint64_t addr;
	union ibv_gid gid;
	uint32_t dmabuf_rkey; /* "dmabuf" mode: the responder's dma-buf region, at DMABUF_IOVA */
};

#define DMABUF_IOVA 0x5000000000ULL
#define MEMFD_NAME "dbl-dmabuf-test"

/* Mappings of the test's memfd in this process (/proc/self/maps). */
static int memfd_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int n = 0;
	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, "memfd:" MEMFD_NAME) != NULL;
	if (f)
		fclose(f);
	return n;
}

struct side {
	int dev;                /* which device of the list, and which port ("devices" mode) */
	uint8_t port;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
	struct ibv_qp *qp[NQP];
	int gid_index;
	struct info me, peer;
};

static int failures;
static uint8_t rnr_retry = 7; /* QA's, on the requester; "rnr" mode lowers it */

static void check(int ok, const char *name, const char *fmt, ...)
{
	if (ok) {
		printf("PASS %s\n", name);
	} else {
		va_list ap;
		va_start(ap, fmt);
		printf("FAIL %s: ", name);
		vprintf(fmt, ap);
		printf("\n");
		va_end(ap);
		failures++;
	}
	fflush(stdout);
}

static void die(const char *what)
{
	fprintf(stderr, "double_test[%d]: %s: %s\n", (int)getpid(), what, strerror(errno));
	exit(2);
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* One completion, or status -1 after WAIT_MS. */
static struct ibv_wc wait_wc(struct side *s)
{
	struct ibv_wc wc;
	double end = now_s() + WAIT_MS / 1e3;
	while (now_s() < end) {
		int n = ibv_poll_cq(s->cq, 1, &wc);
		if (n < 0)
			die("ibv_poll_cq");
		if (n == 1)
			return wc;
		usleep(100);
	}
	memset(&wc, 0, sizeof(wc));
	wc.status = (enum ibv_wc_status) - 1;
	return wc;
}

static void xwrite(int fd, const void *p, size_t n)
{
	if (write(fd, p, n) != (ssize_t)n)
		die("pipe write");
}

static int xread(int fd, void *p, size_t n)
{
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	if (poll(&pf, 1, WAIT_MS) != 1)
		return -1;
	return read(fd, p, n) == (ssize_t)n ? 0 : -1;
}

/* GID choice as NCCL makes it: RoCE v2, IPv4-mapped, link-local entries skipped. */
static int choose_gid(struct ibv_context *ctx, uint8_t port)
{
	struct ibv_port_attr pa;
	if (ibv_query_port(ctx, port, &pa))
		die("ibv_query_port");
	for (int i = 0; i < pa.gid_tbl_len; i++) {
		struct ibv_gid_entry e;
		if (ibv_query_gid_ex(ctx, port, (uint32_t)i, &e, 0))
			continue;
		int v4 = e.gid.raw[10] == 0xff && e.gid.raw[11] == 0xff;
		int link_local = e.gid.raw[0] == 0xfe && (e.gid.raw[1] & 0xc0) == 0x80;
		if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && v4 && !link_local)
			return i;
	}
	return -1;
}

static void setup(struct side *s)
{
	int n;
	struct ibv_device **devs = ibv_get_device_list(&n);
	if (!devs || n <= s->dev)
		die("no such verbs device (is LD_LIBRARY_PATH set to the double?)");
	if (!s->port)
		s->port = 1;
	s->ctx = ibv_open_device(devs[s->dev]);
	ibv_free_device_list(devs);
	if (!s->ctx)
		die("ibv_open_device");
	s->gid_index = choose_gid(s->ctx, s->port);
	if (s->gid_index < 0 || ibv_query_gid(s->ctx, s->port, s->gid_index, &s->me.gid))
		die("no RoCE v2 IPv4 GID");
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 256, NULL, NULL, 0);
	if (posix_memalign((void **)&s->buf, 4096, BUF_SIZE))
		die("posix_memalign");
	memset(s->buf, 0, BUF_SIZE);
	s->mr = ibv_reg_mr(s->pd, s->buf, BUF_SIZE,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!s->pd || !s->cq || !s->mr)
		die("pd/cq/mr");
	s->me.rkey = s->mr->rkey;
	s->me.addr = (uintptr_t)s->buf;
	for (int i = 0; i < NQP; i++) {
		struct ibv_qp_init_attr ia = {
			.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
				 .max_recv_sge = 1, .max_inline_data = 128 },
		};
		s->qp[i] = ibv_create_qp(s->pd, &ia);
		if (!s->qp[i])
			die("ibv_create_qp");
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = s->port,
					 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
		if (ibv_modify_qp(s->qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						    IBV_QP_ACCESS_FLAGS))
			die("modify INIT");
		s->me.qpn[i] = s->qp[i]->qp_num;
	}
}

static void connect_qps(struct side *s)
{
	for (int i = 0; i < NQP; i++) {
		struct ibv_qp_attr a = {
			.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096, .dest_qp_num = s->peer.qpn[i],
			.rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = 20, /* 10.24 ms */
			.ah_attr = { .is_global = 1, .port_num = s->port,
				     .grh = { .dgid = s->peer.gid, .sgid_index = (uint8_t)s->gid_index,
					      .hop_limit = 1 } },
		};
		if (ibv_modify_qp(s->qp[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
						    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
			die("modify RTR");
		struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
					 .rnr_retry = i == QA ? rnr_retry : 7, .sq_psn = 0,
					 .max_rd_atomic = 1 };
		if (ibv_modify_qp(s->qp[i], &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
						    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
						    IBV_QP_MAX_QP_RD_ATOMIC))
			die("modify RTS");
	}
}

static int post_recv(struct side *s, int q, uint64_t id, uint32_t off, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + off, .length = len, .lkey = s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	return ibv_post_recv(s->qp[q], &wr, &bad);
}

static int post(struct side *s, int q, uint64_t id, enum ibv_wr_opcode op, uint32_t off,
		uint32_t len, uint64_t raddr, uint32_t rkey, uint32_t imm, unsigned flags)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + off, .length = len, .lkey = s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = flags, .imm_data = imm }, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(s->qp[q], &wr, &bad);
}

static void fill(char *p, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (char)(seed + i * 7);
}

static int same(const char *p, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (char)(seed + i * 7))
			return 0;
	return 1;
}

/* "devices": what a program sees of two dual-port devices, before any QP is connected. */
static void devices_checks(void)
{
	int n = 0;
	struct ibv_device **devs = ibv_get_device_list(&n);
	check(devs && n == 2 && !strcmp(ibv_get_device_name(devs[0]), "dbl_0") &&
	      !strcmp(ibv_get_device_name(devs[1]), "dbl_1") && ibv_get_device_index(devs[1]) == 1,
	      "devices: IBV_DOUBLE_DEVICES=2 lists dbl_0 and dbl_1", "%d devices", n);
	if (!devs || n != 2)
		die("two devices");
	struct ibv_context *ctx[2];
	struct ibv_device_attr da[2];
	for (int d = 0; d < 2; d++) {
		ctx[d] = ibv_open_device(devs[d]);
		if (!ctx[d] || ibv_query_device(ctx[d], &da[d]))
			die("open / query device");
	}
	check(da[0].node_guid != da[1].node_guid && da[0].node_guid == ibv_get_device_guid(devs[0]) &&
	      da[1].node_guid == ibv_get_device_guid(devs[1]) &&
	      da[0].sys_image_guid == da[0].node_guid,
	      "devices: a node GUID per device, as ibv_get_device_guid says", "GUIDs %llx %llx",
	      (unsigned long long)da[0].node_guid, (unsigned long long)da[1].node_guid);
	int ports_ok = da[0].phys_port_cnt == 2 && da[1].phys_port_cnt == 2;
	for (int d = 0; d < 2; d++) {
		for (uint8_t p = 1; p <= 2; p++) {
			struct ibv_port_attr pa;
			union ibv_gid g;
			ports_ok &= !ibv_query_port(ctx[d], p, &pa) && pa.state == IBV_PORT_ACTIVE &&
				    pa.link_layer == IBV_LINK_LAYER_ETHERNET && pa.gid_tbl_len == 4 &&
				    choose_gid(ctx[d], p) == 3 && !ibv_query_gid(ctx[d], p, 3, &g) &&
				    g.raw[10] == 0xff && g.raw[12] == 127;
		}
		struct ibv_port_attr pa;
		ports_ok &= ibv_query_port(ctx[d], 3, &pa) != 0;
	}
	check(ports_ok, "devices: two ACTIVE Ethernet ports each, GID 3 = ::ffff:127.0.0.1 RoCE v2, "
	      "no port 3", "a port check failed");
	struct ibv_pd *pd = ibv_alloc_pd(ctx[0]);
	struct ibv_cq *cq = ibv_create_cq(ctx[1], 16, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
						.max_recv_sge = 1 } };
	struct ibv_qp *qp = pd && cq ? ibv_create_qp(pd, &ia) : NULL;
	check(pd && cq && !qp && errno == EINVAL,
	      "devices: a QP with a PD of dbl_0 and a CQ of dbl_1 is refused (EINVAL)", "qp %p", qp);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	for (int d = 0; d < 2; d++)
		ibv_close_device(ctx[d]);
	ibv_free_device_list(devs);
}

/* ---- the peer (child): posts receives, reports what it saw, then waits to be killed ---- */

static void server(const char *mode, int rd, int wr)
{
	if (!strcmp(mode, "delay"))
		setenv("IBV_DOUBLE_DELAY_US", "200000", 1);
	if (!strcmp(mode, "reorder"))
		setenv("IBV_DOUBLE_REORDER", "1", 1);
	if (!strcmp(mode, "rnr"))
		setenv("IBV_DOUBLE_RNR", "2", 1);
	struct side s = { 0 };
	if (!strcmp(mode, "devices")) {
		s.dev = 1;
		s.port = 2;
	}
	setup(&s);
	fill(s.buf + 16384, 1024, 'R');
	struct ibv_context *other = NULL;
	if (!strcmp(mode, "devices")) {
		/* A region of the same bytes on a PD of the other device: its rkey is no key of the
		 * QPs of this device. */
		struct ibv_device **devs = ibv_get_device_list(NULL);
		other = devs ? ibv_open_device(devs[0]) : NULL;
		ibv_free_device_list(devs);
		struct ibv_pd *opd = other ? ibv_alloc_pd(other) : NULL;
		struct ibv_mr *omr = opd ? ibv_reg_mr(opd, s.buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE |
						      IBV_ACCESS_REMOTE_WRITE) : NULL;
		if (!omr)
			die("a region on the other device");
		s.me.rkey_other = omr->rkey;
		post_recv(&s, QA, 501, 32768, 64);
	}
	if (!strcmp(mode, "reorder"))
		post_recv(&s, QA, 401, 32768, 64);
	int memfd = -1;
	char *dmabuf = NULL;
	struct ibv_mr *dmabuf_mr = NULL;
	if (!strcmp(mode, "dmabuf")) {
		memfd = memfd_create(MEMFD_NAME, MFD_CLOEXEC);
		if (memfd < 0 || ftruncate(memfd, 8192))
			die("memfd");
		dmabuf = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
		if (dmabuf == MAP_FAILED)
			die("mmap memfd");
		dmabuf_mr = ibv_reg_dmabuf_mr(s.pd, 4096, 4096, DMABUF_IOVA, memfd,
					      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!dmabuf_mr)
			die("ibv_reg_dmabuf_mr");
		s.me.dmabuf_rkey = dmabuf_mr->rkey;
		post_recv(&s, QA, 501, 32768, 64);
	}
	if (!strcmp(mode, "rnr")) /* for IBV_DOUBLE_RNR: posted, yet NAKed once each */
		for (uint64_t id = 501; id <= 502; id++)
			post_recv(&s, QC, id, 32768, 4096);
	if (!strcmp(mode, "basic")) {
		post_recv(&s, QA, 101, 32768, 4096); /* write-with-imm consumes it; no bytes here */
		post_recv(&s, QA, 102, 32768, 4096); /* send-with-imm lands here */
		post_recv(&s, QB, 201, 32768, 64);   /* flushed when B fails */
	}
	xwrite(wr, &s.me, sizeof(s.me));
	if (xread(rd, &s.peer, sizeof(s.peer)))
		die("no peer info");
	connect_qps(&s);
	char ready = 'r';
	xwrite(wr, &ready, 1);
	if (!strcmp(mode, "basic")) {
		struct ibv_wc wc = wait_wc(&s);
		int ok = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
			 wc.wr_id == 101 && wc.byte_len == 4096 && (wc.wc_flags & IBV_WC_WITH_IMM) &&
			 ntohl(wc.imm_data) == 0x1234 && wc.qp_num == s.me.qpn[QA] && same(s.buf, 4096, 'W');
		check(ok, "responder: write-with-imm completion and data", "status %d opcode %d wr_id %llu "
		      "byte_len %u imm 0x%x", wc.status, wc.opcode, (unsigned long long)wc.wr_id,
		      wc.byte_len, ntohl(wc.imm_data));
		wc = wait_wc(&s);
		ok = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 102 &&
		     wc.byte_len == 100 && (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 7 &&
		     same(s.buf + 32768, 100, 'S');
		check(ok, "responder: send-with-imm inline lands in the receive buffer",
		      "status %d opcode %d wr_id %llu byte_len %u", wc.status, wc.opcode,
		      (unsigned long long)wc.wr_id, wc.byte_len);
		wc = wait_wc(&s);
		check(wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 201 && wc.qp_num == s.me.qpn[QB],
		      "responder: peer QP in error flushes the posted receive",
		      "status %d wr_id %llu", wc.status, (unsigned long long)wc.wr_id);
		char done = failures ? 'F' : 'P';
		xwrite(wr, &done, 1);
	}
	if (!strcmp(mode, "devices")) {
		struct ibv_wc wc = wait_wc(&s);
		check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
		      wc.wr_id == 501 && wc.qp_num == s.me.qpn[QA] && same(s.buf + 4096, 2048, 'M'),
		      "devices: write-with-imm from dbl_0 port 2 lands on dbl_1 port 2",
		      "status %d opcode %d wr_id %llu", wc.status, wc.opcode, (unsigned long long)wc.wr_id);
		char done = failures ? 'F' : 'P';
		xwrite(wr, &done, 1);
	}
	if (!strcmp(mode, "reorder")) {
		/* The requester wrote 'x' then 'y' over bytes 0..63, then 'z' to 128..191, then a
		 * zero-byte write-with-imm: at that completion every write has landed, in reverse. */
		struct ibv_wc wc = wait_wc(&s);
		int xs = 0, zs = 0;
		for (int i = 0; i < 64; i++) {
			xs += s.buf[i] == 'x';
			zs += s.buf[128 + i] == 'z';
		}
		check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && xs == 64 &&
		      zs == 64, "IBV_DOUBLE_REORDER=1: later write placed first, all placed at the imm",
		      "status %d, %d bytes 'x' (64 expected), %d bytes 'z'", wc.status, xs, zs);
		char done = failures ? 'F' : 'P';
		xwrite(wr, &done, 1);
	}
	if (!strcmp(mode, "dmabuf")) {
		struct ibv_wc wc = wait_wc(&s);
		int maps_registered = memfd_maps();
		errno = 0;
		struct ibv_mr *probe = ibv_reg_dmabuf_mr(s.pd, 0, 0, 0, -1, 0);
		int probe_errno = errno;
		int dereg = ibv_dereg_mr(dmabuf_mr);
		int maps_after = memfd_maps();
		check(wc.status == IBV_WC_SUCCESS && wc.wr_id == 501 && same(dmabuf + 4096, 4096, 'M') &&
		      !probe && probe_errno == EBADF && dereg == 0 && maps_registered == 2 &&
		      maps_after == 1,
		      "dma-buf: a write to the iova lands in the memfd (seen through our mapping); "
		      "fd -1 is EBADF; dereg unmaps",
		      "status %d wr_id %llu, data %s, probe errno %d, dereg %d, memfd maps %d then %d",
		      wc.status, (unsigned long long)wc.wr_id,
		      same(dmabuf + 4096, 4096, 'M') ? "ok" : "wrong", probe_errno, dereg,
		      maps_registered, maps_after);
		char done = failures ? 'F' : 'P';
		xwrite(wr, &done, 1);
	}
	char cmd;
	while (xread(rd, &cmd, 1) == 0) {
		if (cmd == 'd')
			ibv_destroy_qp(s.qp[QE]);
		if (cmd == 'r')
			post_recv(&s, QB, 301, 32768, 4096);
		xwrite(wr, &cmd, 1);
	}
	pause(); /* killed by the parent */
	exit(0);
}

/* ---- the requester (parent) ---- */

static int run(const char *mode)
{
	int p2c[2], c2p[2];
	if (pipe(p2c) || pipe(c2p))
		die("pipe");
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
		alarm(30);
		close(p2c[1]);
		close(c2p[0]);
		server(mode, p2c[0], c2p[1]);
	}
	close(p2c[0]);
	close(c2p[1]);
	if (!strcmp(mode, "fail-after"))
		setenv("IBV_DOUBLE_FAIL_AFTER", "1", 1);
	if (!strcmp(mode, "rnr"))
		rnr_retry = 1;
	struct side s = { 0 };
	if (!strcmp(mode, "devices")) {
		devices_checks();
		s.port = 2;
	}
	setup(&s);
	check(s.gid_index == 3, "GID choice: RoCE v2 IPv4 entry, link-local skipped",
	      "chose index %d", s.gid_index);
	if (xread(c2p[0], &s.peer, sizeof(s.peer)))
		die("no peer info");
	xwrite(p2c[1], &s.me, sizeof(s.me));
	connect_qps(&s);
	char c;
	if (xread(c2p[0], &c, 1))
		die("peer not ready");
	struct ibv_wc wc;
	uint64_t ra = s.peer.addr;
	uint32_t rk = s.peer.rkey;

	if (!strcmp(mode, "basic")) {
		fill(s.buf, 4096, 'W');
		post(&s, QA, 1, IBV_WR_RDMA_WRITE_WITH_IMM, 0, 4096, ra, rk, htonl(0x1234), IBV_SEND_SIGNALED);
		wc = wait_wc(&s);
		check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id == 1,
		      "requester: write-with-imm completes", "status %d opcode %d", wc.status, wc.opcode);

		post(&s, QA, 2, IBV_WR_RDMA_READ, 8192, 1024, ra + 16384, rk, 0, IBV_SEND_SIGNALED);
		wc = wait_wc(&s);
		check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ && wc.wr_id == 2 &&
		      wc.byte_len == 1024 && same(s.buf + 8192, 1024, 'R'),
		      "requester: RDMA read brings the peer's bytes", "status %d opcode %d byte_len %u",
		      wc.status, wc.opcode, wc.byte_len);

		fill(s.buf + 12288, 100, 'S');
		post(&s, QA, 3, IBV_WR_SEND_WITH_IMM, 12288, 100, 0, 0, htonl(7),
		     IBV_SEND_SIGNALED | IBV_SEND_INLINE);
		wc = wait_wc(&s);
		check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND && wc.wr_id == 3,
		      "requester: send-with-imm inline completes", "status %d opcode %d", wc.status, wc.opcode);

		/* Unsignaled then signaled: one completion, and the unsignaled write landed. */
		fill(s.buf + 20480, 512, 'U');
		post(&s, QA, 4, IBV_WR_RDMA_WRITE, 20480, 512, ra + 40960, rk, 0, 0);
		post(&s, QA, 5, IBV_WR_RDMA_READ, 24576, 512, ra + 40960, rk, 0, IBV_SEND_SIGNALED);
		wc = wait_wc(&s);
		struct ibv_wc extra;
		int more = ibv_poll_cq(s.cq, 1, &extra);
		check(wc.status == IBV_WC_SUCCESS && wc.wr_id == 5 && more == 0 &&
		      same(s.buf + 24576, 512, 'U'), "requester: unsignaled write gives no completion",
		      "first wr_id %llu status %d, %d more", (unsigned long long)wc.wr_id, wc.status, more);

		post(&s, QB, 6, IBV_WR_RDMA_WRITE, 0, 64, ra, rk ^ 0x5a5a00, 0, IBV_SEND_SIGNALED);
		wc = wait_wc(&s);
		check(wc.status == IBV_WC_REM_ACCESS_ERR && wc.wr_id == 6 && wc.qp_num == s.me.qpn[QB],
		      "requester: bad rkey gives IBV_WC_REM_ACCESS_ERR", "status %d (%s)", wc.status,
		      ibv_wc_status_str(wc.status));
		post(&s, QB, 7, IBV_WR_RDMA_WRITE, 0, 64, ra, rk, 0, IBV_SEND_SIGNALED);
		wc = wait_wc(&s);
		check(wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 7,
		      "requester: QP in ERR after the access error flushes new work", "status %d", wc.status);

		post(&s, QC, 8, IBV_WR_RDMA_WRITE, 0, 4096, ra + BUF_SIZE - 1024, rk, 0, IBV_SEND_SIGNALED);
		wc = wait_wc(&s);
		check(wc.status == IBV_WC_REM_ACCESS_ERR && wc.wr_id == 8,
		      "requester: write past the region's end gives IBV_WC_REM_ACCESS_ERR", "status %d",
		      wc.status);

		if (xread(c2p[0], &c, 1) || c != 'P')
			check(0, "responder checks", "the peer reported failures (see its lines above)");

		/* The peer destroys QP E: hardware tells nothing, so E stays RTS with its receive still
		 * posted, and its next send fails after the (here immediate) retries. */
		post_recv(&s, QE, 11, 49152, 64);
		c = 'd';
		xwrite(p2c[1], &c, 1);
		if (xread(c2p[0], &c, 1))
			die("peer did not destroy its QP");
		usleep(100000);
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr qia;
		ibv_query_qp(s.qp[QE], &qa, IBV_QP_STATE, &qia);
		int none = ibv_poll_cq(s.cq, 1, &wc) == 0;
		check(none && qa.qp_state == IBV_QPS_RTS,
		      "peer destroyed its QP: ours stays RTS, its receive stays posted",
		      "state %d, completion pending %d", qa.qp_state, !none);
		post(&s, QE, 12, IBV_WR_RDMA_WRITE, 0, 64, ra, rk, 0, IBV_SEND_SIGNALED);
		wc = wait_wc(&s);
		check(wc.status == IBV_WC_RETRY_EXC_ERR && wc.wr_id == 12,
		      "peer destroyed its QP: the next send fails with IBV_WC_RETRY_EXC_ERR",
		      "status %d wr_id %llu", wc.status, (unsigned long long)wc.wr_id);
		wc = wait_wc(&s);
		check(wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 11,
		      "peer destroyed its QP: after the send error the receive flushes",
		      "status %d wr_id %llu", wc.status, (unsigned long long)wc.wr_id);

		/* Outstanding work on D: a receive, and a send the peer has no receive for (it waits,
		 * as RNR retry does). Kill the peer: both flush. */
		post_recv(&s, QD, 9, 49152, 64);
		post(&s, QD, 10, IBV_WR_SEND, 0, 64, 0, 0, 0, IBV_SEND_SIGNALED);
		usleep(100000);
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		double t0 = now_s();
		struct ibv_wc a = wait_wc(&s), b = wait_wc(&s);
		double dt = now_s() - t0;
		check(a.status == IBV_WC_WR_FLUSH_ERR && b.status == IBV_WC_WR_FLUSH_ERR &&
		      a.wr_id + b.wr_id == 19 && dt < 2.0,
		      "peer killed: outstanding send and receive flush with IBV_WC_WR_FLUSH_ERR",
		      "statuses %d/%d wr_ids %llu/%llu after %.2f s", a.status, b.status,
		      (unsigned long long)a.wr_id, (unsigned long long)b.wr_id, dt);
		ibv_query_qp(s.qp[QD], &qa, IBV_QP_STATE, &qia);
		check(qa.qp_state == IBV_QPS_ERR, "peer killed: the QP is in ERR", "state %d", qa.qp_state);
		return failures;
	}
	if (!strcmp(mode, "fail-after")) {
		for (uint64_t id = 1; id <= 3; id++)
			post(&s, QA, id, IBV_WR_RDMA_WRITE, 0, 64, ra, rk, 0, IBV_SEND_SIGNALED);
		struct ibv_wc w[3];
		for (int i = 0; i < 3; i++)
			w[i] = wait_wc(&s);
		check(w[0].status == IBV_WC_SUCCESS && w[1].status == IBV_WC_RETRY_EXC_ERR &&
		      w[2].status == IBV_WC_WR_FLUSH_ERR && w[1].wr_id == 2 && w[2].wr_id == 3,
		      "IBV_DOUBLE_FAIL_AFTER=1: second WR fails, third is flushed",
		      "statuses %d %d %d", w[0].status, w[1].status, w[2].status);
	} else if (!strcmp(mode, "reorder")) {
		memset(s.buf, 'x', 64);
		memset(s.buf + 64, 'y', 64);
		memset(s.buf + 128, 'z', 64);
		struct ibv_sge sg[4] = {
			{ (uintptr_t)s.buf, 64, s.mr->lkey }, { (uintptr_t)s.buf + 64, 64, s.mr->lkey },
			{ (uintptr_t)s.buf + 128, 64, s.mr->lkey }, { 0, 0, 0 },
		};
		struct ibv_send_wr w[4], *bad;
		memset(w, 0, sizeof(w));
		for (int i = 0; i < 4; i++) {
			w[i].wr_id = 20 + i;
			w[i].sg_list = &sg[i];
			w[i].num_sge = i < 3 ? 1 : 0;
			w[i].opcode = i < 3 ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_WRITE_WITH_IMM;
			w[i].wr.rdma.remote_addr = ra + (i == 2 ? 128 : 0);
			w[i].wr.rdma.rkey = rk;
			w[i].next = i < 3 ? &w[i + 1] : NULL;
		}
		w[3].send_flags = IBV_SEND_SIGNALED;
		w[3].imm_data = htonl(1);
		if (ibv_post_send(s.qp[QA], w, &bad))
			die("post the writes");
		wc = wait_wc(&s);
		check(wc.status == IBV_WC_SUCCESS && wc.wr_id == 23, "reorder: the writes complete",
		      "status %d wr_id %llu", wc.status, (unsigned long long)wc.wr_id);
		if (xread(c2p[0], &c, 1) || c != 'P')
			check(0, "responder checks", "the peer reported failures (see its lines above)");
	} else if (!strcmp(mode, "rnr")) {
		/* First (the NAKs go to the first requests): IBV_DOUBLE_RNR=2 at the peer, receives
		 * posted on C; each send is NAKed once, waits min_rnr_timer (20: 10.24 ms), completes. */
		double t0 = now_s();
		post(&s, QC, 3, IBV_WR_SEND, 0, 64, 0, 0, 0, IBV_SEND_SIGNALED);
		post(&s, QC, 4, IBV_WR_SEND, 0, 64, 0, 0, 0, IBV_SEND_SIGNALED);
		struct ibv_wc w3 = wait_wc(&s), w4 = wait_wc(&s);
		double dt = now_s() - t0;
		check(w3.status == IBV_WC_SUCCESS && w4.status == IBV_WC_SUCCESS && w3.wr_id == 3 &&
		      w4.wr_id == 4 && dt >= 0.02,
		      "IBV_DOUBLE_RNR=2: two sends NAKed once each despite posted receives, then complete",
		      "statuses %d/%d wr_ids %llu/%llu after %.3f s", w3.status, w4.status,
		      (unsigned long long)w3.wr_id, (unsigned long long)w4.wr_id, dt);
		t0 = now_s();
		post(&s, QA, 1, IBV_WR_SEND, 0, 64, 0, 0, 0, IBV_SEND_SIGNALED);
		wc = wait_wc(&s);
		dt = now_s() - t0;
		check(wc.status == IBV_WC_RNR_RETRY_EXC_ERR && wc.wr_id == 1 && dt >= 0.02,
		      "rnr_retry 1, no receive posted: IBV_WC_RNR_RETRY_EXC_ERR after the retries",
		      "status %d after %.3f s", wc.status, dt);
		/* rnr_retry 7 (QB): the send waits for the receive posted 300 ms later. */
		post(&s, QB, 2, IBV_WR_SEND, 0, 64, 0, 0, 0, IBV_SEND_SIGNALED);
		usleep(300000);
		int early = ibv_poll_cq(s.cq, 1, &wc);
		c = 'r';
		xwrite(p2c[1], &c, 1);
		if (xread(c2p[0], &c, 1))
			die("peer did not post its receive");
		if (!early)
			wc = wait_wc(&s);
		check(early == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 2,
		      "rnr_retry 7: the send waits for the receive, then completes",
		      "early %d (wr_id %llu status %d)", early, (unsigned long long)wc.wr_id, wc.status);
	} else if (!strcmp(mode, "devices")) {
		fill(s.buf, 2048, 'M');
		post(&s, QA, 1, IBV_WR_RDMA_WRITE_WITH_IMM, 0, 2048, ra + 4096, rk, htonl(5),
		     IBV_SEND_SIGNALED);
		wc = wait_wc(&s);
		check(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1,
		      "devices: the write across devices completes", "status %d", wc.status);
		post(&s, QB, 2, IBV_WR_RDMA_WRITE, 0, 64, ra, s.peer.rkey_other, 0, IBV_SEND_SIGNALED);
		wc = wait_wc(&s);
		check(wc.status == IBV_WC_REM_ACCESS_ERR && wc.wr_id == 2,
		      "devices: the rkey of another device's region gives IBV_WC_REM_ACCESS_ERR",
		      "status %d (%s)", wc.status, ibv_wc_status_str(wc.status));
		if (xread(c2p[0], &c, 1) || c != 'P')
			check(0, "responder checks", "the peer reported failures (see its lines above)");
	} else if (!strcmp(mode, "dmabuf")) {
		fill(s.buf, 4096, 'M');
		post(&s, QA, 1, IBV_WR_RDMA_WRITE_WITH_IMM, 0, 4096, DMABUF_IOVA, s.peer.dmabuf_rkey,
		     htonl(5), IBV_SEND_SIGNALED);
		wc = wait_wc(&s);
		check(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1,
		      "dma-buf: the write into the peer's dma-buf region completes", "status %d",
		      wc.status);
		if (xread(c2p[0], &c, 1) || c != 'P')
			check(0, "responder checks", "the peer reported failures (see its lines above)");
	} else if (!strcmp(mode, "delay")) {
		double t0 = now_s();
		post(&s, QA, 1, IBV_WR_RDMA_WRITE, 0, 64, ra, rk, 0, IBV_SEND_SIGNALED);
		wc = wait_wc(&s);
		double dt = now_s() - t0;
		check(wc.status == IBV_WC_SUCCESS && dt >= 0.19,
		      "IBV_DOUBLE_DELAY_US=200000 on the responder delays the completion",
		      "status %d after %.3f s", wc.status, dt);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return failures;
}

/* ---- async: IBV_DOUBLE_ASYNC_EVENT, each case in a child process (knobs are read once) ---- */

static char trigger[128];

static void pull_trigger(void)
{
	FILE *f = fopen(trigger, "w");
	if (!f)
		die("create the trigger file");
	fclose(f);
}

/* The next event within WAIT_MS; -1 if none. */
static int next_event(struct side *s, struct ibv_async_event *ev)
{
	struct pollfd pf = { .fd = s->ctx->async_fd, .events = POLLIN };
	double end = now_s() + WAIT_MS / 1e3;
	while (now_s() < end) {
		if (poll(&pf, 1, 100) == 1 && ibv_get_async_event(s->ctx, ev) == 0)
			return 0;
	}
	return -1;
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia))
		die("ibv_query_qp");
	return a.qp_state;
}

static int count_state(struct side *s, enum ibv_qp_state st)
{
	int n = 0;
	for (int i = 0; i < NQP; i++)
		n += qp_state(s->qp[i]) == st;
	return n;
}

static enum ibv_port_state port_state(struct side *s)
{
	struct ibv_port_attr pa;
	if (ibv_query_port(s->ctx, 1, &pa))
		die("ibv_query_port");
	return pa.state;
}

/* An event of `type` naming `what` (NULL: check nothing) arrives after the trigger, which goes. */
static int expect_event(struct side *s, struct ibv_async_event *ev, enum ibv_event_type type,
			const char *name)
{
	pull_trigger();
	int rc = next_event(s, ev);
	check(rc == 0 && ev->event_type == type && access(trigger, F_OK) != 0, name,
	      "rc %d type %d (want %d), trigger file %s", rc, rc ? -1 : (int)ev->event_type, (int)type,
	      access(trigger, F_OK) ? "removed" : "still there");
	return rc;
}

struct destroyer {
	struct ibv_qp *qp;
	volatile int done;
};

static void *destroy_qp_thread(void *arg)
{
	struct destroyer *d = arg;
	ibv_destroy_qp(d->qp);
	d->done = 1;
	return NULL;
}

struct reader {
	struct ibv_context *ctx;
	volatile int rc, err, done;
};

static void *reader_thread(void *arg)
{
	struct reader *r = arg;
	struct ibv_async_event ev;
	r->rc = ibv_get_async_event(r->ctx, &ev);
	r->err = errno;
	r->done = 1;
	return NULL;
}

static void wait_done(volatile int *done, double seconds)
{
	double end = now_s() + seconds;
	while (!*done && now_s() < end)
		usleep(1000);
}

static void async_case(const char *kinds)
{
	setenv("IBV_DOUBLE_ASYNC_EVENT", kinds, 1);
	setenv("IBV_DOUBLE_ASYNC_TRIGGER", trigger, 1);
	struct side s = { 0 };
	setup(&s);
	s.peer = s.me; /* each QP talks to itself */
	connect_qps(&s);
	int fl = fcntl(s.ctx->async_fd, F_GETFL);
	fcntl(s.ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
	struct ibv_async_event ev;
	int rc = ibv_get_async_event(s.ctx, &ev);
	check(rc == -1 && errno == EAGAIN, "async: no event before the trigger (EAGAIN on a "
	      "non-blocking async_fd)", "rc %d errno %d", rc, errno);
	post_recv(&s, QB, 77, 0, 64); /* outstanding work for the flush */
	struct ibv_wc wc;

	if (!strcmp(kinds, "device_fatal") || !strcmp(kinds, "port_err,port_active")) {
		int device = kinds[0] == 'd';
		if (expect_event(&s, &ev, device ? IBV_EVENT_DEVICE_FATAL : IBV_EVENT_PORT_ERR,
				 device ? "device_fatal: IBV_EVENT_DEVICE_FATAL, trigger file removed"
					: "port_err: IBV_EVENT_PORT_ERR, trigger file removed"))
			return;
		if (!device)
			check(ev.element.port_num == 1, "port_err: element.port_num 1", "port %d",
			      ev.element.port_num);
		check(count_state(&s, IBV_QPS_RTS) == NQP, "async: the effect waits for the ack",
		      "%d QPs in RTS", count_state(&s, IBV_QPS_RTS));
		ibv_ack_async_event(&ev);
		wc = wait_wc(&s);
		check(count_state(&s, IBV_QPS_ERR) == NQP && wc.status == IBV_WC_WR_FLUSH_ERR &&
		      wc.wr_id == 77, "async: after the ack every QP is in ERR, the receive flushed",
		      "%d QPs in ERR, completion status %d wr_id %llu", count_state(&s, IBV_QPS_ERR),
		      wc.status, (unsigned long long)wc.wr_id);
		if (!device) {
			check(port_state(&s) == IBV_PORT_DOWN, "port_err: the port is DOWN", "state %d",
			      port_state(&s));
			if (expect_event(&s, &ev, IBV_EVENT_PORT_ACTIVE,
					 "port_active (trigger again): IBV_EVENT_PORT_ACTIVE"))
				return;
			ibv_ack_async_event(&ev);
			check(port_state(&s) == IBV_PORT_ACTIVE, "port_active: the port is ACTIVE again",
			      "state %d", port_state(&s));
			return;
		}
		/* ibv_close_device wakes a thread blocked in ibv_get_async_event. */
		fcntl(s.ctx->async_fd, F_SETFL, fl);
		struct reader r = { .ctx = s.ctx };
		pthread_t t;
		pthread_create(&t, NULL, reader_thread, &r);
		usleep(100000);
		int early = r.done;
		for (int i = 0; i < NQP; i++)
			ibv_destroy_qp(s.qp[i]);
		ibv_dereg_mr(s.mr);
		ibv_destroy_cq(s.cq);
		ibv_dealloc_pd(s.pd);
		ibv_close_device(s.ctx);
		wait_done(&r.done, 2.0);
		check(!early && r.done && r.rc == -1 && r.err == EBADF,
		      "ibv_close_device wakes a reader blocked in ibv_get_async_event (-1, EBADF)",
		      "blocked first %d, woken %d, rc %d errno %d", !early, r.done, r.rc, r.err);
		if (r.done)
			pthread_join(t, NULL);
		return;
	}
	if (!strcmp(kinds, "qp_fatal,comm_est")) {
		if (expect_event(&s, &ev, IBV_EVENT_QP_FATAL, "qp_fatal: IBV_EVENT_QP_FATAL, trigger "
				 "file removed"))
			return;
		check(ev.element.qp == s.qp[QA], "qp_fatal: names the lowest-numbered QP in RTS",
		      "element qpn 0x%x, QA 0x%x", ev.element.qp->qp_num, s.qp[QA]->qp_num);
		check(qp_state(s.qp[QA]) == IBV_QPS_RTS, "qp_fatal: the QP stays RTS until the ack",
		      "state %d", qp_state(s.qp[QA]));
		ibv_ack_async_event(&ev);
		check(qp_state(s.qp[QA]) == IBV_QPS_ERR && count_state(&s, IBV_QPS_RTS) == NQP - 1,
		      "qp_fatal: after the ack that QP alone is in ERR", "QA state %d, %d in RTS",
		      qp_state(s.qp[QA]), count_state(&s, IBV_QPS_RTS));
		if (expect_event(&s, &ev, IBV_EVENT_COMM_EST, "comm_est (trigger again): "
				 "IBV_EVENT_COMM_EST"))
			return;
		check(ev.element.qp == s.qp[QB], "comm_est: names the lowest-numbered QP in RTS now",
		      "element qpn 0x%x, QB 0x%x", ev.element.qp->qp_num, s.qp[QB]->qp_num);
		struct destroyer d = { .qp = s.qp[QB] };
		pthread_t t;
		pthread_create(&t, NULL, destroy_qp_thread, &d);
		usleep(200000);
		int early = d.done;
		ibv_ack_async_event(&ev);
		wait_done(&d.done, 2.0);
		check(!early && d.done, "ibv_destroy_qp waits for the ack of an event it read",
		      "returned before the ack %d, after %d", early, d.done);
		if (d.done)
			pthread_join(t, NULL);
		return;
	}
	if (!strcmp(kinds, "cq_err")) {
		if (expect_event(&s, &ev, IBV_EVENT_CQ_ERR, "cq_err: IBV_EVENT_CQ_ERR, trigger file "
				 "removed"))
			return;
		check(ev.element.cq == s.cq, "cq_err: names the send CQ of the lowest-numbered QP in RTS",
		      "element %p, CQ %p", (void *)ev.element.cq, (void *)s.cq);
		ibv_ack_async_event(&ev);
		usleep(100000);
		int n = ibv_poll_cq(s.cq, 1, &wc);
		check(count_state(&s, IBV_QPS_ERR) == NQP && n == 0,
		      "cq_err: the QPs on the CQ go to ERR, the CQ takes no completion (flush lost)",
		      "%d QPs in ERR, %d completions", count_state(&s, IBV_QPS_ERR), n);
		return;
	}
	if (!strcmp(kinds, "qp_req_err")) {
		pull_trigger();
		usleep(200000);
		int before = qp_state(s.qp[QA]) == IBV_QPS_RTS;
		usleep(600000);
		check(before && qp_state(s.qp[QA]) == IBV_QPS_ERR,
		      "qp_req_err never read: its effect comes 500 ms after the event anyway",
		      "RTS at 200 ms %d, state at 800 ms %d", before, qp_state(s.qp[QA]));
		return;
	}
	check(0, "async case", "unknown case %s", kinds);
}

static int run_async(void)
{
	static const char *const cases[] = { "device_fatal", "port_err,port_active",
					     "qp_fatal,comm_est", "cq_err", "qp_req_err" };
	int failed = 0;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(trigger, sizeof(trigger), "/tmp/double_test_async.%d.%zu", (int)getpid(), i);
		unlink(trigger);
		fflush(stdout);
		pid_t pid = fork();
		if (pid < 0)
			die("fork");
		if (pid == 0) {
			alarm(20);
			async_case(cases[i]);
			fflush(stdout);
			_exit(failures ? 1 : 0);
		}
		int st;
		waitpid(pid, &st, 0);
		unlink(trigger);
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			printf("FAIL async case %s (exit status 0x%x)\n", cases[i], st);
			failed++;
		}
	}
	return failed;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "basic";
	if (strcmp(mode, "basic") && strcmp(mode, "fail-after") && strcmp(mode, "delay") &&
	    strcmp(mode, "rnr") && strcmp(mode, "reorder") && strcmp(mode, "dmabuf") &&
	    strcmp(mode, "async") && strcmp(mode, "devices")) {
		fprintf(stderr, "usage: %s [basic|fail-after|delay|rnr|reorder|dmabuf|async|devices]\n",
			argv[0]);
		return 2;
	}
	if (!strcmp(mode, "devices")) { /* read at the first listing, by both processes */
		setenv("IBV_DOUBLE_DEVICES", "2", 1);
		setenv("IBV_DOUBLE_PORTS", "2", 1);
	}
	alarm(30); /* a hang fails the test */
	int f = strcmp(mode, "async") ? run(mode) : run_async();
	printf("%s: %s\n", mode, f ? "FAILED" : "ok");
	return f ? 1 : 0;
}
