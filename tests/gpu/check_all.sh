#!/usr/bin/env bash
# One device call after a change to the device path, on one GPU (2 ranks as processes under
# MPS): tests/gpu/smoke.sh, the matrix over SHM and NET, the fault checks, the CUDA backend's
# own tests, and (when target/gpu-old holds another build) the benchmark of both side by side.
# Logs to $OUT.
set -u
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
nvidia-cuda-mps-control -d && echo "MPS started"
bash tests/gpu/smoke.sh 2>&1 | grep -v "^ *[0-9]"
matrix shm 200 NCCL_P2P_DISABLE=1
matrix net 200 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 COLL_COLLS=allreduce,allgather,broadcast,sendrecv
bash tests/gpu/faults.sh 2>&1 | grep -v "reports logged"
[ -d target/gpu-old ] && bash tests/gpu/compare_bench.sh target/gpu-old all_reduce all_gather
timeout 200 $G/cuda_backend_test --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | head -30
echo quit | nvidia-cuda-mps-control
