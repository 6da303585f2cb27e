#!/usr/bin/env bash
# Issue 31's device checks, one GPU (2 ranks as processes under MPS), logs to $OUT:
# - network receives announced per launch: the C test net plugin CTcp aborts when a receive
#   connection closes with receives posted (CTCP_CHECK_CLOSE=1), over the correctness matrix
#   and over captured CUDA graphs replayed (their receives are told from a host callback);
# - a plugin whose connect and accept complete in the background and whose test never writes
#   sizes (CTcp's async-setup build, as nccl-fastsocket): the matrix over it;
# - the profiler on the device path: the C test profilers asking for Coll|P2p|KernelCh and
#   for CoMMA's mask get every operation under its API event, completed on its KernelCh stops
#   and on a ProxyOp stop.
set -u
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
C=plugins/testing/c-net-tcp
cc -shared -fPIC -o /tmp/libctcp-check.so $C/ctcp.c $C/ctcp_tables.c -lpthread || echo "CTcp did not compile"
cc -shared -fPIC -DCTCP_ASYNC_SETUP -o /tmp/libctcp-async.so $C/ctcp.c $C/ctcp_tables.c -lpthread || echo "CTcp async did not compile"
nvidia-cuda-mps-control -d && echo "MPS started"
for v in check async; do
  NETENV="NCCL_NET_PLUGIN=/tmp/libctcp-$v.so CTCP_CHECK_CLOSE=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET"
  matrix ctcp_$v 300 $NETENV
  echo "matrix ctcp_$v: CTcp used: $(grep -l 'using CTcp' $OUT/m_ctcp_$v.*.log | wc -l) of 2; closes with receives posted: $(cat $OUT/m_ctcp_$v.*.log | grep -c 'receives in flight')"
done
NETENV="NCCL_NET_PLUGIN=/tmp/libctcp-check.so CTCP_CHECK_CLOSE=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET"
gport=$((29600 + RANDOM % 300)) gseed=$RANDOM$RANDOM
for r in 0 1; do
  env $NETENV COLL_SEED=$gseed NCCL_COMM_ID=127.0.0.1:$gport \
    timeout 300 $G/rank-worker coll-graph 2 $r env > "$OUT/graph_ctcp.$r.log" 2>&1 &
done
wait
echo "graph over CTcp: $(grep -h -E '^(RESULT|ERROR)' "$OUT"/graph_ctcp.*.log | cut -c1-300 | tr '\n' ' ')"
echo "graph over CTcp: CTcp used: $(grep -l 'using CTcp' $OUT/graph_ctcp.*.log | wc -l) of 2; closes with receives posted: $(cat $OUT/graph_ctcp.*.log | grep -c 'receives in flight')"
for build in COLL_P2P_ONLY PROXY_OPS; do
  PROF=/tmp/libprof-$build.so
  cc -shared -fPIC -std=gnu99 -Wall -DPROFILER_$build -o $PROF plugins/testing/c-profiler/profiler_v5.c || echo "profiler did not compile"
  for net in 0 1; do
    pport=$((29600 + RANDOM % 300))
    for r in 0 1; do
      env NCCL_PROFILER_PLUGIN=$PROF RUSTCCL_C_PROFILER_OUT=$OUT/prof_${build}_$net NCCL_SHM_DISABLE=$net NCCL_P2P_DISABLE=$net \
        NCCL_COMM_ID=127.0.0.1:$pport timeout 120 $G/rank-worker profiled 2 $r env > "$OUT/profiled_${build}_$net.$r.log" 2>&1 &
    done
    wait
    echo "profiled ($build, network $net): $(grep -h -E '^(RESULT|ERROR)' "$OUT"/profiled_${build}_$net.*.log | cut -c1-200 | tr '\n' ' ')"
    for r in 0 1; do echo "  rank $r: $(grep -E '^(ops|parents|channels|proxyops|bad|unplanned) ' $OUT/prof_${build}_$net.$r 2>/dev/null | tr '\n' ';')"; done
  done
done
echo quit | nvidia-cuda-mps-control
