#!/usr/bin/env bash
# A shorter GPU run than run_checks.sh: the matrix on P2P, SHM and one process, all_reduce in
# the bench, and PyTorch (rustccl only, its results checked inside the script).
set -u
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
matrix p2p 200; matrix shm 200 NCCL_P2P_DISABLE=1
timeout 200 $G/rank-worker coll-matrix-one-process 2 0 none 2>&1 | grep -E "^(RESULT|ERROR)" | cut -c1-200
timeout 120 $G/rustccl-bench all_reduce -N 2 -b 8 -e 1G -f 8 -c 1 > $OUT/b_all_reduce.txt 2>&1
grep -E "^ +[0-9]|Out of" $OUT/b_all_reduce.txt | awk '{print $1,$6,$8,$9,$10,$12,$13}'
cp -f $G/libnccl.so $G/libnccl.so.2
LD_PRELOAD=$PWD/$G/libnccl.so.2 timeout 200 python3 tests/torch/torch_dist.py --out $OUT/torch_rustccl.json --sizes --port 29544 > $OUT/torch_rustccl.log 2>&1
grep -h failures $OUT/torch_rustccl.log
python3 -c "import json; [print(t['bytes'], round(t['time_us'],1)) for t in json.load(open('$OUT/torch_rustccl.json'))['timings']]"
