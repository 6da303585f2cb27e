/*
 * stubs.c - the parts of libibverbs' ABI the double does not model.
 *
 * Public calls that tools may reach (SRQ, AH, multicast, ECE, rereg, ...) fail the way
 * the verbs man pages say an unsupported call fails (NULL with errno, or an errno value).
 *
 * The IBVERBS_PRIVATE_34 symbols exist only so that provider libraries linked into some tools
 * (perftest links libmlx5 and libefa, whose constructors register a driver) load against the
 * double: they are bound at load time (BIND_NOW), so each must resolve. The double never calls
 * a provider, so reaching one of them is a bug: it says so and aborts.
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void not_modelled(const char *what)
{
	fprintf(stderr, "ibverbs-double[%d]: %s is not modelled by the verbs double\n", (int)getpid(),
		what);
}

/* ---- public calls: a clean failure ---- */

struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	(void)pd; (void)attr;
	not_modelled("ibv_create_srq (shared receive queues)");
	errno = EOPNOTSUPP;
	return NULL;
}

int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
	(void)srq; (void)attr; (void)mask;
	return EOPNOTSUPP;
}

int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	(void)srq; (void)attr;
	return EOPNOTSUPP;
}

int ibv_destroy_srq(struct ibv_srq *srq)
{
	(void)srq;
	return EOPNOTSUPP;
}

struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	(void)pd; (void)attr;
	not_modelled("ibv_create_ah (UD address handles)");
	errno = EOPNOTSUPP;
	return NULL;
}

struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh,
				     uint8_t port_num)
{
	(void)pd; (void)wc; (void)grh; (void)port_num;
	errno = EOPNOTSUPP;
	return NULL;
}

int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc,
			struct ibv_grh *grh, struct ibv_ah_attr *ah_attr)
{
	(void)context; (void)port_num; (void)wc; (void)grh; (void)ah_attr;
	return EOPNOTSUPP;
}

int ibv_destroy_ah(struct ibv_ah *ah)
{
	(void)ah;
	return EOPNOTSUPP;
}

int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp; (void)gid; (void)lid;
	return EOPNOTSUPP;
}

int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp; (void)gid; (void)lid;
	return EOPNOTSUPP;
}

int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length,
		 int access)
{
	(void)mr; (void)flags; (void)pd; (void)addr; (void)length; (void)access;
	return IBV_REREG_MR_ERR_INPUT;
}

int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp; (void)ece;
	return EOPNOTSUPP;
}

int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp; (void)ece;
	return EOPNOTSUPP;
}

int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	(void)qp; (void)op; (void)flags;
	return 0; /* "not guaranteed in order": what a caller must assume anyway */
}

int ibv_resolve_eth_l2_from_gid(struct ibv_context *context, struct ibv_ah_attr *attr,
				uint8_t eth_mac[6], uint16_t *vid)
{
	(void)context; (void)attr; (void)eth_mac; (void)vid;
	return EOPNOTSUPP;
}

/* fork(): the double pins nothing, so there is nothing to protect. */
int ibv_fork_init(void) { return 0; }
enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }
int ibv_dontfork_range(void *base, size_t size) { (void)base; (void)size; return 0; }
int ibv_dofork_range(void *base, size_t size) { (void)base; (void)size; return 0; }

/* ---- enum names (the strings are the double's own) ---- */

const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const names[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "work request flushed error",
		[IBV_WC_MW_BIND_ERR] = "memory window bind error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
		[IBV_WC_TM_ERR] = "TM error",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
	};
	if ((unsigned)status < sizeof(names) / sizeof(names[0]) && names[status])
		return names[status];
	return "unknown";
}

const char *ibv_node_type_str(enum ibv_node_type t)
{
	switch (t) {
	case IBV_NODE_CA: return "InfiniBand channel adapter";
	case IBV_NODE_SWITCH: return "InfiniBand switch";
	case IBV_NODE_ROUTER: return "InfiniBand router";
	case IBV_NODE_RNIC: return "iWARP NIC";
	case IBV_NODE_USNIC: return "usNIC";
	case IBV_NODE_USNIC_UDP: return "usNIC UDP";
	case IBV_NODE_UNSPECIFIED: return "unspecified";
	default: return "unknown";
	}
}

const char *ibv_port_state_str(enum ibv_port_state s)
{
	switch (s) {
	case IBV_PORT_NOP: return "PORT_NOP";
	case IBV_PORT_DOWN: return "PORT_DOWN";
	case IBV_PORT_INIT: return "PORT_INIT";
	case IBV_PORT_ARMED: return "PORT_ARMED";
	case IBV_PORT_ACTIVE: return "PORT_ACTIVE";
	case IBV_PORT_ACTIVE_DEFER: return "PORT_ACTIVE_DEFER";
	default: return "invalid state";
	}
}

const char *ibv_event_type_str(enum ibv_event_type e)
{
	return e == IBV_EVENT_PORT_ACTIVE ? "port active" : e == IBV_EVENT_PORT_ERR ? "port error"
	       : e == IBV_EVENT_QP_FATAL ? "QP fatal" : e == IBV_EVENT_DEVICE_FATAL ? "device fatal"
	       : "async event";
}

/* ---- IBVERBS_PRIVATE_34 (providers) and sysfs/kernel-ABI helpers: load-time only ---- */

/* A flag providers read; a data symbol, so it must exist. */
bool verbs_allow_disassociate_destroy;

/* Provider constructors call these two at load time: accept and ignore. */
void verbs_register_driver_34(const void *ops) { (void)ops; }
void __verbs_log(void *ctx, unsigned int level, const char *fmt, ...)
{
	(void)ctx; (void)level; (void)fmt;
}

#define PROVIDER_ONLY(name)                                                                        \
	void name(void);                                                                           \
	void name(void)                                                                            \
	{                                                                                          \
		not_modelled(#name " (a provider-internal call)");                                 \
		abort();                                                                           \
	}

PROVIDER_ONLY(_verbs_init_and_alloc_context)
PROVIDER_ONLY(execute_ioctl)
PROVIDER_ONLY(__ioctl_final_num_attrs)
PROVIDER_ONLY(ibv_cmd_advise_mr)
PROVIDER_ONLY(ibv_cmd_alloc_dm)
PROVIDER_ONLY(ibv_cmd_alloc_mw)
PROVIDER_ONLY(ibv_cmd_alloc_pd)
PROVIDER_ONLY(ibv_cmd_attach_mcast)
PROVIDER_ONLY(ibv_cmd_close_xrcd)
PROVIDER_ONLY(ibv_cmd_create_ah)
PROVIDER_ONLY(ibv_cmd_create_counters)
PROVIDER_ONLY(ibv_cmd_create_cq)
PROVIDER_ONLY(ibv_cmd_create_cq_ex)
PROVIDER_ONLY(ibv_cmd_create_flow)
PROVIDER_ONLY(ibv_cmd_create_flow_action_esp)
PROVIDER_ONLY(ibv_cmd_create_qp)
PROVIDER_ONLY(ibv_cmd_create_qp_ex)
PROVIDER_ONLY(ibv_cmd_create_qp_ex2)
PROVIDER_ONLY(ibv_cmd_create_rwq_ind_table)
PROVIDER_ONLY(ibv_cmd_create_srq)
PROVIDER_ONLY(ibv_cmd_create_srq_ex)
PROVIDER_ONLY(ibv_cmd_create_wq)
PROVIDER_ONLY(ibv_cmd_dealloc_mw)
PROVIDER_ONLY(ibv_cmd_dealloc_pd)
PROVIDER_ONLY(ibv_cmd_dereg_mr)
PROVIDER_ONLY(ibv_cmd_destroy_ah)
PROVIDER_ONLY(ibv_cmd_destroy_counters)
PROVIDER_ONLY(ibv_cmd_destroy_cq)
PROVIDER_ONLY(ibv_cmd_destroy_flow)
PROVIDER_ONLY(ibv_cmd_destroy_flow_action)
PROVIDER_ONLY(ibv_cmd_destroy_qp)
PROVIDER_ONLY(ibv_cmd_destroy_rwq_ind_table)
PROVIDER_ONLY(ibv_cmd_destroy_srq)
PROVIDER_ONLY(ibv_cmd_destroy_wq)
PROVIDER_ONLY(ibv_cmd_detach_mcast)
PROVIDER_ONLY(ibv_cmd_free_dm)
PROVIDER_ONLY(ibv_cmd_get_context)
PROVIDER_ONLY(ibv_cmd_modify_cq)
PROVIDER_ONLY(ibv_cmd_modify_flow_action_esp)
PROVIDER_ONLY(ibv_cmd_modify_qp)
PROVIDER_ONLY(ibv_cmd_modify_qp_ex)
PROVIDER_ONLY(ibv_cmd_modify_srq)
PROVIDER_ONLY(ibv_cmd_modify_wq)
PROVIDER_ONLY(ibv_cmd_open_qp)
PROVIDER_ONLY(ibv_cmd_open_xrcd)
PROVIDER_ONLY(ibv_cmd_poll_cq)
PROVIDER_ONLY(ibv_cmd_post_recv)
PROVIDER_ONLY(ibv_cmd_post_send)
PROVIDER_ONLY(ibv_cmd_post_srq_recv)
PROVIDER_ONLY(ibv_cmd_query_context)
PROVIDER_ONLY(ibv_cmd_query_device_any)
PROVIDER_ONLY(ibv_cmd_query_mr)
PROVIDER_ONLY(ibv_cmd_query_port)
PROVIDER_ONLY(ibv_cmd_query_qp)
PROVIDER_ONLY(ibv_cmd_query_srq)
PROVIDER_ONLY(ibv_cmd_read_counters)
PROVIDER_ONLY(ibv_cmd_reg_dm_mr)
PROVIDER_ONLY(ibv_cmd_reg_dmabuf_mr)
PROVIDER_ONLY(ibv_cmd_reg_mr)
PROVIDER_ONLY(ibv_cmd_req_notify_cq)
PROVIDER_ONLY(ibv_cmd_rereg_mr)
PROVIDER_ONLY(ibv_cmd_resize_cq)
PROVIDER_ONLY(ibv_read_ibdev_sysfs_file)
PROVIDER_ONLY(verbs_init_cq)
PROVIDER_ONLY(verbs_open_device)
PROVIDER_ONLY(verbs_set_ops)
PROVIDER_ONLY(verbs_uninit_context)
/* librdmacm's kernel-ABI and sysfs helpers (IBVERBS_1.0): rdma_cm needs a kernel device anyway. */
PROVIDER_ONLY(ibv_copy_path_rec_from_kern)
PROVIDER_ONLY(ibv_copy_path_rec_to_kern)
PROVIDER_ONLY(ibv_copy_qp_attr_from_kern)
PROVIDER_ONLY(ibv_copy_ah_attr_from_kern)

/* Tools (ibv_devinfo) read optional sysfs attributes through these: the double has no sysfs. */
const char *ibv_get_sysfs_path(void);
const char *ibv_get_sysfs_path(void) { return "/nonexistent/ibverbs-double/sys"; }
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	(void)dir; (void)file; (void)buf; (void)size;
	errno = ENOENT;
	return -1;
}
