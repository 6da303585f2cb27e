/* A user kernel on rustccl's device API: compiled by nvcc against capi/include/nccl_device.h
 * (tests/gpu/symmetric.sh, section devcomm) and run as NRANKS processes on one GPU (under MPS)
 * with RANK, NRANKS and NCCL_COMM_ID=host:port set: every rank calls ncclGetUniqueId and gets
 * the same id (rank 0 starts the root there at init).
 *
 *   nvcc -O2 -arch=native -I capi/include -o /tmp/devcomm_kernel tests/gpu/devcomm_kernel.cu \
 *        -L target/gpu -lnccl -lcuda
 *
 * Each rank allocates 1 MiB with ncclMemAlloc, registers it as a symmetric window, checks that
 * a multimem requirement is refused (ncclInvalidArgument, as NCCL without NVLS), makes a device communicator with one
 * LSA barrier per block, and launches kernel<<<4, 256>>>. Each round, block b writes a pattern of
 * (rank, round, word) into slice b of its own window (ncclGetLocalPointer), syncs LSA barrier b
 * with every peer's block b, reads slice b of every LSA peer's window (ncclGetLsaPointer) and
 * counts the words that are not that peer's pattern of this round, then syncs again before the
 * next round overwrites. The syncs take turns: sync(coop), sync(coop, cuda::memory_order) when
 * <cuda/atomic> is there, and arrive then wait. 1000 rounds, then a second launch of 10 more
 * rounds (the barriers' epochs carry over from one kernel to the next). Afterwards the user
 * buffer must hold this rank's last pattern (the local pointer is the buffer).
 *
 * Prints "RESULT devcomm rank R: <rounds> rounds, <wrong> wrong" and exits 1 when a word was
 * wrong or a check failed (FAIL lines); a failing CUDA or NCCL call prints its error and exits 2.
 *
 * The kernel (everything outside the host part) also compiles under NVRTC. */
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
  kBytes = 1 << 20,
  kWords = kBytes / 4,
  kSliceWords = kWords / kBlocks, /* each block's part of the window */
  kRounds = 1000,
  kMoreRounds = 10
};

/* What `rank` writes into word `i` of its window in round `round`. */
__host__ __device__ inline uint32_t pattern(int rank, int round, uint32_t i) {
  return (uint32_t)rank * 0x9E3779B1u + (uint32_t)round * 2654435761u + i;
}

/* The first wrong word seen: set, round, LSA peer, word, got, expected. */
struct FirstWrong {
  int set, round, peer;
  unsigned int word, got, want;
};

/* One barrier sync, in the form round % 3 picks. */
__device__ inline void syncRound(ncclLsaBarrierSession<ncclCoopCta>& bar, int round) {
  switch (round % 3) {
#if defined(NCCL_DEVICE_HAS_CUDA_ATOMIC)
    case 1:
      bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
      break;
#endif
    case 2:
      bar.arrive(ncclCoopCta());
      bar.wait(ncclCoopCta());
      break;
    default:
      bar.sync(ncclCoopCta());
      break;
  }
}

__global__ void exchange(ncclDevComm devComm, ncclWindow_t win, int firstRound, int rounds, int* errors,
                         FirstWrong* first) {
  const int block = blockIdx.x;
  const size_t sliceBytes = (size_t)kSliceWords * sizeof(uint32_t);
  const size_t offset = (size_t)block * sliceBytes;
  const uint32_t firstWord = (uint32_t)block * kSliceWords;
  uint32_t* mine = (uint32_t*)ncclGetLocalPointer(win, offset);
  ncclTeam lsa = ncclTeamLsa(devComm);
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), devComm, ncclTeamTagLsa(), (uint32_t)block);
  int wrong = 0;
  for (int round = firstRound; round < firstRound + rounds; round++) {
    for (int i = threadIdx.x; i < kSliceWords; i += blockDim.x) mine[i] = pattern(devComm.rank, round, firstWord + i);
    syncRound(bar, round);
    for (int p = 0; p < devComm.lsaSize; p++) {
      const uint32_t* theirs = (const uint32_t*)ncclGetLsaPointer(win, offset, p);
      const int peerRank = ncclTeamRankToWorld(devComm, lsa, p);
      for (int i = threadIdx.x; i < kSliceWords; i += blockDim.x) {
        const uint32_t got = theirs[i], want = pattern(peerRank, round, firstWord + i);
        if (got != want) {
          wrong++;
          if (atomicCAS(&first->set, 0, 1) == 0) {
            first->round = round;
            first->peer = p;
            first->word = firstWord + i;
            first->got = got;
            first->want = want;
          }
        }
      }
    }
    /* Nobody writes the next round's pattern while a peer still reads this one. */
    syncRound(bar, round + 1);
  }
  if (wrong) atomicAdd(errors, wrong);
}

#ifndef __CUDACC_RTC__

static int rank = 0, nranks = 1, failures = 0;
static ncclComm_t comm = NULL;

#define CUDA_CHECK(call)                                                                                        \
  do {                                                                                                          \
    cudaError_t e_ = (call);                                                                                    \
    if (e_ != cudaSuccess) {                                                                                    \
      printf("ERROR devcomm rank %d %s:%d: %s -> %s (%s)\n", rank, __FILE__, __LINE__, #call, cudaGetErrorName(e_), \
             cudaGetErrorString(e_));                                                                           \
      fflush(stdout);                                                                                           \
      exit(2);                                                                                                  \
    }                                                                                                           \
  } while (0)

#define NCCL_CHECK(call)                                                                                        \
  do {                                                                                                          \
    ncclResult_t r_ = (call);                                                                                   \
    if (r_ != ncclSuccess) {                                                                                    \
      printf("ERROR devcomm rank %d %s:%d: %s -> %s (%s)\n", rank, __FILE__, __LINE__, #call,                  \
             ncclGetErrorString(r_), ncclGetLastError(comm));                                                   \
      fflush(stdout);                                                                                           \
      exit(2);                                                                                                  \
    }                                                                                                           \
  } while (0)

#define EXPECT(cond, ...)                                                     \
  do {                                                                        \
    if (!(cond)) {                                                            \
      failures++;                                                             \
      printf("FAIL devcomm rank %d %s:%d: ", rank, __FILE__, __LINE__);       \
      printf(__VA_ARGS__);                                                    \
      printf("\n");                                                           \
      fflush(stdout);                                                         \
    }                                                                         \
  } while (0)

int main() {
  const char* r = getenv("RANK");
  const char* n = getenv("NRANKS");
  if (!r || !n) {
    printf("ERROR devcomm: set RANK and NRANKS (and NCCL_COMM_ID=host:port with more than one rank)\n");
    return 2;
  }
  rank = atoi(r);
  nranks = atoi(n);
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    printf("ERROR devcomm: RANK %d, NRANKS %d\n", rank, nranks);
    return 2;
  }
  if (nranks > 1 && !getenv("NCCL_COMM_ID")) {
    printf("ERROR devcomm rank %d: set NCCL_COMM_ID=host:port (every rank derives the unique id from it)\n", rank);
    return 2;
  }
  CUDA_CHECK(cudaSetDevice(0)); /* the ranks share one GPU (under MPS) */

  /* With NCCL_COMM_ID set, every rank gets the same id from ncclGetUniqueId. */
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  NCCL_CHECK(ncclCommInitRank(&comm, nranks, id, rank));

  void* buf = NULL;
  NCCL_CHECK(ncclMemAlloc(&buf, kBytes));
  CUDA_CHECK(cudaMemset(buf, 0, kBytes));
  CUDA_CHECK(cudaDeviceSynchronize());
  ncclWindow_t win = NULL;
  NCCL_CHECK(ncclCommWindowRegister(comm, buf, kBytes, &win, NCCL_WIN_COLL_SYMMETRIC));
  if (win == NULL) {
    printf("ERROR devcomm rank %d: ncclCommWindowRegister gave no window\n", rank);
    return 2;
  }

  /* Multimem (NVLS) is not supported: refused before anything collective happens. */
  {
    ncclDevCommRequirements_t mm = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
    mm.lsaMultimem = true;
    mm.lsaBarrierCount = kBlocks;
    ncclDevComm_t unused;
    memset(&unused, 0, sizeof unused);
    ncclResult_t res = ncclDevCommCreate(comm, &mm, &unused);
    EXPECT(res == ncclInvalidArgument, "ncclDevCommCreate with lsaMultimem: %s (%d), expected ncclInvalidArgument (%s)",
           ncclGetErrorString(res), (int)res, ncclGetLastError(comm));
    if (res == ncclSuccess) NCCL_CHECK(ncclDevCommDestroy(comm, &unused));
  }

  ncclDevCommRequirements_t reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  reqs.lsaBarrierCount = kBlocks; /* one per block */
  ncclDevComm_t devComm;
  memset(&devComm, 0, sizeof devComm);
  NCCL_CHECK(ncclDevCommCreate(comm, &reqs, &devComm));
  printf("devcomm rank %d: rank %d of %d, LSA rank %d of %d, %d LSA barriers\n", rank, devComm.rank, devComm.nRanks,
         devComm.lsaRank, devComm.lsaSize, devComm.lsaBarrier.nBarriers);
  EXPECT(devComm.rank == rank && devComm.nRanks == nranks, "device communicator rank %d of %d", devComm.rank,
         devComm.nRanks);
  EXPECT(devComm.lsaSize == nranks && devComm.lsaRank == rank,
         "LSA team: rank %d of %d, expected every rank (they share a GPU): peers' windows are not read", devComm.lsaRank,
         devComm.lsaSize);
  EXPECT(devComm.lsaBarrier.nBarriers >= kBlocks, "%d LSA barriers, asked for %d", devComm.lsaBarrier.nBarriers,
         kBlocks);
  if (devComm.lsaBarrier.nBarriers < kBlocks || devComm.lsaSize < 1 || devComm.lsaRank < 0 ||
      devComm.lsaRank >= devComm.lsaSize) {
    printf("ERROR devcomm rank %d: cannot launch with this device communicator\n", rank);
    return 2;
  }
  /* The header's window pointers agree with the library's. */
  for (int p = 0; p < devComm.lsaSize; p++) {
    void* viaLib = NULL;
    NCCL_CHECK(ncclGetLsaDevicePointer(win, 4096, p, &viaLib));
    EXPECT(ncclGetLsaPointer(win, 4096, p) == viaLib, "LSA peer %d: header pointer %p, library pointer %p", p,
           ncclGetLsaPointer(win, 4096, p), viaLib);
  }

  int* errors = NULL;
  FirstWrong* first = NULL;
  CUDA_CHECK(cudaMalloc((void**)&errors, sizeof(int)));
  CUDA_CHECK(cudaMalloc((void**)&first, sizeof(FirstWrong)));
  CUDA_CHECK(cudaMemset(errors, 0, sizeof(int)));
  CUDA_CHECK(cudaMemset(first, 0, sizeof(FirstWrong)));

  exchange<<<kBlocks, kThreads>>>(devComm, win, 0, kRounds, errors, first);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  /* A second kernel: the barriers go on from the epochs the first one left. */
  exchange<<<kBlocks, kThreads>>>(devComm, win, kRounds, kMoreRounds, errors, first);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  const int rounds = kRounds + kMoreRounds;

  int wrong = 0;
  FirstWrong fw;
  CUDA_CHECK(cudaMemcpy(&wrong, errors, sizeof(int), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(&fw, first, sizeof(FirstWrong), cudaMemcpyDeviceToHost));
  if (fw.set)
    printf("FAIL devcomm rank %d: first wrong word: round %d, LSA peer %d, word %u: 0x%08x, expected 0x%08x\n", rank,
           fw.round, fw.peer, fw.word, fw.got, fw.want);

  /* The user buffer holds what the kernel wrote through the local pointer (the last round). */
  uint32_t* host = (uint32_t*)malloc(kBytes);
  if (!host) {
    printf("ERROR devcomm rank %d: malloc\n", rank);
    return 2;
  }
  CUDA_CHECK(cudaMemcpy(host, buf, kBytes, cudaMemcpyDeviceToHost));
  int stale = 0;
  for (uint32_t i = 0; i < (uint32_t)kWords; i++) stale += host[i] != pattern(rank, rounds - 1, i);
  EXPECT(stale == 0, "%d words of the user buffer are not the last round's pattern (word 0: 0x%08x, expected 0x%08x)",
         stale, host[0], pattern(rank, rounds - 1, 0));
  free(host);

  printf("RESULT devcomm rank %d: %d rounds, %d wrong\n", rank, rounds, wrong);
  fflush(stdout);

  CUDA_CHECK(cudaFree(errors));
  CUDA_CHECK(cudaFree(first));
  NCCL_CHECK(ncclDevCommDestroy(comm, &devComm));
  NCCL_CHECK(ncclCommWindowDeregister(comm, win));
  NCCL_CHECK(ncclMemFree(buf));
  NCCL_CHECK(ncclCommDestroy(comm));
  comm = NULL;
  if (wrong != 0 || failures != 0) {
    printf("devcomm rank %d: FAILED (%d wrong words, %d failed checks)\n", rank, wrong, failures);
    return 1;
  }
  printf("devcomm rank %d: ok\n", rank);
  return 0;
}

#endif /* !__CUDACC_RTC__ */
