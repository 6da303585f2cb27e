#!/usr/bin/env bash
# Every GPU check and the side-by-side benchmark, on the two-GPU machine, in one run that
# builds nothing: it uses the binaries under target/gpu (rank-worker, rustccl-bench,
# libnccl.so.2), built and stripped on the development machine. Logs go to $OUT.
#   tests/gpu/run_checks.sh [checks|bench]   (default: both; each part fits one device call)
set -u
OUT=${OUT:-/tmp/rustccl-gpu}
mkdir -p "$OUT"
. tests/gpu/env.sh
cp -f $G/libnccl.so $G/libnccl.so.2 2>/dev/null
summary=$OUT/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

# The correctness matrix on 2 GPUs as 2 processes: $1 name, rest env.
matrix2() {
  local name=$1; shift
  local port=$((29600 + RANDOM % 300)) seed=$RANDOM$RANDOM
  for r in 0 1; do
    env RUSTCCL_BACKEND=cuda COLL_SEED=$seed NCCL_COMM_ID=127.0.0.1:$port "$@" \
      timeout 240 $G/rank-worker coll-matrix 2 $r env > "$OUT/matrix_$name.$r.log" 2>&1 &
  done
  wait
  note "matrix $name: $(grep -h -E '^(RESULT|ERROR)' "$OUT"/matrix_$name.*.log | tr '\n' ' ')"
}

PART=${1:-all}
nvidia-smi -L > "$OUT/gpus.txt"
# The collective kernels: compiled by NVRTC (in parallel) or found in the cache.
RUSTCCL_BACKEND=cuda timeout 300 $G/rank-worker compile-kernels 1 0 none > "$OUT/compile.log" 2>&1
note "kernels: $(grep -E '^(RESULT|ERROR)' "$OUT/compile.log" | tr '\n' ' ')"
if [ "$PART" != bench ]; then
matrix2 p2p
matrix2 shm NCCL_P2P_DISABLE=1
env RUSTCCL_BACKEND=cuda COLL_SEED=$RANDOM timeout 240 $G/rank-worker coll-matrix-one-process 2 0 none > "$OUT/matrix_one_process.log" 2>&1
note "matrix one process, 2 GPUs: $(grep -E '^(RESULT|ERROR)' "$OUT/matrix_one_process.log" | tr '\n' ' ')"
matrix2 net NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
for p in LL LL128 Simple; do matrix2 proto_$p NCCL_PROTO=$p; done
matrix2 tree NCCL_ALGO=Tree COLL_COLLS=allreduce
# Three ranks on two GPUs (two processes share one): kernels of different processes on one GPU
# only time-slice, so this shows whether such a layout still completes.
tport=$((29600 + RANDOM % 300)) tseed=$RANDOM
for r in 0 1 2; do
  env RUSTCCL_BACKEND=cuda COLL_SEED=$tseed NCCL_COMM_ID=127.0.0.1:$tport COLL_COLLS=allreduce COLL_COUNTS=1001 COLL_LARGE=none \
    timeout 60 $G/rank-worker coll-matrix 3 $r env > "$OUT/matrix_3ranks.$r.log" 2>&1 &
done
wait
note "matrix 3 ranks on 2 GPUs (allreduce): $(grep -h -E '^(RESULT|ERROR)' "$OUT"/matrix_3ranks.*.log | tr '\n' ' ') $(ls "$OUT"/matrix_3ranks.*.log | wc -l) logs"

# Each protocol forced from 1 element to 1 GiB, results checked by the bench (-c 1: every
# size validated, #wrong counted), on P2P and on SHM.
for p in LL LL128 Simple; do
  RUSTCCL_BACKEND=cuda NCCL_PROTO=$p timeout 200 $G/rustccl-bench all_reduce -N 2 -b 4 -e 1G -f 16 -c 1 -n 3 > "$OUT/proto_sizes_$p.txt" 2>&1
  note "protocol $p 4 B..1 GiB all_reduce (p2p): $(grep -E '^ +[0-9]' "$OUT/proto_sizes_$p.txt" | awk '{w+=$9+$13; n++} END {print n " sizes, " w " wrong"}') $(grep -h -E 'Out of bounds|rror' "$OUT/proto_sizes_$p.txt" | head -2 | tr '\n' ' ')"
done
RUSTCCL_BACKEND=cuda NCCL_P2P_DISABLE=1 NCCL_PROTO=LL timeout 200 $G/rustccl-bench all_reduce -N 2 -b 4 -e 256M -f 64 -c 1 -n 2 > "$OUT/proto_sizes_shm_LL.txt" 2>&1
note "protocol LL 4 B..256 MiB all_reduce (shm): $(grep -E '^ +[0-9]' "$OUT/proto_sizes_shm_LL.txt" | awk '{w+=$9+$13; n++} END {print n " sizes, " w " wrong"}')"

# Where a small operation's time goes (host enqueue vs the whole call).
lport=$((29600 + RANDOM % 300))
for r in 0 1; do
  env RUSTCCL_BACKEND=cuda RUSTCCL_PROFILE_ENQUEUE=1 NCCL_COMM_ID=127.0.0.1:$lport timeout 120 $G/rank-worker latency 2 $r env > "$OUT/latency.$r.log" 2>&1 &
done
wait
note "latency (rank 0): $(grep -E '^(RESULT|ERROR)' "$OUT/latency.0.log" | tr '\n' ' ')"

# CUDA graphs: collectives captured on a stream, the graph replayed 20 times with fresh inputs,
# 2 processes (rank-worker coll-graph; it also prints the time per replay vs uncaptured calls).
gport=$((29600 + RANDOM % 300)) gseed=$RANDOM$RANDOM
for r in 0 1; do
  env RUSTCCL_BACKEND=cuda COLL_SEED=$gseed NCCL_COMM_ID=127.0.0.1:$gport \
    timeout 240 $G/rank-worker coll-graph 2 $r env > "$OUT/graph.$r.log" 2>&1 &
done
wait
note "graph: $(grep -h -E '^(RESULT|ERROR)' "$OUT"/graph.*.log | tr '\n' ' ')"
note "graph timing: $(grep -h -E '^INFO graph timing' "$OUT"/graph.*.log | tr '\n' ' ')"

# Operations of one communicator on two streams, no synchronisation between them: issue order.
sport=$((29600 + RANDOM % 300))
for r in 0 1; do
  env RUSTCCL_BACKEND=cuda NCCL_COMM_ID=127.0.0.1:$sport timeout 120 $G/rank-worker coll-streams 2 $r env > "$OUT/streams.$r.log" 2>&1 &
done
wait
note "streams: $(grep -h -E '^(RESULT|ERROR|MISMATCH)' "$OUT"/streams.*.log | head -4 | tr '\n' ' ')"

# A rank killed while the other's kernel waits for it: the watchdog must end that kernel.
dport=$((29600 + RANDOM % 300))
for r in 0 1; do
  env RUSTCCL_BACKEND=cuda NCCL_COMM_ID=127.0.0.1:$dport timeout 90 $G/rank-worker coll-peer-death 2 $r env > "$OUT/peer_death.$r.log" 2>&1 &
done
wait
note "peer death: $(grep -h -E '^(RESULT|ERROR)' "$OUT"/peer_death.*.log | tr '\n' ' ')"

# Symmetric memory (issue 13) across the two GPUs: windows (peers' memory over NVLink, 1000
# register/deregister cycles), the matrix on windows with each all_reduce kernel forced and
# the copy engines forced.
for r in 0 1; do
  env RUSTCCL_BACKEND=cuda NCCL_COMM_ID=127.0.0.1:$((dport + 1)) timeout 120 $G/rank-worker windows 2 $r env > "$OUT/windows.$r.log" 2>&1 &
done
wait
note "windows: $(grep -h -E '^(RESULT|ERROR|windows:)' "$OUT"/windows.*.log | tr '\n' ' ')"
for k in ll rsag auto; do matrix2 win_$k COLL_WINDOWS=1 COLL_COLLS=AllReduce,AllGather,ReduceScatter RUSTCCL_SYM_KERNEL=$k; done
matrix2 win_ce COLL_WINDOWS=1 COLL_COLLS=AllGather,Broadcast,AlltoAll RUSTCCL_SYM_KERNEL=ce
# Registered buffers (ncclCommRegister): point-to-point receives over P2P written straight into
# them by the senders (the RESULT line counts the zero-copy steps).
matrix2 registered COLL_REGISTER=1

# Memory checking on a small run.
if command -v compute-sanitizer >/dev/null || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  env RUSTCCL_BACKEND=cuda COLL_COLLS=allreduce,allgather,reducescatter,broadcast,sendrecv COLL_DTYPES=float32,int8 \
    COLL_OPS=sum,avg COLL_COUNTS=7 COLL_LARGE=none timeout 150 "$CS" --tool memcheck --target-processes all \
    $G/rank-worker coll-matrix-one-process 2 0 none > "$OUT/memcheck.log" 2>&1
  note "memcheck: $(grep -E 'ERROR SUMMARY|^RESULT|^ERROR' "$OUT/memcheck.log" | tr '\n' ' ')"
fi

fi
if [ "$PART" != checks ]; then
# The benchmark, side by side in this run: rustccl (Rust API), NVIDIA NCCL and rustccl's
# libnccl.so.2 through the same C driver.
B="timeout 200 $G/rustccl-bench"
for op in all_reduce all_gather reduce_scatter broadcast alltoall; do
  e=1G; [ $op != all_reduce ] && e=512M
  RUSTCCL_BACKEND=cuda $B $op -N 2 -b 8 -e $e -f 8 -c 1 -J "$OUT/bench_rustccl_$op.json" > "$OUT/bench_rustccl_$op.txt" 2>&1
  [ -n "$NV" ] && $B $op -N 2 -b 8 -e $e -f 8 -c 1 --lib "$NV" -J "$OUT/bench_nccl_$op.json" > "$OUT/bench_nccl_$op.txt" 2>&1
done
RUSTCCL_BACKEND=cuda $B all_reduce -N 2 -b 8 -e 1G -f 8 -c 1 --lib $G/libnccl.so.2 > "$OUT/bench_rustccl_capi_all_reduce.txt" 2>&1
# Symmetric windows (-R 2: ncclMemAlloc + ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC):
# rustccl's symmetric kernels and copy engines against NCCL's symmetric kernels.
for op in all_reduce all_gather reduce_scatter broadcast alltoall; do
  RUSTCCL_BACKEND=cuda $B $op -N 2 -b 8 -e 512M -f 8 -c 1 -R 2 -J "$OUT/bench_rustccl_win_$op.json" > "$OUT/bench_rustccl_win_$op.txt" 2>&1
  [ -n "$NV" ] && $B $op -N 2 -b 8 -e 512M -f 8 -c 1 -R 2 --lib "$NV" -J "$OUT/bench_nccl_win_$op.json" > "$OUT/bench_nccl_win_$op.txt" 2>&1
done
# Registered buffers (-R 1: ncclCommRegister): zero-copy point-to-point against NCCL's.
for op in sendrecv alltoall; do
  for R in 0 1; do
    RUSTCCL_BACKEND=cuda $B $op -N 2 -b 64K -e 1G -f 8 -c 1 -R $R -J "$OUT/bench_rustccl_reg${R}_$op.json" > "$OUT/bench_rustccl_reg${R}_$op.txt" 2>&1
    [ -n "$NV" ] && $B $op -N 2 -b 64K -e 1G -f 8 -c 1 -R $R --lib "$NV" -J "$OUT/bench_nccl_reg${R}_$op.json" > "$OUT/bench_nccl_reg${R}_$op.txt" 2>&1
  done
done
note "bench: $(grep -h -E 'Avg bus|Out of bounds' "$OUT"/bench_*.txt | sort | uniq -c | tr '\n' ' ')"

# PyTorch, NVIDIA's NCCL then rustccl's (LD_PRELOAD), results compared.
timeout 200 python3 tests/torch/torch_dist.py --out "$OUT/torch_nccl.json" --sizes --graph > "$OUT/torch_nccl.log" 2>&1
RUSTCCL_BACKEND=cuda LD_PRELOAD=$PWD/$G/libnccl.so.2 timeout 200 python3 tests/torch/torch_dist.py --out "$OUT/torch_rustccl.json" --sizes --graph --port 29544 > "$OUT/torch_rustccl.log" 2>&1
python3 - "$OUT" <<'PY' | tee -a "$summary"
import json, sys, os
o = sys.argv[1]
try:
    a = json.load(open(os.path.join(o, "torch_nccl.json"))); b = json.load(open(os.path.join(o, "torch_rustccl.json")))
except Exception as e:
    print("torch: no result to compare:", e); sys.exit()
same = a["results"] == b["results"]
print("torch: nccl failures", a["failures"], "rustccl failures", b["failures"], "results equal:", same)
g = lambda r: {k: r.get("graph", {}).get(k) for k in ("ok", "bad_replays", "error")}
print("torch graph: nccl", g(a), "rustccl", g(b))
for x, y in zip(a["timings"], b["timings"]):
    print(f"torch all_reduce {x['bytes']:>11} B: nccl {x['time_us']:9.1f} us  rustccl {y['time_us']:9.1f} us  ratio {x['time_us']/y['time_us']:.2f}")
PY

fi
# The compiled kernels, to carry in target/kcache next time (see smoke.sh).
tar czf /tmp/kcache.tgz -C "$(dirname "$RUSTCCL_KERNEL_CACHE_DIR")" "$(basename "$RUSTCCL_KERNEL_CACHE_DIR")" 2>/dev/null
# Everything in one archive (the device tool brings back a limited number of files).
( cd "$OUT" && tar czf /tmp/rustccl-gpu-logs.tgz --exclude summary.txt . && find . -type f ! -name summary.txt -delete && mv /tmp/rustccl-gpu-logs.tgz logs.tgz && mv /tmp/kcache.tgz . 2>/dev/null )
