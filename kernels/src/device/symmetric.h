// rustccl device code: the symmetric kernels. Collectives on buffers in symmetric windows,
// which read and write the peers' copies directly (loads and stores through the
// communicator's flat range, where rank r's copy of an address is `addr + (r - rank) *
// stride`), with no FIFO and no proxy. Included at the end of exec.cu, so every (operator,
// type) module has them; their parameter is RustcclSymArgs (kernels/src/exec.rs).
//
// Ordering between ranks:
// - The launch epoch E lives in this rank's resource memory (RUSTCCL_SYM_RES_EPOCH). Every
//   block reads it when it starts; the last block to finish writes E + 1. The next launch on
//   the stream starts after this one ends, so it sees E + 1: no host counter, so replays of a
//   captured graph count too. Every rank runs the same symmetric launches in the same order,
//   so their epochs agree.
// - Barriers (per block index b, phase 1 on entry and 2 on exit): block b of each rank stores
//   2E + phase into every peer's inbox [b][rank] after a release fence, then waits until its
//   own inbox [b][p] holds at least that for every peer p (acquire loads). A peer's block b
//   that arrived on entry has started its launch, so everything before it on its stream is
//   done (its buffers are ready); one that arrived on exit has finished its part of the data.
//   Every rank cuts the data into the same parts per block (the same grid from the same size),
//   so what block b of a peer reads or writes is exactly what block b here waits for.
// - The one-shot LL kernel needs no barrier: each 8-byte word travels in a 16-byte line with
//   the flag E + 1 twice, stored whole (v4) into the peer's scratch; the reader polls the line
//   until both flags are E + 1. The scratch has two halves, by E's parity: a writer reaches
//   launch E + 2 only after this rank's pushes of launch E + 1, which it makes after it has
//   read everything of launch E, so a half is never overwritten while it is read.
//
// Every rank reduces in rank order (0, 1, ..., n-1), so every rank's result is the same bits.
#ifndef RUSTCCL_SYMMETRIC_H
#define RUSTCCL_SYMMETRIC_H

// Spins between two looks at the abort flag.
#define RUSTCCL_SYM_ABORT_EVERY 1024

#if RUSTCCL_HIP
// The same orders through the compiler's atomics (system scope on AMD GPUs).
RUSTCCL_DEVICE u32 sym_ld_acquire(u64 addr) { return __atomic_load_n((u32*)addr, __ATOMIC_ACQUIRE); }
RUSTCCL_DEVICE void sym_st_relaxed(u64 addr, u32 v) { __atomic_store_n((u32*)addr, v, __ATOMIC_RELAXED); }
RUSTCCL_DEVICE void sym_fence_release() { __atomic_thread_fence(__ATOMIC_ACQ_REL); }
#else
RUSTCCL_DEVICE u32 sym_ld_acquire(u64 addr) {
  u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
  return v;
}
RUSTCCL_DEVICE void sym_st_relaxed(u64 addr, u32 v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(addr), "r"(v) : "memory");
}
RUSTCCL_DEVICE void sym_fence_release() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
#endif

// Rank r's copy of this rank's flat address `a`.
RUSTCCL_DEVICE u64 sym_peer(const RustcclSymArgs& a, u64 addr, u32 r) {
  return addr + (u64)((long long)r - (long long)a.rank) * a.stride;
}

RUSTCCL_DEVICE bool sym_aborted(const RustcclSymArgs& a) {
  return a.control && ld_volatile_u32((u64) & ((RustcclExecControl*)a.control)->abort) != 0;
}

// The launch epoch (read by every block when it starts).
RUSTCCL_DEVICE u32 sym_epoch(const RustcclSymArgs& a) { return ld_volatile_u32(a.res + RUSTCCL_SYM_RES_EPOCH); }

// The end of a block's part: the last block of the launch moves the epoch on.
RUSTCCL_DEVICE void sym_finish(const RustcclSymArgs& a, u32 epoch) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    unsigned int* done = (unsigned int*)(a.res + RUSTCCL_SYM_RES_EPOCH + 4);
    if (atomicAdd(done, 1u) == gridDim.x - 1) {
      *done = 0;
      *(volatile unsigned int*)(a.res + RUSTCCL_SYM_RES_EPOCH) = epoch + 1;
      __threadfence();
    }
  }
}

// Block barrier with the same block of every peer; false if the communicator was aborted.
RUSTCCL_DEVICE bool sym_barrier(const RustcclSymArgs& a, u32 epoch, u32 phase) {
  const u32 target = 2 * epoch + phase;
  const u64 inbox = a.res + RUSTCCL_SYM_RES_INBOX + (u64)blockIdx.x * a.nranks * 4;
  __syncthreads();
  bool ok = true;
  for (u32 p = threadIdx.x; p < a.nranks; p += blockDim.x) {
    if (p == a.rank) continue;
    sym_fence_release();
    sym_st_relaxed(sym_peer(a, inbox, p) + (u64)a.rank * 4, target);
  }
  for (u32 p = threadIdx.x; p < a.nranks; p += blockDim.x) {
    if (p == a.rank) continue;
    u32 spins = 0;
    while ((int)(sym_ld_acquire(inbox + (u64)p * 4) - target) < 0) {
      if (++spins == RUSTCCL_SYM_ABORT_EVERY) {
        spins = 0;
        if (sym_aborted(a)) {
          ok = false;
          break;
        }
      }
    }
  }
  return __syncthreads_and(ok);
}

// This rank's PreMulSum scalar (read when the launch runs, as exec.cu does).
RUSTCCL_DEVICE u64 sym_scalar(const RustcclSymArgs& a) {
  return a.scalar_ptr ? (u64)*(const volatile typename RUSTCCL_EXEC_ELEM::Raw*)a.scalar_ptr : a.scalar;
}

// PreMulSum scales each rank's input by that rank's scalar: every block publishes this rank's
// in its resource memory before the entry barrier (which releases it); peers read it after.
// A launch rewrites it only once every peer has left the previous launch's exit barrier.
RUSTCCL_DEVICE void sym_publish_scalar(const RustcclSymArgs& a) {
  if (RUSTCCL_EXEC_OP == RUSTCCL_OP_PREMULSUM && threadIdx.x == 0) *(volatile u64*)(a.res + RUSTCCL_SYM_RES_SCALAR) = sym_scalar(a);
}
RUSTCCL_DEVICE u64 sym_peer_scalar(const RustcclSymArgs& a, u32 r) {
  if (RUSTCCL_EXEC_OP != RUSTCCL_OP_PREMULSUM) return 0;
  return *(const volatile u64*)(sym_peer(a, a.res, r) + RUSTCCL_SYM_RES_SCALAR);
}

// The bytes [begin, end) of `total` that block `b` of `nblocks` takes: parts of whole 16-byte
// units, so no word is split between blocks.
RUSTCCL_DEVICE void sym_part(u64 total, u32 b, u32 nblocks, u64& begin, u64& end) {
  const u64 units = (total + 15) / 16;
  const u64 per = (units + nblocks - 1) / nblocks;
  begin = min(total, (u64)b * per * 16);
  end = min(total, begin + per * 16);
}

// 16-byte units in flight per thread.
#define RUSTCCL_SYM_UNROLL 4

// The block's part [lo, hi) (byte offsets): reduced over every rank's copy of `src` in rank
// order (each scaled by its rank's PreMulSum scalar), or, with Reduce false, this rank's
// `src` alone; stored at the same offset of `dst` on this rank (DstAll false) or on every
// rank. 16-byte loads and stores, RUSTCCL_SYM_UNROLL per thread at a time, when the
// addresses allow; words at the end (and everywhere when they do not).
template <bool Reduce, bool DstAll>
RUSTCCL_DEVICE void sym_range(const RustcclSymArgs& a, u64 src, u64 dst, u64 lo, u64 hi) {
  const u32 nsrc = Reduce ? a.nranks : 1;
  const u64 vend = (((src | dst | lo) & 15) == 0) ? lo + ((hi - lo) & ~15ull) : lo;
  const u64 step = (u64)blockDim.x * 16;
  for (u64 base = lo + threadIdx.x * 16; base < vend; base += step * RUSTCCL_SYM_UNROLL) {
    u64 x[RUSTCCL_SYM_UNROLL], y[RUSTCCL_SYM_UNROLL];
    for (u32 r = 0; r < nsrc; ++r) {
      const u32 from = Reduce ? r : a.rank;
      const u64 at = sym_peer(a, src, from);
      const u64 scalar = Reduce ? sym_peer_scalar(a, from) : 0;
      u64 vx[RUSTCCL_SYM_UNROLL], vy[RUSTCCL_SYM_UNROLL];
#pragma unroll
      for (int u = 0; u < RUSTCCL_SYM_UNROLL; ++u) {
        const u64 o = base + u * step;
        if (o < vend) {
          const ulonglong2 v = *(const ulonglong2*)(at + o);
          vx[u] = v.x;
          vy[u] = v.y;
        }
      }
#pragma unroll
      for (int u = 0; u < RUSTCCL_SYM_UNROLL; ++u) {
        if (Reduce) {
          vx[u] = Word::pre(vx[u], scalar);
          vy[u] = Word::pre(vy[u], scalar);
        }
        x[u] = r == 0 ? vx[u] : Word::combine(x[u], vx[u]);
        y[u] = r == 0 ? vy[u] : Word::combine(y[u], vy[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < RUSTCCL_SYM_UNROLL; ++u) {
      const u64 o = base + u * step;
      if (o >= vend) continue;
      ulonglong2 v;
      v.x = Reduce ? Word::post(x[u], a.divisor) : x[u];
      v.y = Reduce ? Word::post(y[u], a.divisor) : y[u];
      if (DstAll) {
        for (u32 r = 0; r < a.nranks; ++r) *(ulonglong2*)(sym_peer(a, dst, r) + o) = v;
      } else {
        *(ulonglong2*)(dst + o) = v;
      }
    }
  }
  // Words: the end, or everything when the addresses are not 16-byte aligned.
  for (u64 off = vend + threadIdx.x * 8; off < hi; off += blockDim.x * 8) {
    const u32 valid = (u32)min((u64)8, hi - off);
    u64 acc = 0;
    for (u32 r = 0; r < nsrc; ++r) {
      const u32 from = Reduce ? r : a.rank;
      u64 v = load_user((const unsigned char*)(sym_peer(a, src, from) + off), valid);
      if (Reduce) v = Word::pre(v, sym_peer_scalar(a, from));
      acc = r == 0 ? v : Word::combine(acc, v);
    }
    if (Reduce) acc = Word::post(acc, a.divisor);
    if (DstAll) {
      for (u32 r = 0; r < a.nranks; ++r) store_user((unsigned char*)(sym_peer(a, dst, r) + off), acc, valid);
    } else {
      store_user((unsigned char*)(dst + off), acc, valid);
    }
  }
}

// ---- all_reduce, one shot through LL lines in the peers' scratch ---------------------------
// Each rank pushes its input already scaled by its own PreMulSum scalar.
extern "C" __global__ void __launch_bounds__(RUSTCCL_SYM_THREADS, 1)
    rustccl_sym_ar_ll(RUSTCCL_GRID_CONSTANT const RustcclSymArgs a) {
  const u32 epoch = sym_epoch(a);
  const u32 flag = epoch + 1;
  const u64 words = (a.bytes + 7) / 8;
  const u64 region = (RUSTCCL_SYM_LL_HALF / a.nranks) & ~15ull;
  const u64 half = a.res + RUSTCCL_SYM_RES_LL + (u64)(epoch & 1) * RUSTCCL_SYM_LL_HALF;
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 step = (u64)gridDim.x * blockDim.x;
  const u64 scalar = sym_scalar(a);
  // Push: this rank's words into its region of every peer's scratch.
  for (u64 w = first; w < words; w += step) {
    const u32 valid = (u32)min((u64)8, a.bytes - w * 8);
    const u64 v = Word::pre(load_user((const unsigned char*)(a.send + w * 8), valid), scalar);
    const u64 line = half + (u64)a.rank * region + w * 16;
    for (u32 r = 0; r < a.nranks; ++r) {
      if (r == a.rank) continue;
      st_volatile_v4(sym_peer(a, line, r), (u32)v, flag, (u32)(v >> 32), flag);
    }
  }
  // Reduce: every rank's words, in rank order, as they arrive in this rank's scratch.
  bool ok = true;
  for (u64 w = first; w < words && ok; w += step) {
    const u32 valid = (u32)min((u64)8, a.bytes - w * 8);
    u64 acc = 0;
    for (u32 r = 0; r < a.nranks; ++r) {
      u64 x;
      if (r == a.rank) {
        x = Word::pre(load_user((const unsigned char*)(a.send + w * 8), valid), scalar);
      } else {
        const u64 line = half + (u64)r * region + w * 16;
        u32 lo, f1, hi, f2, spins = 0;
        for (;;) {
          ld_volatile_v4(line, lo, f1, hi, f2);
          if (f1 == flag && f2 == flag) break;
          if (++spins == RUSTCCL_SYM_ABORT_EVERY) {
            spins = 0;
            if (sym_aborted(a)) {
              ok = false;
              break;
            }
          }
        }
        x = (u64)lo | ((u64)hi << 32);
      }
      acc = r == 0 ? x : Word::combine(acc, x);
    }
    if (ok) store_user((unsigned char*)(a.recv + w * 8), Word::post(acc, a.divisor), valid);
  }
  sym_finish(a, epoch);
}

// ---- all_reduce, one shot by loads ---------------------------------------------------------
extern "C" __global__ void __launch_bounds__(RUSTCCL_SYM_THREADS, 1)
    rustccl_sym_ar_ld(RUSTCCL_GRID_CONSTANT const RustcclSymArgs a) {
  const u32 epoch = sym_epoch(a);
  sym_publish_scalar(a);
  if (sym_barrier(a, epoch, 1)) {
    u64 begin, end;
    sym_part(a.bytes, blockIdx.x, gridDim.x, begin, end);
    sym_range<true, false>(a, a.send, a.recv, begin, end);
    sym_barrier(a, epoch, 2);
  }
  sym_finish(a, epoch);
}

// ---- all_reduce, two shots: reduce my slice from every peer, store it into every peer ------
extern "C" __global__ void __launch_bounds__(RUSTCCL_SYM_THREADS, 1)
    rustccl_sym_ar_rs_ag(RUSTCCL_GRID_CONSTANT const RustcclSymArgs a) {
  const u32 epoch = sym_epoch(a);
  sym_publish_scalar(a);
  if (sym_barrier(a, epoch, 1)) {
    // Slices of whole 16-byte units; the last may be short (or empty).
    const u64 slice = ((a.bytes + 15) / 16 + a.nranks - 1) / a.nranks * 16;
    const u64 lo = min(a.bytes, (u64)a.rank * slice), hi = min(a.bytes, lo + slice);
    u64 begin, end;
    sym_part(hi - lo, blockIdx.x, gridDim.x, begin, end);
    sym_range<true, true>(a, a.send, a.recv, lo + begin, lo + end);
    sym_barrier(a, epoch, 2);
  }
  sym_finish(a, epoch);
}

// ---- all_gather: store my part into every peer's receive buffer ----------------------------
extern "C" __global__ void __launch_bounds__(RUSTCCL_SYM_THREADS, 1)
    rustccl_sym_ag(RUSTCCL_GRID_CONSTANT const RustcclSymArgs a) {
  const u32 epoch = sym_epoch(a);
  if (sym_barrier(a, epoch, 1)) {
    u64 begin, end;
    sym_part(a.bytes, blockIdx.x, gridDim.x, begin, end);
    // Source offsets are the destination's less rank * bytes.
    const u64 at = (u64)a.rank * a.bytes;
    sym_range<false, true>(a, a.send - at, a.recv, at + begin, at + end);
    sym_barrier(a, epoch, 2);
  }
  sym_finish(a, epoch);
}

// ---- reduce_scatter: reduce my part from every peer's send buffer --------------------------
extern "C" __global__ void __launch_bounds__(RUSTCCL_SYM_THREADS, 1)
    rustccl_sym_rs(RUSTCCL_GRID_CONSTANT const RustcclSymArgs a) {
  const u32 epoch = sym_epoch(a);
  sym_publish_scalar(a);
  if (sym_barrier(a, epoch, 1)) {
    u64 begin, end;
    sym_part(a.bytes, blockIdx.x, gridDim.x, begin, end);
    const u64 at = (u64)a.rank * a.bytes;
    sym_range<true, false>(a, a.send + at, a.recv, begin, end);
    sym_barrier(a, epoch, 2);
  }
  sym_finish(a, epoch);
}

#endif  // RUSTCCL_SYMMETRIC_H
