set -u
G=target/gpu
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=WARN RUSTCCL_BACKEND=cuda
m() { name=$1; shift; port=$((29600 + RANDOM % 300)); seed=$RANDOM; for r in 0 1; do env COLL_SEED=$seed NCCL_COMM_ID=127.0.0.1:$port "$@" timeout 200 $G/rank-worker coll-matrix 2 $r env > $OUT/m_$name.$r.log 2>&1 & done; wait; echo "matrix $name: $(grep -h -E '^(RESULT|ERROR)' $OUT/m_$name.*.log | cut -c1-200 | tr '\n' ' ')"; }
m p2p; m shm NCCL_P2P_DISABLE=1; m simple NCCL_PROTO=Simple COLL_COLLS=allreduce,reducescatter,allgather COLL_COUNTS=1,1001,3000001
timeout 200 $G/rank-worker coll-matrix-one-process 2 0 none 2>&1 | grep -E "^(RESULT|ERROR)" | cut -c1-200
for op in all_reduce all_gather broadcast alltoall; do e=1G; [ $op != all_reduce ] && e=512M; timeout 120 $G/rustccl-bench $op -N 2 -b 8 -e $e -f 8 -c 1 > $OUT/b_$op.txt 2>&1; echo "== $op"; grep -E "^ +[0-9]|Out of" $OUT/b_$op.txt | awk '{print $1,$6,$8,$9,$10,$12,$13}'; done
