#!/usr/bin/env bash
# One rank on one GPU against NVIDIA's NCCL (issue 12: in place does no device work, out of
# place is one copy at cudaMemcpy's bandwidth, small calls cost no more than NCCL's), launched
# as usual and replayed from a CUDA graph (-G): rustccl-bench for rustccl's Rust API, for
# rustccl's libnccl.so.2 and for NVIDIA's through the same C driver. Also the launch floor
# and copy roofline (copy_roofline.cu) and the host cost per call of a 2-rank all_reduce
# (RUSTCCL_PROFILE_ENQUEUE). Uses target/gpu; summary.txt and logs.tgz in $OUT.
set -u
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
results one_rank
restore_kcache
copy_roofline
cols() { grep -hE "^ +[0-9]" "$1" | awk '{print $6, $10}'; }
for c in all_reduce broadcast all_gather reduce_scatter sendrecv alltoall; do
    for g in 0 10; do
        A="$c -N 1 -b 8 -e 256M -f 32 -c 1 -n 50 -w 5"
        [ $g -gt 0 ] && A="$A -G $g -c 0"
        timeout 60 $G/rustccl-bench $A > $OUT/${c}_G${g}_rust.txt 2>&1
        timeout 60 $G/rustccl-bench $A --lib $PWD/$G/libnccl.so.2 > $OUT/${c}_G${g}_capi.txt 2>&1
        [ -n "$NV" ] && timeout 60 $G/rustccl-bench $A --lib "$NV" > $OUT/${c}_G${g}_nccl.txt 2>&1
        note "== $c, 1 rank, graph replays $g: size | us out of place, in place: rustccl Rust API | rustccl C ABI | NCCL ($(wrong $OUT/${c}_G${g}_*.txt))"
        paste <(grep -hE "^ +[0-9]" $OUT/${c}_G${g}_rust.txt | awk '{print $1, $6, $10}') <(cols $OUT/${c}_G${g}_capi.txt) <(cols $OUT/${c}_G${g}_nccl.txt) | tee -a $S
        grep -h -i -E "error|panick" $OUT/${c}_G${g}_*.txt | head -2 | cut -c1-300 | tee -a $S
    done
done
nvidia-cuda-mps-control -d 2>/dev/null && started_mps=1 || started_mps=0
enqueue_latency ", under MPS"
[ $started_mps = 1 ] && echo quit | nvidia-cuda-mps-control
tar czf $FINAL_OUT/logs.tgz -C $OUT . 2>/dev/null
