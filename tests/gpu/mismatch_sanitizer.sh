#!/usr/bin/env bash
# Ranks that call different collectives on device buffers, per protocol, then under
# compute-sanitizer (memcheck; without MPS, which the sanitizer does not support): a mismatch
# must end in an error or a timeout, never a device fault. Logs to $OUT.
set -u
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
run2() { # name, prefix command ('' or sanitizer), env...
    name=$1; pre=$2; shift 2; port=$((29600 + RANDOM % 300))
    for r in 0 1; do env NCCL_COMM_ID=127.0.0.1:$port "$@" timeout 120 $pre $G/rank-worker fault-mismatch 2 $r env > $OUT/d_$name.$r.log 2>&1 & done; wait
    echo "$name: $(grep -h -E '^(RESULT|ERROR)|ERROR SUMMARY|Invalid|at 0x' $OUT/d_$name.*.log | sort | uniq -c | head -8 | cut -c1-220 | tr '\n' ' ')"
}
nvidia-cuda-mps-control -d
for kind in kind count; do for p in LL LL128 Simple; do run2 ${kind}_$p "" MISMATCH=$kind NCCL_PROTO=$p NCCL_OP_TIMEOUT_MS=4000; done; done
echo quit | nvidia-cuda-mps-control; sleep 1
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
run2 kind_memcheck "$CS --tool memcheck --print-limit 5" MISMATCH=kind NCCL_OP_TIMEOUT_MS=20000
