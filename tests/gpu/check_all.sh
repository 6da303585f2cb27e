#!/usr/bin/env bash
# One device call after a change to the device path, on one GPU (2 ranks as processes under
# MPS): tests/gpu/smoke.sh, the matrix over SHM and NET, the fault checks, the CUDA backend's
# own tests, and (when target/gpu-old holds another build) the benchmark of both side by side.
# Logs to $OUT.
set -u
G=target/gpu
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=WARN RUSTCCL_BACKEND=cuda
export RUSTCCL_KERNEL_CACHE_DIR=${RUSTCCL_KERNEL_CACHE_DIR:-$PWD/target/kcache}
nvidia-cuda-mps-control -d && echo "MPS started"
bash tests/gpu/smoke.sh 2>&1 | grep -v "^ *[0-9]"
m() { name=$1; shift; port=$((29600 + RANDOM % 300)); seed=$RANDOM; for r in 0 1; do env COLL_SEED=$seed NCCL_COMM_ID=127.0.0.1:$port "$@" timeout 200 $G/rank-worker coll-matrix 2 $r env > $OUT/m_$name.$r.log 2>&1 & done; wait; echo "matrix $name: $(grep -h -E '^(RESULT|ERROR)' $OUT/m_$name.*.log | cut -c1-200 | tr '\n' ' ')"; }
m shm NCCL_P2P_DISABLE=1
m net NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 COLL_COLLS=allreduce,allgather,broadcast,sendrecv
bash tests/gpu/faults.sh 2>&1 | grep -v "reports logged"
[ -d target/gpu-old ] && bash tests/gpu/compare_bench.sh target/gpu-old all_reduce all_gather
timeout 200 $G/cuda_backend_test --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | head -30
echo quit | nvidia-cuda-mps-control
