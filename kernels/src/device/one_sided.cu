// rustccl device code: the one-sided operations on symmetric windows (NCCL 2.29's
// ncclPutSignal, ncclSignal, ncclWaitSignal), two tiny kernels in a compilation unit of their
// own (no operator or element type: compiled once per architecture, in well under a second).
//
// Where the signals live: each rank's symmetric resource memory holds one u64 counter per
// peer (RUSTCCL_SYM_RES_SIGNALS + 8 * p: the signals rank p sent it; only p adds to it) and one
// u64 per peer of what its waits consumed so far (RUSTCCL_SYM_RES_SIGNALS_SEEN + 8 * p). Peers
// reach each other's counters through the communicator's flat window range.
//
// - rustccl_signal: one thread adds 1 to the peer's counter for this rank, after a system
//   fence, with release order at system scope. A put is the copy of its bytes into the peer's
//   window on the same stream (the copy engines), then this kernel: the copy has completed
//   when the kernel starts, and the release orders it before the signal for the peer.
// - rustccl_wait_signal: thread i waits until this rank's counter for peers[i] reaches
//   seen[peers[i]] + counts[i] (acquire loads at system scope), then stores that as the new
//   seen value. The expected value is counted on the device, not on the host: a wait replayed
//   in a CUDA graph waits for the next signals, not for ones it already consumed. It polls the
//   control block's abort flag while it waits (set by the host on an abort or a failed peer),
//   and then returns without consuming anything: the host reports the failure.
//
// The peers of one launch are distinct (the host adds up a peer named twice), so no two
// threads touch one `seen` word.
#include "port.h"
#include "rustccl_exec_abi.h"

// Spins between two looks at the abort flag.
#define RUSTCCL_SIGNAL_ABORT_EVERY 1024

#if RUSTCCL_HIP
// The compiler's atomics (system scope on AMD GPUs, as symmetric.h's).
RUSTCCL_DEVICE void signal_add_release(u64 addr) { __atomic_fetch_add((u64*)addr, 1ull, __ATOMIC_RELEASE); }
RUSTCCL_DEVICE u64 signal_ld_acquire(u64 addr) { return __atomic_load_n((u64*)addr, __ATOMIC_ACQUIRE); }
#else
RUSTCCL_DEVICE void signal_add_release(u64 addr) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(addr), "l"(1ull) : "memory");
}
RUSTCCL_DEVICE u64 signal_ld_acquire(u64 addr) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(addr) : "memory");
  return v;
}
#endif

RUSTCCL_DEVICE bool signal_aborted(u64 control) {
  return control && rustccl_load_volatile(&((const RustcclExecControl*)control)->abort) != 0;
}

extern "C" __global__ void __launch_bounds__(32, 1) rustccl_signal(RUSTCCL_GRID_CONSTANT const RustcclSignalArgs a) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    __threadfence_system();
    signal_add_release(a.counter);
  }
}

extern "C" __global__ void __launch_bounds__(RUSTCCL_SIGNAL_WAIT_MAX, 1)
    rustccl_wait_signal(RUSTCCL_GRID_CONSTANT const RustcclWaitSignalArgs a) {
  const u32 i = threadIdx.x;
  if (blockIdx.x != 0 || i >= a.n) return;
  const u64 peer = a.peers[i];
  u64* seen = (u64*)(a.seen + 8 * peer);
  const u64 target = *seen + a.counts[i];
  u32 spins = 0;
  while (signal_ld_acquire(a.counters + 8 * peer) < target) {
    if (++spins == RUSTCCL_SIGNAL_ABORT_EVERY) {
      spins = 0;
      if (signal_aborted(a.control)) return;
    }
  }
  *seen = target;
}
