/* NCCL 2.31/2.32's host API on rustccl's libnccl.so.2 (host backend), beside what
 * api_2_30_test.c and coll_config_test.c cover: every function of NCCL 2.32.3's nccl.h (and
 * of the device API's host calls nccl4py 0.6 binds) is exported under its nccl and pnccl
 * names; the 2.32.3 ncclConfig_t (its five 2.31/2.32 fields, a config from an older header);
 * the 2.31/2.32 window flags; and the CFT calls, which answer as NCCL's do on a GPU without
 * CFT support (one-rank teams, logical-endpoint queries and CFT device communicator
 * requirements refused with a message); nccl_device.h's 2.32.3 layouts; ncclSetEncryption's
 * NULL, magic and size rules.
 *
 * NRANKS processes with RANK, NRANKS and NCCL_TEST_ID (a unique id in hex) in the
 * environment; the ranks share a host. */
#define _GNU_SOURCE
#include "test_util.h"
#include "nccl_device.h"

#include <dlfcn.h>
#include <limits.h>
#include <stddef.h>

#define SAYS(text) CHECK(strstr(ncclGetLastError(NULL), text) != NULL, "last error should say \"%s\": %s", text, ncclGetLastError(NULL))
#define TEAM_IS(t, n, r, s) CHECK((t).nRanks == (n) && (t).rank == (r) && (t).stride == (s), "%s = {%d, %d, %d}, expected {%d, %d, %d}", #t, (t).nRanks, (t).rank, (t).stride, n, r, s)

/* NCCL 2.32.3's nccl.h, then the device API's host functions nccl4py 0.6 binds. */
static const char* const FUNCTIONS[] = {
  "ncclMemAlloc", "ncclMemFree", "ncclGetVersion", "ncclGetUniqueId", "ncclSetEncryption",
  "ncclCommInitRankConfig", "ncclCommInitRank", "ncclCommInitAll", "ncclCommInitRankScalable",
  "ncclCommFinalize", "ncclCommDestroy", "ncclCommAbort", "ncclCommRevoke", "ncclCommSplit",
  "ncclCommShrink", "ncclCommGetUniqueId", "ncclCommGrow", "ncclCommSuspend", "ncclCommResume",
  "ncclCommMemStats", "ncclGetErrorString", "ncclGetLastError", "ncclCommGetAsyncError",
  "ncclCommCount", "ncclCommCuDevice", "ncclCommUserRank", "ncclCommRegister", "ncclCommDeregister",
  "ncclCommWindowRegister", "ncclCommWindowDeregister", "ncclWinGetUserPtr",
  "ncclRedOpCreatePreMulSum", "ncclRedOpDestroy",
  "ncclReduce", "ncclBcast", "ncclBroadcast", "ncclAllReduce", "ncclReduceScatter", "ncclAllGather",
  "ncclAlltoAll", "ncclGather", "ncclScatter",
  "ncclAllReduceConfig", "ncclBroadcastConfig", "ncclReduceConfig", "ncclAllGatherConfig",
  "ncclReduceScatterConfig", "ncclAlltoAllConfig", "ncclGatherConfig", "ncclScatterConfig",
  "ncclSend", "ncclRecv", "ncclPutSignal", "ncclSignal", "ncclWaitSignal",
  "ncclGroupStart", "ncclGroupEnd", "ncclGroupSimulateEnd",
  "ncclParamBind", "ncclParamGetI8", "ncclParamGetI16", "ncclParamGetI32", "ncclParamGetI64",
  "ncclParamGetU8", "ncclParamGetU16", "ncclParamGetU32", "ncclParamGetU64", "ncclParamGetStr",
  "ncclParamGet", "ncclParamGetParameter", "ncclParamGetAllParameterKeys", "ncclParamDumpAll",
  "ncclCommQueryProperties", "ncclDevCommCreate", "ncclDevCommDestroy",
  "ncclGetLsaMultimemDevicePointer", "ncclGetLsaDevicePointer", "ncclGetMultimemDevicePointer",
  "ncclGetPeerDevicePointer", "ncclGetMultimemDeviceLeInfo", "ncclGetCftDeviceLeInfo",
  "ncclGetPeerDeviceLeInfo", "ncclTeamWorld", "ncclTeamLsa", "ncclTeamCft", "ncclTeamCftMultimem",
  "ncclTeamRail", "ncclTeamRankToWorld", "ncclTeamRankToLsa", "ncclLsaBarrierCreateRequirement",
  "ncclGinBarrierCreateRequirement", "ncclCftBarrierCreateRequirement", "ncclLLA2ACreateRequirement",
  "ncclLLA2ACalcSlots",
};

static void test_exports(void) {
  int missing = 0;
  for (size_t i = 0; i < sizeof FUNCTIONS / sizeof FUNCTIONS[0]; i++) {
    char alias[128];
    snprintf(alias, sizeof alias, "p%s", FUNCTIONS[i]);
    void* f = dlsym(RTLD_DEFAULT, FUNCTIONS[i]);
    void* p = dlsym(RTLD_DEFAULT, alias);
    CHECK(f != NULL && p != NULL, "%s%s not exported", f == NULL ? FUNCTIONS[i] : "", p == NULL ? alias : "");
    missing += f == NULL || p == NULL;
  }
  CHECK(missing == 0, "%d of NCCL 2.32.3's functions missing", missing);
}

/* ncclGetVersion says the newest NCCL whose host API rustccl implements: 2.32.3. */
static void test_version(void) {
  int v = 0;
  OK(ncclGetVersion(&v));
  CHECK(v == 23203 && v == NCCL_VERSION_CODE && v == NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH) &&
            NCCL_MAJOR == 2 && NCCL_MINOR == 32 && NCCL_PATCH == 3,
        "ncclGetVersion %d, NCCL_VERSION_CODE %d", v, (int)NCCL_VERSION_CODE);
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
  CHECK(c.version == 23203 && cc.version == 23203, "initializers' versions %u %u", c.version, cc.version);
}

static void test_layouts(void) {
  CHECK(sizeof(ncclConfig_t) == 120 && offsetof(ncclConfig_t, launchOrderImplicit) == 96 &&
            offsetof(ncclConfig_t, nvlsHostMode) == 112,
        "ncclConfig_t: %zu bytes, nvlsHostMode at %zu (2.32.3: 120, 112)", sizeof(ncclConfig_t), offsetof(ncclConfig_t, nvlsHostMode));
  CHECK(sizeof(ncclCollConfig_t) == 72 && offsetof(ncclCollConfig_t, launchCompletionEvent) == 64, "ncclCollConfig_t %zu", sizeof(ncclCollConfig_t));
  CHECK(sizeof(ncclCftBarrierHandle_t) == 8 && sizeof(ncclCftLeId) == 4, "CFT types");
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  CHECK(c.size == 120 && c.graphStreamOrdering == NCCL_CONFIG_UNDEF_INT && c.launchOrderImplicit == NCCL_CONFIG_UNDEF_INT &&
            c.numRmaSig == NCCL_CONFIG_UNDEF_INT && c.rmaEagerInit == NCCL_CONFIG_UNDEF_INT &&
            c.hostCftMode == ncclHostCftDefault && c.nvlsHostMode == ncclNvlsHostModeDefault,
        "NCCL_CONFIG_INITIALIZER leaves the 2.31/2.32 fields unset");
  CHECK(ncclHostCftEnable == 1 && ncclHostCftDisable == 2 && ncclHostCftFallback == 3, "ncclHostCftMode_t");
  CHECK(ncclNvlsHostModeEnable == 0 && ncclNvlsHostModeDisableTransport == 1 && ncclNvlsHostModeDisableSymmetricMultimem == 2 &&
            ncclNvlsHostModeDisable == INT_MAX,
        "ncclNvlsHostMode_t");
  CHECK(ncclMaxRedOp == 0x7fffffff && sizeof(ncclRedOp_t) == 4 && sizeof(ncclRedOp_dummy_t) == 4 && ncclNumOps_dummy == 5, "ncclRedOp_t");
  CHECK(NCCL_WIN_GIN_ONLY == 4 && NCCL_WIN_CFT_COUNTED == 8, "window flags");
  CHECK(NCCL_CFT_TEAM_FLAT == 0 && NCCL_CFT_TEAM_HIER_MULTIMEM == 1 && NCCL_CFT_TEAM_HIER_LSA == 2, "ncclCftTeamMode_t");
}

/* The 2.31/2.32 fields, set; a bad one; a config as a 2.28.9 header made it. */
static ncclComm_t test_config(ncclUniqueId id) {
  ncclComm_t comm = NULL, bad = NULL;
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.hostCftMode = 7;
  INVALID(ncclCommInitRankConfig(&bad, nranks, id, rank, &c));
  SAYS("hostCftMode");
  c.hostCftMode = ncclHostCftDefault;
  c.nvlsHostMode = -5;
  INVALID(ncclCommInitRankConfig(&bad, nranks, id, rank, &c));
  SAYS("nvlsHostMode");
  c.nvlsHostMode = ncclNvlsHostModeDefault;
  c.numRmaSig = 0;
  INVALID(ncclCommInitRankConfig(&bad, nranks, id, rank, &c));
  SAYS("numRmaSig");
  c.numRmaSig = NCCL_CONFIG_UNDEF_INT;
  c.launchOrderImplicit = 2;
  INVALID(ncclCommInitRankConfig(&bad, nranks, id, rank, &c));
  SAYS("launchOrderImplicit");

  ncclConfig_t good = NCCL_CONFIG_INITIALIZER;
  good.launchOrderImplicit = 1;
  good.numRmaSig = 2;
  good.rmaEagerInit = 1;
  good.hostCftMode = ncclHostCftFallback;
  good.nvlsHostMode = ncclNvlsHostModeDisable;
  OK(ncclCommInitRankConfig(&comm, nranks, id, rank, &good));
  float x = (float)(rank + 1);
  OK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL));
  CHECK(x == (float)(nranks * (nranks + 1) / 2), "all-reduce on the 2.32 config's communicator: %f", x);

  /* A program built against 2.28.9's nccl.h: an 80-byte config (up to nvlinkCentricSched)
   * with that version. The fields past its size keep their defaults. */
  ncclConfig_t old = NCCL_CONFIG_INITIALIZER;
  old.size = offsetof(ncclConfig_t, nvlinkCentricSched) + sizeof(int);
  old.version = NCCL_VERSION(2, 28, 9);
  old.blocking = 1;
  old.launchOrderImplicit = 99; /* beyond its size: never read */
  ncclComm_t split = NULL;
  OK(ncclCommSplit(comm, 0, rank, &split, &old));
  float y = 1.0f;
  OK(ncclAllReduce(&y, &y, 1, ncclFloat, ncclSum, split, NULL));
  CHECK(y == (float)nranks, "all-reduce on the communicator split with a 2.28 config: %f", y);
  OK(ncclCommDestroy(split));
  return comm;
}

static void test_windows_and_cft(ncclComm_t comm) {
  void* mem = NULL;
  OK(ncclMemAlloc(&mem, 1 << 16));
  ncclWindow_t gin_only = NULL, counted = NULL, unknown = NULL;
  OK(ncclCommWindowRegister(comm, mem, 4096, &gin_only, NCCL_WIN_GIN_ONLY));
  OK(ncclCommWindowRegister(comm, (char*)mem + 8192, 8192, &counted, NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_CFT_COUNTED));
  INVALID(ncclCommWindowRegister(comm, (char*)mem + 32768, 4096, &unknown, 0x10));
  SAYS("window flags");

  /* Teams: this rank alone, as NCCL's without CFT support. */
  ncclTeam_t flat = ncclTeamCft(comm, NCCL_CFT_TEAM_FLAT), mc = ncclTeamCftMultimem(comm);
  ncclTeam_t hmc = ncclTeamCft(comm, NCCL_CFT_TEAM_HIER_MULTIMEM), hlsa = ncclTeamCft(comm, NCCL_CFT_TEAM_HIER_LSA);
  TEAM_IS(flat, 1, 0, 1);
  TEAM_IS(mc, 1, 0, 1);
  TEAM_IS(hmc, 1, 0, 1);
  ncclTeam_t lsa = ncclTeamLsa(comm);
  TEAM_IS(hlsa, 1 / lsa.nRanks, 0, lsa.nRanks); /* NCCL's outer factor of the flat team by the LSA team */
  ncclTeam_t none = ncclTeamCft(NULL, NCCL_CFT_TEAM_FLAT), odd = ncclTeamCft(comm, (ncclCftTeamMode_t)9);
  TEAM_IS(none, 0, 0, 0);
  TEAM_IS(odd, 0, 0, 0);
  ncclTeam_t palias = pncclTeamCft(comm, NCCL_CFT_TEAM_FLAT);
  TEAM_IS(palias, 1, 0, 1);

  /* Logical-endpoint queries: arguments first, then refused (no CFT). */
  ncclCftLeId le = 77;
  size_t le_off = 77;
  INVALID(ncclGetPeerDeviceLeInfo(counted, 0, rank, &le, &le_off));
  SAYS("CFT (Compute Fabric Transport)");
  CHECK(le == 77 && le_off == 77, "outputs untouched by a refusal");
  INVALID(ncclGetCftDeviceLeInfo(counted, 0, 0, flat, &le, &le_off));
  SAYS("logical-endpoint");
  INVALID(ncclGetMultimemDeviceLeInfo(counted, 0, &le, &le_off));
  SAYS("ncclGetMultimemDeviceLeInfo");
  INVALID(pncclGetPeerDeviceLeInfo(counted, 0, rank, &le, &le_off));
  INVALID(ncclGetPeerDeviceLeInfo(counted, 0, rank, NULL, &le_off));
  SAYS("leId is NULL");
  INVALID(ncclGetCftDeviceLeInfo(NULL, 0, 0, flat, &le, &le_off));
  SAYS("window is NULL");
  INVALID(ncclGetMultimemDeviceLeInfo((ncclWindow_t)&le, 0, &le, &le_off));
  SAYS("not a live window");

  /* The CFT barrier requirement: NCCL's arithmetic ((3 + nRanks) * nBarriers words of 16 bytes). */
  ncclCftBarrierHandle_t h = {12345, 0};
  ncclDevResourceRequirements_t req;
  memset(&req, 0xff, sizeof req);
  ncclTeam_t four = {4, 1, 1};
  OK(ncclCftBarrierCreateRequirement(four, 2, &h, &req));
  CHECK(h.nBarriers == 2 && req.bufferSize == (3 + 4) * 2 * 16 && req.bufferAlign == 16 && req.outBufferHandle == &h.bufHandle &&
            req.next == NULL && req.ginSignalCount == 0 && req.ginCounterCount == 0,
        "CFT barrier requirement: %zu bytes, align %zu", req.bufferSize, req.bufferAlign);
  INVALID(ncclCftBarrierCreateRequirement(four, 2, NULL, &req));
  INVALID(ncclCftBarrierCreateRequirement(four, -1, &h, &req));

  OK(ncclCommWindowDeregister(comm, gin_only));
  OK(ncclCommWindowDeregister(comm, counted));
  OK(ncclMemFree(mem));
}

/* ncclDevCommRequirements_t as nccl_device.h now declares it, 2.32.3's layout: 2.30's fields,
 * then ginCustomStride, ginType, useRuntimeVersion, cftCaps and cftBarrierCount (120 bytes).
 * CFT is refused before anything is made; the same requirements without CFT make a device
 * communicator. */
static void test_devcomm_cft(ncclComm_t comm) {
  CHECK(sizeof(ncclDevCommRequirements_t) == 120 && offsetof(ncclDevCommRequirements_t, ginCustomStride) == 96 &&
            offsetof(ncclDevCommRequirements_t, useRuntimeVersion) == 104 && offsetof(ncclDevCommRequirements_t, cftCaps) == 108 &&
            offsetof(ncclDevCommRequirements_t, cftBarrierCount) == 112,
        "2.32 requirements layout");
  CHECK(sizeof(ncclCommProperties_t) == 144 && offsetof(ncclCommProperties_t, commHash) == 56 &&
            offsetof(ncclCommProperties_t, ginSupport) == 72 && offsetof(ncclCommProperties_t, devCommRuntimeVersionSize) == 136,
        "2.31/2.32 properties layout");
  CHECK(NCCL_GIN_TYPE_EFA_GDA == 5 && NCCL_GIN_MAX_TYPES == 6 && NCCL_GIN_CONNECTION_CUSTOM_STRIDE == 3 && NCCL_CFT == 1 &&
            NCCL_CFT_MULTIMEM == 2,
        "2.31 enum values");
  ncclDevCommRequirements_t r = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  r.cftCaps = NCCL_CFT;
  ncclDevComm_t dc;
  INVALID(ncclDevCommCreate(comm, &r, &dc));
  SAYS("reqs->cftCaps = 1");
  r.cftCaps = NCCL_CFT_NONE;
  r.cftBarrierCount = 4;
  INVALID(ncclDevCommCreate(comm, &r, &dc));
  SAYS("reqs->cftBarrierCount = 4");
  r.cftBarrierCount = 0;
  if (ncclTeamLsa(comm).nRanks == nranks) {
    OK(ncclDevCommCreate(comm, &r, &dc));
    CHECK(dc.rank == rank && dc.nRanks == nranks, "device communicator from 2.32-sized requirements");
    OK(ncclDevCommDestroy(comm, &dc));
  }
}

/* ncclSetEncryption's rules (NCCL 2.32's): a NULL configuration is mode NONE; a magic other than
 * NCCL_API_MAGIC is ncclInvalidArgument; a struct is read up to its size, the initializer's
 * values past it (a size that stops before `mode`: NONE). Run after the communicator is gone,
 * ending with no key (the key is process-global). */
static void test_encryption(void) {
  const char* key = "0123456789abcdef0123456789abcdef-test";
  OK(ncclSetEncryption(NULL));
  ncclEncryptionConfig_t c = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  CHECK(c.magic == NCCL_API_MAGIC && c.mode == NCCL_ENCRYPTION_MODE_NONE && c.psk == NULL, "encryption initializer");
  OK(ncclSetEncryption(&c));
  c.mode = NCCL_ENCRYPTION_MODE_PSK;
  c.psk = key;
  c.magic = 0;
  INVALID(ncclSetEncryption(&c));
  SAYS("NCCL_API_MAGIC");
  c.magic = NCCL_API_MAGIC;
  c.size = 16; /* stops before mode: NONE, whatever mode says */
  OK(ncclSetEncryption(&c));
  c.size = sizeof c;
  c.psk = "short";
  INVALID(ncclSetEncryption(&c));
  c.psk = NULL;
  INVALID(ncclSetEncryption(&c));
  c.psk = key;
  c.mode = 9;
  INVALID(ncclSetEncryption(&c));
  c.mode = NCCL_ENCRYPTION_MODE_PSK;
  OK(ncclSetEncryption(&c));
  OK(ncclSetEncryption(NULL)); /* off again */
}

int main(void) {
  ncclUniqueId id;
  read_rank_env("NCCL_TEST_ID", &id);
  test_exports();
  test_version();
  test_layouts();
  ncclComm_t comm = test_config(id);
  test_windows_and_cft(comm);
  test_devcomm_cft(comm);
  OK(ncclCommDestroy(comm));
  test_encryption();
  return finish();
}
