#!/usr/bin/env bash
# The benchmark of two builds side by side in one run (2 ranks as processes on the GPU(s);
# under MPS when one GPU holds both): target/gpu (this build) and $1 (another build's
# rustccl-bench and libnccl.so, e.g. the previous commit's). Each collective alternates
# between the two, twice, so that drift of the machine touches both alike. Logs to $OUT.
#   tests/gpu/compare_bench.sh target/gpu-old [collectives...]
set -u
OLD=$1; shift
COLLS=${*:-all_reduce all_gather reduce_scatter broadcast}
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
for c in $COLLS; do
    for round in 1 2; do
        for which in new old; do
            dir=target/gpu; [ $which = old ] && dir=$OLD
            KC=$RUSTCCL_KERNEL_CACHE_DIR; [ $which = old ] && KC=$RUSTCCL_KERNEL_CACHE_DIR.old; RUSTCCL_KERNEL_CACHE_DIR=$KC timeout 150 $dir/rustccl-bench $c -N 2 -b 8 -e 256M -f 8 -c 1 > $OUT/cmp_${c}_${which}_$round.txt 2>&1
        done
    done
    echo "== $c: size, time us and busbw (new r1, old r1, new r2, old r2)"
    paste <(grep -E "^ +[0-9]" $OUT/cmp_${c}_new_1.txt | awk '{print $1, $6, $8}') \
          <(grep -E "^ +[0-9]" $OUT/cmp_${c}_old_1.txt | awk '{print $6, $8}') \
          <(grep -E "^ +[0-9]" $OUT/cmp_${c}_new_2.txt | awk '{print $6, $8}') \
          <(grep -E "^ +[0-9]" $OUT/cmp_${c}_old_2.txt | awk '{print $6, $8}')
    grep -h -E "#wrong|Out of bounds" $OUT/cmp_${c}_*.txt | sort | uniq -c | head -3
done
