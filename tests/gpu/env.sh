# Sourced by the GPU scripts: where the binaries and CUDA libraries are, the variables every
# run needs (NVLink multicast off, loopback bootstrap, warnings), the kernel cache, NVIDIA's
# NCCL from PyTorch's environment ($NV, empty when absent), and `matrix`.
G=target/gpu
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=WARN
export RUSTCCL_KERNEL_CACHE_DIR=${RUSTCCL_KERNEL_CACHE_DIR:-$PWD/target/kcache}
NV=$(python3 -c 'import nvidia.nccl,os;print(os.path.join(nvidia.nccl.__path__[0],"lib","libnccl.so.2"))' 2>/dev/null)

# matrix <name> <seconds> [VAR=value ...]: the correctness matrix as 2 processes (one seed for
# both), logs in $OUT/m_<name>.<rank>.log, one summary line.
matrix() {
    local name=$1 t=$2; shift 2
    local port=$((29600 + RANDOM % 300)) seed=$RANDOM
    for r in 0 1; do
        env COLL_SEED=$seed NCCL_COMM_ID=127.0.0.1:$port "$@" timeout $t $G/rank-worker coll-matrix 2 $r env > $OUT/m_$name.$r.log 2>&1 &
    done
    wait
    echo "matrix $name: $(grep -h -E '^(RESULT|ERROR)' $OUT/m_$name.*.log | cut -c1-300 | tr '\n' ' ')"
}
