#!/usr/bin/env bash
# Issue 13's checks on one GPU in one device call, from binaries under target/gpu:
#  1. the kernels (with the symmetric ones) compile;
#  2. windows on the GPU, 2 ranks as processes: peers' windows read and written through their
#     flat-range pointers, 1000 register/deregister cycles with the device memory in use
#     before and after, bad registrations refused on every rank;
#  3. (under MPS) the correctness matrix with every buffer in a symmetric window, each
#     all_reduce kernel forced in turn (ll, ld, rsag) and the default choice, with
#     all_gather and reduce_scatter; the number of symmetric launches each run made;
#  4. (bench) all_reduce latency 8 B..256 KiB, 2 ranks: window buffers (-R 2, the symmetric
#     kernels) against plain buffers (the ring), same run; and larger sizes;
#  5. (devcomm) a user kernel compiled by nvcc against capi/include/nccl_device.h that reads
#     its peer's window through the device communicator and synchronises with an LSA
#     barrier; (nccl_header) a C program built against NVIDIA's nccl.h alone with windows;
#  6. (sanitizer, before MPS) compute-sanitizer memcheck on a small matrix with windows;
#  7. (torch) PyTorch with rustccl's libnccl.so.2 preloaded;
#  8. (register, under MPS) buffers registered with ncclCommRegister: the correctness matrix
#     (point-to-point receives written straight into them: the zero-copy steps counted), and
#     sendrecv and alltoall with registered buffers (-R 1) against plain ones (-R 0).
# SKIP lists sections to leave out: compile windows matrix bench latency devcomm nccl_header sanitizer sanitizer_reg torch register.
# Only summary.txt, logs.tgz and the kernel cache (kcache.tgz.part-*) come back.
#   tests/gpu/symmetric.sh
set -u
k=0
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
results symmetric
restore_kcache
ls $G/kcache.tgz.part-* > /dev/null 2>&1 && cat $G/kcache.tgz.part-* | tar xzf - -C target
nvidia-smi -L >> $S
if want compile; then
    timeout 400 $G/rank-worker compile-kernels 1 0 none > $OUT/compile.log 2>&1
    note "kernels: rc $? $(grep -E '^(RESULT|ERROR)' $OUT/compile.log | cut -c1-600 | tr '\n' ' ')"
fi
want windows && two windows 120 windows
if want windows; then
    # three <name> <command>: rank-worker <command> as 3 processes, rank 2 the victim.
    three() {
        local port=$((29600 + RANDOM % 300)) r
        for r in 0 1 2; do NCCL_COMM_ID=127.0.0.1:$port timeout 90 $G/rank-worker $2 3 $r env > $OUT/$1.$r.log 2>&1 & done
        wait
    }
    three peer_death windows-peer-death
    note "windows-peer-death (3 ranks on the GPU, rank 2 SIGKILLed): $(grep -h -E '^(RESULT|ERROR)' $OUT/peer_death.*.log | cut -c1-200 | tr '\n' ' ')"
    three op_death windows-op-death
    note "windows-op-death (3 ranks, rank 2 SIGKILLed during an all_to_all on windows: copy engines): $(grep -h -E '^(RESULT|ERROR)' $OUT/op_death.*.log | cut -c1-200 | tr '\n' ' ')"
fi

# compute-sanitizer does not run MPS clients: before MPS (the ranks time-slice).
if want sanitizer; then
    port=$((29600 + RANDOM % 300)) seed=$RANDOM
    for r in 0 1; do
        env COLL_SEED=$seed NCCL_COMM_ID=127.0.0.1:$port COLL_WINDOWS=1 COLL_COLLS=AllReduce,AllGather,ReduceScatter COLL_DTYPES=float32,int8 COLL_OPS=sum,premulsum-device COLL_LARGE=none \
            timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 $G/rank-worker coll-matrix 2 $r env > $OUT/sanitizer.$r.log 2>&1 &
    done
    wait
    note "compute-sanitizer memcheck, matrix on windows: $(grep -h -E '^(RESULT|ERROR)|ERROR SUMMARY' $OUT/sanitizer.*.log | cut -c1-200 | tr '\n' ' ')"
fi
if want sanitizer_reg; then
    # Zero-copy receives into registered buffers (the senders write into the receivers').
    timeout 200 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 $G/rustccl-bench sendrecv -N 2 -b 64K -e 16M -f 16 -n 2 -w 1 -c 1 -R 1 > $OUT/sanitizer_reg.log 2>&1
    note "compute-sanitizer memcheck, sendrecv on registered buffers: rc $? $(grep -h -E 'ERROR SUMMARY|Out of bounds' $OUT/sanitizer_reg.log | cut -c1-200 | tr '\n' ' ')"
fi

started_mps=0
nvidia-cuda-mps-control -d 2>/dev/null && started_mps=1
note "MPS started: $started_mps"

if want matrix; then
    W="COLL_WINDOWS=1 COLL_COLLS=AllReduce,AllGather,ReduceScatter"
    for kern in ll ld rsag auto; do
        matrix win_$kern 200 $W RUSTCCL_SYM_KERNEL=$kern | tee -a $S
    done
    # Everything else on window buffers (the usual kernels), and the fallback with them off.
    matrix win_other 200 COLL_WINDOWS=1 COLL_COLLS=Broadcast,Reduce,AlltoAll,SendRecv | tee -a $S
    matrix win_ce 200 COLL_WINDOWS=1 COLL_COLLS=AllGather,Broadcast,AlltoAll RUSTCCL_SYM_KERNEL=ce | tee -a $S
    matrix win_off 200 $W RUSTCCL_SYM_KERNEL=off | tee -a $S
fi

if want register; then
    matrix reg_p2p 200 COLL_REGISTER=1 COLL_COLLS=SendRecv,AlltoAll | tee -a $S
    matrix reg_all 200 COLL_REGISTER=1 | tee -a $S
    rb() { local f=$1; shift; timeout 150 $G/rustccl-bench "$@" -N 2 -c 1 > $OUT/$f.txt 2>&1; }
    rcols() { grep -E "^ +[0-9]" $OUT/$1.txt | awk '{print $1, $6, $8}'; }
    for c in sendrecv alltoall; do
        rb reg0_$c $c -b 64K -e 1G -f 4 -n 20 -w 5 -R 0
        rb reg1_$c $c -b 64K -e 1G -f 4 -n 20 -w 5 -R 1
        note "== $c 2 ranks: size | us, busbw: plain buffers | registered (zero-copy receives) ($(wrong $OUT/reg?_$c.txt))"
        paste <(rcols reg0_$c) <(rcols reg1_$c | cut -d' ' -f2-) | tee -a $S
    done
fi

if want bench; then
    # b <file> <bench args...>: one bench run, 2 ranks (under MPS), into $OUT/<file>.txt.
    b() { local f=$1; shift; timeout 150 $G/rustccl-bench "$@" -N 2 -c 1 > $OUT/$f.txt 2>&1; }
    # cols <file>: size, us and busbw of the out-of-place column.
    cols() { grep -E "^ +[0-9]" $OUT/$1.txt | awk '{print $1, $6, $8}'; }
    b ar_ring all_reduce -b 8 -e 4M -f 4 -n 200 -w 20 -R 0
    for kern in ll ld rsag; do RUSTCCL_SYM_KERNEL=$kern b ar_$kern all_reduce -b 8 -e 4M -f 4 -n 200 -w 20 -R 2; done
    b ar_auto all_reduce -b 8 -e 4M -f 4 -n 200 -w 20 -R 2
    note "== all_reduce 2 ranks, one GPU: size | us, busbw: ring (plain buffers) | ll | ld | rsag | default on windows ($(wrong $OUT/ar_*.txt))"
    paste <(cols ar_ring) <(cols ar_ll | cut -d' ' -f2-) <(cols ar_ld | cut -d' ' -f2-) <(cols ar_rsag | cut -d' ' -f2-) <(cols ar_auto | cut -d' ' -f2-) | tee -a $S
    grep -h -i -E "error" $OUT/ar_*.txt | head -3 | tee -a $S
    b arbig_ring all_reduce -b 4M -e 1G -f 4 -n 20 -w 5 -R 0
    b arbig_win all_reduce -b 4M -e 1G -f 4 -n 20 -w 5 -R 2
    note "== all_reduce large: size | us, busbw: ring | rsag ($(wrong $OUT/arbig_*.txt))"
    paste <(cols arbig_ring) <(cols arbig_win | cut -d' ' -f2-) | tee -a $S
    for c in all_gather reduce_scatter broadcast alltoall; do
        b ${c}_ring $c -b 1K -e 1G -f 8 -n 20 -w 5 -R 0
        b ${c}_win $c -b 1K -e 1G -f 8 -n 20 -w 5 -R 2
        [ $c = all_gather ] && RUSTCCL_SYM_KERNEL=ce b ${c}_ce $c -b 1K -e 1G -f 8 -n 20 -w 5 -R 2
        [ $c = all_gather ] && RUSTCCL_SYM_KERNEL=ag b ${c}_kern $c -b 1K -e 1G -f 8 -n 20 -w 5 -R 2
        [ $c = broadcast ] && RUSTCCL_SYM_KERNEL=ce b ${c}_ce $c -b 1K -e 1G -f 8 -n 20 -w 5 -R 2
        note "== $c 2 ranks: size | us, busbw: plain buffers | windows default$( [ -f $OUT/${c}_ce.txt ] && echo ' | copy engines forced')$( [ -f $OUT/${c}_kern.txt ] && echo ' | kernel forced') ($(wrong $OUT/${c}_*.txt))"
        if [ -f $OUT/${c}_kern.txt ]; then paste <(cols ${c}_ring) <(cols ${c}_win | cut -d' ' -f2-) <(cols ${c}_ce | cut -d' ' -f2-) <(cols ${c}_kern | cut -d' ' -f2-) | tee -a $S
        elif [ -f $OUT/${c}_ce.txt ]; then paste <(cols ${c}_ring) <(cols ${c}_win | cut -d' ' -f2-) <(cols ${c}_ce | cut -d' ' -f2-) | tee -a $S
        else paste <(cols ${c}_ring) <(cols ${c}_win | cut -d' ' -f2-) | tee -a $S; fi
    done
    copy_roofline
fi

# The latency table: all_reduce 8 B..256 KiB, ring (plain buffers) against windows.
if want latency; then
    for R in 0 2; do timeout 120 $G/rustccl-bench all_reduce -N 2 -b 8 -e 256K -f 2 -c 1 -n 500 -w 50 -R $R > $OUT/lat_R$R.txt 2>&1; done
    note "== all_reduce 2 ranks, one GPU, 8 B..256 KiB: size | us out of place, in place: ring (plain buffers) | symmetric (windows) ($(wrong $OUT/lat_R0.txt $OUT/lat_R2.txt))"
    paste <(grep -E "^ +[0-9]" $OUT/lat_R0.txt | awk '{print $1, $6, $10}') <(grep -E "^ +[0-9]" $OUT/lat_R2.txt | awk '{print $6, $10}') | tee -a $S
fi

# c_ranks <name> <program>: a C program linked to rustccl's library as 2 ranks (RANK, NRANKS,
# NCCL_COMM_ID), logs in $OUT/<name>.<rank>.log.
c_ranks() {
    local port=$((29600 + RANDOM % 300)) r
    for r in 0 1; do
        RANK=$r NRANKS=2 NCCL_COMM_ID=127.0.0.1:$port LD_LIBRARY_PATH=$PWD/$G:$LD_LIBRARY_PATH timeout 60 $2 > $OUT/$1.$r.log 2>&1 &
    done
    wait
}

if want devcomm && [ -f tests/gpu/devcomm_kernel.cu ]; then
    nvcc -O2 -arch=native -I capi/include -o /tmp/devcomm_kernel tests/gpu/devcomm_kernel.cu -L$G -lnccl -lcuda > $OUT/devcomm_build.log 2>&1
    note "devcomm user kernel build: rc $? $(head -c 600 $OUT/devcomm_build.log | tr '\n' ' ')"
    c_ranks devcomm /tmp/devcomm_kernel
    note "devcomm user kernel: $(cat $OUT/devcomm.*.log | grep -E 'RESULT|ERROR|FAIL|error' | head -4 | cut -c1-300 | tr '\n' ' ')"
fi

if want nccl_header && [ -f tests/gpu/sym_nccl_header.c ]; then
    NVINC=$(python3 -c 'import nvidia.nccl,os;print(os.path.join(nvidia.nccl.__path__[0],"include"))' 2>/dev/null)
    gcc -O2 -DWITH_CUDA -I "$NVINC" -I /usr/local/cuda/include -o /tmp/sym_nccl_header tests/gpu/sym_nccl_header.c -L$G -lnccl -L/usr/local/cuda/lib64 -lcudart > $OUT/nccl_header_build.log 2>&1
    note "C program against NVIDIA's nccl.h ($NVINC): build rc $? $(head -c 400 $OUT/nccl_header_build.log | tr '\n' ' ')"
    c_ranks nccl_header /tmp/sym_nccl_header
    note "C program against NVIDIA's nccl.h, 2 ranks: $(cat $OUT/nccl_header.*.log | grep -E 'RESULT|ERROR|FAIL|rror' | head -4 | cut -c1-300 | tr '\n' ' ')"
fi

# PyTorch with rustccl's libnccl.so.2 preloaded (both ranks on the GPU, graphs included).
if want torch; then
    LD_PRELOAD=$PWD/$G/libnccl.so.2 timeout 150 python3 tests/torch/torch_dist.py --out $OUT/torch_rustccl.json --sizes --graph --one-gpu --port 29544 > $OUT/torch_rustccl.log 2>&1
    note "torch (rustccl preloaded): rc $? $(grep -h -E 'failures|version|Error' $OUT/torch_rustccl.log | head -4 | tr '\n' ' ' | cut -c1-400)"
fi

[ $started_mps = 1 ] && echo quit | nvidia-cuda-mps-control
# The kernel cache comes back in parts (a file back is at most 16 MiB): copy them to target/gpu/.
tar czf - -C target kcache 2>/dev/null | split -b 15M - $FINAL_OUT/kcache.tgz.part-
tar czf $FINAL_OUT/logs.tgz -C $OUT . 2>/dev/null
