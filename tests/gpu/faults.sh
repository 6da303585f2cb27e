#!/usr/bin/env bash
# Fault checks on device buffers (rank-worker fault-* scenarios, tests/src/bin/worker_faults.rs):
# several ranks as processes on the GPU(s), under MPS when one GPU holds several ranks (so
# their kernels run at once). A peer killed mid-collective, abort while stuck, ranks in
# different operations, a rank that never calls (hang report, then the operation timeout and
# a shrink), destroy right after the last collective (over the network transport and P2P). Uses the binaries under target/gpu; logs to $OUT.
set -u
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
started_mps=0
if [ "$(nvidia-smi -L | wc -l)" -lt 3 ] && ! pgrep -x nvidia-cuda-mps >/dev/null; then
    nvidia-cuda-mps-control -d && started_mps=1 && echo "MPS started"
fi
# f <name> <nranks> <seconds> <scenario> [VAR=value ...]
f() {
    name=$1; n=$2; t=$3; sc=$4; shift 4; port=$((29600 + RANDOM % 300))
    for r in $(seq 0 $((n - 1))); do
        env NCCL_COMM_ID=127.0.0.1:$port "$@" timeout $t $G/rank-worker $sc $n $r env > $OUT/f_$name.$r.log 2>&1 &
    done
    wait
    echo "$name: $(grep -h -E '^(RESULT|ERROR)' $OUT/f_$name.*.log | cut -c1-260 | tr '\n' ' ')"
    echo "  reports logged: $(cat $OUT/f_$name.*.log | grep -c 'rustccl hang report for'), never-arrived lines: $(cat $OUT/f_$name.*.log | grep -c 'never arrived: ')"
}
f peer_death 2 90 coll-peer-death
f destroy_net 2 240 destroy-cycles CYCLES=${CYCLES:-60} NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
f destroy_p2p 2 240 destroy-cycles CYCLES=${CYCLES:-60}
f abort_stuck 3 60 fault-abort-stuck
f mismatch_count 2 60 fault-mismatch MISMATCH=count
f mismatch_kind 2 60 fault-mismatch MISMATCH=kind NCCL_OP_TIMEOUT_MS=5000
f mismatch_type 2 60 fault-mismatch MISMATCH=type NCCL_OP_TIMEOUT_MS=5000
for p in LL LL128 Simple; do
    f mismatch_type_$p 2 60 fault-mismatch MISMATCH=type NCCL_PROTO=$p NCCL_OP_TIMEOUT_MS=5000
    f mismatch_kind_$p 2 60 fault-mismatch MISMATCH=kind NCCL_PROTO=$p NCCL_OP_TIMEOUT_MS=5000
    f mismatch_count_$p 2 60 fault-mismatch MISMATCH=count NCCL_PROTO=$p NCCL_OP_TIMEOUT_MS=5000
done
f mismatch_type_checked 2 60 fault-mismatch MISMATCH=type RUSTCCL_CHECK_COLLECTIVES=1
f hang_report 3 60 fault-hang HANG_MODE=report RUSTCCL_HANG_REPORT_S=1 ABSENT_S=3
f hang_timeout 3 60 fault-hang HANG_MODE=timeout NCCL_OP_TIMEOUT_MS=1500 ABSENT_S=3
f report_signal 3 60 fault-report RUSTCCL_HANG_REPORT_S=0.2
[ $started_mps = 1 ] && echo quit | nvidia-cuda-mps-control
true
