/*
 * CTcp's core, shared by ctcp.c (devices, sockets, progress, requests: the same for every ABI
 * version) and ctcp_tables.c (the exported `ncclNetPlugin_vN` tables, one thin wrapper per
 * version around the core).
 */
#ifndef CTCP_H
#define CTCP_H

#include <stddef.h>
#include <stdint.h>

/* ---- The parts of NCCL's ABI the core uses (values as NCCL defines them) ---- */

typedef int result_t;
enum { RC_OK = 0, RC_SYSTEM = 2, RC_INTERNAL = 3, RC_INVALID_ARG = 4, RC_INVALID_USAGE = 5, RC_REMOTE = 6 };
enum { LOG_WARN = 2, LOG_INFO = 3 };
#define SUBSYS_NET 0x10UL
#define PTR_HOST 1
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
typedef result_t (*profiler_cb_t)(void** event, int type, void* parent, int64_t plugin_id, void* ext);

extern logger_t ctcp_logger;

#define LOG(level, ...)                                                              \
  do {                                                                               \
    if (ctcp_logger) ctcp_logger(level, SUBSYS_NET, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

#define MAX_RECVS 8
/* Physical devices: 0 is the interface NCCL_SOCKET_IFNAME names (else the first non-loopback
 * one, else loopback), 1 is always loopback ("ctcp-lo"). Virtual devices follow them. */
#define NPHYS 2
#define MAX_MEMBERS 8

/* What every version's getProperties reports of a device. */
struct ctcp_dev {
  char* name;
  uint64_t guid;
  int ptr_support, speed, max_comms, max_recvs;
  /* the physical devices it is made of (itself, for a physical device) */
  int ndevs;
  int devs[MAX_MEMBERS];
};

result_t ctcp_init(int version);
int ctcp_ndevs(void);
result_t ctcp_dev(int dev, struct ctcp_dev* out);
/* makeVDevice: fuses `ndevs` distinct physical devices (at most `max`) into a new device. */
result_t ctcp_make_vdevice(int* d, int ndevs, const int* devs, int max);

result_t ctcp_listen(int dev, void* handle, void** listen_comm);
result_t ctcp_connect(int dev, void* handle, void** send_comm);
result_t ctcp_accept(void* listen_comm, void** recv_comm);
result_t ctcp_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle);
result_t ctcp_dereg_mr(void* comm, void* mhandle);
result_t ctcp_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void** request);
result_t ctcp_irecv(void* recv_comm, int n, void** data, const size_t* sizes, int* tags, void** mhandles,
                    void** request);
result_t ctcp_test(void* request, int* done, int* sizes);
result_t ctcp_close_comm(void* comm);
result_t ctcp_close_listen(void* listen_comm);

#endif
