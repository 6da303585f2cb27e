/* Device communicators through nccl_device.h, compiled as host C++ (the header's functions
 * then run on the CPU) and run as NRANKS processes on the host backend with RANK, NRANKS and
 * NCCL_TEST_ID (the unique id in hex) in the environment: requirements and their layout, the
 * resource memory of every rank, window pointers, 100 rounds of write / LSA barrier / read of
 * every peer's window (a broken barrier shows as a stale pattern), the abort flag, and the
 * bad inputs. Prints one line per failed check and a closing "N passed, M failed" line. */
#include "nccl_device.h"
#include "test_util.h"

#include <stdint.h>
#include <unistd.h>

#define USAGE(call) CHECK((call) == ncclInvalidUsage, "%s should be ncclInvalidUsage (%s)", #call, ncclGetLastError(NULL))
/* The last error of comm names what it must. */
#define SAYS(comm, text) \
  CHECK(strstr(ncclGetLastError(comm), text) != NULL, "last error should say \"%s\": %s", text, ncclGetLastError(comm))

static const int kWords = 1024; /* 4 KiB of pattern per rank */

static uint32_t pattern(int r, int round, int i) {
  return (uint32_t)r * 0x9E3779B1u + (uint32_t)round * 2654435761u + (uint32_t)i;
}

/* Requirements that must be refused before anything collective happens. */
static void test_bad_requirements(ncclComm_t comm) {
  ncclDevComm_t dev;
  ncclDevCommRequirements_t reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  INVALID(ncclDevCommCreate(comm, NULL, &dev));
  INVALID(ncclDevCommCreate(comm, &reqs, NULL));
  INVALID(ncclDevCommCreate(NULL, &reqs, &dev));
  /* Multimem (NVLS) and GIN: rustccl drives neither, and refuses them with NCCL 2.28.9's codes
   * for a system without them (multimem ncclInvalidArgument, GIN ncclInvalidUsage), naming the
   * hardware. */
  {
    ncclDevCommRequirements_t r = reqs;
    r.lsaMultimem = true;
    INVALID(ncclDevCommCreate(comm, &r, &dev));
    SAYS(comm, "lsaMultimem");
    SAYS(comm, "NVLink SHARP multicast (NVLS)");
  }
  {
    ncclTeamRequirements_t tr, tr2;
    memset(&tr, 0, sizeof tr);
    memset(&tr2, 0, sizeof tr2);
    tr.team = ncclTeamLsa(comm);
    tr.next = &tr2;
    tr2.team = ncclTeamWorld(comm);
    tr2.multimem = true;
    ncclDevCommRequirements_t r = reqs;
    r.teamRequirementsList = &tr;
    INVALID(ncclDevCommCreate(comm, &r, &dev));
    SAYS(comm, "team requirement 1");
    SAYS(comm, "NVLS");
  }
  {
    ncclDevCommRequirements_t r = reqs;
    r.ginSignalCount = 1;
    USAGE(ncclDevCommCreate(comm, &r, &dev));
    SAYS(comm, "reqs->ginSignalCount");
    SAYS(comm, "GIN (GPU-initiated networking)");
    SAYS(comm, "GIN-capable network");
    r = reqs;
    r.ginCounterCount = 1;
    USAGE(ncclDevCommCreate(comm, &r, &dev));
    r = reqs;
    r.railGinBarrierCount = 2;
    USAGE(ncclDevCommCreate(comm, &r, &dev));
    r = reqs;
    r.worldGinBarrierCount = 1;
    USAGE(ncclDevCommCreate(comm, &r, &dev));
    r = reqs;
    r.ginConnectionType = NCCL_GIN_CONNECTION_RAIL;
    USAGE(ncclDevCommCreate(comm, &r, &dev));
    r = reqs;
    r.ginConnectionType = NCCL_GIN_CONNECTION_CUSTOM_STRIDE; /* 2.31 */
    r.ginCustomStride = 2;
    USAGE(ncclDevCommCreate(comm, &r, &dev));
    SAYS(comm, "reqs->ginConnectionType");
    r = reqs;
    r.ginForceEnable = true;
    USAGE(ncclDevCommCreate(comm, &r, &dev));
    SAYS(comm, "ginForceEnable");
    /* Both: GIN is refused first, as NCCL checks it first. */
    r.lsaMultimem = true;
    USAGE(ncclDevCommCreate(comm, &r, &dev));
    SAYS(comm, "GIN");
    /* The GIN hints that ask for nothing are ignored; so are the LL all-to-all counts, as NCCL
     * ignores them (this device communicator works, and is destroyed). */
    r = reqs;
    r.ginContextCount = 8;
    r.ginQueueDepth = 64;
    r.lsaLLA2ABlockCount = 1;
    r.lsaLLA2ASlotCount = 16;
    /* 2.31's GIN hints ask for nothing without a GIN connection either (as NCCL: the backend
     * and stride only choose among GIN connections). */
    r.ginExclusiveContexts = true;
    r.ginCustomStride = 4;
    r.ginType = NCCL_GIN_TYPE_GDAKI;
    r.ginStrongSignalsRequired = false;
    OK(ncclDevCommCreate(comm, &r, &dev));
    OK(ncclDevCommDestroy(comm, &dev));
  }
  /* CFT (2.31: cftCaps, cftBarrierCount): no logical endpoints here, so ncclInvalidArgument,
   * as NCCL on a GPU without CFT support, before anything is made. */
  {
    ncclDevCommRequirements_t r = reqs;
    CHECK(sizeof r == 120 && r.cftCaps == NCCL_CFT_NONE && r.ginCustomStride == 1 && r.ginType == NCCL_GIN_TYPE_NONE &&
              !r.useRuntimeVersion && r.cftBarrierCount == 0,
          "2.32 requirements and their initializer (%zu bytes)", sizeof r);
    r.cftCaps = NCCL_CFT;
    INVALID(ncclDevCommCreate(comm, &r, &dev));
    SAYS(comm, "reqs->cftCaps = 1");
    r.cftCaps = NCCL_CFT | NCCL_CFT_MULTIMEM;
    INVALID(ncclDevCommCreate(comm, &r, &dev));
    r = reqs;
    r.cftBarrierCount = 2;
    INVALID(ncclDevCommCreate(comm, &r, &dev));
    SAYS(comm, "reqs->cftBarrierCount = 2");
    SAYS(comm, "CFT");
  }
  {
    ncclGinBarrierHandle_t* noHandle = NULL;
    ncclDevResourceRequirements_t rq;
    USAGE(ncclGinBarrierCreateRequirement(comm, ncclTeamRail(comm), 1, noHandle, &rq));
    SAYS(comm, "GIN (GPU-initiated networking)");
    /* LL all-to-all: its slot count as NCCL computes it; a NULL handle is refused (its sessions:
     * lla2a_test.cpp). */
    CHECK(ncclLLA2ACalcSlots(10, 12) == 20 && ncclLLA2ACalcSlots(3, 8) == 3 && ncclLLA2ACalcSlots(0, 4) == 0,
          "ncclLLA2ACalcSlots %d %d", ncclLLA2ACalcSlots(10, 12), ncclLLA2ACalcSlots(3, 8));
    INVALID(ncclLLA2ACreateRequirement(1, 4, NULL, &rq));
  }
  {
    ncclDevCommRequirements_t r = reqs;
    r.magic = 0;
    USAGE(ncclDevCommCreate(comm, &r, &dev));
    r = reqs;
    r.size = 16;
    INVALID(ncclDevCommCreate(comm, &r, &dev));
    r = reqs;
    r.lsaBarrierCount = -1;
    INVALID(ncclDevCommCreate(comm, &r, &dev));
  }
  {
    ncclDevResourceRequirements_t rr;
    memset(&rr, 0, sizeof rr);
    rr.bufferSize = 64;
    rr.bufferAlign = 24;
    ncclDevCommRequirements_t r = reqs;
    r.resourceRequirementsList = &rr;
    INVALID(ncclDevCommCreate(comm, &r, &dev));
    rr.bufferAlign = 16;
    rr.ginCounterCount = 1;
    USAGE(ncclDevCommCreate(comm, &r, &dev));
    SAYS(comm, "resource requirement 0");
    SAYS(comm, "GIN");
  }
  ncclLsaBarrierHandle_t h;
  ncclDevResourceRequirements_t rq;
  ncclTeam_t lsa = ncclTeamLsa(comm);
  INVALID(ncclLsaBarrierCreateRequirement(lsa, 0, &h, &rq));
  INVALID(ncclLsaBarrierCreateRequirement(lsa, 2, NULL, &rq));
  INVALID(ncclLsaBarrierCreateRequirement(lsa, 2, &h, NULL));
  ncclTeam_t empty = {0, 0, 1};
  INVALID(ncclLsaBarrierCreateRequirement(empty, 2, &h, &rq));
  ncclDevComm_t zero;
  memset(&zero, 0, sizeof zero);
  INVALID(ncclDevCommDestroy(comm, NULL));
  INVALID(ncclDevCommDestroy(comm, &zero));
}

/* 2.31's properties: the communicator's hash (the same on every rank: gathered and compared),
 * no GIN, and the size of the device communicator ncclDevCommCreate writes. A struct from a
 * 2.29/2.30 header (56 bytes) gets its own fields and nothing past them. */
static void test_properties_2_31(ncclComm_t comm, const ncclCommProperties_t& props) {
  CHECK(sizeof props == 144, "2.31 properties: %zu bytes", sizeof props);
  CHECK(props.commHash != 0, "commHash");
  CHECK(props.ginMinStride == 0 && props.ginConnectionType == NCCL_GIN_CONNECTION_NONE && props.railedGinType == NCCL_GIN_TYPE_NONE,
        "no GIN: stride %d, connection %d", props.ginMinStride, (int)props.ginConnectionType);
  int anyGin = 0;
  for (int t = 0; t < 64; t++) anyGin |= props.ginSupport[t];
  CHECK(!anyGin, "ginSupport all false");
  CHECK(props.devCommRuntimeVersionSize == sizeof(ncclDevComm_t), "devCommRuntimeVersionSize %zu, expected %zu",
        props.devCommRuntimeVersionSize, sizeof(ncclDevComm_t));
  unsigned long long* hashes = NULL;
  OK(ncclMemAlloc((void**)&hashes, 2 * 8 * nranks));
  hashes[0] = props.commHash;
  OK(ncclAllGather(hashes, hashes + nranks, 1, ncclUint64, comm, NULL)); /* host backend: done on return */
  for (int p = 0; p < nranks; p++)
    CHECK(hashes[nranks + p] == props.commHash, "rank %d's commHash %llx, this rank's %llx", p, hashes[nranks + p],
          props.commHash);
  OK(ncclMemFree(hashes));

  unsigned char old[144];
  memset(old, 0xee, sizeof old);
  ncclCommProperties_t init = NCCL_COMM_PROPERTIES_INITIALIZER;
  memcpy(old, &init, 24);
  size_t oldSize = 56;
  memcpy(old, &oldSize, sizeof oldSize);
  OK(ncclCommQueryProperties(comm, (ncclCommProperties_t*)old));
  ncclCommProperties_t got;
  memcpy(&got, old, sizeof got);
  int untouched = 1;
  for (size_t i = 56; i < sizeof old; i++) untouched &= old[i] == 0xee;
  CHECK(got.rank == rank && got.nRanks == nranks && got.deviceApiSupport && untouched,
        "a 56-byte (2.29/2.30) properties struct: rank %d, nothing written past it %d", got.rank, untouched);
}

/* What programs for NCCL >= 2.31 do (DeepEP, and others): ask for the runtime's layout and
 * allocate the device communicator with devCommRuntimeVersionSize bytes. Guard bytes past that
 * size catch a library writing more than it said. The device communicator then works. */
static void test_runtime_version_devcomm(ncclComm_t comm, const ncclCommProperties_t& props) {
  ncclDevCommRequirements_t reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  reqs.useRuntimeVersion = true;
  reqs.lsaBarrierCount = 1;
  size_t size = props.devCommRuntimeVersionSize;
  CHECK(size >= 24, "devCommRuntimeVersionSize %zu", size);
  const size_t guard = 256;
  unsigned char* mem = (unsigned char*)malloc(size + guard);
  memset(mem + size, 0x5a, guard);
  ncclDevComm_t* dc = (ncclDevComm_t*)mem;
  OK(ncclDevCommCreate(comm, &reqs, dc));
  int intact = 1;
  for (size_t i = 0; i < guard; i++) intact &= mem[size + i] == 0x5a;
  CHECK(intact, "ncclDevCommCreate wrote past devCommRuntimeVersionSize (%zu bytes)", size);
  if (size >= sizeof(ncclDevComm_t)) {
    CHECK(dc->magic == NCCL_API_MAGIC && dc->rank == rank && dc->nRanks == nranks && dc->lsaBarrier.nBarriers == 1,
          "runtime-version device communicator: rank %d of %d", dc->rank, dc->nRanks);
    {
      ncclLsaBarrierSession<ncclCoopThread> bar(ncclCoopThread(), *dc, ncclTeamTagLsa(), 0);
      bar.sync(ncclCoopThread());
    }
    OK(ncclDevCommDestroy(comm, dc));
  }
  free(mem);
}

/* Requirements from older headers are read up to their size: 2.30's (96 bytes) and 2.29.7's
 * (88), with 2.31 fields past that size asking for CFT, which are not read. */
static void test_older_requirements(ncclComm_t comm) {
  const size_t sizes[] = {96, 88};
  for (size_t size : sizes) {
    ncclDevCommRequirements_t r = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
    r.size = size;
    r.version = 23007;
    r.lsaBarrierCount = 2;
    r.cftCaps = NCCL_CFT; /* past size */
    r.cftBarrierCount = 3;
    if (size == 88) r.ginTrafficClass = 12345; /* past size: not read either */
    ncclDevComm_t dc;
    OK(ncclDevCommCreate(comm, &r, &dc));
    CHECK(dc.lsaBarrier.nBarriers == 2, "%zu-byte requirements: %d barriers", size, dc.lsaBarrier.nBarriers);
    OK(ncclDevCommDestroy(comm, &dc));
  }
}

int main(void) {
  ncclUniqueId id;
  read_rank_env("NCCL_TEST_ID", &id);
  ncclComm_t comm = NULL;
  OK(ncclCommInitRank(&comm, nranks, id, rank));

  test_bad_requirements(comm);

  /* A window every rank writes its pattern into. */
  uint32_t* buf = NULL;
  OK(ncclMemAlloc((void**)&buf, 2 * 4096));
  ncclWindow_t win = NULL;
  OK(ncclCommWindowRegister(comm, buf, 2 * 4096, &win, NCCL_WIN_DEFAULT));
  CHECK(win != NULL, "window handle");

  ncclTeam_t lsa = ncclTeamLsa(comm);
  CHECK(lsa.nRanks == nranks && lsa.rank == rank && lsa.stride == 1, "LSA team %d %d %d", lsa.nRanks, lsa.rank,
        lsa.stride);

  /* The communicator's properties (2.29). */
  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  OK(ncclCommQueryProperties(comm, &props));
  /* Host one-sided calls reach every rank here (host backend, one host). */
  CHECK(props.rank == rank && props.nRanks == nranks && props.deviceApiSupport && !props.multimemSupport &&
            props.ginType == NCCL_GIN_TYPE_NONE && props.nLsaTeams == 1 && props.hostRmaSupport,
        "properties: rank %d of %d, device API %d, multimem %d, gin %d, %d LSA teams, host RMA %d", props.rank,
        props.nRanks, props.deviceApiSupport, props.multimemSupport, (int)props.ginType, props.nLsaTeams,
        props.hostRmaSupport);
  INVALID(ncclCommQueryProperties(comm, NULL));
  test_properties_2_31(comm, props);
  ncclCommProperties_t bad = props;
  bad.magic = 0;
  USAGE(ncclCommQueryProperties(comm, &bad)); /* as NCCL, and as ncclDevCommCreate's magic */
  bad = props;
  bad.size = 16;
  INVALID(ncclCommQueryProperties(comm, &bad));

  /* Multicast pointers of a window (2.29): NULL, as NCCL's without multimem. */
  {
    void* mc = &props;
    OK(ncclGetLsaMultimemDevicePointer(win, 64, &mc));
    CHECK(mc == NULL, "LSA multimem pointer %p", mc);
    ncclMultimemHandle_t none = {NULL}, some = {(void*)&props};
    mc = &props;
    OK(ncclGetMultimemDevicePointer(win, 0, some, &mc));
    CHECK(mc == NULL, "multimem pointer %p", mc);
    INVALID(ncclGetMultimemDevicePointer(win, 0, none, &mc));
    INVALID(ncclGetLsaMultimemDevicePointer(NULL, 0, &mc));
    INVALID(ncclGetLsaMultimemDevicePointer(win, 0, NULL));
    INVALID(ncclGetLsaMultimemDevicePointer((ncclWindow_t)&props, 0, &mc));
  }

  /* Window flags: NCCL_WIN_STRICT_ORDERING (2.29; GIN's ordering) is accepted, an unknown bit is
   * not (collective: every rank passes the same). */
  {
    void* mem = NULL;
    OK(ncclMemAlloc(&mem, 4096));
    ncclWindow_t strict = NULL;
    OK(ncclCommWindowRegister(comm, mem, 4096, &strict, NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING));
    CHECK(strict != NULL, "strict-ordering window");
    OK(ncclCommWindowDeregister(comm, strict));
    ncclWindow_t unknown = NULL;
    INVALID(ncclCommWindowRegister(comm, mem, 4096, &unknown, 0x10)); /* 4 and 8 are 2.31/2.32's flags */
    OK(ncclMemFree(mem));
  }

  /* Requirements: a barrier of the caller's own (3 barriers over the LSA team) and 1000 bytes
   * aligned to 256. */
  ncclLsaBarrierHandle_t userBar;
  ncclDevResourceRequirements_t barReq;
  memset(&barReq, 0xab, sizeof barReq);
  OK(ncclLsaBarrierCreateRequirement(lsa, 3, &userBar, &barReq));
  CHECK(barReq.bufferSize == (size_t)(4 * 3 * (1 + nranks)) && barReq.bufferAlign == 16, "barrier requirement %zu %zu",
        barReq.bufferSize, barReq.bufferAlign);
  CHECK(barReq.outBufferHandle == &userBar.bufHandle && userBar.nBarriers == 3 && barReq.next == NULL &&
            barReq.ginSignalCount == 0 && barReq.outGinSignalStart == NULL,
        "barrier requirement fields");
  ncclDevResourceHandle_t extra = 0xffffffffu;
  ncclDevResourceRequirements_t extraReq;
  memset(&extraReq, 0, sizeof extraReq);
  extraReq.bufferSize = 1000;
  extraReq.bufferAlign = 256;
  extraReq.outBufferHandle = &extra;
  barReq.next = &extraReq;
  ncclTeamRequirements_t teamReq; /* a team without multimem: accepted */
  memset(&teamReq, 0, sizeof teamReq);
  teamReq.team = lsa;

  ncclDevCommRequirements_t reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  reqs.lsaBarrierCount = 2;
  reqs.resourceRequirementsList = &barReq;
  reqs.teamRequirementsList = &teamReq;
  ncclDevComm_t dev;
  memset(&dev, 0, sizeof dev);
  OK(ncclDevCommCreate(comm, &reqs, &dev));

  CHECK(dev.magic == NCCL_API_MAGIC && dev.internal != NULL && dev.abortFlag == NULL, "magic %#x", dev.magic);
  CHECK(dev.version == 23203 && reqs.version == NCCL_VERSION_CODE, "version %u", dev.version);
  CHECK(dev.rank == rank && dev.nRanks == nranks, "rank %d nRanks %d", dev.rank, dev.nRanks);
  CHECK(dev.lsaRank == rank && dev.lsaSize == nranks, "lsaRank %d lsaSize %d", dev.lsaRank, dev.lsaSize);
  CHECK(dev.lsaBarrier.nBarriers == 2, "lsaBarrier.nBarriers %d", dev.lsaBarrier.nBarriers);
  CHECK(dev.stride != 0 && dev.stride % (1ull << 32) == 0, "stride %llx", dev.stride);
  CHECK(dev.resourceBytes >= 4096 && dev.resourceBytes % 4096 == 0, "resourceBytes %llu", dev.resourceBytes);
  /* The layout: the LSA barrier, the caller's barrier, the extra buffer, without overlaps. */
  size_t lsaBarBytes = 4 * 2 * (1 + nranks), userBarBytes = 4 * 3 * (1 + nranks);
  CHECK(dev.lsaBarrier.bufHandle % 16 == 0 && userBar.bufHandle % 16 == 0 && extra % 256 == 0, "alignment %u %u %u",
        dev.lsaBarrier.bufHandle, userBar.bufHandle, extra);
  CHECK(dev.lsaBarrier.bufHandle + lsaBarBytes <= userBar.bufHandle && userBar.bufHandle + userBarBytes <= extra &&
            extra + 1000 <= dev.resourceBytes,
        "layout %u %u %u of %llu", dev.lsaBarrier.bufHandle, userBar.bufHandle, extra, dev.resourceBytes);
  CHECK(ncclGetResourceBufferOffset(extra) == extra, "resource offset");

  /* Teams of the device communicator. */
  ncclTeam world = ncclTeamWorld(dev), dlsa = ncclTeamLsa(dev), rail = ncclTeamRail(dev);
  CHECK(world.nRanks == nranks && world.rank == rank && dlsa.nRanks == nranks && dlsa.rank == rank, "dev teams");
  CHECK(rail.nRanks == 1 && rail.rank == 0 && rail.stride == nranks, "rail %d %d %d", rail.nRanks, rail.rank, rail.stride);
  CHECK(ncclTeamRankToWorld(dev, dlsa, nranks - 1) == nranks - 1 && ncclTeamRankToLsa(dev, world, 0) == 0, "team ranks");
  CHECK(ncclTeamRankIsMember(dlsa, world, nranks - 1) && !ncclTeamRankIsMember(dlsa, world, nranks), "members");

  /* Resource memory: zeroed, each peer's copy one stride further, writable by every rank. */
  char* local = (char*)ncclGetResourceBufferLocalPointer(dev, extra);
  int zero = 1;
  for (int i = 0; i < 1000; i++) zero &= local[i] == 0;
  uint32_t* lsaEpochs = (uint32_t*)ncclGetResourceBufferLocalPointer(dev, dev.lsaBarrier.bufHandle);
  zero &= lsaEpochs[0] == 0 && lsaEpochs[1] == 0;
  CHECK(zero, "resource memory starts zeroed");
  char* p0 = (char*)ncclGetResourceBufferPeerPointer(dev, extra, dlsa, 0);
  for (int p = 0; p < nranks; p++) {
    char* pp = (char*)ncclGetResourceBufferPeerPointer(dev, extra, dlsa, p);
    CHECK((unsigned long long)(pp - p0) == (unsigned long long)p * dev.stride, "peer %d resource at +%lld", p,
          (long long)(pp - p0));
    CHECK(pp == (char*)ncclGetResourceBufferLsaPointer(dev, extra, p), "lsa pointer of %d", p);
  }
  CHECK(local == (char*)ncclGetResourceBufferPeerPointer(dev, extra, dlsa, rank), "local pointer");
  {
    ncclLsaBarrierSession<ncclCoopThread> bar(ncclCoopThread(), dev, ncclTeamTagLsa(), 0);
    bar.sync(ncclCoopThread());
  }
  for (int p = 0; p < nranks; p++) {
    uint32_t* slots = (uint32_t*)ncclGetResourceBufferPeerPointer(dev, extra, dlsa, p);
    slots[rank] = 1000u + (uint32_t)rank;
  }
  {
    ncclLsaBarrierSession<ncclCoopThread> bar(ncclCoopThread(), dev, ncclTeamTagLsa(), 0);
    bar.sync(ncclCoopThread());
  }
  {
    uint32_t* mine = (uint32_t*)local;
    int ok = 1;
    for (int p = 0; p < nranks; p++) ok &= mine[p] == 1000u + (uint32_t)p;
    CHECK(ok, "every peer wrote its slot of this rank's resource buffer");
  }

  /* Window pointers: the header's agree with the library's. */
  for (int p = 0; p < nranks; p++) {
    void* viaLib = NULL;
    OK(ncclGetLsaDevicePointer(win, 64, p, &viaLib));
    CHECK(ncclGetLsaPointer(win, 64, p) == viaLib && ncclGetPeerPointer(win, 64, p) == viaLib &&
              ncclGetPeerPointer(win, 64, dlsa, p) == viaLib,
          "window pointer of %d", p);
  }
  CHECK(ncclGetLocalPointer(win, 0) == ncclGetLsaPointer(win, 0, rank), "local window pointer");

  /* 100 rounds: write this rank's pattern, sync, check every peer's, sync (so nobody writes the
   * next pattern while a peer still reads). The barriers alternate, and take turns: the device
   * communicator's (index 0/1, round-robin), the caller's (team constructor), and arrive/wait
   * split; one rank sleeps a little each round so a barrier that lets ranks through early
   * shows stale patterns. */
  uint32_t syncs[2] = {1 + 1, 0}; /* index 0 was used twice above */
  uint32_t userSyncs[3] = {0, 0, 0};
  int stale = 0;
  for (int round = 0; round < 100; round++) {
    int idx = round % 2;
    if (rank == round % nranks) usleep(200 + (round % 7) * 100);
    for (int i = 0; i < kWords; i++) buf[i] = pattern(rank, round, i);
    if (round % 3 == 2) {
      ncclLsaBarrierSession<ncclCoopWarp> bar(ncclCoopWarp(), dev, ncclTeamLsa(dev), userBar, idx);
      bar.arrive(ncclCoopWarp());
      bar.wait(ncclCoopWarp());
      userSyncs[idx]++;
    } else {
      ncclLsaBarrierSession<ncclCoopThread> bar(ncclCoopThread(), dev, ncclTeamTagLsa(), idx);
      bar.sync(ncclCoopThread());
      syncs[idx]++;
    }
    for (int p = 0; p < nranks; p++) {
      const uint32_t* theirs = (const uint32_t*)ncclGetLsaPointer(win, 0, p);
      int bad = 0;
      for (int i = 0; i < kWords; i++) bad += theirs[i] != pattern(p, round, i);
      if (bad) {
        stale++;
        printf("rank %d round %d: %d words of rank %d's window are stale\n", rank, round, bad, p);
      }
    }
    {
      ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), dev, ncclTeamTagLsa(), idx);
      bar.sync(ncclCoopCta());
      syncs[idx]++;
    }
  }
  CHECK(stale == 0, "%d stale reads of peers' windows", stale);
  CHECK(lsaEpochs[0] == syncs[0] && lsaEpochs[1] == syncs[1], "LSA barrier epochs %u %u, expected %u %u", lsaEpochs[0],
        lsaEpochs[1], syncs[0], syncs[1]);
  uint32_t* userEpochs = (uint32_t*)ncclGetResourceBufferLocalPointer(dev, userBar.bufHandle);
  CHECK(userEpochs[0] == userSyncs[0] && userEpochs[1] == userSyncs[1] && userEpochs[2] == 0,
        "caller's barrier epochs %u %u %u", userEpochs[0], userEpochs[1], userEpochs[2]);

  /* The abort flag ends a wait nobody will answer (barrier 2 of the caller's, never arrived). */
  if (nranks > 1) {
    unsigned int flag = 1;
    ncclDevComm_t aborting = dev;
    aborting.abortFlag = &flag;
    {
      ncclLsaBarrierSession<ncclCoopThread> bar(ncclCoopThread(), aborting, dlsa, userBar, 2);
      bar.wait(ncclCoopThread());
    }
    CHECK(1, "a wait with the abort flag set returned");
  }

  test_runtime_version_devcomm(comm, props);
  test_older_requirements(comm);

  /* A second device communicator: the 2.29.2 requirements size (fields past it are not read),
   * and barrierCount counted as LSA barriers (the LSA team is every rank). */
  ncclDevCommRequirements_t old = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  old.size = 72;
  old.barrierCount = 3;
  old.lsaBarrierCount = 1;
  old.ginConnectionType = NCCL_GIN_CONNECTION_FULL; /* past size 72: ignored */
  ncclDevComm_t dev2;
  OK(ncclDevCommCreate(comm, &old, &dev2));
  CHECK(dev2.lsaBarrier.nBarriers == 3, "barrierCount as LSA barriers: %d", dev2.lsaBarrier.nBarriers);
  {
    ncclLsaBarrierSession<ncclCoopThread> bar(ncclCoopThread(), dev2, ncclTeamTagLsa(), 2);
    bar.sync(ncclCoopThread());
  }

  /* Destroy: a copy works like the original; a second destroy and a foreign comm are refused. */
  ncclDevComm_t copy = dev;
  INVALID(ncclDevCommDestroy(NULL, &copy));
  OK(ncclDevCommDestroy(comm, &copy));
  INVALID(ncclDevCommDestroy(comm, &dev));
  OK(ncclCommWindowDeregister(comm, win));
  OK(ncclMemFree(buf));
  OK(ncclCommDestroy(comm));
  /* dev2 outlived its communicator: an error, not a crash (and only once). */
  INVALID(ncclDevCommDestroy(comm, &dev2));
  INVALID(ncclDevCommDestroy(comm, &dev2));
  return finish();
}
