// rustccl device code: the LL protocol's data loop (16-byte lines, 8 payload bytes and two flags).
// Included by exec.cu after StepView and compute.
#ifndef RUSTCCL_LL_LOOP_H
#define RUSTCCL_LL_LOOP_H

// Whether an LL line, read as {data lo, flag} {data hi, flag ^ h}, carries flag `f`.
RUSTCCL_DEVICE bool ll_line_ready(u64 x, u64 y, u32 f, u32 h) { return (u32)(x >> 32) == f && (u32)(y >> 32) == (f ^ h); }

// Reads an LL line until it carries flag `f`, and returns it; a line without the flag when
// aborted meanwhile. Called (not inlined) on the slow path, by value: the lines the data loop
// holds in flight stay in registers.
RUSTCCL_DEVICE_CALL ulonglong2 wait_ll_line(u64 addr, u32 f, u32 h, const volatile u32* abort) {
  ulonglong2 l;
  for (u32 spins = 0;; ++spins) {
    ld_volatile_v2(addr, l.x, l.y);
    if (ll_line_ready(l.x, l.y, f, h)) return l;
    if ((spins & 4095) == 4095 && *abort) return make_ulonglong2(0, 0);
  }
}

// LL: one 16-byte line per 8 payload bytes, RUSTCCL_LL_UNROLL lines per thread per round; every
// line's loads, and the matching user words, are issued before any flag is looked at, and only
// lines whose flags are not there yet are read again. False when aborted.
// (RUSTCCL_LL_UNROLL in LL's own entry point, RUSTCCL_LL_UNROLL_MIXED in the entry point of every
// protocol, which has fewer registers to spare: the depths where ptxas reports no spills.)
#ifndef RUSTCCL_LL_UNROLL
#define RUSTCCL_LL_UNROLL 4
#endif
#ifndef RUSTCCL_LL_UNROLL_MIXED
#define RUSTCCL_LL_UNROLL_MIXED 1
#endif
template <int NR, int NS, bool MIXED>
RUSTCCL_DEVICE bool run_ll(const StepView& shared_view) {
  const StepView v = shared_view;
  const int U = MIXED ? RUSTCCL_LL_UNROLL_MIXED : RUSTCCL_LL_UNROLL;
  const u32 words = (v.bytes + 7) / 8, nt = blockDim.x;
  for (u32 base = threadIdx.x; base < words; base += U * nt) {
    // A line as two words: {data lo, flag} and {data hi, flag ^ h}.
    u64 lo[U][NR > 0 ? NR : 1], hi[U][NR > 0 ? NR : 1];
    u64 s[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const u32 w = base + u * nt;
      s[u] = 0;
      if (w >= words) continue;
#pragma unroll
      for (int k = 0; k < NR; ++k) ld_volatile_v2(v.recv[k] + (u64)w * 16, lo[u][k], hi[u][k]);
      if (v.src) s[u] = load_user(v.src + (u64)w * 8, min(8u, v.bytes - w * 8));
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const u32 w = base + u * nt;
      if (w >= words) continue;
      u64 in[NR > 0 ? NR : 1];
#pragma unroll
      for (int k = 0; k < NR; ++k) {
        u64 x = lo[u][k], y = hi[u][k];
        if (!ll_line_ready(x, y, (u32)v.rflag[k], v.h)) {
          const ulonglong2 l = wait_ll_line(v.recv[k] + (u64)w * 16, (u32)v.rflag[k], v.h, v.abort);
          if (!ll_line_ready(l.x, l.y, (u32)v.rflag[k], v.h)) return false;
          x = l.x;
          y = l.y;
        }
        in[k] = (x & 0xffffffffull) | (y << 32);
      }
      const u64 r = compute<NR>(v, in, s[u]);
      if (v.dst) store_user(v.dst + (u64)w * 8, r, min(8u, v.bytes - w * 8));
#pragma unroll
      for (int k = 0; k < NS; ++k) {
        const u64 f = (u32)v.sflag[k];
        st_volatile_v2(v.send[k] + (u64)w * 16, (r & 0xffffffffull) | (f << 32), (r >> 32) | ((f ^ v.h) << 32));
      }
    }
  }
  return true;
}

#endif  // RUSTCCL_LL_LOOP_H
