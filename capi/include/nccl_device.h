/*
 * nccl_device.h for rustccl's libnccl.so.2: the LSA subset of NCCL's device API (2.28, with
 * 2.32.3's requirements and properties layouts and 2.30's LL all-to-all), written by the
 * rustccl project. It is what a program compiles its own kernels with: device communicators
 * (ncclDevCommCreate), teams, pointers into peers' symmetric windows, cooperative groups, the
 * LSA barrier and LL all-to-all sessions (ncclLLA2ASession: messages between LSA ranks with no
 * barrier).
 *
 * Compilers. The structs and host declarations are C and C++. Everything inline needs C++11:
 * with a CUDA compiler (nvcc, clang, NVRTC) every function is __host__ __device__, and device
 * code orders memory with inline PTX (sm_70 or newer for release/acquire; older chips fall
 * back to volatile accesses and system fences); with a host compiler (g++, clang++) the same
 * functions run on the CPU with GCC's __atomic builtins: a cooperative group is then one
 * thread, and an LL line's two 8-byte halves are two 64-bit atomics (see storeLine). No
 * CCCL header is needed; when <cuda/atomic> is found (and the language is C++17), the barrier
 * also takes the cuda::memory_order argument NCCL's takes (acquire/release is always used). Under NVRTC, which has no C library headers, nccl.h is not included: this
 * header declares the few of its types kernels use (pass -I with this directory only).
 *
 * Where rustccl differs from NCCL:
 *   - ncclDevComm has rustccl's own layout (NCCL promises no ABI for it either); the fields
 *     programs read (rank, nRanks, lsaRank, lsaSize, lsaBarrier) have NCCL's names.
 *   - A resource handle is a byte offset into the device communicator's resource memory
 *     (NCCL's counts 128-byte units); ncclGetResourceBufferOffset converts as NCCL's does.
 *   - Not supported, because rustccl drives no such hardware: multimem (NVLink SHARP
 *     multicast, NVLS) and GIN (GPU-initiated networking: GIN barriers, signals, counters, the
 *     hybrid ncclBarrierSession). ncclDevCommCreate refuses requirements for them with the
 *     code NCCL returns where that hardware is missing, and a message in ncclGetLastError
 *     naming it: multimem ncclInvalidArgument, GIN ncclInvalidUsage (see nccl.h's header).
 *     ncclCommQueryProperties reports multimemSupport false and ginType NCCL_GIN_TYPE_NONE.
 *     CFT (2.31: cftCaps, cftBarrierCount) is refused too, with ncclInvalidArgument.
 *   - LL all-to-all: no multimem bcast (the session's multimem arguments are ignored: bcast
 *     stores to each rank); the session keeps its own fields (NCCL's has a base struct).
 *   - The LSA team is every rank when the ranks share a host and the backend has symmetric
 *     memory (the host backend, CUDA); else each rank alone.
 */
#ifndef NCCL_DEVICE_H_
#define NCCL_DEVICE_H_

#if !defined(__CUDACC_RTC__) || defined(NCCL_H_)
#include "nccl.h"
#else
/* NVRTC has no C library headers, which nccl.h includes: the types of nccl.h that kernels
 * need, declared here instead (the host functions are not declared under NVRTC). */
typedef unsigned int uint32_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;
typedef struct ncclTeam { int nRanks; int rank; int stride; } ncclTeam_t;
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;
typedef struct ncclDevComm ncclDevComm_t;
typedef struct ncclLsaBarrierHandle ncclLsaBarrierHandle_t;
typedef struct ncclLLA2AHandle ncclLLA2AHandle_t;
typedef struct ncclDevResourceRequirements ncclDevResourceRequirements_t;
#endif

#if !defined(__cplusplus)
#include <stdbool.h>
#endif
#if defined(__cplusplus) && !defined(__CUDACC_RTC__) && !defined(_WIN32)
#include <sched.h>
#endif

/* Qualifiers: __host__ __device__ under a CUDA compiler, nothing under a host compiler. */
#if defined(__CUDACC__)
#define NCCL_HOST_DEVICE __host__ __device__
#else
#define NCCL_HOST_DEVICE
#endif
#define NCCL_HOST_DEVICE_INLINE NCCL_HOST_DEVICE inline

/* The magic of NCCL's versioned structs (ncclConfig_t's too). */
#ifndef NCCL_API_MAGIC
#define NCCL_API_MAGIC 0xcafebeef
#endif

/* ---- types ---- */

typedef struct ncclWindow_vidmem ncclWindow_vidmem_t;
typedef struct ncclMultimemHandle ncclMultimemHandle_t;
typedef struct ncclTeamRequirements ncclTeamRequirements_t;

/* A byte offset into the device communicator's resource memory. */
typedef uint32_t ncclDevResourceHandle;
typedef ncclDevResourceHandle ncclDevResourceHandle_t;
typedef uint32_t ncclGinSignal_t;
typedef uint32_t ncclGinCounter_t;

#if defined(__cplusplus)
/* Tags picking a device communicator's own team. */
struct ncclTeamTagWorld {};
struct ncclTeamTagLsa {};
struct ncclTeamTagRail {};
#endif

/* What a window handle (ncclWindow_t) points to: readable on the host and, where the backend
 * has devices, by kernels. Rank r of the window's LSA team holds its window at
 * lsaFlatBase + r * (stride4G << 32). rustccl writes these fields and nothing past them. */
struct ncclWindow_vidmem {
  void* winHost;
  char* lsaFlatBase;
  int lsaRank;
  int worldRank;
  uint32_t stride4G;
  uint32_t mcOffset4K;
};

/* Multimem (NVLS) is not supported: here for ncclTeamRequirements' layout and the multimem
 * pointer calls; rustccl never hands out a non-NULL mcBasePtr. */
struct ncclMultimemHandle {
  void* mcBasePtr;
};

typedef enum {
  NCCL_GIN_CONNECTION_NONE = 0,
  NCCL_GIN_CONNECTION_FULL = 1,
  NCCL_GIN_CONNECTION_RAIL = 2,
  NCCL_GIN_CONNECTION_CUSTOM_STRIDE = 3 /* 2.31: every ginCustomStride-th rank */
} ncclGinConnectionType_t;

/* GIN backends (ncclCommProperties' ginType, ginSupport[], and the requirements' ginType, where
 * NCCL_GIN_TYPE_NONE asks for any). rustccl has none: it reports NCCL_GIN_TYPE_NONE. */
typedef enum {
  NCCL_GIN_TYPE_NONE = 0,
  NCCL_GIN_TYPE_PROXY = 2,
  NCCL_GIN_TYPE_GDAKI = 3,
  NCCL_GIN_TYPE_GPI = 4,
  NCCL_GIN_TYPE_EFA_GDA = 5, /* 2.31 */
  NCCL_GIN_MAX_TYPES = 6
} ncclGinType_t;

/* The requirements' cftCaps (2.31), a bitmask. CFT is not supported: anything but
 * NCCL_CFT_NONE is refused (see below). */
typedef enum {
  NCCL_CFT_NONE = 0x0,
  NCCL_CFT = 0x1,
  NCCL_CFT_MULTIMEM = 0x2
} ncclCftCap_t;

/* NCCL 2.32.3's layout (2.31's; 120 bytes). Initialize with NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER,
 * then set what the kernels need. Requirements from older headers (2.29/2.30: 72 to 96 bytes)
 * are read up to their size, the initializer's values past it. rustccl accepts
 * resourceRequirementsList, teamRequirementsList (without multimem), lsaBarrierCount, and
 * barrierCount where the LSA team is every rank (it then counts as LSA barriers: the barriers
 * of comm.lsaBarrier are max(lsaBarrierCount, barrierCount)). Ignored, as NCCL ignores them
 * where no GIN is asked for: ginContextCount, ginExclusiveContexts, ginQueueDepth,
 * ginTrafficClass, ginStrongSignalsRequired, ginVaSignalsRequired, ginCustomStride and ginType;
 * lsaLLA2ABlockCount / lsaLLA2ASlotCount are ignored too (NCCL ignores them). useRuntimeVersion
 * is accepted either way: rustccl's ncclDevComm has one layout, of
 * ncclCommProperties.devCommRuntimeVersionSize (= sizeof(ncclDevComm_t)) bytes. Refused:
 * multimem (lsaMultimem) with ncclInvalidArgument, GIN (ginForceEnable, ginSignalCount,
 * ginCounterCount, ginConnectionType, GIN barriers) with ncclInvalidUsage, CFT (cftCaps,
 * cftBarrierCount) with ncclInvalidArgument. */
struct ncclDevCommRequirements {
  size_t size;
  unsigned int magic;
  unsigned int version;

  ncclDevResourceRequirements_t* resourceRequirementsList;
  ncclTeamRequirements_t* teamRequirementsList;

  bool lsaMultimem;

  int barrierCount;
  int lsaBarrierCount;
  int railGinBarrierCount;

  int lsaLLA2ABlockCount, lsaLLA2ASlotCount;

  bool ginForceEnable;
  int ginContextCount;
  int ginSignalCount;
  int ginCounterCount;
  ncclGinConnectionType_t ginConnectionType;
  bool ginExclusiveContexts;
  int ginQueueDepth;
  int ginTrafficClass;

  int worldGinBarrierCount;

  bool ginStrongSignalsRequired;
  bool ginVaSignalsRequired;

  /* 2.31 */
  int ginCustomStride;          /* with NCCL_GIN_CONNECTION_CUSTOM_STRIDE */
  ncclGinType_t ginType;        /* the GIN backend wanted; NCCL_GIN_TYPE_NONE: any */
  bool useRuntimeVersion;       /* lay outDevComm out as this library's version does */
  int cftCaps;                  /* ncclCftCap_t bits */
  int cftBarrierCount;
};

#define NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER {                               \
    sizeof(ncclDevCommRequirements_t),           /* size */                    \
    NCCL_API_MAGIC,                              /* magic */                   \
    NCCL_VERSION_CODE,                           /* version */                 \
    NULL,                                        /* resourceRequirementsList */\
    NULL,                                        /* teamRequirementsList */    \
    false,                                       /* lsaMultimem */             \
    0,                                           /* barrierCount */            \
    0,                                           /* lsaBarrierCount */         \
    0,                                           /* railGinBarrierCount */     \
    0,                                           /* lsaLLA2ABlockCount */      \
    0,                                           /* lsaLLA2ASlotCount */       \
    false,                                       /* ginForceEnable */          \
    4,                                           /* ginContextCount */         \
    0,                                           /* ginSignalCount */          \
    0,                                           /* ginCounterCount */         \
    NCCL_GIN_CONNECTION_NONE,                    /* ginConnectionType */       \
    false,                                       /* ginExclusiveContexts */    \
    0,                                           /* ginQueueDepth */           \
    NCCL_CONFIG_UNDEF_INT,                       /* ginTrafficClass */         \
    0,                                           /* worldGinBarrierCount */    \
    true,                                        /* ginStrongSignalsRequired */\
    true,                                        /* ginVaSignalsRequired */    \
    1,                                           /* ginCustomStride */         \
    NCCL_GIN_TYPE_NONE,                          /* ginType */                 \
    false,                                       /* useRuntimeVersion */       \
    NCCL_CFT_NONE,                               /* cftCaps */                 \
    0                                            /* cftBarrierCount */         \
}

/* Memory a kernel needs in every rank's resource memory (a list, through next).
 * ncclDevCommCreate places each (aligned to max(bufferAlign, 16)) and writes its handle to
 * *outBufferHandle when that is not NULL. GIN signals and counters are not supported (0). */
struct ncclDevResourceRequirements {
  ncclDevResourceRequirements_t* next;
  size_t bufferSize, bufferAlign;
  ncclDevResourceHandle_t* outBufferHandle;
  int ginSignalCount;
  int ginCounterCount;
  ncclGinSignal_t* outGinSignalStart;
  ncclGinCounter_t* outGinCounterStart;
};

struct ncclTeamRequirements {
  ncclTeamRequirements_t* next;
  ncclTeam_t team;
  bool multimem;
  ncclMultimemHandle_t* outMultimemHandle;
};

/* nBarriers barriers over a team. Their memory, at bufHandle in every rank's resource
 * memory: nBarriers 32-bit epochs (this rank's count of finished syncs per barrier), then
 * nBarriers * nRanks 32-bit inboxes (inbox [index * nRanks + p]: the epoch team rank p last
 * arrived at on barrier index). */
struct ncclLsaBarrierHandle {
  ncclDevResourceHandle_t bufHandle;
  int nBarriers;
};

/* An LL all-to-all buffer (ncclLLA2ACreateRequirement) of nBlocks blocks of nSlots slots. Its
 * memory, at bufHandle in every rank's resource memory: per block, one 16-byte header line
 * (its first word: the block's epoch - 2, saved by the last session) and two halves of nSlots
 * 16-byte lines each, used in turn by odd and even epochs. A line holds 8 bytes of data as
 * {data low word, epoch, data high word, epoch}: a receiver knows the data is this epoch's
 * when both epoch words are. */
struct ncclLLA2AHandle {
  ncclDevResourceHandle_t bufHandle;
  uint32_t nSlots;
};

/* A device communicator: a plain value kernels take by copy. rustccl's layout. */
struct ncclDevComm {
  unsigned int magic;   /* NCCL_API_MAGIC */
  unsigned int version; /* NCCL_VERSION_CODE of the library that made it */
  int rank, nRanks;     /* in the world (the communicator) */
  int lsaRank, lsaSize; /* in the LSA team (the ranks whose memory this one reaches) */
  /* LSA rank 0's resource memory in the flat range of windows; LSA rank r's lies at
   * resourceFlatBase + r * stride. */
  char* resourceFlatBase;
  unsigned long long stride;
  unsigned long long resourceBytes; /* each rank's resource memory */
  ncclLsaBarrierHandle_t lsaBarrier; /* the barriers of ncclTeamTagLsa sessions */
  unsigned int* abortFlag;          /* non-zero: barriers stop waiting; may be NULL */
  void* internal;                   /* the library's record */
  unsigned long long reserved[8];
};

/* What a communicator offers (NCCL 2.31's layout, 144 bytes, which 2.32.3 keeps):
 * ncclCommQueryProperties fills it, writing only `size` bytes (a struct from a 2.29/2.30 header
 * gets its own fields). NCCL 2.32 also reports CFT support past devCommRuntimeVersionSize
 * (cftSupport, cftMulticastSupport, cftCountedSupport); their layout in NCCL's header could not
 * be confirmed here, so they are not declared: a struct from NCCL's 2.32 header keeps the
 * zeroes its initializer gave them (no CFT), which is rustccl's answer. */
#define NCCL_GIN_MAX_ACTIVE_BACKENDS 4
typedef struct ncclCommProperties {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int rank;
  int nRanks;
  int cudaDev;
  int nvmlDev;
  bool deviceApiSupport;  /* device communicators work (the LSA team is every rank) */
  bool multimemSupport;   /* always false: no NVLS */
  ncclGinType_t ginType;  /* always NCCL_GIN_TYPE_NONE */
  int nLsaTeams;
  bool hostRmaSupport;    /* ncclPutSignal & co. reach every rank: host backend or CUDA, one host */
  ncclGinType_t railedGinType; /* always NCCL_GIN_TYPE_NONE */
  /* 2.31 */
  unsigned long long commHash;        /* the same on every rank of the communicator */
  int ginMinStride;                   /* 0: no GIN */
  ncclGinConnectionType_t ginConnectionType; /* always NCCL_GIN_CONNECTION_NONE */
  bool ginSupport[64];                /* [t]: GIN type t available; all false */
  size_t devCommRuntimeVersionSize;   /* bytes of the ncclDevComm ncclDevCommCreate writes */
} ncclCommProperties_t;
#define NCCL_COMM_PROPERTIES_INITIALIZER {sizeof(ncclCommProperties_t), NCCL_API_MAGIC, NCCL_VERSION_CODE}

/* ---- host functions (the library; also declared by nccl.h) ---- */

#if !defined(__CUDACC_RTC__)
#ifdef __cplusplus
extern "C" {
#endif
/* Collective: every rank calls it with the same requirements. */
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t* reqs, ncclDevComm_t* outDevComm);
/* Local; before the communicator is destroyed. */
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t* devComm);
/* props initialized with NCCL_COMM_PROPERTIES_INITIALIZER (2.29). */
ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t* props);
/* Multicast addresses of a window (2.29): *outPtr = NULL, as NCCL's where the system has no
 * multimem; a NULL window or outPtr, a window that is not live, or (for the second) a handle
 * whose mcBasePtr is NULL is ncclInvalidArgument. */
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void** outPtr);
ncclResult_t ncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset, ncclMultimemHandle_t multimem,
                                          void** outPtr);
/* Fills *outReq (bufferSize 4 * nBarriers * (1 + team.nRanks)) and outHandle->nBarriers; add
 * *outReq to ncclDevCommRequirements' resourceRequirementsList to get outHandle->bufHandle. */
ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t* outHandle,
                                             ncclDevResourceRequirements_t* outReq);
/* Slots an LL all-to-all needs for maxElts elements of at most maxEltSize bytes: one per 8
 * bytes of each, maxElts * ceil(maxEltSize / 8) (NCCL 2.30). */
int ncclLLA2ACalcSlots(int maxElts, int maxEltSize);
/* Fills *outReq (bufferSize nBlocks * (1 + 2 * nSlots) * 16, aligned to 16) and
 * outHandle->nSlots; add *outReq to ncclDevCommRequirements' resourceRequirementsList to get
 * outHandle->bufHandle (NCCL 2.30). NULL pointers, nBlocks or nSlots below 1, or a buffer over
 * 4 GiB are ncclInvalidArgument. */
ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle,
                                        ncclDevResourceRequirements_t* outReq);
#ifdef __cplusplus
}
#endif
#endif /* !__CUDACC_RTC__ */

#if defined(__cplusplus)

#if __cplusplus >= 201103L && (defined(__LP64__) || defined(_WIN64))
static_assert(sizeof(ncclWindow_vidmem) == 32, "ncclWindow_vidmem layout");
static_assert(sizeof(ncclCommProperties_t) == 144, "ncclCommProperties layout (NCCL 2.31/2.32)");
static_assert(sizeof(ncclDevCommRequirements) == 120, "ncclDevCommRequirements layout (NCCL 2.31/2.32)");
static_assert(sizeof(ncclDevResourceRequirements) == 56, "ncclDevResourceRequirements layout");
static_assert(sizeof(ncclTeamRequirements) == 32, "ncclTeamRequirements layout");
static_assert(sizeof(ncclDevComm) == 136, "ncclDevComm layout");
static_assert(sizeof(ncclLLA2AHandle) == 8, "ncclLLA2AHandle layout (NCCL 2.30)");
#if !defined(__CUDACC_RTC__) /* offsetof comes from nccl.h's <stddef.h> */
static_assert(offsetof(ncclCommProperties_t, commHash) == 56 && offsetof(ncclCommProperties_t, ginSupport) == 72 &&
                  offsetof(ncclCommProperties_t, devCommRuntimeVersionSize) == 136,
              "ncclCommProperties 2.31 fields");
static_assert(offsetof(ncclDevCommRequirements, ginCustomStride) == 96 && offsetof(ncclDevCommRequirements, cftCaps) == 108,
              "ncclDevCommRequirements 2.31 fields");
#endif
#endif

/* libcu++ needs C++17. */
#if defined(__has_include) && !defined(NCCL_DEVICE_NO_CUDA_ATOMIC) && __cplusplus >= 201703L
#if __has_include(<cuda/atomic>)
#include <cuda/atomic>
#define NCCL_DEVICE_HAS_CUDA_ATOMIC 1
#endif
#endif

/* ---- memory ordering (internal) ---- */

namespace rustccl_device {

NCCL_HOST_DEVICE_INLINE void storeRelease(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#elif defined(__CUDA_ARCH__)
  __threadfence_system();
  *(volatile uint32_t*)p = v;
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

NCCL_HOST_DEVICE_INLINE uint32_t loadAcquire(const uint32_t* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#elif defined(__CUDA_ARCH__)
  uint32_t v = *(const volatile uint32_t*)p;
  __threadfence_system();
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

NCCL_HOST_DEVICE_INLINE uint32_t loadRelaxed(const uint32_t* p) {
#if defined(__CUDA_ARCH__)
  return *(const volatile uint32_t*)p;
#else
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

/* Orders every earlier access of this thread (and, after a coop sync, of its group) before
 * its later stores, for every observer in the system. */
NCCL_HOST_DEVICE_INLINE void fenceAcqRel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("fence.acq_rel.sys;" ::: "memory");
#elif defined(__CUDA_ARCH__)
  __threadfence_system();
#else
  __atomic_thread_fence(__ATOMIC_ACQ_REL);
#endif
}

/* One step of a polling loop: true when the abort flag says stop (checked every 1024 steps).
 * On the host, every 64th step gives the CPU away (ranks may share cores). */
NCCL_HOST_DEVICE_INLINE bool pollStep(const uint32_t* abortFlag, uint32_t& steps) {
  steps++;
#if !defined(__CUDA_ARCH__) && !defined(__CUDACC_RTC__) && !defined(_WIN32)
  if ((steps & 63) == 0) sched_yield();
#endif
  if ((steps & 1023) != 0) return false;
  return abortFlag != 0 && loadRelaxed(abortFlag) != 0;
}

#if defined(__CUDA_ARCH__)
__device__ inline int lane() {
  uint32_t l;
  asm("mov.u32 %0, %%laneid;" : "=r"(l));
  return (int)l;
}
#endif

/* `base` plus `i` slots of `stride` bytes plus `offset` bytes. */
NCCL_HOST_DEVICE_INLINE void* slot(char* base, long long i, unsigned long long stride, size_t offset) {
  return (void*)(base + (i * (long long)stride + (long long)offset));
}

NCCL_HOST_DEVICE_INLINE void storeRelaxed(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  *(volatile uint32_t*)p = v;
#else
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
#endif
}

/* Fully unrolled loops in device code (where the bounds are constants). */
#if defined(__CUDA_ARCH__)
#define RUSTCCL_DEVICE_UNROLL _Pragma("unroll")
#else
#define RUSTCCL_DEVICE_UNROLL
#endif

/* One 16-byte line of an LL all-to-all buffer: 8 bytes of data, each 4-byte half beside the
 * epoch it was sent in. */
struct alignas(16) LLLine {
  uint32_t lo, loEpoch, hi, hiEpoch;
};

/* Writes {lo, epoch, hi, epoch} into `line` (a peer's memory).
 *
 * Device: one 16-byte store, relaxed at system scope (volatile before sm_70). The hardware
 * makes each aligned 8-byte half of it single-copy atomic (not necessarily the whole 16), which
 * is why each half carries its own epoch word.
 *
 * Host: the same two halves as two 64-bit atomic stores ({lo, epoch} and {hi, epoch}); a
 * reader's 64-bit atomic load of a half sees the data word and its epoch word of one store, so
 * a half whose epoch word is this epoch holds this epoch's data, whatever order the two halves
 * land in. (No 16-byte atomic is used: x86-64's cmpxchg16b goes through libatomic, which may
 * take a lock that other processes do not see.) Release order is free on x86 and keeps the
 * data of a half ordered before later stores on weaker CPUs. */
NCCL_HOST_DEVICE_INLINE void storeLine(LLLine* line, uint32_t lo, uint32_t hi, uint32_t epoch) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("st.relaxed.sys.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(lo), "r"(epoch), "r"(hi),
               "r"(epoch)
               : "memory");
#elif defined(__CUDA_ARCH__)
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(lo), "r"(epoch), "r"(hi),
               "r"(epoch)
               : "memory");
#else
  unsigned long long* half = (unsigned long long*)line;
  uint32_t words[4] = {lo, epoch, hi, epoch};
  unsigned long long v0, v1;
  __builtin_memcpy(&v0, &words[0], 8);
  __builtin_memcpy(&v1, &words[2], 8);
  __atomic_store_n(&half[0], v0, __ATOMIC_RELEASE);
  __atomic_store_n(&half[1], v1, __ATOMIC_RELEASE);
#endif
}

/* Reads a line of this rank's buffer (see storeLine: each half is read in one piece). */
NCCL_HOST_DEVICE_INLINE LLLine loadLine(const LLLine* line) {
  LLLine l;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(l.lo), "=r"(l.loEpoch), "=r"(l.hi), "=r"(l.hiEpoch)
               : "l"(line)
               : "memory");
#elif defined(__CUDA_ARCH__)
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(l.lo), "=r"(l.loEpoch), "=r"(l.hi), "=r"(l.hiEpoch)
               : "l"(line)
               : "memory");
#else
  const unsigned long long* half = (const unsigned long long*)line;
  unsigned long long v0 = __atomic_load_n(&half[0], __ATOMIC_ACQUIRE);
  unsigned long long v1 = __atomic_load_n(&half[1], __ATOMIC_ACQUIRE);
  __builtin_memcpy((char*)&l, &v0, 8);
  __builtin_memcpy((char*)&l + 8, &v1, 8);
#endif
  return l;
}

/* A value of type T seen as the 8-byte words an LL all-to-all moves (the last one padded
 * with zeros). T must be trivially copyable. */
template <typename T>
union LLWords {
  enum { count = (sizeof(T) + 7) / 8 };
  T value;
  uint32_t word[count][2];
  NCCL_HOST_DEVICE_INLINE LLWords() : word() {}
};

/* For decltype only (C++11's std::declval, without <utility>, which NVRTC lacks). */
template <typename T>
NCCL_HOST_DEVICE T&& declval() noexcept;

} // namespace rustccl_device

/* ---- cooperative groups: the threads that call a function together ---- */

/* An aligned, power-of-two group of lanes of a warp (one thread, a whole warp). */
template <int nThreadsPow2>
struct ncclCoopTile {
  static_assert(nThreadsPow2 >= 1 && nThreadsPow2 <= 32 && (nThreadsPow2 & (nThreadsPow2 - 1)) == 0,
                "ncclCoopTile: a power of two from 1 to 32 threads");
  NCCL_HOST_DEVICE_INLINE int thread_rank() const {
#if defined(__CUDA_ARCH__)
    return rustccl_device::lane() % nThreadsPow2;
#else
    return 0;
#endif
  }
  NCCL_HOST_DEVICE_INLINE int size() const {
#if defined(__CUDA_ARCH__)
    return nThreadsPow2;
#else
    return 1;
#endif
  }
  NCCL_HOST_DEVICE_INLINE int num_threads() const { return size(); }
#if defined(__CUDA_ARCH__)
  __device__ inline uint32_t laneMask() const {
    return (0xffffffffu >> (32 - nThreadsPow2)) << (rustccl_device::lane() & -nThreadsPow2);
  }
#endif
  NCCL_HOST_DEVICE_INLINE void sync() {
#if defined(__CUDA_ARCH__)
    if (nThreadsPow2 > 1) __syncwarp(laneMask());
#endif
  }
};

typedef ncclCoopTile<1> ncclCoopThread;
typedef ncclCoopTile<32> ncclCoopWarp;

/* Every thread of the block (one-dimensional blocks). */
struct ncclCoopCta {
  NCCL_HOST_DEVICE_INLINE int thread_rank() const {
#if defined(__CUDA_ARCH__)
    return (int)threadIdx.x;
#else
    return 0;
#endif
  }
  NCCL_HOST_DEVICE_INLINE int size() const {
#if defined(__CUDA_ARCH__)
    return (int)blockDim.x;
#else
    return 1;
#endif
  }
  NCCL_HOST_DEVICE_INLINE int num_threads() const { return size(); }
  NCCL_HOST_DEVICE_INLINE void sync() {
#if defined(__CUDA_ARCH__)
    __syncthreads();
#endif
  }
};

/* ---- teams ---- */

NCCL_HOST_DEVICE_INLINE ncclTeam ncclTeamWorld(ncclDevComm const& comm) {
  ncclTeam t;
  t.nRanks = comm.nRanks;
  t.rank = comm.rank;
  t.stride = 1;
  return t;
}

NCCL_HOST_DEVICE_INLINE ncclTeam ncclTeamLsa(ncclDevComm const& comm) {
  ncclTeam t;
  t.nRanks = comm.lsaSize;
  t.rank = comm.lsaRank;
  t.stride = 1;
  return t;
}

/* The ranks with this rank's LSA rank, one per LSA team. */
NCCL_HOST_DEVICE_INLINE ncclTeam ncclTeamRail(ncclDevComm const& comm) {
  ncclTeam t;
  t.nRanks = comm.nRanks / comm.lsaSize;
  t.rank = comm.rank / comm.lsaSize;
  t.stride = comm.lsaSize;
  return t;
}

/* World rank of rank `rank` of team `team` (a team this rank belongs to). */
NCCL_HOST_DEVICE_INLINE int ncclTeamRankToWorld(ncclDevComm const& comm, ncclTeam team, int rank) {
  return comm.rank + (rank - team.rank) * team.stride;
}

/* LSA rank of rank `rank` of team `team` (one inside the LSA team). */
NCCL_HOST_DEVICE_INLINE int ncclTeamRankToLsa(ncclDevComm const& comm, ncclTeam team, int rank) {
  return comm.lsaRank + (rank - team.rank) * team.stride;
}

/* Whether rank `bRank` of team b belongs to team a (both teams hold this rank). */
NCCL_HOST_DEVICE_INLINE bool ncclTeamRankIsMember(ncclTeam a, ncclTeam b, int bRank) {
  int delta = (bRank - b.rank) * b.stride;
  if (delta % a.stride != 0) return false;
  int aRank = a.rank + delta / a.stride;
  return 0 <= aRank && aRank < a.nRanks;
}

/* Rank `bRank` of team b as a rank of team a. */
NCCL_HOST_DEVICE_INLINE int ncclTeamRankToTeam(ncclTeam a, ncclTeam b, int bRank) {
  return a.rank + (bRank - b.rank) * b.stride / a.stride;
}

NCCL_HOST_DEVICE_INLINE ncclTeam ncclTeamInnerFactor(ncclTeam parent, int innerSize) {
  ncclTeam t;
  t.nRanks = innerSize;
  t.rank = parent.rank % innerSize;
  t.stride = parent.stride;
  return t;
}

NCCL_HOST_DEVICE_INLINE ncclTeam ncclTeamOuterFactor(ncclTeam parent, int innerSize) {
  ncclTeam t;
  t.nRanks = parent.nRanks / innerSize;
  t.rank = parent.rank / innerSize;
  t.stride = parent.stride * innerSize;
  return t;
}

/* ---- pointers into windows ---- */

/* `offset` bytes into this rank's own window. */
NCCL_HOST_DEVICE_INLINE void* ncclGetLocalPointer(ncclWindow_t w, size_t offset) {
  return rustccl_device::slot(w->lsaFlatBase, w->lsaRank, (unsigned long long)w->stride4G << 32, offset);
}

/* `offset` bytes into the window of LSA rank `lsaPeer`. */
NCCL_HOST_DEVICE_INLINE void* ncclGetLsaPointer(ncclWindow_t w, size_t offset, int lsaPeer) {
  return rustccl_device::slot(w->lsaFlatBase, lsaPeer, (unsigned long long)w->stride4G << 32, offset);
}

/* `offset` bytes into the window of world rank `peer` (a member of the LSA team). */
NCCL_HOST_DEVICE_INLINE void* ncclGetPeerPointer(ncclWindow_t w, size_t offset, int peer) {
  return rustccl_device::slot(w->lsaFlatBase, w->lsaRank + (peer - w->worldRank), (unsigned long long)w->stride4G << 32,
                              offset);
}

/* `offset` bytes into the window of rank `peer` of team `team` (inside the LSA team). */
NCCL_HOST_DEVICE_INLINE void* ncclGetPeerPointer(ncclWindow_t w, size_t offset, ncclTeam team, int peer) {
  return rustccl_device::slot(w->lsaFlatBase, w->lsaRank + (peer - team.rank) * team.stride,
                              (unsigned long long)w->stride4G << 32, offset);
}

/* Bytes from the start of the resource memory to resource `h`. */
NCCL_HOST_DEVICE_INLINE size_t ncclGetResourceBufferOffset(ncclDevResourceHandle_t h) { return (size_t)h; }

NCCL_HOST_DEVICE_INLINE void* ncclGetResourceBufferLocalPointer(ncclDevComm const& comm, ncclDevResourceHandle_t h) {
  return rustccl_device::slot(comm.resourceFlatBase, comm.lsaRank, comm.stride, h);
}

NCCL_HOST_DEVICE_INLINE void* ncclGetResourceBufferLsaPointer(ncclDevComm const& comm, ncclDevResourceHandle_t h,
                                                              int lsaPeer) {
  return rustccl_device::slot(comm.resourceFlatBase, lsaPeer, comm.stride, h);
}

/* Resource `h` of rank `peer` of team `team` (inside the LSA team). */
NCCL_HOST_DEVICE_INLINE void* ncclGetResourceBufferPeerPointer(ncclDevComm const& comm, ncclDevResourceHandle_t h,
                                                               ncclTeam team, int peer) {
  return rustccl_device::slot(comm.resourceFlatBase, comm.lsaRank + (peer - team.rank) * team.stride, comm.stride, h);
}

/* ---- the LSA barrier ----
 *
 * A session is made by every thread of a cooperative group, on one barrier (index) of a
 * handle over a team: sync (arrive, then wait) returns once every rank of the team arrived
 * at it, and what each rank wrote before arriving is visible to every rank after its wait.
 * A barrier counts syncs (its epoch): the session reads the count when made and writes it
 * back when it ends, so barriers can be used across sessions and kernels. One group at a
 * time per barrier on each rank. */
template <typename Coop>
struct ncclLsaBarrierSession {
  Coop coop;
  ncclTeam team;
  ncclLsaBarrierHandle handle;
  uint32_t index;
  uint32_t epoch;
  char* resourceFlatBase;
  unsigned long long stride;
  int lsaRank;
  unsigned int* abortFlag;

  NCCL_HOST_DEVICE_INLINE ncclLsaBarrierSession(Coop coop_, ncclDevComm const& comm, ncclTeam team_,
                                                ncclLsaBarrierHandle handle_, uint32_t index_)
      : coop(coop_), team(team_), handle(handle_), index(index_), epoch(0), resourceFlatBase(comm.resourceFlatBase),
        stride(comm.stride), lsaRank(comm.lsaRank), abortFlag(comm.abortFlag) {
    epoch = state(team.rank)[index];
  }

  NCCL_HOST_DEVICE_INLINE ncclLsaBarrierSession(Coop coop_, ncclDevComm const& comm, ncclTeamTagLsa, uint32_t index_)
      : ncclLsaBarrierSession(coop_, comm, ncclTeamLsa(comm), comm.lsaBarrier, index_) {}

  ncclLsaBarrierSession(ncclLsaBarrierSession const&) = delete;
  ncclLsaBarrierSession& operator=(ncclLsaBarrierSession const&) = delete;

  NCCL_HOST_DEVICE_INLINE ~ncclLsaBarrierSession() {
    if (coop.thread_rank() == 0) state(team.rank)[index] = epoch;
    coop.sync();
  }

  /* The barrier memory of team rank `peer`. */
  NCCL_HOST_DEVICE_INLINE uint32_t* state(int peer) const {
    int lsaPeer = lsaRank + (peer - team.rank) * team.stride;
    return (uint32_t*)rustccl_device::slot(resourceFlatBase, lsaPeer, stride, handle.bufHandle);
  }

  /* Where rank `from` tells rank `owner` it arrived. */
  NCCL_HOST_DEVICE_INLINE uint32_t* inbox(int owner, int from) const {
    return state(owner) + handle.nBarriers + index * (uint32_t)team.nRanks + from;
  }

  /* Tells every other rank of the team this rank arrived (after the group's earlier writes). */
  NCCL_HOST_DEVICE_INLINE void arrive(Coop) {
    coop.sync();
    if (team.nRanks > 1) rustccl_device::fenceAcqRel();
    for (int i = coop.thread_rank(); i < team.nRanks - 1; i += coop.size()) {
      int peer = i + (team.rank <= i ? 1 : 0);
      rustccl_device::storeRelease(inbox(peer, team.rank), epoch + 1);
    }
  }

  /* Waits until every other rank of the team arrived (or the abort flag is set). */
  NCCL_HOST_DEVICE_INLINE void wait(Coop) {
    for (int i = coop.thread_rank(); i < team.nRanks - 1; i += coop.size()) {
      int peer = i + (team.rank <= i ? 1 : 0);
      const uint32_t* box = inbox(team.rank, peer);
      uint32_t steps = 0;
      while ((int)(rustccl_device::loadAcquire(box) - (epoch + 1)) < 0) {
        if (rustccl_device::pollStep(abortFlag, steps)) break;
      }
    }
    epoch += 1;
    coop.sync();
  }

  NCCL_HOST_DEVICE_INLINE void sync(Coop c) {
    arrive(c);
    wait(c);
  }

#if defined(NCCL_DEVICE_HAS_CUDA_ATOMIC)
  /* NCCL's signatures: the order is always at least acquire/release here. */
  NCCL_HOST_DEVICE_INLINE void arrive(Coop c, cuda::memory_order) { arrive(c); }
  NCCL_HOST_DEVICE_INLINE void wait(Coop c, cuda::memory_order) { wait(c); }
  NCCL_HOST_DEVICE_INLINE void sync(Coop c, cuda::memory_order) { sync(c); }
#endif
};

/* ---- the LL all-to-all (NCCL 2.30) ----
 *
 * Small messages between the ranks of a team (inside the LSA team) without a barrier: each
 * 8 bytes of data travel in a 16-byte line beside the epoch they belong to, written straight
 * into the receiver's buffer; the receiver polls its own buffer until the line carries the
 * current epoch. A session is made by every thread of a cooperative group, on one block of a
 * handle (ncclLLA2ACreateRequirement; one group at a time per block on each rank), with
 * slots 0 .. maxElts - 1: the 8-byte word u of the element in slot s lies at line
 * s + u * maxElts of the half, so nSlots must be at least ncclLLA2ACalcSlots(maxElts,
 * sizeof(T)) for the largest T sent.
 *
 * An epoch: send (or bcast) to slots of peers' buffers, recv from this rank's, then endEpoch.
 * Each slot is written at most once per epoch, and before endEpoch every thread of the group
 * together must have sent to every peer of the team and received something every peer sent
 * (that is what keeps a peer at most one epoch ahead, which the two halves allow). The epoch
 * goes on across sessions and kernels (saved in the block's header line). Multimem is not
 * supported (rustccl drives no NVLS): the multimem arguments are taken for NCCL's signature and
 * ignored, so bcast always writes to each rank with unicast stores. */
template <typename Coop>
struct ncclLLA2ASession {
  Coop coop;
  ncclTeam team;
  ncclLLA2AHandle handle;
  int block;
  int pitch; /* maxElts: lines between the words of one element */
  uint32_t epoch;
  uint32_t slotsOffset; /* lines from the buffer's start to this epoch's half of the block */
  char* resourceFlatBase;
  unsigned long long stride;
  int lsaRank;
  unsigned int* abortFlag;

  NCCL_HOST_DEVICE_INLINE ncclLLA2ASession(Coop coop_, ncclDevComm const& comm, ncclTeam team_,
                                           ncclLLA2AHandle handle_, uint32_t block_, int maxElts,
                                           bool multimem = false, ncclMultimemHandle mmHandle = {})
      : coop(coop_), team(team_), handle(handle_), block((int)block_), pitch(maxElts), epoch(0), slotsOffset(0),
        resourceFlatBase(comm.resourceFlatBase), stride(comm.stride), lsaRank(comm.lsaRank),
        abortFlag(comm.abortFlag) {
    (void)multimem;
    (void)mmHandle;
    /* The saved value is the epoch - 2, so a zeroed buffer starts at epoch 2: never 0, the
     * epoch of a zeroed line. */
    epoch = rustccl_device::loadRelaxed(&header()->lo) + 2;
    slotsOffset = halfOffset();
  }

  ncclLLA2ASession(ncclLLA2ASession const&) = delete;
  ncclLLA2ASession& operator=(ncclLLA2ASession const&) = delete;

  NCCL_HOST_DEVICE_INLINE ~ncclLLA2ASession() {
    if (coop.thread_rank() == 0) rustccl_device::storeRelaxed(&header()->lo, epoch - 2);
    coop.sync();
  }

  /* Lines from the buffer's start to this block's header line. */
  NCCL_HOST_DEVICE_INLINE uint32_t blockOffset() const { return (uint32_t)block * (1 + 2 * handle.nSlots); }
  /* ... to the half this epoch uses. */
  NCCL_HOST_DEVICE_INLINE uint32_t halfOffset() const { return blockOffset() + 1 + (epoch & 1) * handle.nSlots; }

  /* The buffer of team rank `peer`. */
  NCCL_HOST_DEVICE_INLINE rustccl_device::LLLine* lines(int peer) const {
    int lsaPeer = lsaRank + (peer - team.rank) * team.stride;
    return (rustccl_device::LLLine*)rustccl_device::slot(resourceFlatBase, lsaPeer, stride, handle.bufHandle);
  }
  NCCL_HOST_DEVICE_INLINE rustccl_device::LLLine* header() const { return lines(team.rank) + blockOffset(); }

  /* Writes `data` into slot `slot` of team rank `peer`'s buffer (this rank included). */
  template <typename T>
  NCCL_HOST_DEVICE_INLINE void send(int peer, int slot, T data) {
    rustccl_device::LLWords<T> w;
    w.value = data;
    put(peer, slot, w);
  }

  /* send to every rank of the team (this one included): this rank first, then the ones after
   * it, so that ranks spread their stores over different peers. */
  template <typename T>
  NCCL_HOST_DEVICE_INLINE void bcast(int slot, T data) {
    rustccl_device::LLWords<T> w;
    w.value = data;
    int peer = team.rank;
    for (int i = 0; i < team.nRanks; i++) {
      put(peer, slot, w);
      peer = peer + 1 == team.nRanks ? 0 : peer + 1;
    }
  }

  /* Waits for slot `slot` of this rank's buffer to hold this epoch's data, and returns it. */
  template <typename T>
  NCCL_HOST_DEVICE_INLINE T recv(int slot) {
    T v[1];
    recvUnrolled<1, 1>(slot, 1, 0, v);
    return v[0];
  }

  /* Receives elements eltStart, eltStart + eltStride, ... (eltCount of them, at most
   * MaxEltCount; the first MinEltCount are read whatever eltCount says) into vals, waiting
   * for all of them at once. */
  template <int MinEltCount, int MaxEltCount, typename T>
  NCCL_HOST_DEVICE_INLINE void recvUnrolled(int eltStart, int eltCount, int eltStride, T (&vals)[MaxEltCount]) {
    typedef rustccl_device::LLWords<T> Words;
    const rustccl_device::LLLine* buf = lines(team.rank) + slotsOffset + eltStart;
    rustccl_device::LLLine got[MaxEltCount][Words::count];
    uint32_t steps = 0;
    for (;;) {
      bool all = true;
      RUSTCCL_DEVICE_UNROLL
      for (int u = 0; u < MaxEltCount; u++) {
        if (u < MinEltCount || u < eltCount) {
          RUSTCCL_DEVICE_UNROLL
          for (int v = 0; v < Words::count; v++) {
            got[u][v] = rustccl_device::loadLine(buf + u * eltStride + v * pitch);
            all = all && got[u][v].loEpoch == epoch && got[u][v].hiEpoch == epoch;
          }
        }
      }
      if (all || rustccl_device::pollStep(abortFlag, steps)) break;
    }
    RUSTCCL_DEVICE_UNROLL
    for (int u = 0; u < MaxEltCount; u++) {
      if (u < MinEltCount || u < eltCount) {
        Words w;
        RUSTCCL_DEVICE_UNROLL
        for (int v = 0; v < Words::count; v++) {
          w.word[v][0] = got[u][v].lo;
          w.word[v][1] = got[u][v].hi;
        }
        vals[u] = w.value;
      }
    }
  }

  /* Receives eltCount elements (eltStart, eltStart + eltStride, ...), Unroll at a time, and
   * folds them: red(...red(eltToAcc(e0), eltToAcc(e1))..., eltToAcc(eN-1)). eltCount >= 1. */
  template <int Unroll, typename Elt, typename EltToAcc, typename Reduce>
  NCCL_HOST_DEVICE_INLINE auto recvReduce(int eltStart, int eltCount, int eltStride, EltToAcc eltToAcc, Reduce red)
      -> decltype(eltToAcc(rustccl_device::declval<Elt>())) {
    typedef decltype(eltToAcc(rustccl_device::declval<Elt>())) Acc;
    Acc acc = Acc();
    int i = 0;
    for (; i + Unroll <= eltCount; i += Unroll) {
      Elt got[Unroll];
      recvUnrolled<Unroll, Unroll>(eltStart + i * eltStride, Unroll, eltStride, got);
      RUSTCCL_DEVICE_UNROLL
      for (int j = 0; j < Unroll; j++) acc = i + j == 0 ? eltToAcc(got[j]) : red(acc, eltToAcc(got[j]));
    }
    if (i < eltCount) {
      Elt got[Unroll];
      recvUnrolled<1, Unroll>(eltStart + i * eltStride, eltCount - i, eltStride, got);
      RUSTCCL_DEVICE_UNROLL
      for (int j = 0; j < Unroll; j++) {
        if (i + j < eltCount) acc = i + j == 0 ? eltToAcc(got[j]) : red(acc, eltToAcc(got[j]));
      }
    }
    return acc;
  }

  /* Ends this epoch (see above); the next uses the other half. When the 32-bit epoch is about
   * to wrap, both halves are cleared (their last two epochs) so that lines from long ago can
   * never pass for the epochs after the wrap, and epochs 0 and 1 are skipped. */
  NCCL_HOST_DEVICE_INLINE void endEpoch(Coop) {
    coop.sync();
    if (epoch >= 0xfffffffeu) {
      rustccl_device::LLLine* half = lines(team.rank) + slotsOffset;
      for (int i = coop.thread_rank(); i < (int)handle.nSlots; i += coop.size())
        rustccl_device::storeLine(half + i, 0, 0, 0);
      coop.sync();
    }
    epoch = epoch == 0xffffffffu ? 2 : epoch + 1;
    slotsOffset = halfOffset();
  }

  /* The 8-byte words of one element into a peer's slot. */
  template <typename T>
  NCCL_HOST_DEVICE_INLINE void put(int peer, int slot, rustccl_device::LLWords<T> const& w) {
    rustccl_device::LLLine* buf = lines(peer) + slotsOffset + slot;
    RUSTCCL_DEVICE_UNROLL
    for (int u = 0; u < rustccl_device::LLWords<T>::count; u++)
      rustccl_device::storeLine(buf + u * pitch, w.word[u][0], w.word[u][1], epoch);
  }
};

#endif /* __cplusplus */

#endif /* NCCL_DEVICE_H_ */
