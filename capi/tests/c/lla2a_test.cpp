/* The device API's LL all-to-all (NCCL 2.30) through nccl_device.h, compiled as host C++ (the
 * header's functions then run on the CPU: a cooperative group is one thread) and run as
 * NRANKS processes on the host backend with RANK, NRANKS and NCCL_TEST_ID (the unique id in
 * hex) in the environment:
 *   - ncclLLA2ACalcSlots, ncclLLA2ACreateRequirement's requirement and its bad arguments;
 *   - ncclDevCommCreate places the buffer (aligned, inside the resource memory, zeroed);
 *   - 12 sessions on 3 blocks (thread, warp and CTA groups), 1 to 4 epochs each, over the LSA
 *     team: send + recv, bcast + recvUnrolled, send + recvReduce (sum), with elements of 4, 8,
 *     16 and 20 bytes (1 to 3 lines each); data fresh per run (from the unique id), per epoch
 *     and per pair, checked exactly; the epoch saved in each block's header after each session;
 *     a rank arrives late each session, so peers run an epoch ahead into the other half;
 *   - the 32-bit epoch wrapping (stale lines planted with the epochs after the wrap must not
 *     pass for data: the halves are cleared at the wrap);
 *   - the abort flag ends a receive nobody answers.
 * Prints one line per failed check and a closing "N passed, M failed" line. */
#include "nccl_device.h"
#include "test_util.h"

#include <stdint.h>
#include <unistd.h>

static const int kElts = 37; /* elements each rank sends each peer per epoch */
static const int kMaxRanks = 4;
static const int kBlocks = 5; /* 0-2: the sessions, 3: the wrap, 4: the abort */

/* Same on every rank, new each run: from the unique id. */
static uint32_t seed = 0;

static uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

/* Word w of element e that `src` sends `dst` (-1: a bcast) in round `round`. */
static uint32_t dataWord(int src, int dst, uint32_t round, int e, int w) {
  return mix(seed ^ mix((uint32_t)src * 0x9E3779B1u ^ mix((uint32_t)(dst + 1) * 0x85ebca6bu ^
                                                          mix(round * 0xc2b2ae35u ^ mix((uint32_t)e * 64 + w)))));
}

struct Mid { /* 16 bytes: two lines */
  uint64_t a, b;
};
struct Big { /* 20 bytes: three lines, the last one half padding */
  uint32_t w[5];
};

template <typename T>
static T element(int src, int dst, uint32_t round, int e) {
  uint32_t words[(sizeof(T) + 3) / 4];
  for (size_t w = 0; w < sizeof words / 4; w++) words[w] = dataWord(src, dst, round, e, (int)w);
  T v;
  memcpy(&v, words, sizeof v);
  return v;
}

template <typename T>
static bool same(T const& a, T const& b) {
  return memcmp(&a, &b, sizeof(T)) == 0;
}

/* Word-wise sum mod 2^32 (recvReduce's fold). */
template <typename T>
struct AddWords {
  T operator()(T a, T b) const {
    uint32_t x[sizeof(T) / 4], y[sizeof(T) / 4];
    memcpy(x, &a, sizeof a);
    memcpy(y, &b, sizeof b);
    for (size_t i = 0; i < sizeof(T) / 4; i++) x[i] += y[i];
    memcpy(&a, x, sizeof a);
    return a;
  }
};
template <typename T>
struct Identity {
  T operator()(T v) const { return v; }
};

/* 4-byte elements fold into a 64-bit accumulator (recvReduce's Acc differs from its Elt). */
struct Widen {
  uint64_t operator()(uint32_t v) const { return v; }
};
struct Add64 {
  uint64_t operator()(uint64_t a, uint64_t b) const { return a + b; }
};

template <typename T>
struct Fold {
  typedef T Acc;
  static Acc acc(T v) { return v; }
  template <typename S>
  static Acc reduce(S& s, int e, int n) {
    return s.template recvReduce<2, T>(e, n, kElts, Identity<T>(), AddWords<T>());
  }
  static Acc add(Acc a, T v) { return AddWords<T>()(a, v); }
};
template <>
struct Fold<uint32_t> {
  typedef uint64_t Acc;
  static Acc acc(uint32_t v) { return v; }
  template <typename S>
  static Acc reduce(S& s, int e, int n) {
    return s.template recvReduce<4, uint32_t>(e, n, kElts, Widen(), Add64());
  }
  static Acc add(Acc a, uint32_t v) { return a + v; }
};

/* Sends element e of this epoch to every rank of the team (slot base + rank * kElts + e). */
template <typename T, typename Coop>
static void sendAll(ncclLLA2ASession<Coop>& s, int me, int n, uint32_t round, int base) {
  for (int e = 0; e < kElts; e++)
    for (int i = 0; i < n; i++) {
      int peer = (me + 1 + i) % n;
      s.send(peer, base + me * kElts + e, element<T>(me, peer, round, e));
    }
}

/* One epoch of one of four kinds (round % 4) in slots base.. base + n * kElts - 1; returns
 * the wrong elements. */
template <typename T, typename Coop>
static int epoch(ncclLLA2ASession<Coop>& s, int me, int n, uint32_t round, int base) {
  int wrong = 0;
  switch (round % 4) {
    case 0: /* send + recv, one element at a time */
      sendAll<T>(s, me, n, round, base);
      for (int p = 0; p < n; p++)
        for (int e = 0; e < kElts; e++)
          wrong += !same(s.template recv<T>(base + p * kElts + e), element<T>(p, me, round, e));
      break;
    case 1: /* bcast + recvUnrolled: element e of every rank at once (stride kElts) */
      for (int e = 0; e < kElts; e++) s.bcast(base + me * kElts + e, element<T>(me, -1, round, e));
      for (int e = 0; e < kElts; e++) {
        T got[kMaxRanks];
        s.template recvUnrolled<1, kMaxRanks>(base + e, n, kElts, got);
        for (int p = 0; p < n; p++) wrong += !same(got[p], element<T>(p, -1, round, e));
      }
      break;
    default: { /* send + recvReduce: the sum over the senders of element e */
      sendAll<T>(s, me, n, round, base);
      for (int e = 0; e < kElts; e++) {
        typename Fold<T>::Acc want = Fold<T>::acc(element<T>(0, me, round, e));
        for (int p = 1; p < n; p++) want = Fold<T>::add(want, element<T>(p, me, round, e));
        typename Fold<T>::Acc got = Fold<T>::reduce(s, base + e, n);
        wrong += !same(got, want);
      }
      break;
    }
  }
  s.endEpoch(s.coop);
  return wrong;
}

/* Elements per slot range: two ranges of nranks * kElts slots (the lower and the upper). */
static int maxElts(void) { return 2 * nranks * kElts; }

/* A session of `epochs` epochs on `block`, rounds from *round on, in the lower or upper
 * range of slots. */
template <typename T, typename Coop>
static int session(ncclDevComm const& dev, ncclLLA2AHandle h, int block, int epochs, uint32_t* round, int upper) {
  ncclTeam lsa = ncclTeamLsa(dev);
  ncclLLA2ASession<Coop> s(Coop(), dev, lsa, h, (uint32_t)block, maxElts());
  int wrong = 0;
  for (int i = 0; i < epochs; i++) wrong += epoch<T>(s, lsa.rank, lsa.nRanks, (*round)++, upper * nranks * kElts);
  return wrong;
}

template <typename Coop>
static int sessionOf(int type, ncclDevComm const& dev, ncclLLA2AHandle h, int block, int epochs, uint32_t* round,
                     int upper) {
  switch (type) {
    case 0: return session<uint32_t, Coop>(dev, h, block, epochs, round, upper);
    case 1: return session<uint64_t, Coop>(dev, h, block, epochs, round, upper);
    case 2: return session<Mid, Coop>(dev, h, block, epochs, round, upper);
    default: return session<Big, Coop>(dev, h, block, epochs, round, upper);
  }
}

static void test_requirement_arguments(void) {
  CHECK(ncclLLA2ACalcSlots(10, 12) == 20 && ncclLLA2ACalcSlots(3, 8) == 3 && ncclLLA2ACalcSlots(0, 4) == 0 &&
            ncclLLA2ACalcSlots(7, 1) == 7 && ncclLLA2ACalcSlots(5, 17) == 15,
        "ncclLLA2ACalcSlots %d %d %d", ncclLLA2ACalcSlots(10, 12), ncclLLA2ACalcSlots(3, 8), ncclLLA2ACalcSlots(5, 17));
  ncclLLA2AHandle_t h;
  ncclDevResourceRequirements_t rq;
  INVALID(ncclLLA2ACreateRequirement(1, 4, NULL, &rq));
  CHECK(strstr(ncclGetLastError(NULL), "NULL") != NULL, "NULL message: %s", ncclGetLastError(NULL));
  INVALID(ncclLLA2ACreateRequirement(1, 4, &h, NULL));
  INVALID(ncclLLA2ACreateRequirement(0, 4, &h, &rq));
  CHECK(strstr(ncclGetLastError(NULL), "nBlocks 0") != NULL, "nBlocks message: %s", ncclGetLastError(NULL));
  INVALID(ncclLLA2ACreateRequirement(-3, 4, &h, &rq));
  INVALID(ncclLLA2ACreateRequirement(2, 0, &h, &rq));
  INVALID(ncclLLA2ACreateRequirement(2, -1, &h, &rq));
  /* 2^20 blocks of 1024 slots: 34 GB per rank; INT_MAX of each overflows 32 bits many times. */
  INVALID(ncclLLA2ACreateRequirement(1 << 20, 1024, &h, &rq));
  CHECK(strstr(ncclGetLastError(NULL), "4 GiB") != NULL, "size message: %s", ncclGetLastError(NULL));
  INVALID(ncclLLA2ACreateRequirement(INT_MAX, INT_MAX, &h, &rq));
  /* A good one: NCCL's size and alignment, the handle's slots, its bufHandle the output. */
  memset(&rq, 0xab, sizeof rq);
  memset(&h, 0xab, sizeof h);
  OK(ncclLLA2ACreateRequirement(3, 10, &h, &rq));
  CHECK(rq.bufferSize == (size_t)(3 * (1 + 2 * 10) * 16) && rq.bufferAlign == 16 && rq.next == NULL &&
            rq.outBufferHandle == &h.bufHandle && rq.ginSignalCount == 0 && rq.ginCounterCount == 0 &&
            rq.outGinSignalStart == NULL && rq.outGinCounterStart == NULL && h.nSlots == 10,
        "requirement: %zu bytes aligned %zu, handle out %d, nSlots %u", rq.bufferSize, rq.bufferAlign,
        rq.outBufferHandle == &h.bufHandle, h.nSlots);
}

int main(void) {
  ncclUniqueId id;
  read_rank_env("NCCL_TEST_ID", &id);
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) seed = mix(seed ^ (uint8_t)id.internal[i]);
  ncclComm_t comm = NULL;
  OK(ncclCommInitRank(&comm, nranks, id, rank));
  if (nranks > kMaxRanks) {
    printf("rank %d: at most %d ranks\n", rank, kMaxRanks);
    return 2;
  }

  test_requirement_arguments();

  /* The buffer (two ranges of 20-byte elements from every rank), an LSA barrier, and a second
   * requirement after it, to see the placement. */
  const int nSlots = ncclLLA2ACalcSlots(maxElts(), (int)sizeof(Big));
  ncclLLA2AHandle_t h;
  ncclDevResourceRequirements_t a2aReq;
  OK(ncclLLA2ACreateRequirement(kBlocks, nSlots, &h, &a2aReq));
  ncclDevResourceHandle_t after = 0;
  ncclDevResourceRequirements_t afterReq;
  memset(&afterReq, 0, sizeof afterReq);
  afterReq.bufferSize = 64;
  afterReq.bufferAlign = 64;
  afterReq.outBufferHandle = &after;
  a2aReq.next = &afterReq;
  ncclDevCommRequirements_t reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  reqs.lsaBarrierCount = 1;
  reqs.resourceRequirementsList = &a2aReq;
  ncclDevComm_t dev;
  memset(&dev, 0, sizeof dev);
  OK(ncclDevCommCreate(comm, &reqs, &dev));
  if (failed) return finish(); /* no buffer to run sessions on */
  CHECK(dev.lsaSize == nranks && dev.lsaRank == rank, "LSA team %d of %d", dev.lsaRank, dev.lsaSize);
  const size_t bytes = (size_t)kBlocks * (1 + 2 * nSlots) * 16;
  CHECK(h.bufHandle % 16 == 0 && h.bufHandle + bytes <= after && after + 64 <= dev.resourceBytes,
        "layout: LL buffer at %u (%zu bytes), next at %u, of %llu", h.bufHandle, bytes, after, dev.resourceBytes);
  {
    const unsigned char* mem = (const unsigned char*)ncclGetResourceBufferLocalPointer(dev, h.bufHandle);
    int nonzero = 0;
    for (int b = 0; b < kBlocks; b++)
      for (int i = 0; i < 16; i++) nonzero += mem[(size_t)b * (1 + 2 * nSlots) * 16 + i] != 0;
    CHECK(nonzero == 0, "the blocks' header lines start zeroed (%d bytes are not)", nonzero);
  }
  const uint32_t* headers = (const uint32_t*)ncclGetResourceBufferLocalPointer(dev, h.bufHandle);
  uint32_t ended[kBlocks] = {0, 0, 0, 0, 0}; /* epochs ended per block */
  uint32_t rounds[kBlocks] = {0, 0, 0, 0, 0};

  /* 12 sessions: block s % 3 with its own group kind, element type s % 4, 1 to 4 epochs, the
   * lower or upper range of slots. */
  int wrong = 0;
  for (int s = 0; s < 12; s++) {
    const int block = s % 3, type = s % 4, epochs = 1 + (s * 7) % 4, upper = (s / 3) % 2;
    if (rank == s % nranks) usleep(2000); /* the others run ahead */
    int w;
    switch (block) {
      case 0: w = sessionOf<ncclCoopThread>(type, dev, h, block, epochs, &rounds[block], upper); break;
      case 1: w = sessionOf<ncclCoopWarp>(type, dev, h, block, epochs, &rounds[block], upper); break;
      default: w = sessionOf<ncclCoopCta>(type, dev, h, block, epochs, &rounds[block], upper); break;
    }
    ended[block] += epochs;
    if (w) printf("rank %d: session %d (block %d, %d-byte elements): %d wrong elements\n", rank, s, block,
                  type == 0 ? 4 : type == 1 ? 8 : type == 2 ? 16 : 20, w);
    wrong += w;
    const uint32_t saved = headers[(size_t)block * (1 + 2 * nSlots) * 4];
    CHECK(saved == ended[block], "session %d: block %d saved epoch %u (+2), expected %u", s, block, saved,
          ended[block]);
  }
  CHECK(wrong == 0, "%d wrong elements in the sessions", wrong);
  CHECK(rounds[0] + rounds[1] + rounds[2] == 30, "%u epochs in all", rounds[0] + rounds[1] + rounds[2]);

  /* The wrap: block 3 starts 2 epochs before the 32-bit epoch wraps (every rank the same), with
   * stale lines planted in both halves carrying the first epochs after the wrap (2 in the even
   * half, 3 in the odd one), as lines written 2^32 epochs ago would. The two epochs before the
   * wrap use the upper range of slots, the ones after it the lower range, where nothing was
   * written since the planting: unless the wrap clears the halves, epochs 2 and 3 take the
   * stale lines for data. Rank 0 waits 20 ms before sending in those epochs, so that the
   * other ranks read before its data is there. */
  {
    rustccl_device::LLLine* blk =
        (rustccl_device::LLLine*)ncclGetResourceBufferLocalPointer(dev, h.bufHandle) + 3 * (1 + 2 * nSlots);
    for (int i = 0; i < 2 * nSlots; i++)
      rustccl_device::storeLine(blk + 1 + i, 0xdeadbeefu, 0xdeadbeefu, i < nSlots ? 2 : 3);
    rustccl_device::storeRelaxed(&blk->lo, 0xfffffffcu); /* epoch 0xfffffffe next */
    ncclLsaBarrierSession<ncclCoopThread> bar(ncclCoopThread(), dev, ncclTeamTagLsa(), 0);
    bar.sync(ncclCoopThread()); /* nobody sends into block 3 before every rank planted its lines */
  }
  {
    ncclTeam lsa = ncclTeamLsa(dev);
    ncclLLA2ASession<ncclCoopThread> s(ncclCoopThread(), dev, lsa, h, 3, maxElts());
    CHECK(s.epoch == 0xfffffffeu, "wrap session starts at epoch %#x", s.epoch);
    int w = 0;
    uint32_t seen[6];
    for (int i = 0; i < 6; i++) {
      seen[i] = s.epoch;
      if (rank == 0 && (s.epoch == 2 || s.epoch == 3)) usleep(20000);
      const int base = i < 2 ? nranks * kElts : 0;
      w += epoch<uint64_t>(s, lsa.rank, lsa.nRanks, 1000 + 4 * (uint32_t)i, base); /* send + recv */
    }
    CHECK(seen[0] == 0xfffffffeu && seen[1] == 0xffffffffu && seen[2] == 2 && seen[3] == 3 && seen[4] == 4 &&
              seen[5] == 5,
          "epochs across the wrap: %#x %#x %u %u %u %u", seen[0], seen[1], seen[2], seen[3], seen[4], seen[5]);
    CHECK(w == 0, "%d wrong elements across the epoch's wrap (stale lines taken for data?)", w);
  }
  CHECK(headers[(size_t)3 * (1 + 2 * nSlots) * 4] == 4, "block 3 saved epoch %u (+2) after the wrap, expected 4",
        headers[(size_t)3 * (1 + 2 * nSlots) * 4]);

  /* The abort flag ends a receive nobody answers (block 4: nobody sends there). */
  {
    unsigned int flag = 1;
    ncclDevComm_t aborting = dev;
    aborting.abortFlag = &flag;
    ncclLLA2ASession<ncclCoopThread> s(ncclCoopThread(), aborting, ncclTeamLsa(aborting), h, 4, maxElts());
    (void)s.recv<uint64_t>(0);
    CHECK(1, "a receive with the abort flag set returned");
  }

  /* Nobody destroys its device communicator while a peer may still send into it. */
  {
    ncclLsaBarrierSession<ncclCoopThread> bar(ncclCoopThread(), dev, ncclTeamTagLsa(), 0);
    bar.sync(ncclCoopThread());
  }
  OK(ncclDevCommDestroy(comm, &dev));
  OK(ncclCommDestroy(comm));
  return finish();
}
