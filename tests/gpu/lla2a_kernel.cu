/* A user kernel on rustccl's LL all-to-all (nccl_device.h's ncclLLA2ASession, NCCL 2.30):
 * compiled by nvcc against capi/include (tests/gpu/issue34_lla2a.sh) and run as NRANKS
 * processes on one GPU (under MPS) with RANK, NRANKS, NCCL_COMM_ID=host:port and LLA2A_SEED
 * (the same on every rank: the data is fresh each run) set.
 *
 *   nvcc -O2 -arch=native -I capi/include -o /tmp/lla2a_kernel tests/gpu/lla2a_kernel.cu \
 *        -L target/gpu -lnccl -lcuda
 *
 * Each rank makes a device communicator with one LL all-to-all buffer (ncclLLA2ACreateRequirement)
 * of kBlocks + kBlocks * kWarps blocks: the CTA kernel (kBlocks blocks of kThreads threads)
 * runs a session per CTA (ncclCoopCta) on LL blocks 0..kBlocks-1, the warp kernel a session per
 * warp (ncclCoopWarp) on the others. Each epoch of a session every rank gives every rank (itself
 * included) kElts elements, in one of three ways by round: send + recv, bcast + recvUnrolled
 * (every rank's element e at once), send + recvReduce (the sum over the senders), and checks
 * every element received against what the sender must have sent (a hash of the seed, sender,
 * receiver, LL block, round and element). Elements of 4, 8 and 20 bytes (1 to 3 lines); each
 * kernel is launched kLaunches times per type with kEpochs epochs each, so the epochs go on
 * from launch to launch through each block's saved epoch, which the host checks at the end.
 *
 * Prints "RESULT lla2a rank R: E epochs, W wrong elements" and a "PASS lla2a rank R" or
 * "FAIL lla2a rank R: ..." summary line; exits 1 when something was wrong, 2 when a CUDA or
 * NCCL call failed (ERROR line).
 *
 * The kernels (everything outside the host part) also compile under NVRTC. */
#ifndef __CUDACC_RTC__
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nccl.h"
#endif
#include "nccl_device.h"

enum {
  kBlocks = 4,
  kThreads = 256,
  kWarps = kThreads / 32,
  kLLBlocks = kBlocks + kBlocks * kWarps,
  kElts = 300, /* elements each rank gives each rank per epoch */
  kMaxRanks = 8,
  kEpochs = 40,
  kLaunches = 3
};

__host__ __device__ inline uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

/* Word w of element e that `src` gives `dst` (-1: a bcast) on LL block `blk` in `round`. */
__host__ __device__ inline uint32_t dataWord(uint32_t seed, int src, int dst, int blk, uint32_t round, int e, int w) {
  return mix(seed ^ mix((uint32_t)src * 0x9E3779B1u ^
                        mix((uint32_t)(dst + 1) * 0x85ebca6bu ^
                            mix((uint32_t)blk * 0x27d4eb2fu ^ mix(round * 0xc2b2ae35u ^ mix((uint32_t)e * 64 + w))))));
}

struct Big { /* 20 bytes: three lines, the last one half padding */
  uint32_t w[5];
};

template <typename T>
__device__ inline T element(uint32_t seed, int src, int dst, int blk, uint32_t round, int e) {
  union {
    T v;
    uint32_t w[sizeof(T) / 4];
  } u;
  for (int i = 0; i < (int)(sizeof(T) / 4); i++) u.w[i] = dataWord(seed, src, dst, blk, round, e, i);
  return u.v;
}

template <typename T>
__device__ inline bool same(T const& a, T const& b) {
  const uint32_t* x = (const uint32_t*)&a;
  const uint32_t* y = (const uint32_t*)&b;
  bool eq = true;
  for (int i = 0; i < (int)(sizeof(T) / 4); i++) eq = eq && x[i] == y[i];
  return eq;
}

/* recvReduce's fold: 4-byte elements into a 64-bit sum, others word by word mod 2^32. */
template <typename T>
struct Fold {
  typedef T Acc;
  __device__ Acc operator()(T v) const { return v; }
  __device__ Acc operator()(Acc a, Acc b) const {
    uint32_t* x = (uint32_t*)&a;
    const uint32_t* y = (const uint32_t*)&b;
    for (int i = 0; i < (int)(sizeof(T) / 4); i++) x[i] += y[i];
    return a;
  }
  __device__ static Acc add(Acc a, T v) { return Fold()(a, v); }
};
template <>
struct Fold<uint32_t> {
  typedef unsigned long long Acc;
  __device__ Acc operator()(uint32_t v) const { return v; }
  __device__ Acc operator()(Acc a, Acc b) const { return a + b; }
  __device__ static Acc add(Acc a, uint32_t v) { return a + v; }
};

/* The first wrong element seen: set, round, LL block, sender, element. */
struct FirstWrong {
  int set, round, blk, src, elt;
};

struct Counters {
  unsigned long long epochs; /* epochs run, summed over sessions */
  int wrong;
  FirstWrong first;
};

__device__ inline void noteWrong(Counters* c, int round, int blk, int src, int e) {
  atomicAdd(&c->wrong, 1);
  if (atomicCAS(&c->first.set, 0, 1) == 0) {
    c->first.round = round;
    c->first.blk = blk;
    c->first.src = src;
    c->first.elt = e;
  }
}

/* `epochs` epochs of a session of coop on LL block `blk`, rounds from firstRound on; the
 * coop's threads share the elements. */
template <typename T, typename Coop>
__device__ void exchange(Coop coop, ncclDevComm const& devComm, ncclLLA2AHandle h, int blk, uint32_t seed,
                         uint32_t firstRound, int epochs, Counters* c) {
  ncclTeam lsa = ncclTeamLsa(devComm);
  const int me = lsa.rank, n = lsa.nRanks;
  ncclLLA2ASession<Coop> s(coop, devComm, lsa, h, (uint32_t)blk, n * kElts);
  const int t = coop.thread_rank(), nt = coop.size();
  for (uint32_t round = firstRound; round < firstRound + (uint32_t)epochs; round++) {
    switch (round % 3) {
      case 0: /* send + recv */
        for (int i = t; i < n * kElts; i += nt) {
          const int peer = (me + 1 + i / kElts) % n, e = i % kElts;
          s.send(peer, me * kElts + e, element<T>(seed, me, peer, blk, round, e));
        }
        for (int i = t; i < n * kElts; i += nt) {
          const int p = i / kElts, e = i % kElts;
          if (!same(s.template recv<T>(p * kElts + e), element<T>(seed, p, me, blk, round, e)))
            noteWrong(c, (int)round, blk, p, e);
        }
        break;
      case 1: /* bcast + recvUnrolled (element e of every rank at once) */
        for (int e = t; e < kElts; e += nt) s.bcast(me * kElts + e, element<T>(seed, me, -1, blk, round, e));
        for (int e = t; e < kElts; e += nt) {
          T got[kMaxRanks];
          s.template recvUnrolled<1, kMaxRanks>(e, n, kElts, got);
          for (int p = 0; p < n; p++)
            if (!same(got[p], element<T>(seed, p, -1, blk, round, e))) noteWrong(c, (int)round, blk, p, e);
        }
        break;
      default: /* send + recvReduce (the sum over the senders of element e) */
        for (int i = t; i < n * kElts; i += nt) {
          const int peer = (me + 1 + i / kElts) % n, e = i % kElts;
          s.send(peer, me * kElts + e, element<T>(seed, me, peer, blk, round, e));
        }
        for (int e = t; e < kElts; e += nt) {
          typename Fold<T>::Acc want = Fold<T>()(element<T>(seed, 0, me, blk, round, e));
          for (int p = 1; p < n; p++) want = Fold<T>::add(want, element<T>(seed, p, me, blk, round, e));
          typename Fold<T>::Acc got = s.template recvReduce<2, T>(e, n, kElts, Fold<T>(), Fold<T>());
          if (!same(got, want)) noteWrong(c, (int)round, blk, -1, e);
        }
        break;
    }
    s.endEpoch(coop);
  }
  if (t == 0) atomicAdd(&c->epochs, (unsigned long long)epochs);
}

/* A session per CTA, on LL block blockIdx.x. */
template <typename T>
__global__ void ctaKernel(ncclDevComm devComm, ncclLLA2AHandle h, uint32_t seed, uint32_t firstRound, int epochs,
                          Counters* c) {
  exchange<T>(ncclCoopCta(), devComm, h, (int)blockIdx.x, seed, firstRound, epochs, c);
}

/* A session per warp, on LL block kBlocks + blockIdx.x * kWarps + warp. */
template <typename T>
__global__ void warpKernel(ncclDevComm devComm, ncclLLA2AHandle h, uint32_t seed, uint32_t firstRound, int epochs,
                           Counters* c) {
  const int blk = kBlocks + (int)blockIdx.x * kWarps + (int)(threadIdx.x / 32);
  exchange<T>(ncclCoopWarp(), devComm, h, blk, seed, firstRound, epochs, c);
}

#ifndef __CUDACC_RTC__

static int rank = 0, nranks = 1, failures = 0;
static ncclComm_t comm = NULL;

#define CUDA_CHECK(call)                                                                                        \
  do {                                                                                                          \
    cudaError_t e_ = (call);                                                                                    \
    if (e_ != cudaSuccess) {                                                                                    \
      printf("ERROR lla2a rank %d %s:%d: %s -> %s (%s)\n", rank, __FILE__, __LINE__, #call, cudaGetErrorName(e_),  \
             cudaGetErrorString(e_));                                                                           \
      fflush(stdout);                                                                                           \
      exit(2);                                                                                                  \
    }                                                                                                           \
  } while (0)

#define NCCL_CHECK(call)                                                                                        \
  do {                                                                                                          \
    ncclResult_t r_ = (call);                                                                                   \
    if (r_ != ncclSuccess) {                                                                                    \
      printf("ERROR lla2a rank %d %s:%d: %s -> %s (%s)\n", rank, __FILE__, __LINE__, #call,                    \
             ncclGetErrorString(r_), ncclGetLastError(comm));                                                   \
      fflush(stdout);                                                                                           \
      exit(2);                                                                                                  \
    }                                                                                                           \
  } while (0)

#define EXPECT(cond, ...)                                                   \
  do {                                                                      \
    if (!(cond)) {                                                          \
      failures++;                                                           \
      printf("FAIL lla2a rank %d %s:%d: ", rank, __FILE__, __LINE__);       \
      printf(__VA_ARGS__);                                                  \
      printf("\n");                                                         \
      fflush(stdout);                                                       \
    }                                                                       \
  } while (0)

/* kLaunches launches of both kernels with elements of type T, rounds from *round on. */
template <typename T>
static void runType(ncclDevComm const& devComm, ncclLLA2AHandle h, uint32_t seed, uint32_t* round, Counters* c) {
  for (int l = 0; l < kLaunches; l++) {
    ctaKernel<T><<<kBlocks, kThreads>>>(devComm, h, seed, *round, kEpochs, c);
    CUDA_CHECK(cudaGetLastError());
    warpKernel<T><<<kBlocks, kThreads>>>(devComm, h, seed, *round, kEpochs, c);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    *round += kEpochs;
  }
}

int main() {
  const char* r = getenv("RANK");
  const char* n = getenv("NRANKS");
  if (!r || !n) {
    printf("ERROR lla2a: set RANK and NRANKS (and NCCL_COMM_ID=host:port with more than one rank)\n");
    return 2;
  }
  rank = atoi(r);
  nranks = atoi(n);
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) {
    printf("ERROR lla2a: RANK %d, NRANKS %d (1 to %d ranks)\n", rank, nranks, kMaxRanks);
    return 2;
  }
  if (nranks > 1 && !getenv("NCCL_COMM_ID")) {
    printf("ERROR lla2a rank %d: set NCCL_COMM_ID=host:port (every rank derives the unique id from it)\n", rank);
    return 2;
  }
  const char* seedText = getenv("LLA2A_SEED");
  const uint32_t seed = seedText ? (uint32_t)strtoul(seedText, NULL, 0) : 12345u;
  CUDA_CHECK(cudaSetDevice(0)); /* the ranks share one GPU (under MPS) */

  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  NCCL_CHECK(ncclCommInitRank(&comm, nranks, id, rank));

  /* The LL all-to-all buffer: room for 20-byte elements from every rank. */
  const int nSlots = ncclLLA2ACalcSlots(nranks * kElts, (int)sizeof(Big));
  ncclLLA2AHandle_t h;
  ncclDevResourceRequirements_t req;
  NCCL_CHECK(ncclLLA2ACreateRequirement(kLLBlocks, nSlots, &h, &req));
  EXPECT(req.bufferSize == (size_t)kLLBlocks * (1 + 2 * nSlots) * 16 && h.nSlots == (uint32_t)nSlots,
         "requirement: %zu bytes, %u slots", req.bufferSize, h.nSlots);
  ncclDevCommRequirements_t reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  reqs.resourceRequirementsList = &req;
  ncclDevComm_t devComm;
  memset(&devComm, 0, sizeof devComm);
  NCCL_CHECK(ncclDevCommCreate(comm, &reqs, &devComm));
  printf("lla2a rank %d: LSA rank %d of %d, LL buffer at %u: %d blocks of %d slots, seed %#x\n", rank,
         devComm.lsaRank, devComm.lsaSize, h.bufHandle, kLLBlocks, nSlots, seed);
  if (devComm.lsaSize != nranks || devComm.lsaRank != rank) {
    printf("ERROR lla2a rank %d: LSA team: rank %d of %d, expected every rank (they share a GPU)\n", rank,
           devComm.lsaRank, devComm.lsaSize);
    return 2;
  }

  Counters* c = NULL;
  CUDA_CHECK(cudaMalloc((void**)&c, sizeof(Counters)));
  CUDA_CHECK(cudaMemset(c, 0, sizeof(Counters)));
  uint32_t round = 0;
  runType<uint32_t>(devComm, h, seed, &round, c);
  runType<unsigned long long>(devComm, h, seed, &round, c);
  runType<Big>(devComm, h, seed, &round, c);

  Counters host;
  CUDA_CHECK(cudaMemcpy(&host, c, sizeof host, cudaMemcpyDeviceToHost));
  const unsigned long long wantEpochs = 3ull * kLaunches * kEpochs * kLLBlocks;
  EXPECT(host.epochs == wantEpochs, "%llu epochs run, expected %llu", host.epochs, wantEpochs);
  if (host.first.set)
    printf("FAIL lla2a rank %d: first wrong element: round %d, LL block %d, sender %d (-1: a sum), element %d\n", rank,
           host.first.round, host.first.blk, host.first.src, host.first.elt);

  /* Every block's header line holds its epoch - 2: the epochs it ended (the buffer started zeroed). */
  {
    const size_t lines = (size_t)kLLBlocks * (1 + 2 * nSlots);
    uint32_t* mem = (uint32_t*)malloc(lines * 16);
    if (!mem) {
      printf("ERROR lla2a rank %d: malloc\n", rank);
      return 2;
    }
    CUDA_CHECK(cudaMemcpy(mem, ncclGetResourceBufferLocalPointer(devComm, h.bufHandle), lines * 16,
                          cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int b = 0; b < kLLBlocks; b++) bad += mem[(size_t)b * (1 + 2 * nSlots) * 4] != round;
    EXPECT(bad == 0, "%d blocks saved another epoch than %u (block 0: %u)", bad, round, mem[0]);
    free(mem);
  }

  printf("RESULT lla2a rank %d: %llu epochs, %d wrong elements\n", rank, host.epochs, host.wrong);
  fflush(stdout);

  /* Nobody frees its buffer while a peer may still write into it. */
  NCCL_CHECK(ncclAllReduce(c, c, 1, ncclInt32, ncclSum, comm, 0));
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaFree(c));
  NCCL_CHECK(ncclDevCommDestroy(comm, &devComm));
  NCCL_CHECK(ncclCommDestroy(comm));
  comm = NULL;
  if (host.wrong != 0 || failures != 0) {
    printf("FAIL lla2a rank %d: %d wrong elements, %d failed checks\n", rank, host.wrong, failures);
    return 1;
  }
  printf("PASS lla2a rank %d: %llu epochs on %d LL blocks (CTA and warp sessions), elements of 4, 8 and 20 bytes\n",
         rank, host.epochs, kLLBlocks);
  return 0;
}

#endif /* !__CUDACC_RTC__ */
