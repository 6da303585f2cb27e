#!/usr/bin/env bash
# Issue 34 item 3 on one GPU, in one device call, from binaries under target/gpu
# (tests/gpu/build.sh): ncclPutSignal / ncclSignal / ncclWaitSignal on the CUDA backend,
# 2 ranks as processes on one GPU (the one-sided worker, tests/src/bin/worker_one_sided.rs,
# its window in device memory, every operation on a stream of its own):
#  0. (compile) the collective kernels compile (the kernel cache's keys cover every device
#     source, one_sided.cu included, so a cache from before this change misses; the group
#     section's all_reduce needs one of them);
#  1. (sanitizer, before MPS: compute-sanitizer runs no MPS clients) memcheck on the ring;
#  2. (ring, under MPS) rounds of a ring of puts and waits, the bytes checked against fresh
#     random data over poisoned destinations; signals without data waited for on every peer
#     in one call; the bad arguments refused, the communicator usable after them;
#  3. (group, under MPS) the same inside ncclGroupStart/End, mixed with an all_reduce, and a
#     group with a refused call that runs nothing;
#  4. (graph, under MPS) a round's puts and wait captured into a CUDA graph and replayed 8
#     times with fresh data and poisoned destinations each time, then an uncaptured round;
#  5. (death, under MPS) rank 1 SIGKILLed while rank 0 waits for its signal: the wait's kernel
#     ends (the watchdog's abort) and the failure is reported within seconds, not a hang.
# Each section notes its RESULT/ERROR lines; the INIT lines of rank 0 say where the one-sided
# kernels came from (compiled by NVRTC, or the kernel cache).
# SKIP lists sections to leave out: compile sanitizer ring group graph death. Only summary.txt and
# logs.tgz come back. RUSTCCL_BACKEND=host runs the same sections on the host backend (a dry
# run of the script and worker where there is no GPU: SKIP="compile sanitizer graph").
#   tests/gpu/issue34_onesided.sh
set -u
. tests/gpu/env.sh
export RUSTCCL_BACKEND=${RUSTCCL_BACKEND:-cuda}
results issue34_onesided
restore_kcache
nvidia-smi -L >> $S
if want compile; then
    timeout 400 $G/rank-worker compile-kernels 1 0 none > $OUT/compile.log 2>&1
    note "kernels: rc $? $(grep -E '^(RESULT|ERROR)' $OUT/compile.log | cut -c1-300 | tr '\n' ' ')"
fi
if want sanitizer; then
    port=$((29600 + RANDOM % 300))
    for r in 0 1; do
        NCCL_COMM_ID=127.0.0.1:$port timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 $G/rank-worker one-sided 2 $r env > $OUT/sanitizer.$r.log 2>&1 &
    done
    wait
    note "compute-sanitizer memcheck, one-sided ring: $(grep -h -E '^(RESULT|ERROR)|ERROR SUMMARY' $OUT/sanitizer.*.log | cut -c1-200 | tr '\n' ' ')"
fi
started_mps=0
nvidia-cuda-mps-control -d 2>/dev/null && started_mps=1
note "MPS started: $started_mps"
want ring && two ring 120 one-sided NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT
want ring && note "ring rank 0, one-sided kernels: $(grep -h -E 'one-sided kernels' $OUT/ring.0.log | head -2 | cut -c1-200 | tr '\n' ' ')"
want group && two group 240 one-sided-group
want graph && two graph 120 one-sided-graph
want death && two death 90 one-sided-death
[ $started_mps = 1 ] && echo quit | nvidia-cuda-mps-control
tar czf $FINAL_OUT/logs.tgz -C $OUT . 2>/dev/null
