#!/usr/bin/env bash
# Issue 33's look at the GPU machine, in one device call, from binaries under target/gpu
# (tests/gpu/build.sh also puts the IB plugin and the verbs double there):
#  1. what RDMA the machine has (/sys/class/infiniband, /dev/infiniband, Mellanox PCI
#     functions, libibverbs): if a device shows up, say so: the ConnectX steps of
#     docs/STATUS.md then apply;
#  2. the kernels compile (the cache in /tmp survives on a warm machine);
#  3. the correctness matrix, 2 ranks as processes on the CUDA backend under MPS, over the
#     network only (P2P and SHM off): with NCCL_NET=IB on the verbs double (the INFO lines
#     must name the double's device and the double counts the RDMA bytes), and with NCCL_NET
#     unset, IB beside rank-worker: passed over for Socket with no warning here (no RDMA);
#  4. the issue's sweep: all_reduce 8 B-64 MiB, 2 ranks, NCCL_NET=IB on the double against
#     Socket in the same run.
# SKIP lists sections to leave out: rdma compile matrix bench. Only summary.txt comes back.
set -u
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda RUSTCCL_KERNEL_CACHE_DIR=/tmp/kcache
results issue33
DOUBLE=$PWD/$G/verbs-double/libibverbs.so.1
nvidia-smi -L >> $S
if want rdma; then
    note "rdma: /sys/class/infiniband: $(ls /sys/class/infiniband 2>&1 | tr '\n' ' ')"
    note "rdma: /dev/infiniband: $(ls /dev/infiniband 2>&1 | tr '\n' ' ')"
    note "rdma: Mellanox/NVIDIA NICs (PCI vendor 15b3): $(lspci -d 15b3: 2>/dev/null | wc -l) ($(lspci -d 15b3: 2>/dev/null | head -2 | tr '\n' ' '))"
    note "rdma: libibverbs: $(ldconfig -p 2>/dev/null | grep -c libibverbs.so.1) in the loader cache; kernel modules: $(lsmod 2>/dev/null | grep -E '^(ib_uverbs|mlx5_ib|nvidia_peermem)' | awk '{print $1}' | tr '\n' ' ')"
fi
if want compile; then
    s=$(date +%s); timeout 400 $G/rank-worker compile-kernels 1 0 none > $OUT/compile.log 2>&1
    note "kernels: rc $? in $(($(date +%s)-s)) s: $(grep -E '^(RESULT|ERROR)' $OUT/compile.log | cut -c1-200 | tr '\n' ' ')"
fi
nvidia-cuda-mps-control -d 2>/dev/null && started_mps=1 || started_mps=0
NETONLY="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET"
if want matrix; then
    matrix net_ib 300 $NETONLY NCCL_NET=IB NCCL_IBVERBS_LIB=$DOUBLE IBV_DOUBLE_STATS=1 | tee -a $S
    for r in 0 1; do
        note "net_ib rank $r: $(grep -hoE 'NET/IB : Using [^;]*|using IB \(rustccl net ABI v[0-9]\)|stats: RDMA writes posted [0-9]+ \([0-9]+ bytes\)' $OUT/m_net_ib.$r.log | sort -u | tr '\n' ';')"
    done
    matrix net_default 300 $NETONLY | tee -a $S
    for r in 0 1; do
        note "net_default rank $r: $(grep -hoE 'skipped IB[^\n]{0,160}|NET/Plugin: using [^,]*' $OUT/m_net_default.$r.log | sort -u | tr '\n' ';') warnings: $(grep -c 'NCCL WARN' $OUT/m_net_default.$r.log)"
    done
fi
if want bench; then
    for net in IB Socket; do
        NCCL_NET=$net NCCL_IBVERBS_LIB=$DOUBLE NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
            timeout 200 $G/rustccl-bench all_reduce -N 2 -b 8 -e 64M -f 2 -c 1 -n 20 -w 5 > $OUT/b_$net.txt 2>&1
    done
    note "== all_reduce over the network, 2 ranks: size | IB (double): us busbw | Socket: us busbw ($(wrong $OUT/b_*.txt))"
    paste <(grep -hE "^ +[0-9]" $OUT/b_IB.txt | awk '{print $1, $6, $8}') <(grep -hE "^ +[0-9]" $OUT/b_Socket.txt | awk '{print $6, $8}') | tee -a $S
fi
[ $started_mps = 1 ] && echo quit | nvidia-cuda-mps-control
tar czf $FINAL_OUT/logs.tgz -C $OUT . 2>/dev/null
