#!/usr/bin/env bash
# The hip backend's host code on the NVIDIA GPU: tests/gpu/hip_on_cuda.c (the HIP runtime and
# hipRTC calls the backend makes, served by CUDA and NVRTC) stands in for libamdhip64. Every
# collective kernel compiled through the backend's hipRTC path (for "gfx90a"; NVRTC
# underneath) and loaded with hipModuleLoadData, then the correctness matrix as 2 processes
# under MPS over P2P (hipIpc handles) and SHM (hipHostMalloc / hipHostRegister) with
# RUSTCCL_BACKEND=hip, fp8 aside (not built for HIP). What it cannot check: AMD's hardware,
# its memory model and hipRTC's code.
set -u
. tests/gpu/env.sh
SHIM=/tmp/libamdhip64-on-cuda.so
gcc -shared -fPIC -O2 -Wall tests/gpu/hip_on_cuda.c -I/usr/local/cuda/include -L/usr/local/cuda/lib64 \
    -lcudart -lcuda -lnvrtc -o $SHIM || { echo "ERROR the shim did not build"; exit 1; }
export RUSTCCL_BACKEND=hip RUSTCCL_HIP_PATH=$SHIM RUSTCCL_HIPRTC_PATH=$SHIM
export RUSTCCL_KERNEL_CACHE_DIR=/tmp/kcache-hip
export COLL_DTYPES=${COLL_DTYPES:-int8,uint8,int32,uint32,int64,uint64,float16,float32,float64,bfloat16}
timeout ${COMPILE_S:-300} $G/rank-worker compile-kernels 1 0 none 2>&1 | grep -E "^(RESULT|ERROR)|rror" | cut -c1-400
matrix hip_p2p ${MATRIX_S:-120}
matrix hip_shm ${MATRIX_S:-120} NCCL_P2P_DISABLE=1
matrix hip_ll128 ${MATRIX_S:-120} NCCL_PROTO=LL128
