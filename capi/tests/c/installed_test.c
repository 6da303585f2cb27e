/* A program as a user of NCCL writes it, built against an installed nccl.h and run with the
 * installed libnccl.so.2 (capi/tests/install.rs): the version it was built for and the one it
 * runs with, then a one-rank all-reduce on the host backend, checked. */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) { printf("ncclGetVersion failed\n"); return 1; }
  printf("built for %d, running %d\n", NCCL_VERSION_CODE, version);
  ncclComm_t comm;
  int dev = 0;
  if (ncclCommInitAll(&comm, 1, &dev) != ncclSuccess) { printf("init failed: %s\n", ncclGetLastError(NULL)); return 1; }
  float in[4] = {1, 2, 3, 4}, out[4] = {0};
  ncclResult_t r = ncclAllReduce(in, out, 4, ncclFloat, ncclSum, comm, NULL);
  if (r != ncclSuccess || out[3] != 4) { printf("all_reduce: %s, out[3] = %g\n", ncclGetErrorString(r), out[3]); return 1; }
  ncclCommDestroy(comm);
  printf("all_reduce ok\n");
  return version == NCCL_VERSION_CODE ? 0 : 1;
}
