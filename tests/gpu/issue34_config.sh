#!/usr/bin/env bash
# Issue 34 item 2 on one GPU, in one device call, from target/gpu (tests/gpu/build.sh):
# tests/gpu/issue34_config.cu, built here with nvcc against capi/include/nccl.h and
# target/gpu/libnccl.so, as 2 ranks (processes) on GPU 0 under MPS, RUSTCCL_BACKEND=cuda: the
# eight nccl*Config calls with minCTAs / maxCTAs / algSelection / userProfilerTag and a
# launchCompletionEvent each, eagerly and captured in a CUDA graph replayed 4 times with new
# data; each result is checked once its event alone has completed. Run twice: plain, and with
# a profiler plugin (NCCL's C ABI v7: plugins/testing/c-profiler/profiler_v7.c, built here),
# which must see the tags 100..107 on the CollApi and Coll events of the eager calls.
# Only summary.txt and logs.tgz come back.
#   tests/gpu/issue34_config.sh
set -u
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
results issue34_config
restore_kcache
nvidia-smi -L >> $S

nvcc -O2 -arch=native -I capi/include -o /tmp/issue34_config_prog tests/gpu/issue34_config.cu -L$G -lnccl > $OUT/build.log 2>&1
note "build: rc $? $(head -c 600 $OUT/build.log | tr '\n' ' ')"
cc -std=gnu99 -Wall -Werror -shared -fPIC -o /tmp/libc_tagger.so plugins/testing/c-profiler/profiler_v7.c > $OUT/plugin_build.log 2>&1
note "profiler plugin build: rc $? $(head -c 300 $OUT/plugin_build.log | tr '\n' ' ')"

started_mps=0
nvidia-cuda-mps-control -d 2>/dev/null && started_mps=1
note "MPS started: $started_mps"

# run <name> [VAR=value ...]: the program as 2 ranks, one seed for both, one summary line.
run() {
    local name=$1 port=$((29600 + RANDOM % 300)) seed=$RANDOM r
    shift
    for r in 0 1; do
        env RANK=$r NRANKS=2 SEED=$seed NCCL_COMM_ID=127.0.0.1:$port LD_LIBRARY_PATH=$PWD/$G:$LD_LIBRARY_PATH "$@" \
            timeout 120 /tmp/issue34_config_prog > $OUT/$name.$r.log 2>&1 &
    done
    wait
    note "$name: $(grep -h -E 'RESULT|ERROR|FAIL' $OUT/$name.*.log | head -6 | cut -c1-300 | tr '\n' ' ')"
}

run plain
rm -f /tmp/issue34_tags.*
run profiled NCCL_PROFILER_PLUGIN=/tmp/libc_tagger.so RUSTCCL_C_PROFILER_OUT=/tmp/issue34_tags
for r in 0 1; do
    f=/tmp/issue34_tags.$r
    [ -f $f ] && cp $f $OUT/
    # Expected: at least 24 tagged CollApi (3 eager rounds of 8 calls, plus the 8 made while
    # capturing) and Coll for the 5 planner collectives at least (AlltoAll, Gather and Scatter
    # may come as P2p events with their call's tag), no KernelPhase.
    note "profiled rank $r: $(head -1 $f 2>/dev/null); tagged CollApi $(grep -cE '^CollApi .* 10[0-7]$' $f 2>/dev/null) Coll $(grep -cE '^Coll .* 10[0-7]$' $f 2>/dev/null), untagged $(grep -cE ' 0$' $f 2>/dev/null), KernelPhase $(grep -c KernelPhase $f 2>/dev/null)"
done

[ $started_mps = 1 ] && echo quit | nvidia-cuda-mps-control
tar czf $FINAL_OUT/logs.tgz -C $OUT . 2>/dev/null
