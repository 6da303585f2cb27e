#!/usr/bin/env bash
# A shorter GPU run than run_checks.sh: the matrix on P2P, SHM and one process, all_reduce in
# the bench, and PyTorch (rustccl only, its results checked inside the script).
set -u
G=target/gpu
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=WARN RUSTCCL_BACKEND=cuda
m() { name=$1; shift; port=$((29600 + RANDOM % 300)); seed=$RANDOM; for r in 0 1; do env COLL_SEED=$seed NCCL_COMM_ID=127.0.0.1:$port "$@" timeout 200 $G/rank-worker coll-matrix 2 $r env > $OUT/m_$name.$r.log 2>&1 & done; wait; echo "matrix $name: $(grep -h -E '^(RESULT|ERROR)' $OUT/m_$name.*.log | cut -c1-200 | tr '\n' ' ')"; }
m p2p; m shm NCCL_P2P_DISABLE=1
timeout 200 $G/rank-worker coll-matrix-one-process 2 0 none 2>&1 | grep -E "^(RESULT|ERROR)" | cut -c1-200
timeout 120 $G/rustccl-bench all_reduce -N 2 -b 8 -e 1G -f 8 -c 1 > $OUT/b_all_reduce.txt 2>&1
grep -E "^ +[0-9]|Out of" $OUT/b_all_reduce.txt | awk '{print $1,$6,$8,$9,$10,$12,$13}'
cp -f $G/libnccl.so $G/libnccl.so.2
LD_PRELOAD=$PWD/$G/libnccl.so.2 timeout 200 python3 tests/torch/torch_dist.py --out $OUT/torch_rustccl.json --sizes --port 29544 > $OUT/torch_rustccl.log 2>&1
grep -h failures $OUT/torch_rustccl.log
python3 -c "import json; [print(t['bytes'], round(t['time_us'],1)) for t in json.load(open('$OUT/torch_rustccl.json'))['timings']]"
