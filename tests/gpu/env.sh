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

# results <name>: only a few files come back from the device machine, so the logs go to
# /tmp/<name> ($OUT from here on) and the caller leaves summary.txt ($S) and tarballs in
# $FINAL_OUT. note <text>: prints a line and adds it to the summary.
results() {
    FINAL_OUT=$OUT
    OUT=/tmp/$1
    mkdir -p $OUT
    S=$FINAL_OUT/summary.txt
}
note() { echo "$*" | tee -a $S; }

# want <section>: whether SKIP (a list of section names) leaves <section> in.
want() { case " ${SKIP:-} " in *" $1 "*) return 1;; *) return 0;; esac; }

# wrong <files>: how many bench rows and the sum of their #wrong columns.
wrong() { grep -hE "^ +[0-9]" "$@" | awk '{w+=$9+$13; n++} END {print n " sizes, " w+0 " wrong"}'; }

# enqueue_latency <label> [ranks]: the host cost of a small all_reduce, in place and out of
# place (rank-worker latency with RUSTCCL_PROFILE_ENQUEUE=1; 2 ranks unless given), rank 0's
# results as a note.
enqueue_latency() {
    local port=$((29600 + RANDOM % 300)) n=${2:-2} r
    for r in $(seq 0 $((n - 1))); do
        RUSTCCL_PROFILE_ENQUEUE=1 NCCL_COMM_ID=127.0.0.1:$port timeout 60 $G/rank-worker latency $n $r env > $OUT/latency$n.$r.log 2>&1 &
    done
    wait
    note "latency ($n ranks, rank 0$1): $(grep -E '^(RESULT|ERROR)' $OUT/latency$n.0.log | cut -c1-400 | tr '\n' ' ')"
}

# restore_kcache: the kernel cache a previous run brought back (target/gpu/kcache.tgz), if any.
restore_kcache() { [ -f $G/kcache.tgz ] && tar xzf $G/kcache.tgz -C target; }

# copy_roofline: the plain copy kernel's bandwidth per block count, cudaMemcpy, and the launch
# floor (tests/gpu/copy_roofline.cu), into the summary.
copy_roofline() { nvcc -O3 -arch=native -o /tmp/copy_roofline tests/gpu/copy_roofline.cu >> $S 2>&1 && /tmp/copy_roofline | tee -a $S; }

# two <name> <seconds> <command> [VAR=value ...]: rank-worker <command> as 2 processes, one
# summary line (needs `results` first: it notes into the summary).
two() {
    local name=$1 t=$2 cmd=$3; shift 3
    local port=$((29600 + RANDOM % 300))
    for r in 0 1; do
        env NCCL_COMM_ID=127.0.0.1:$port "$@" timeout $t $G/rank-worker $cmd 2 $r env > $OUT/$name.$r.log 2>&1 &
    done
    wait
    note "$name: $(grep -h -E '^(RESULT|ERROR|windows:)' $OUT/$name.*.log | cut -c1-300 | tr '\n' ' ')"
}
