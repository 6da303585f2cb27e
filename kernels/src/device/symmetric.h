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

RUSTCCL_DEVICE u32 sym_ld_acquire(u64 addr) {
  u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
  return v;
}
RUSTCCL_DEVICE void sym_st_relaxed(u64 addr, u32 v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(addr), "r"(v) : "memory");
}
RUSTCCL_DEVICE void sym_fence_release() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

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

// The PreMulSum scalar (read when the launch runs, as exec.cu does).
RUSTCCL_DEVICE u64 sym_scalar(const RustcclSymArgs& a) {
  return a.scalar_ptr ? (u64)*(const volatile typename RUSTCCL_EXEC_ELEM::Raw*)a.scalar_ptr : a.scalar;
}

// The bytes [begin, end) of `total` that block `b` of `nblocks` takes: parts of whole 16-byte
// units, so no word is split between blocks.
RUSTCCL_DEVICE void sym_part(u64 total, u32 b, u32 nblocks, u64& begin, u64& end) {
  const u64 units = (total + 15) / 16;
  const u64 per = (units + nblocks - 1) / nblocks;
  begin = min(total, (u64)b * per * 16);
  end = min(total, begin + per * 16);
}

// Reduces the word at byte `off` of `src` (this rank's flat address) over every rank, in rank
// order; `valid` bytes (1..8) are real.
RUSTCCL_DEVICE u64 sym_reduce_word(const RustcclSymArgs& a, u64 src, u64 off, u32 valid, u64 scalar) {
  u64 acc = 0;
  for (u32 r = 0; r < a.nranks; ++r) {
    const u64 x = Word::pre(load_user((const unsigned char*)(sym_peer(a, src, r) + off), valid), scalar);
    acc = r == 0 ? x : Word::combine(acc, x);
  }
  return Word::post(acc, a.divisor);
}

// ---- all_reduce, one shot through LL lines in the peers' scratch ---------------------------
extern "C" __global__ void __launch_bounds__(RUSTCCL_SYM_THREADS)
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
    const u64 v = load_user((const unsigned char*)(a.send + w * 8), valid);
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
        x = load_user((const unsigned char*)(a.send + w * 8), valid);
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
      x = Word::pre(x, scalar);
      acc = r == 0 ? x : Word::combine(acc, x);
    }
    if (ok) store_user((unsigned char*)(a.recv + w * 8), Word::post(acc, a.divisor), valid);
  }
  sym_finish(a, epoch);
}

// ---- all_reduce, one shot by loads ---------------------------------------------------------
extern "C" __global__ void __launch_bounds__(RUSTCCL_SYM_THREADS)
    rustccl_sym_ar_ld(RUSTCCL_GRID_CONSTANT const RustcclSymArgs a) {
  const u32 epoch = sym_epoch(a);
  if (sym_barrier(a, epoch, 1)) {
    u64 begin, end;
    sym_part(a.bytes, blockIdx.x, gridDim.x, begin, end);
    const u64 scalar = sym_scalar(a);
    for (u64 off = begin + threadIdx.x * 8; off < end; off += blockDim.x * 8) {
      const u32 valid = (u32)min((u64)8, end - off);
      store_user((unsigned char*)(a.recv + off), sym_reduce_word(a, a.send, off, valid, scalar), valid);
    }
    sym_barrier(a, epoch, 2);
  }
  sym_finish(a, epoch);
}

// ---- all_reduce, two shots: reduce my slice from every peer, store it into every peer ------
extern "C" __global__ void __launch_bounds__(RUSTCCL_SYM_THREADS)
    rustccl_sym_ar_rs_ag(RUSTCCL_GRID_CONSTANT const RustcclSymArgs a) {
  const u32 epoch = sym_epoch(a);
  if (sym_barrier(a, epoch, 1)) {
    // Slices of whole 16-byte units; the last may be short (or empty).
    const u64 slice = ((a.bytes + 15) / 16 + a.nranks - 1) / a.nranks * 16;
    const u64 lo = min(a.bytes, (u64)a.rank * slice), hi = min(a.bytes, lo + slice);
    u64 begin, end;
    sym_part(hi - lo, blockIdx.x, gridDim.x, begin, end);
    const u64 scalar = sym_scalar(a);
    for (u64 off = lo + begin + threadIdx.x * 8; off < lo + end; off += blockDim.x * 8) {
      const u32 valid = (u32)min((u64)8, lo + end - off);
      const u64 v = sym_reduce_word(a, a.send, off, valid, scalar);
      for (u32 r = 0; r < a.nranks; ++r) store_user((unsigned char*)(sym_peer(a, a.recv, r) + off), v, valid);
    }
    sym_barrier(a, epoch, 2);
  }
  sym_finish(a, epoch);
}

// ---- all_gather: store my part into every peer's receive buffer ----------------------------
extern "C" __global__ void __launch_bounds__(RUSTCCL_SYM_THREADS)
    rustccl_sym_ag(RUSTCCL_GRID_CONSTANT const RustcclSymArgs a) {
  const u32 epoch = sym_epoch(a);
  if (sym_barrier(a, epoch, 1)) {
    u64 begin, end;
    sym_part(a.bytes, blockIdx.x, gridDim.x, begin, end);
    const u64 at = (u64)a.rank * a.bytes;
    for (u64 off = begin + threadIdx.x * 8; off < end; off += blockDim.x * 8) {
      const u32 valid = (u32)min((u64)8, end - off);
      const u64 v = load_user((const unsigned char*)(a.send + off), valid);
      for (u32 r = 0; r < a.nranks; ++r) store_user((unsigned char*)(sym_peer(a, a.recv, r) + at + off), v, valid);
    }
    sym_barrier(a, epoch, 2);
  }
  sym_finish(a, epoch);
}

// ---- reduce_scatter: reduce my part from every peer's send buffer --------------------------
extern "C" __global__ void __launch_bounds__(RUSTCCL_SYM_THREADS)
    rustccl_sym_rs(RUSTCCL_GRID_CONSTANT const RustcclSymArgs a) {
  const u32 epoch = sym_epoch(a);
  if (sym_barrier(a, epoch, 1)) {
    u64 begin, end;
    sym_part(a.bytes, blockIdx.x, gridDim.x, begin, end);
    const u64 at = (u64)a.rank * a.bytes;
    const u64 scalar = sym_scalar(a);
    for (u64 off = begin + threadIdx.x * 8; off < end; off += blockDim.x * 8) {
      const u32 valid = (u32)min((u64)8, end - off);
      store_user((unsigned char*)(a.recv + off), sym_reduce_word(a, a.send + at, off, valid, scalar), valid);
    }
    sym_barrier(a, epoch, 2);
  }
  sym_finish(a, epoch);
}

#endif  // RUSTCCL_SYMMETRIC_H
