#!/usr/bin/env bash
# Issue 32's GPU checks on one GPU in one device call (2 ranks as processes under MPS), from
# binaries under target/gpu, with the previous build's binaries under target/gpu-before (if
# present) for the before/after benchmark in the same run:
#  1. the kernels compile;
#  2. the correctness matrices over P2P, SHM and NET, with LL and LL128 forced, on symmetric
#     windows with each symmetric kernel forced (and the copy engines, and off);
#  3. CUDA graphs (rank-worker coll-graph) and a peer's death; ranks that take different
#     routes (agree: rank 0 on symmetric windows, rank 1 on plain memory, all_reduce: both
#     must fail within seconds with the mismatch named, not by the operation timeout);
#  4. the benchmark, before and after in the same run: all_reduce 8 B-1 GiB, sendrecv and
#     alltoall (2 ranks); one rank against NVIDIA's NCCL; a grouped all_reduce of 8 tensors
#     (-m 8) against single calls, plain buffers and windows (-R 2).
# SKIP lists what to leave out: the sections compile matrix graph agree routes bench, and the benchmarks
# ar2 ar2_win sr2 a2a2 ar2_m8 ar2_m8_win one_rank; MATRICES names the matrices to run. Only summary.txt comes back.
set -u
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
results issue32
B=target/gpu-before
nvidia-smi -L >> $S
if want compile; then
    s=$(date +%s); timeout 400 $G/rank-worker compile-kernels 1 0 none > $OUT/compile.log 2>&1
    note "kernels: rc $? in $(($(date +%s)-s)) s: $(grep -E '^(RESULT|ERROR)' $OUT/compile.log | cut -c1-200 | tr '\n' ' ')"
fi
nvidia-cuda-mps-control -d 2>/dev/null && started_mps=1 || started_mps=0
if want matrix; then
    # MATRICES: which of p2p shm net ll ll128 win_ll win_ld win_rsag win_ce win_default run.
    W="COLL_WINDOWS=1 COLL_COLLS=AllReduce,AllGather,ReduceScatter"
    for m in ${MATRICES:-p2p shm net ll ll128 win_ll win_ld win_rsag win_ce win_default}; do
        case $m in
            p2p) matrix p2p 200 ;;
            shm) matrix shm 200 NCCL_P2P_DISABLE=1 ;;
            net) matrix net 240 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 ;;
            ll) matrix proto_LL 200 NCCL_PROTO=LL ;;
            ll128) matrix proto_LL128 200 NCCL_PROTO=LL128 ;;
            win_ce) matrix win_ce 200 COLL_WINDOWS=1 COLL_COLLS=AllGather,Broadcast,AlltoAll RUSTCCL_SYM_KERNEL=ce ;;
            win_default) matrix win_default 200 COLL_WINDOWS=1 ;;
            win_*) matrix $m 200 $W RUSTCCL_SYM_KERNEL=${m#win_} ;;
        esac | tee -a $S
    done
fi
if want graph; then
    two graph 200 coll-graph
    two peer_death 90 coll-peer-death
fi
if want agree; then
    # rank-worker windows-mismatch: rank 0's all_reduce takes the symmetric kernel, rank 1's
    # the planner; the watchdog reads the route rings. The operation timeout (60 s) and the
    # scenario's own hang guard (40 s) are far above the 10 s each rank must fail within.
    two agree 90 windows-mismatch NCCL_OP_TIMEOUT_MS=60000
    for r in 0 1; do
        line=$(grep -h '^RESULT windows-mismatch ok' $OUT/agree.$r.log)
        ms=$(echo "$line" | awk '{print $6}')
        if [ -n "$line" ] && [ "${ms:-99999}" -lt 10000 ] && echo "$line" | grep -q 'symmetric-kernel way' && echo "$line" | grep -q 'planner way'; then
            note "agree rank $r: PASS (error after $ms ms)"
        else
            note "agree rank $r: FAIL: $(grep -hE '^(RESULT|ERROR)' $OUT/agree.$r.log | cut -c1-400 | tr '\n' ' ')"
        fi
    done
fi
if want routes; then
    # Routing inside groups and on non-blocking communicators (tests/src/bin/worker_routes.rs):
    # a group of a small all_reduce and broadcast (planner), an all_reduce on windows (a
    # symmetric kernel inside the group), a 4 MiB all_reduce and a send/receive ring; results
    # checked element by element and each collective's published way.
    two routes_group 120 routes-group
    two routes_nb 120 routes-nonblocking
fi
if want bench; then
    # bench <label> <args>: after, then before (same machine, same run), rows side by side.
    bench() {
        local l=$1; shift
        timeout 120 $G/rustccl-bench "$@" > $OUT/b_${l}_after.txt 2>&1
        [ -x $B/rustccl-bench ] && timeout 120 $B/rustccl-bench "$@" > $OUT/b_${l}_before.txt 2>&1
        note "== $l ($*): size | after: us busbw | before: us busbw ($(wrong $OUT/b_${l}_*.txt))"
        paste <(grep -hE "^ +[0-9]" $OUT/b_${l}_after.txt | awk '{print $1, $6, $8}') <(grep -hE "^ +[0-9]" $OUT/b_${l}_before.txt 2>/dev/null | awk '{print $6, $8}') | tee -a $S
    }
    want ar2 && bench ar2 all_reduce -N 2 -b 8 -e 1G -f 8 -c 1 -n 50 -w 10
    want ar2_win && bench ar2_win all_reduce -N 2 -b 8 -e 4M -f 8 -c 1 -n 100 -w 10 -R 2
    want sr2 && bench sr2 sendrecv -N 2 -b 8 -e 256M -f 32 -c 1 -n 50 -w 10
    want a2a2 && bench a2a2 alltoall -N 2 -b 8 -e 256M -f 32 -c 1 -n 50 -w 10
    want ar2_m8 && bench ar2_m8 all_reduce -N 2 -b 8 -e 4M -f 8 -c 1 -n 50 -w 10 -m 8
    want ar2_m8_win && bench ar2_m8_win all_reduce -N 2 -b 8 -e 1M -f 8 -c 1 -n 50 -w 10 -m 8 -R 2
    want one_rank && for c in all_reduce sendrecv alltoall; do
        A="$c -N 1 -b 8 -e 64M -f 64 -c 1 -n 50 -w 5"
        timeout 60 $G/rustccl-bench $A > $OUT/one_${c}_rust.txt 2>&1
        [ -n "$NV" ] && timeout 60 $G/rustccl-bench $A --lib "$NV" > $OUT/one_${c}_nccl.txt 2>&1
        note "== one rank $c: size | us out of place, in place: rustccl | NCCL ($(wrong $OUT/one_${c}_*.txt))"
        paste <(grep -hE "^ +[0-9]" $OUT/one_${c}_rust.txt | awk '{print $1, $6, $10}') <(grep -hE "^ +[0-9]" $OUT/one_${c}_nccl.txt | awk '{print $6, $10}') | tee -a $S
    done
fi
[ $started_mps = 1 ] && echo quit | nvidia-cuda-mps-control
tar czf $FINAL_OUT/logs.tgz -C $OUT . 2>/dev/null
