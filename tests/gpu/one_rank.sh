#!/usr/bin/env bash
# One rank on one GPU against NVIDIA's NCCL (issue 12: in place does no device work, out of
# place is one copy at cudaMemcpy's bandwidth): rustccl-bench for rustccl's Rust API, for
# rustccl's libnccl.so.2 and for NVIDIA's through the same C driver; a device-to-device copy
# roofline from PyTorch. Uses target/gpu; logs to $OUT.
set -u
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
for c in all_reduce broadcast all_gather; do
    A="$c -N 1 -b 8 -e 1G -f 8 -c 1 -n 50 -w 5"
    timeout 120 $G/rustccl-bench $A > $OUT/one_${c}_rust.txt 2>&1
    timeout 120 $G/rustccl-bench $A --lib $PWD/$G/libnccl.so.2 > $OUT/one_${c}_capi.txt 2>&1
    [ -n "$NV" ] && timeout 120 $G/rustccl-bench $A --lib "$NV" > $OUT/one_${c}_nccl.txt 2>&1
    echo "== $c, 1 rank: size | time us out-of-place, in-place: rustccl (Rust API) | rustccl (C ABI) | NCCL"
    paste <(grep -E "^ +[0-9]" $OUT/one_${c}_rust.txt | awk '{print $1, $6, $10}') \
          <(grep -E "^ +[0-9]" $OUT/one_${c}_capi.txt | awk '{print $6, $10}') \
          <(grep -E "^ +[0-9]" $OUT/one_${c}_nccl.txt | awk '{print $6, $10}')
    grep -h -E "wrong|rror" $OUT/one_${c}_*.txt | sort | uniq -c | head -4
done
python3 - <<'PY'
import torch, time
for n in (8 << 20, 128 << 20, 1 << 30):
    a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
    for _ in range(3): b.copy_(a)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(50): b.copy_(a)
    torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 50
    print(f"cudaMemcpy D2D roofline {n} bytes: {dt*1e6:.1f} us, {n/dt/1e9:.1f} GB/s")
PY
