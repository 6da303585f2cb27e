/*
 * nccl.h for rustccl's libnccl.so.2: the C interface of NCCL 2.32.3, written by the rustccl
 * project from the facts of that ABI (types, values, signatures, struct layouts). Programs
 * built against NVIDIA's nccl.h up to 2.32.3 run on rustccl (structs from older headers are
 * read by their size); programs built against this header run on either library.
 *
 * Version. ncclGetVersion and NCCL_VERSION_CODE say 2.32.3 (23203): every call of 2.32.3's
 * nccl.h, and every host call of the device API (nccl_device.h), works on the hardware rustccl
 * drives (the host backend, and GPUs of one host), or is refused as NCCL refuses it where the
 * hardware it needs is missing, with a message in ncclGetLastError naming that hardware.
 *
 * Refused, because rustccl drives no such hardware:
 *   - multimem (NVLink SHARP multicast, NVLS): ncclDevCommCreate with lsaMultimem or a team
 *     requirement's multimem set returns ncclInvalidArgument (no multicast object is made);
 *     ncclGetLsaMultimemDevicePointer and ncclGetMultimemDevicePointer give NULL, as NCCL's do
 *     without multimem; nvlsHostMode (2.32) is accepted and changes nothing.
 *   - GIN (GPU-initiated networking): ncclDevCommCreate with ginForceEnable, ginSignalCount,
 *     ginCounterCount, ginConnectionType, GIN barriers (railGinBarrierCount,
 *     worldGinBarrierCount, or barrierCount where the LSA team is not every rank) or a resource
 *     requirement with GIN signals or counters, and ncclGinBarrierCreateRequirement, return
 *     ncclInvalidUsage; NCCL_WIN_STRICT_ORDERING and NCCL_WIN_GIN_ONLY are accepted without
 *     effect.
 *   - CFT (Compute Fabric Transport: CUDA logical endpoints, 2.31): ncclGetMultimemDeviceLeInfo,
 *     ncclGetCftDeviceLeInfo and ncclGetPeerDeviceLeInfo return ncclInvalidArgument after their
 *     argument checks, and so does ncclDevCommCreate with cftCaps or cftBarrierCount (of a 2.31+
 *     ncclDevCommRequirements_t); ncclTeamCft and ncclTeamCftMultimem give the one-rank teams
 *     NCCL gives without CFT; hostCftMode and NCCL_WIN_CFT_COUNTED are accepted without effect.
 * ncclCommQueryProperties (2.29) says so beforehand: multimemSupport false, ginType
 * NCCL_GIN_TYPE_NONE, no GIN types in ginSupport (2.31's fields: commHash, ginMinStride,
 * ginConnectionType, ginSupport, devCommRuntimeVersionSize). The device API's LL all-to-all
 * (2.30: ncclLLA2ACalcSlots, ncclLLA2ACreateRequirement, nccl_device.h's ncclLLA2ASession)
 * works over the LSA team, with no multimem bcast; lsaLLA2ABlockCount/SlotCount are ignored,
 * as NCCL ignores them.
 *
 * Not yet everywhere: the one-sided ncclPutSignal/ncclSignal/ncclWaitSignal (2.29) work on the
 * host backend and CUDA between the ranks of one host (sigIdx, ctx and flags 0; inside groups
 * too, run before the group's collectives); HIP, which has no symmetric windows, returns
 * ncclInvalidUsage. ncclCollConfig_t's launchCompletionEvent is refused on the host backend
 * (its operations have completed when their call returns).
 *
 * Everything else works: communicators (init, split, shrink, grow, revoke, suspend/resume,
 * memory statistics), the collectives and their per-call *Config forms (2.31), send/recv,
 * groups, windows (2.27) and the device API's LSA subset (2.28), ncclSetEncryption (2.32),
 * the ncclParam* API (2.30), and ncclConfig_t's fields up to 2.32's (those rustccl does not act
 * on are said once at INFO).
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <stddef.h>
#include <stdint.h>
#include <limits.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 32
#define NCCL_PATCH 3
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE 23203
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

/* The CUDA runtime's stream; rustccl's host backend ignores it (NULL is fine). */
typedef struct CUstream_st* cudaStream_t;

typedef struct ncclComm* ncclComm_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  /* NCCL 2.30's code. rustccl returns it only when an operation timeout is set
   * (NCCL_OP_TIMEOUT_MS, rustccl's own): a stuck operation then ends with it on every rank. */
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
/* 2.29: orders GIN's network writes into the window; accepted without effect (no GIN). */
#define NCCL_WIN_STRICT_ORDERING 0x02
/* 2.32: register the window for GIN only; 2.31: register it for CFT's counted logical
 * endpoints. Accepted without effect (no GIN, no CFT): the window is an ordinary one. */
#define NCCL_WIN_GIN_ONLY 0x04
#define NCCL_WIN_CFT_COUNTED 0x08
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01
#define NCCL_REVOKE_DEFAULT 0x00

/* ncclConfig_t.hostCftMode (2.31): host-side CFT (Compute Fabric Transport) logical endpoints.
 * Accepted; rustccl drives no CFT hardware, so every mode behaves as NCCL's on a GPU without
 * CFT support (the CFT queries below are refused). */
typedef enum {
  ncclHostCftDefault = NCCL_CONFIG_UNDEF_INT,
  ncclHostCftEnable = 1,
  ncclHostCftDisable = 2,
  ncclHostCftFallback = 3
} ncclHostCftMode_t;

/* ncclConfig_t.nvlsHostMode (2.32): which host NVLS (NVLink SHARP) components a communicator
 * may use, a bitmask. Accepted without effect: rustccl has no NVLS. */
typedef enum {
  ncclNvlsHostModeDefault = NCCL_CONFIG_UNDEF_INT,
  ncclNvlsHostModeEnable = 0,
  ncclNvlsHostModeDisableTransport = 1 << 0,
  ncclNvlsHostModeDisableSymmetricMultimem = 1 << 1,
  ncclNvlsHostModeDisable = INT_MAX
} ncclNvlsHostMode_t;

/* NCCL 2.32.3's layout (ncclConfig_v23100). Fields are only ever appended: a caller built
 * against an older header passes a smaller size, and the fields it lacks keep their defaults. */
typedef struct ncclConfig_v23100 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  /* 2.29: 0 no CUDA graphs, 1 one graph, 2 (default) several graphs or graphs and eager calls. */
  int graphUsageMode;
  /* 2.29: contexts for one-sided operations (accepted; rustccl has none yet). */
  int numRmaCtx;
  /* 2.30.3: most peers a rank talks to at once in send/recv-based operations (accepted;
   * rustccl does not cap them). */
  int maxP2pPeers;
  /* 2.30.7: 1 (default) keeps capture-time ordering of communication kernels, 0 leaves it
   * to the caller and needs graphUsageMode 0 or 1. */
  int graphStreamOrdering;
  /* 2.31: 1 lets this communicator's kernels overlap other such communicators' (implicit
   * launch order); 0 or unset keeps the usual ordering. Accepted (rustccl orders its launches
   * per communicator either way); NCCL_LAUNCH_ORDER_IMPLICIT overrides it. */
  int launchOrderImplicit;
  /* 2.31: signal indexes per one-sided context (sigIdx < numRmaSig; default 1). Accepted;
   * rustccl's one-sided calls take sigIdx 0. */
  int numRmaSig;
  /* 2.31: 1 sets up one-sided signals at init instead of at the first window registration.
   * Accepted; NCCL_RMA_EAGER_INIT overrides it. */
  int rmaEagerInit;
  /* 2.31: an ncclHostCftMode_t. */
  int hostCftMode;
  /* 2.32: an ncclNvlsHostMode_t bitmask. */
  int nvlsHostMode;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER {                                           \
  sizeof(ncclConfig_t), /* size */                                          \
  0xcafebeef,           /* magic */                                         \
  NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */           \
  NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,      \
  NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,      \
  NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,      \
  NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,      \
  NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,      \
  NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,      \
  NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,      \
  NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                              \
}

typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER { sizeof(ncclSimInfo_t), 0x74685283u, \
  NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_UNDEF_FLOAT }

/* Per-collective configuration (NCCL 2.31, launchCompletionEvent 2.32): the last argument of
 * the nccl*Config collectives below. Make it with NCCL_COLLCONFIG_INITIALIZER and give every
 * rank the same values; a NULL config is the plain call. rustccl checks it as NCCL does (size
 * at least 64, the magic, forceAlgSelection 0 or 1, CTAPolicy unset or 0..3) before anything
 * is enqueued: a bad one is ncclInvalidArgument, with the reason in ncclGetLastError, and the
 * group it was called in goes on without it. Like ncclConfig_t it only grows at its end. */
#ifndef NCCL_API_MAGIC
#define NCCL_API_MAGIC 0xcafebeef
#endif

/* The CUDA runtime's event; rustccl's host backend has none (see launchCompletionEvent). */
typedef struct CUevent_st* cudaEvent_t;

/* One vendor-specific option, in a NULL-terminated list (NCCL ignores them all, and so does
 * rustccl, saying so once at INFO). */
typedef struct ncclConfigExt {
  struct ncclConfigExt* next;
  struct {
    int vendorId;
    int optionId;
  } key;
  union {
    int i;
    const char* s;
    void* raw;
  } val;
} ncclConfigExt_t;

typedef struct ncclCollConfig_v23200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  ncclConfigExt_t* ext;
  /* The fewest and the most channels the call uses, within the communicator's limits
   * (rustccl's planner honours both). */
  int minCTAs;
  int maxCTAs;
  /* NVLink SHARP channels and thread-block clusters: accepted, not honoured by rustccl. */
  int nvlsCTAs;
  int cgaClusterSize;
  /* Which algorithms the call may use: NCCL's names (RING_LL, RING_LL128, RING_SIMPLE,
   * TREE_..., NVLS_..., PAT_..., SYMK_...), each a case-insensitive prefix ("RING"), joined by
   * ',' (either), '+' (both) and '^' (not). rustccl plans RING for every collective and TREE
   * for AllReduce; a selection of only other names, or none this collective has, is
   * ncclInvalidArgument while forceAlgSelection is 1 (the default), automatic when it is 0.
   * NULL or "" is automatic. */
  const char* algSelection;
  int forceAlgSelection;
  /* A combination of NCCL_CTA_POLICY_*; accepted, not honoured by rustccl. */
  int CTAPolicy;
  /* The caller's tag for the call's profiler events (0: none; values with the top bit set are
   * NCCL's): a profiler plugin of NCCL's v7 gets it as userTag on the call's CollApi and Coll
   * events (rustccl's own profiler ABI v3 as user_tag). */
  uint64_t userProfilerTag;
  /* 2.32: an event to record on the stream once the collective is launched (at the outermost
   * ncclGroupEnd inside a group); under stream capture each replay of the graph records it.
   * On the host backend it must be NULL (an operation has completed when its call or group
   * returns); on a non-blocking communicator too. */
  cudaEvent_t launchCompletionEvent;
} ncclCollConfig_t;

#define NCCL_COLLCONFIG_INITIALIZER {                                       \
  sizeof(ncclCollConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE,               \
  NCCL_CONFIG_UNDEF_PTR,    /* ext */                                        \
  NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, /* minCTAs, maxCTAs */       \
  NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, /* nvlsCTAs, cgaClusterSize */ \
  NCCL_CONFIG_UNDEF_PTR,    /* algSelection */                               \
  1,                        /* forceAlgSelection */                          \
  NCCL_CONFIG_UNDEF_INT,    /* CTAPolicy */                                  \
  0,                        /* userProfilerTag */                            \
  NCCL_CONFIG_UNDEF_PTR     /* launchCompletionEvent */                      \
}

/* Sizes ncclRedOp_t as NCCL's header does (ncclMaxRedOp is the largest value of an enum of
 * this size: 0x7fffffff where enums are 4 bytes). */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum {
  ncclScalarDevice = 0,
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* ncclCommSuspend flags. NCCL_SUSPEND_MEM frees the memory the communicator allocated (its
 * FIFOs and scratch); ncclCommResume makes it again. Both are collective: every rank calls
 * them. While suspended, operations on the communicator return ncclInvalidUsage. */
#define NCCL_SUSPEND_MEM 0x01

/* ncclCommMemStats selectors. rustccl counts the memory the communicator allocated on this
 * rank and holds now (device memory, and the host memory its FIFOs use on the host backend). */
typedef enum {
  ncclStatGpuMemSuspend = 0,   /* bytes a suspend frees (0 while suspended) */
  ncclStatGpuMemSuspended = 1, /* 1 while suspended, else 0 */
  ncclStatGpuMemPersist = 2,   /* bytes a suspend keeps */
  ncclStatGpuMemTotal = 3      /* every byte held */
} ncclCommMemStat_t;

/* A parameter bound by ncclParamBind: owned by the library, valid for the process's life. */
typedef struct ncclParamHandle* ncclParamHandle_t;

/* ncclWaitSignal's descriptor: wait for opCnt signals from peer on (sigIdx, ctx). */
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;

/* The device API's host-side types. nccl_device.h (rustccl's, for kernels and host C++)
 * defines the structs: device communicators (the LSA subset) work where windows do. */
typedef struct ncclTeam { int nRanks; int rank; int stride; } ncclTeam_t;
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;
typedef struct ncclDevComm ncclDevComm_t;
typedef struct ncclLsaBarrierHandle ncclLsaBarrierHandle_t;
typedef struct ncclGinBarrierHandle ncclGinBarrierHandle_t;
typedef struct ncclLLA2AHandle ncclLLA2AHandle_t;
typedef struct ncclDevResourceRequirements ncclDevResourceRequirements_t;

/* CFT (Compute Fabric Transport, 2.31/2.32): CUDA logical endpoints (CUDA 13.3 and GPUs with
 * logical-endpoint support), which rustccl does not drive. The calls below answer as NCCL's do
 * on a GPU without CFT support: one-rank CFT teams, and the logical-endpoint queries refused
 * with ncclInvalidArgument (the message in ncclGetLastError says why). */
typedef uint32_t ncclCftLeId;
typedef enum {
  NCCL_CFT_TEAM_FLAT = 0,
  NCCL_CFT_TEAM_HIER_MULTIMEM = 1,
  NCCL_CFT_TEAM_HIER_LSA = 2
} ncclCftTeamMode_t;
typedef struct ncclCftBarrierHandle { uint32_t bufHandle; int nBarriers; } ncclCftBarrierHandle_t;

/* NCCL 2.32: encryption of the library's TCP traffic (bootstrap, socket transport) with a
 * pre-shared key of at least 32 bytes; process-global, set before ncclGetUniqueId. Every rank
 * must use the same key; a rank with another key, or none, is refused at init. The environment
 * can give the key instead: NCCL_ENCRYPTION_PSK (the key) or NCCL_ENCRYPTION_PSK_FILE (a file
 * holding it). As NCCL: a NULL config means mode NONE (no key), a magic other than
 * NCCL_API_MAGIC is ncclInvalidArgument, and min(size, sizeof) bytes are read (the
 * initializer's values past them). */
typedef enum { NCCL_ENCRYPTION_MODE_NONE = 0, NCCL_ENCRYPTION_MODE_PSK = 1 } ncclEncryptionMode_t;
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int mode;
  const char* psk;
} ncclEncryptionConfig_t;
#define NCCL_ENCRYPTION_CONFIG_INITIALIZER { sizeof(ncclEncryptionConfig_t), 0xcafebeef, \
  NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_ENCRYPTION_MODE_NONE, NULL }

#define NCCL_DECLARE(ret, name, ...) ret name(__VA_ARGS__); ret p##name(__VA_ARGS__)

NCCL_DECLARE(ncclResult_t, ncclGetVersion, int* version);
NCCL_DECLARE(ncclResult_t, ncclGetUniqueId, ncclUniqueId* uniqueId);
NCCL_DECLARE(ncclResult_t, ncclSetEncryption, const ncclEncryptionConfig_t* config);
NCCL_DECLARE(ncclResult_t, ncclCommInitRank, ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
NCCL_DECLARE(ncclResult_t, ncclCommInitRankConfig, ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config);
NCCL_DECLARE(ncclResult_t, ncclCommInitAll, ncclComm_t* comm, int ndev, const int* devlist);
NCCL_DECLARE(ncclResult_t, ncclCommInitRankScalable, ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds, ncclConfig_t* config);
NCCL_DECLARE(ncclResult_t, ncclCommFinalize, ncclComm_t comm);
NCCL_DECLARE(ncclResult_t, ncclCommDestroy, ncclComm_t comm);
NCCL_DECLARE(ncclResult_t, ncclCommAbort, ncclComm_t comm);
NCCL_DECLARE(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags);
NCCL_DECLARE(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
NCCL_DECLARE(ncclResult_t, ncclCommShrink, ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
/* Grow (2.29): the coordinator (one existing rank) gets an id from ncclCommGetUniqueId and
 * hands it to the new ranks out of band; each id serves one grow. Then existing ranks call
 * ncclCommGrow(comm, nRanks, id or NULL, -1, ...) (the coordinator passes the id, the others
 * NULL) and keep their ranks, and new ranks call ncclCommGrow(NULL, nRanks, &id, rank, ...)
 * with a rank from the old size to nRanks-1. The old communicator stays usable until
 * destroyed. Without a config, existing ranks inherit the old communicator's. */
NCCL_DECLARE(ncclResult_t, ncclCommGetUniqueId, ncclComm_t comm, ncclUniqueId* uniqueId);
NCCL_DECLARE(ncclResult_t, ncclCommGrow, ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank, ncclComm_t* newcomm, ncclConfig_t* config);
NCCL_DECLARE(ncclResult_t, ncclCommSuspend, ncclComm_t comm, int flags);
NCCL_DECLARE(ncclResult_t, ncclCommResume, ncclComm_t comm);
NCCL_DECLARE(ncclResult_t, ncclCommMemStats, ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);
NCCL_DECLARE(const char*, ncclGetErrorString, ncclResult_t result);
NCCL_DECLARE(const char*, ncclGetLastError, ncclComm_t comm);
NCCL_DECLARE(void, ncclResetDebugInit, void);
NCCL_DECLARE(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t* asyncError);
NCCL_DECLARE(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count);
NCCL_DECLARE(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int* device);
NCCL_DECLARE(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int* rank);
NCCL_DECLARE(ncclResult_t, ncclMemAlloc, void** ptr, size_t size);
NCCL_DECLARE(ncclResult_t, ncclMemFree, void* ptr);
NCCL_DECLARE(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void* buff, size_t size, void** handle);
NCCL_DECLARE(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void* handle);
NCCL_DECLARE(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags);
NCCL_DECLARE(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win);
NCCL_DECLARE(ncclResult_t, ncclWinGetUserPtr, ncclComm_t comm, ncclWindow_t win, void** outUserPtr);
/* Where rank `lsaRank` of the window's LSA team (or world rank `peer`) holds `offset` bytes
 * into its window, in this process (2.29); a peer outside the LSA team gives NULL. */
NCCL_DECLARE(ncclResult_t, ncclGetLsaDevicePointer, ncclWindow_t window, size_t offset, int lsaRank, void** outPtr);
NCCL_DECLARE(ncclResult_t, ncclGetPeerDevicePointer, ncclWindow_t window, size_t offset, int peer, void** outPtr);
NCCL_DECLARE(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t* op, void* scalar, ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm);
NCCL_DECLARE(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm);
NCCL_DECLARE(ncclResult_t, ncclReduce, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
NCCL_DECLARE(ncclResult_t, ncclBcast, void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
NCCL_DECLARE(ncclResult_t, ncclBroadcast, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
NCCL_DECLARE(ncclResult_t, ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
NCCL_DECLARE(ncclResult_t, ncclReduceScatter, const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
NCCL_DECLARE(ncclResult_t, ncclAllGather, const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
NCCL_DECLARE(ncclResult_t, ncclAlltoAll, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
NCCL_DECLARE(ncclResult_t, ncclGather, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
NCCL_DECLARE(ncclResult_t, ncclScatter, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
NCCL_DECLARE(ncclResult_t, ncclSend, const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream);
NCCL_DECLARE(ncclResult_t, ncclRecv, void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream);
/* The collectives with a per-call configuration (2.31): as the plain ones, with config last. */
NCCL_DECLARE(ncclResult_t, ncclAllReduceConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
NCCL_DECLARE(ncclResult_t, ncclBroadcastConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
NCCL_DECLARE(ncclResult_t, ncclReduceConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
NCCL_DECLARE(ncclResult_t, ncclAllGatherConfig, const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
NCCL_DECLARE(ncclResult_t, ncclReduceScatterConfig, const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
NCCL_DECLARE(ncclResult_t, ncclAlltoAllConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
NCCL_DECLARE(ncclResult_t, ncclGatherConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
NCCL_DECLARE(ncclResult_t, ncclScatterConfig, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
/* One-sided operations (2.29) on symmetric windows, stream-ordered: a put writes count
 * elements from localbuff (in an NCCL_WIN_COLL_SYMMETRIC window) at peerWinOffset of peer's
 * part of peerWin, then adds one signal from this rank at peer; ncclSignal adds the signal
 * alone; ncclWaitSignal waits for opCnt more signals (since this rank's last wait) from each
 * descriptor's peer. sigIdx, ctx and flags must be 0. Host backend and CUDA (a copy-engine
 * copy, then a kernel's release add; the wait a kernel that an abort or a dead peer ends);
 * capturable in CUDA graphs. Inside a group they run at ncclGroupEnd in call order, before the
 * group's collectives, as NCCL schedules them. */
NCCL_DECLARE(ncclResult_t, ncclPutSignal, const void* localbuff, size_t count, ncclDataType_t datatype, int peer, ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream);
NCCL_DECLARE(ncclResult_t, ncclSignal, int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream);
NCCL_DECLARE(ncclResult_t, ncclWaitSignal, int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm, cudaStream_t stream);
NCCL_DECLARE(ncclResult_t, ncclGroupStart, void);
NCCL_DECLARE(ncclResult_t, ncclGroupEnd, void);
NCCL_DECLARE(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t* simInfo);

/* Parameters (2.30): every parameter rustccl reads (NCCL_* names with NCCL's meaning, and
 * rustccl's own RUSTCCL_* ones), by name. A value is the environment variable's when set,
 * else the default. Integer and flag parameters read through any integer getter whose type
 * holds the value; string parameters through ncclParamGetStr only. ncclParamGet copies the
 * native value: int64_t for integers, one byte for flags, the NUL-terminated text for strings
 * (too small a maxLen: ncclInvalidArgument, *len the size needed). Unknown keys, type
 * mismatches and NULL pointers are ncclInvalidArgument, with the reason in ncclGetLastError.
 * Strings and tables returned stay valid until the same function is called again on the same
 * thread. Key lists and dumps cover NCCL's documented parameters, and rustccl's own too with
 * NCCL_PARAM_DUMP_ALL=true; ncclParamDumpAll logs at INFO (NCCL_DEBUG=INFO). */
NCCL_DECLARE(ncclResult_t, ncclParamBind, ncclParamHandle_t* out, const char* key);
NCCL_DECLARE(ncclResult_t, ncclParamGetI8, ncclParamHandle_t h, int8_t* out);
NCCL_DECLARE(ncclResult_t, ncclParamGetI16, ncclParamHandle_t h, int16_t* out);
NCCL_DECLARE(ncclResult_t, ncclParamGetI32, ncclParamHandle_t h, int32_t* out);
NCCL_DECLARE(ncclResult_t, ncclParamGetI64, ncclParamHandle_t h, int64_t* out);
NCCL_DECLARE(ncclResult_t, ncclParamGetU8, ncclParamHandle_t h, uint8_t* out);
NCCL_DECLARE(ncclResult_t, ncclParamGetU16, ncclParamHandle_t h, uint16_t* out);
NCCL_DECLARE(ncclResult_t, ncclParamGetU32, ncclParamHandle_t h, uint32_t* out);
NCCL_DECLARE(ncclResult_t, ncclParamGetU64, ncclParamHandle_t h, uint64_t* out);
NCCL_DECLARE(ncclResult_t, ncclParamGetStr, ncclParamHandle_t h, const char** out);
NCCL_DECLARE(ncclResult_t, ncclParamGet, ncclParamHandle_t h, void* out, int maxLen, int* len);
NCCL_DECLARE(ncclResult_t, ncclParamGetParameter, const char* key, const char** value, int* valueLen);
NCCL_DECLARE(ncclResult_t, ncclParamGetAllParameterKeys, const char*** table, int* tableLen);
NCCL_DECLARE(void, ncclParamDumpAll, void);
NCCL_DECLARE(ncclResult_t, ncclDevCommCreate, ncclComm_t comm, const ncclDevCommRequirements_t* reqs, ncclDevComm_t* outDevComm);
NCCL_DECLARE(ncclResult_t, ncclDevCommDestroy, ncclComm_t comm, const ncclDevComm_t* devComm);
NCCL_DECLARE(ncclTeam_t, ncclTeamWorld, ncclComm_t comm);
NCCL_DECLARE(ncclTeam_t, ncclTeamLsa, ncclComm_t comm);
NCCL_DECLARE(ncclTeam_t, ncclTeamRail, ncclComm_t comm);
NCCL_DECLARE(int, ncclTeamRankToWorld, ncclComm_t comm, ncclTeam_t team, int rank);
NCCL_DECLARE(int, ncclTeamRankToLsa, ncclComm_t comm, ncclTeam_t team, int rank);
NCCL_DECLARE(ncclResult_t, ncclLsaBarrierCreateRequirement, ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
NCCL_DECLARE(ncclResult_t, ncclGinBarrierCreateRequirement, ncclComm_t comm, ncclTeam_t team, int nBarriers, ncclGinBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
NCCL_DECLARE(ncclResult_t, ncclLLA2ACreateRequirement, int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
NCCL_DECLARE(int, ncclLLA2ACalcSlots, int maxElts, int maxEltSize);
/* CFT (see ncclCftLeId above). Teams: {1 rank, rank 0, stride 1} (NCCL_CFT_TEAM_HIER_LSA: that
 * team's outer factor by the LSA team, as NCCL computes it); {0, 0, 0} for a bad communicator
 * or mode. The logical-endpoint queries check their pointers and the window, then return
 * ncclInvalidArgument (no CFT). The barrier requirement is computed as NCCL's (memory only);
 * a CFT barrier itself needs a CFT device communicator. */
#ifdef __cplusplus
/* C++: the flat team by default, as NCCL's declaration. */
ncclTeam_t ncclTeamCft(ncclComm_t comm, ncclCftTeamMode_t mode = NCCL_CFT_TEAM_FLAT);
ncclTeam_t pncclTeamCft(ncclComm_t comm, ncclCftTeamMode_t mode = NCCL_CFT_TEAM_FLAT);
#else
NCCL_DECLARE(ncclTeam_t, ncclTeamCft, ncclComm_t comm, ncclCftTeamMode_t mode);
#endif
NCCL_DECLARE(ncclTeam_t, ncclTeamCftMultimem, ncclComm_t comm);
NCCL_DECLARE(ncclResult_t, ncclGetMultimemDeviceLeInfo, ncclWindow_t window, size_t offset, ncclCftLeId* leId, size_t* leOffset);
NCCL_DECLARE(ncclResult_t, ncclGetCftDeviceLeInfo, ncclWindow_t window, size_t offset, int peerCft, ncclTeam_t cftTeam, ncclCftLeId* leId, size_t* leOffset);
NCCL_DECLARE(ncclResult_t, ncclGetPeerDeviceLeInfo, ncclWindow_t window, size_t offset, int peerWorld, ncclCftLeId* leId, size_t* leOffset);
NCCL_DECLARE(ncclResult_t, ncclCftBarrierCreateRequirement, ncclTeam_t team, int nBarriers, ncclCftBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);

#undef NCCL_DECLARE

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
