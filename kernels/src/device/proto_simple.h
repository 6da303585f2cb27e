// rustccl device code: the Simple protocol's data loop (the payload as is in the slot). Included by
// exec.cu after StepView and compute.
#ifndef RUSTCCL_SIMPLE_LOOP_H
#define RUSTCCL_SIMPLE_LOOP_H

// Words [begin, end) of a Simple step, 8 payload bytes each, one per thread in turn: the tail
// of a step and steps whose user buffers are not 16-byte aligned.
template <int NR, int NS>
RUSTCCL_DEVICE void run_words(const StepView& v, u64 begin, u64 end) {
  for (u64 w = begin + threadIdx.x; w < end; w += blockDim.x) {
    const u64 off = w * 8;
    const u32 valid = (u32)min((u64)8, (u64)v.bytes - off);
    u64 in[NR > 0 ? NR : 1];
#pragma unroll
    for (int k = 0; k < NR; ++k) in[k] = ld_volatile_u64(v.recv[k] + off);
    const u64 s = v.src ? load_user(v.src + off, valid) : 0;
    const u64 r = compute<NR>(v, in, s);
    if (v.dst) store_user(v.dst + off, r, valid);
#pragma unroll
    for (int k = 0; k < NS; ++k) *(u64*)(v.send[k] + off) = r;
  }
}

// Simple: 16-byte units, RUSTCCL_SIMPLE_UNROLL per thread per round for memory parallelism,
// then the tail in words.
#ifndef RUSTCCL_SIMPLE_UNROLL
#define RUSTCCL_SIMPLE_UNROLL 4
#endif
template <int NR, int NS>
RUSTCCL_DEVICE bool run_simple(const StepView& shared_view) {
  const StepView v = shared_view;
  const bool aligned = (((u64)v.src | (u64)v.dst) & 15) == 0;
  const u64 units = aligned ? v.bytes / 16 : 0;
  const int U = RUSTCCL_SIMPLE_UNROLL;
  const u64 nt = blockDim.x;
  const bool has_src = v.src != 0, has_dst = v.dst != 0;
  u64 base = threadIdx.x;
  // Whole rounds: every thread has U units.
  for (; base + (U - 1) * nt < units; base += U * nt) {
    ulonglong2 in[U][NR > 0 ? NR : 1];
    ulonglong2 s[U];
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const u64 u = base + j * nt;
#pragma unroll
      for (int k = 0; k < NR; ++k) ld_volatile_v2(v.recv[k] + u * 16, in[j][k].x, in[j][k].y);
      s[j] = has_src ? *(const ulonglong2*)(v.src + u * 16) : make_ulonglong2(0, 0);
    }
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const u64 u = base + j * nt;
      u64 x0[NR > 0 ? NR : 1], x1[NR > 0 ? NR : 1];
#pragma unroll
      for (int k = 0; k < NR; ++k) {
        x0[k] = in[j][k].x;
        x1[k] = in[j][k].y;
      }
      const ulonglong2 r = make_ulonglong2(compute<NR>(v, x0, s[j].x), compute<NR>(v, x1, s[j].y));
      if (has_dst) *(ulonglong2*)(v.dst + u * 16) = r;
#pragma unroll
      for (int k = 0; k < NS; ++k) *(ulonglong2*)(v.send[k] + u * 16) = r;
    }
  }
  // The last partial round, a unit per thread at a time.
  for (; base < units; base += nt) {
    u64 x0[NR > 0 ? NR : 1], x1[NR > 0 ? NR : 1];
#pragma unroll
    for (int k = 0; k < NR; ++k) ld_volatile_v2(v.recv[k] + base * 16, x0[k], x1[k]);
    const ulonglong2 s = has_src ? *(const ulonglong2*)(v.src + base * 16) : make_ulonglong2(0, 0);
    const ulonglong2 r = make_ulonglong2(compute<NR>(v, x0, s.x), compute<NR>(v, x1, s.y));
    if (has_dst) *(ulonglong2*)(v.dst + base * 16) = r;
#pragma unroll
    for (int k = 0; k < NS; ++k) *(ulonglong2*)(v.send[k] + base * 16) = r;
  }
  run_words<NR, NS>(v, units * 2, ((u64)v.bytes + 7) / 8);
  return true;
}

#endif  // RUSTCCL_SIMPLE_LOOP_H
