#!/usr/bin/env bash
# A short kernel round on one GPU (2 ranks under MPS): every protocol's all_reduce checked
# from 4 B to 64 MiB, one Simple channel new against old (the directory $1 holds the old
# exec.cu) twice each, and where a Simple block's time goes (RUSTCCL_KERNEL_TIMING).
#   tests/gpu/simple_ab.sh target/gpu/old-src
set -u
OLD=$1
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
results simple_ab
nvidia-cuda-mps-control -d 2>/dev/null
for p in Simple LL128 LL; do
    NCCL_PROTO=$p timeout 60 $G/rustccl-bench all_reduce -N 2 -b 4 -e 64M -f 16 -c 1 -n 3 -w 1 > $OUT/sweep_$p.txt 2>&1
    note "sweep $p all_reduce 4 B..64 MiB: $(wrong $OUT/sweep_$p.txt)"
done
k=0
for which in new old new old; do
    f=$OUT/ch1_${which}_$((++k)).txt
    if [ $which = new ]; then env NCCL_PROTO=Simple NCCL_MIN_CTAS=1 NCCL_MAX_CTAS=1 timeout 60 $G/rustccl-bench all_reduce -N 2 -b 2M -e 256M -f 8 -c 1 -n 10 -w 3 > $f 2>&1
    else env NCCL_PROTO=Simple NCCL_MIN_CTAS=1 NCCL_MAX_CTAS=1 RUSTCCL_KERNEL_SOURCE_DIR=$PWD/$OLD RUSTCCL_KERNEL_CACHE_DIR=$RUSTCCL_KERNEL_CACHE_DIR.old timeout 60 $G/rustccl-bench all_reduce -N 2 -b 2M -e 256M -f 8 -c 1 -n 10 -w 3 > $f 2>&1; fi
done
note "== 1 channel, Simple, all_reduce 2 ranks: size | us, busbw: new, old, new, old ($(wrong $OUT/ch1_*))"
paste <(grep -E "^ +[0-9]" $OUT/ch1_new_1.txt | awk '{print $1, $6, $8}') <(grep -E "^ +[0-9]" $OUT/ch1_old_2.txt | awk '{print $6, $8}') \
      <(grep -E "^ +[0-9]" $OUT/ch1_new_3.txt | awk '{print $6, $8}') <(grep -E "^ +[0-9]" $OUT/ch1_old_4.txt | awk '{print $6, $8}') | tee -a $S
NCCL_PROTO=Simple NCCL_MIN_CTAS=1 NCCL_MAX_CTAS=1 RUSTCCL_KERNEL_DEFINES=-DRUSTCCL_KERNEL_TIMING=1 RUSTCCL_KERNEL_CACHE_DIR=$RUSTCCL_KERNEL_CACHE_DIR.timing \
    timeout 60 $G/rustccl-bench all_reduce -N 2 -b 128M -e 128M -c 1 -n 3 -w 1 > $OUT/timing.txt 2>&1
note "timing Simple 128M ($(wrong $OUT/timing.txt)): $(grep -h RUSTCCL_KERNEL_TIMING $OUT/timing.txt | tail -2 | tr '\n' ' ' | cut -c1-400)"
echo quit | nvidia-cuda-mps-control
tar czf $FINAL_OUT/logs.tgz -C $OUT . 2>/dev/null
