#!/usr/bin/env bash
# Device kernels, before and after, on one GPU (issue 12): 2 ranks as processes on the one GPU
# under MPS. "new" is this build's embedded kernel source; "old" is the kernel source in the
# directory $1 (RUSTCCL_KERNEL_SOURCE_DIR; same ABI), run by the same binaries. Each figure
# alternates new and old. Also: a plain copy kernel and cudaMemcpy as rooflines, the
# correctness matrix per protocol with the new kernel, and the kernels' registers and local
# memory (cuobjdump). Uses target/gpu; a summary and logs in $OUT.
#   tests/gpu/kernel_ab.sh target/gpu/old-src [part]   (part: all | check | perf)
# Only a few files come back from the device machine: $OUT gets summary.txt, logs.tgz and
# kcache.tgz; the logs are written under /tmp/kernel_ab first.
set -u
OLD=$1
PART=${2:-all}
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
FINAL_OUT=$OUT
OUT=/tmp/kernel_ab
mkdir -p $OUT
S=$FINAL_OUT/summary.txt
note() { echo "$*" | tee -a $S; }
nvidia-smi -L >> $S
nvcc -O3 -arch=native -o /tmp/copy_roofline tests/gpu/copy_roofline.cu >> $S 2>&1 && /tmp/copy_roofline >> $S 2>&1
started_mps=0
if nvidia-cuda-mps-control -d 2>/dev/null; then started_mps=1; fi
trap '[ $started_mps = 1 ] && echo quit | nvidia-cuda-mps-control' EXIT
OLDKC=$RUSTCCL_KERNEL_CACHE_DIR.old
# The new kernels, every operator and type (NVRTC's errors in the log); the old ones compile
# as the runs below need them.
timeout 300 $G/rank-worker compile-kernels 1 0 none > $OUT/compile_new.log 2>&1
note "kernels new: $(grep -E '^(RESULT|ERROR)' $OUT/compile_new.log | cut -c1-1500 | tr '\n' ' ')"
# Registers and local memory (spills) of one instantiation per kernel build.
for d in $RUSTCCL_KERNEL_CACHE_DIR $OLDKC; do
    f=$(ls -S $d 2>/dev/null | head -1)
    [ -n "$f" ] && note "resources $(basename $d): $(cuobjdump -res-usage $d/$f 2>&1 | grep -E 'REG|spill' | head -2 | tr -s ' ' | tr '\n' ' ')"
done
if [ $PART != perf ]; then
    matrix p2p 240 | tee -a $S
    for p in LL LL128 Simple; do matrix proto_$p 200 NCCL_PROTO=$p | tee -a $S; done
    matrix shm 200 NCCL_P2P_DISABLE=1 | tee -a $S
fi
bench() {  # bench <which> <file> <args...>
    local which=$1 f=$2; shift 2
    if [ $which = new ]; then
        timeout 150 $G/rustccl-bench "$@" > $f 2>&1
    else
        RUSTCCL_KERNEL_SOURCE_DIR=$PWD/$OLD RUSTCCL_KERNEL_CACHE_DIR=$OLDKC timeout 150 $G/rustccl-bench "$@" > $f 2>&1
    fi
}
if [ $PART != check ]; then
    # One channel per protocol: per-block throughput and small-message latency.
    for p in Simple LL128 LL; do
        case $p in Simple) e=256M;; LL128) e=32M;; LL) e=4M;; esac
        for r in 1 2; do for which in new old; do
            NCCL_PROTO=$p NCCL_MIN_CTAS=1 NCCL_MAX_CTAS=1 bench $which $OUT/ch1_${p}_${which}_$r.txt all_reduce -N 2 -b 8 -e $e -f 8 -c 1 -n 20 -w 5
        done; done
        note "== 1 channel, $p, all_reduce 2 ranks: size | time us, busbw (new r1, old r1, new r2, old r2)"
        paste <(grep -E "^ +[0-9]" $OUT/ch1_${p}_new_1.txt | awk '{print $1, $6, $8}') \
              <(grep -E "^ +[0-9]" $OUT/ch1_${p}_old_1.txt | awk '{print $6, $8}') \
              <(grep -E "^ +[0-9]" $OUT/ch1_${p}_new_2.txt | awk '{print $6, $8}') \
              <(grep -E "^ +[0-9]" $OUT/ch1_${p}_old_2.txt | awk '{print $6, $8}') | tee -a $S
        grep -h -E "#wrong|rror" $OUT/ch1_${p}_*.txt | sort | uniq -c | head -3 | tee -a $S
    done
    # Default choices, every size.
    for c in all_reduce all_gather reduce_scatter broadcast alltoall; do
        for which in new old; do
            bench $which $OUT/def_${c}_${which}.txt $c -N 2 -b 8 -e 1G -f 8 -c 1 -n 20 -w 5
        done
        note "== $c 2 ranks default: size | time us, busbw (new, old)"
        paste <(grep -E "^ +[0-9]" $OUT/def_${c}_new.txt | awk '{print $1, $6, $8}') \
              <(grep -E "^ +[0-9]" $OUT/def_${c}_old.txt | awk '{print $6, $8}') | tee -a $S
        grep -h -E "#wrong|rror" $OUT/def_${c}_*.txt | sort | uniq -c | head -3 | tee -a $S
    done
fi
cat $OUT/m_*.log 2>/dev/null | grep -E "^(RESULT|ERROR)" | cut -c1-300 > $OUT/matrix_results.txt
tar czf $FINAL_OUT/kcache.tgz -C target kcache 2>/dev/null
tar czf $FINAL_OUT/logs.tgz -C $OUT . 2>/dev/null
