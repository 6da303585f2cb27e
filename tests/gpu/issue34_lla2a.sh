#!/usr/bin/env bash
# Issue 34 item 4 on one GPU, in one device call, against target/gpu's libnccl (tests/gpu/build.sh):
# a user kernel's LL all-to-all (tests/gpu/lla2a_kernel.cu, compiled by nvcc against
# capi/include/nccl_device.h) as 2 ranks on one GPU under MPS: CTA and warp sessions
# (ncclLLA2ASession) with send/recv, bcast/recvUnrolled and send/recvReduce on elements of 4, 8
# and 20 bytes, fresh data each run (LLA2A_SEED), every element checked, the saved epochs
# checked after 9 launches per kernel; two runs with different data. Prints a PASS/FAIL summary
# line per run; only summary.txt and logs.tgz come back.
#   tests/gpu/issue34_lla2a.sh
set -u
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
results issue34_lla2a
nvidia-smi -L >> $S
nvcc -O2 -arch=native -I capi/include -o /tmp/lla2a_kernel tests/gpu/lla2a_kernel.cu -L$G -lnccl -lcuda > $OUT/lla2a_build.log 2>&1
note "lla2a user kernel build: rc $? $(head -c 800 $OUT/lla2a_build.log | tr '\n' ' ')"
started_mps=0
nvidia-cuda-mps-control -d 2>/dev/null && started_mps=1
note "MPS started: $started_mps"
if [ -x /tmp/lla2a_kernel ]; then
    for run in 1 2; do
        port=$((29600 + RANDOM % 300)) seed=$((RANDOM * 32768 + RANDOM))
        for r in 0 1; do
            RANK=$r NRANKS=2 LLA2A_SEED=$seed NCCL_COMM_ID=127.0.0.1:$port LD_LIBRARY_PATH=$PWD/$G:$LD_LIBRARY_PATH \
                timeout 120 /tmp/lla2a_kernel > $OUT/lla2a.$run.$r.log 2>&1 &
        done
        wait
        note "lla2a user kernel, run $run (seed $seed): $(cat $OUT/lla2a.$run.*.log | grep -E '^(RESULT|PASS|FAIL|ERROR)' | head -6 | cut -c1-300 | tr '\n' ' ')"
        pass=$(cat $OUT/lla2a.$run.*.log | grep -c '^PASS lla2a')
        note "lla2a run $run summary: $([ "$pass" = 2 ] && echo PASS || echo FAIL) ($pass of 2 ranks passed)"
    done
fi
[ $started_mps = 1 ] && echo quit | nvidia-cuda-mps-control
tar czf $FINAL_OUT/logs.tgz -C $OUT . 2>/dev/null
