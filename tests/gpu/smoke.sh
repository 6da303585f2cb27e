#!/usr/bin/env bash
# A first look on the GPU machine after a change to the device path (a few minutes): kernel
# compiles, the all-reduce matrix on P2P with each protocol, the whole matrix on P2P, and a
# short side-by-side bench. Uses the binaries under target/gpu; logs to $OUT.
set -u
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
s=$(date +%s); timeout 300 $G/rank-worker compile-kernels 1 0 none > $OUT/compile.log 2>&1; echo "compile: rc=$? $(($(date +%s)-s)) s: $(tail -2 $OUT/compile.log | tr '\n' ' ')"
matrix ar_small 60 COLL_COLLS=allreduce COLL_DTYPES=float32 COLL_OPS=sum COLL_COUNTS=1,7,1001 COLL_LARGE=none
for p in Simple LL LL128; do matrix ar_$p 120 NCCL_PROTO=$p COLL_COLLS=allreduce,allgather,reducescatter COLL_DTYPES=float32,int8,bfloat16 COLL_COUNTS=1,1001,300001; done
matrix p2p 240
matrix tree 120 NCCL_ALGO=Tree COLL_COLLS=allreduce
B="timeout 120 $G/rustccl-bench all_reduce -N 2 -b 8 -e 1G -f 16 -c 1"
$B > $OUT/b_rustccl.txt 2>&1; [ -n "$NV" ] && $B --lib "$NV" > $OUT/b_nccl.txt 2>&1
paste <(grep -E "^ +[0-9]" $OUT/b_rustccl.txt | awk '{print $1,$6,$8}') <(grep -E "^ +[0-9]" $OUT/b_nccl.txt | awk '{print $6,$8}')
grep -h -E "wrong|Out of" $OUT/b_*.txt | head -4
port=$((29600 + RANDOM % 300)); for r in 0 1; do env NCCL_COMM_ID=127.0.0.1:$port timeout 200 $G/rank-worker coll-graph 2 $r env > $OUT/graph.$r.log 2>&1 & done; wait
echo "graph: $(grep -h -E '^(RESULT|ERROR|INFO graph timing)' $OUT/graph.*.log | cut -c1-300 | tr '\n' ' ')"
COLL_SEED=$RANDOM timeout 150 $G/rank-worker coll-matrix-one-process 2 0 none > $OUT/one_process.log 2>&1
echo "one process rc=$?: $(grep -E '^(RESULT|ERROR)' $OUT/one_process.log | cut -c1-300 | tr '\n' ' ')"
port=$((29600 + RANDOM % 300)); for r in 0 1; do env NCCL_COMM_ID=127.0.0.1:$port timeout 120 $G/rank-worker coll-streams 2 $r env > $OUT/streams.$r.log 2>&1 & done; wait
echo "streams: $(grep -h -E '^(RESULT|ERROR|MISMATCH)' $OUT/streams.*.log | head -4 | tr '\n' ' ')"
port=$((29600 + RANDOM % 300)); for r in 0 1; do env NCCL_COMM_ID=127.0.0.1:$port timeout 90 $G/rank-worker coll-peer-death 2 $r env > $OUT/peer_death.$r.log 2>&1 & done; wait
echo "peer death: $(grep -h -E '^(RESULT|ERROR)' $OUT/peer_death.*.log | tr '\n' ' ')"
# The compiled kernels come back with the logs: carried in target/kcache next time (same
# sources, driver and NVRTC), a fresh machine skips the ~45 s of compiles.
tar czf $OUT/kcache.tgz -C "$(dirname "$RUSTCCL_KERNEL_CACHE_DIR")" "$(basename "$RUSTCCL_KERNEL_CACHE_DIR")" 2>/dev/null
