// rustccl device code: the LL128 protocol's data loop (128-byte lines, 120 payload bytes and an
// 8-byte flag). Included by exec.cu after StepView and compute.
#ifndef RUSTCCL_LL128_LOOP_H
#define RUSTCCL_LL128_LOOP_H

// LL128: each warp takes RUSTCCL_LL128_UNROLL groups of four lines at a time, eight lanes a
// line, 16 bytes a lane; lane 7 of a line carries its last payload word and the flag. A line's
// eight loads (and stores) are one 128-byte transaction. Every group's loads, and the user
// words they combine with, are issued before the first flag is looked at; a group whose flags
// are not all there is read again whole. Lines whose 120 payload bytes all lie in the step, in
// user buffers aligned to 8 bytes, take whole-word loads and stores without size checks.
// (Staging user data through shared memory in 16-byte units, as NCCL does, was measured
// slower here: 8.2 against 9.7 GB/s per channel, session 7.)
// (RUSTCCL_LL128_UNROLL in LL128's own entry point, RUSTCCL_LL128_UNROLL_MIXED in the entry
// point of every protocol: the depths where ptxas reports no spills.)
#ifndef RUSTCCL_LL128_UNROLL
#define RUSTCCL_LL128_UNROLL 3
#endif
#ifndef RUSTCCL_LL128_UNROLL_MIXED
#define RUSTCCL_LL128_UNROLL_MIXED 2
#endif
template <int NR, int NS, bool MIXED>
RUSTCCL_DEVICE bool run_ll128(const StepView& shared_view, bool lines_whole) {
  const StepView v = shared_view;
  constexpr int U = MIXED ? RUSTCCL_LL128_UNROLL_MIXED : RUSTCCL_LL128_UNROLL;
  const u32 bytes = v.bytes;
  const u32 lines = ((bytes + 7) / 8 + 14) / 15;
  const u32 full_lines = bytes / 120;
  const bool aligned = (((u64)v.src | (u64)v.dst) & 7) == 0;
  const u32 lane = threadIdx.x % 32, t = lane % 8;
  const u32 warps = blockDim.x / 32, warp = threadIdx.x / 32;
  // Round r gives warp w the line groups r * U * warps + u * warps + w: a short step spreads
  // over every warp before any warp takes a second group.
  for (u32 base = warp * 4; base < lines; base += warps * 4 * U) {
    u64 in0[U][NR > 0 ? NR : 1], in1[U][NR > 0 ? NR : 1];
    u64 s0[U], s1[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const u32 line = base + u * warps * 4 + lane / 8;
      const u32 off = line * 120 + t * 16;
#pragma unroll
      for (int k = 0; k < NR; ++k) {
        in0[u][k] = in1[u][k] = 0;
        if (line < lines) ld_volatile_v2(v.recv[k] + (u64)line * 128 + t * 16, in0[u][k], in1[u][k]);
      }
      s0[u] = s1[u] = 0;
      if (v.src && line < lines) {
        if (aligned && line < full_lines) {
          s0[u] = *(const u64*)(v.src + off);
          if (t != 7) s1[u] = *(const u64*)(v.src + off + 8);
        } else {
          if (off < bytes) s0[u] = load_user(v.src + off, min(8u, bytes - off));
          if (t != 7 && off + 8 < bytes) s1[u] = load_user(v.src + off + 8, min(8u, bytes - off - 8));
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const u32 line = base + u * warps * 4 + lane / 8;
      const bool active = line < lines;
#pragma unroll
      for (int k = 0; k < NR; ++k) {
        for (u32 spins = 0;; ++spins) {
          const bool ok = !active || !lines_whole || t != 7 || in1[u][k] == v.rflag[k];
          if (RUSTCCL_ALL(ok)) break;
          if ((spins & 4095) == 4095 && *v.abort) return false;
          if (active) ld_volatile_v2(v.recv[k] + (u64)line * 128 + t * 16, in0[u][k], in1[u][k]);
        }
      }
      if (!active) continue;
      const u32 off = line * 120 + t * 16;
      u64 x0[NR > 0 ? NR : 1], x1[NR > 0 ? NR : 1];
#pragma unroll
      for (int k = 0; k < NR; ++k) {
        x0[k] = in0[u][k];
        x1[k] = in1[u][k];
      }
      const u64 r0 = off < bytes ? compute<NR>(v, x0, s0[u]) : 0;
      const u64 r1 = t != 7 && off + 8 < bytes ? compute<NR>(v, x1, s1[u]) : 0;
      if (v.dst) {
        if (aligned && line < full_lines) {
          *(u64*)(v.dst + off) = r0;
          if (t != 7) *(u64*)(v.dst + off + 8) = r1;
        } else {
          if (off < bytes) store_user(v.dst + off, r0, min(8u, bytes - off));
          if (t != 7 && off + 8 < bytes) store_user(v.dst + off + 8, r1, min(8u, bytes - off - 8));
        }
      }
#pragma unroll
      for (int k = 0; k < NS; ++k) st_volatile_v2(v.send[k] + (u64)line * 128 + t * 16, r0, t == 7 ? v.sflag[k] : r1);
    }
  }
  return true;
}

#endif  // RUSTCCL_LL128_LOOP_H
