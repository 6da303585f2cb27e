#!/usr/bin/env bash
# Issue 12's checks on one GPU in one device call, from binaries under target/gpu:
#  1. the new kernels compile; the correctness matrix with 2 ranks as processes under MPS (P2P
#     with the default choices and with LL / LL128 forced, SHM), and every protocol from 4 B to
#     256 MiB checked by the bench (#wrong summed);
#  2. one rank against NVIDIA's NCCL (out of place / in place), and the host cost per call
#     (RUSTCCL_PROFILE_ENQUEUE=1, rank-worker latency, 2 ranks);
#  3. the typed API's cudarc example (2 ranks on the GPU) and PyTorch with rustccl's
#     libnccl.so.2 preloaded;
#  4. the kernel before and after (the directory $1 holds the old exec.cu, same ABI): one
#     channel per protocol, and the default choices for the collectives in $COLLS (all_reduce
#     and all_gather unless set), 2 ranks;
#  5. where a block's time goes per protocol (kernels built with -DRUSTCCL_KERNEL_TIMING=1);
#  0. (first, before MPS) the README's main job: ranks by default, and 2 ranks on one GPU
#     without MPS (one line saying so) and with --start-mps.
#  4b. (P2P_CHANNELS="8 32", when set) alltoall and sendrecv with those NCCL_MAX_P2P_NCHANNELS;
#  6. (trace) the driver calls per operation and their host time, where nsys is installed:
#     one rank out of place (Rust API, C ABI, NCCL) and 2 ranks, 8 B all_reduce.
# SKIP lists sections to leave out: compile layout matrix sweeps one_rank latency torch ab
# defaults timing trace; PROTOS the protocols of ab and timing (Simple LL128 LL unless set). A
# short kernel round: SKIP="compile layout matrix one_rank latency torch defaults trace"
# PROTOS=Simple. VARIANTS, when set, is a list of PROTOCOL:DEFINES[:ENV] (DEFINES for
# RUSTCCL_KERNEL_DEFINES, ENV variable assignments; commas for spaces in both) to run the
# one-channel all_reduce of that protocol with too, and to check it from 4 B, e.g.
# VARIANTS="LL128:-DRUSTCCL_LL128_WAIT_TAIL=1 Simple::NCCL_BUFFSIZE=8388608".
# Only summary.txt, logs.tgz and kcache.tgz come back ($OUT); logs are written in /tmp first.
#   tests/gpu/device_path.sh target/gpu/old-src
set -u
OLD=$1
k=0
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
results device_path
restore_kcache
nvidia-smi -L >> $S
if want compile; then
    timeout 300 $G/rank-worker compile-kernels 1 0 none > $OUT/compile.log 2>&1
    note "kernels: $(grep -E '^(RESULT|ERROR)' $OUT/compile.log | cut -c1-1500 | tr '\n' ' ')"
fi
# 0. The README's main job on this machine.
if want layout; then
timeout 60 $G/rustccl-bench all_reduce -b 8 -e 1M -f 32 -c 1 -n 10 -w 2 > $OUT/layout_default.txt 2>&1
note "layout, default ranks: rc $? $(grep -h -i -E 'ranks|mps|time-slice' $OUT/layout_default.txt | head -3 | tr '\n' ' ' | cut -c1-300) $(wrong $OUT/layout_default.txt)"
timeout 60 $G/rustccl-bench all_reduce -N 2 -b 8 -e 64K -f 64 -c 1 -n 3 -w 1 > $OUT/layout_nomps.txt 2>&1
note "layout, -N 2 without MPS: rc $? $(grep -h -i -E 'mps|time-slice' $OUT/layout_nomps.txt | head -2 | tr '\n' ' ' | cut -c1-400)"
timeout 90 $G/rustccl-bench all_reduce -N 2 --start-mps -b 8 -e 1M -f 32 -c 1 -n 10 -w 2 > $OUT/layout_mps.txt 2>&1
note "layout, -N 2 --start-mps: rc $? $(grep -h -i -E 'mps' $OUT/layout_mps.txt | head -2 | tr '\n' ' ' | cut -c1-300) $(wrong $OUT/layout_mps.txt); MPS still running after: $(pgrep -c nvidia-cuda-mps || true)"
grep -E "^ +[0-9]" $OUT/layout_mps.txt | awk '{print "  ", $1, $6, $8}' | tee -a $S
fi
# 2. One rank against NCCL, without MPS (as NCCL runs one rank).
want one_rank && for c in all_reduce broadcast all_gather reduce_scatter; do
    A="$c -N 1 -b 8 -e 1G -f 8 -c 1 -n ${ONE_N:-50} -w 5"
    timeout 90 $G/rustccl-bench $A > $OUT/one_${c}_rust.txt 2>&1
    timeout 90 $G/rustccl-bench $A --lib $PWD/$G/libnccl.so.2 > $OUT/one_${c}_capi.txt 2>&1
    [ -n "$NV" ] && timeout 90 $G/rustccl-bench $A --lib "$NV" > $OUT/one_${c}_nccl.txt 2>&1
    note "== $c, 1 rank: size | us out of place, in place: rustccl Rust API | rustccl C ABI | NCCL ($(wrong $OUT/one_${c}_rust.txt $OUT/one_${c}_capi.txt))"
    paste <(grep -E "^ +[0-9]" $OUT/one_${c}_rust.txt | awk '{print $1, $6, $10}') \
          <(grep -E "^ +[0-9]" $OUT/one_${c}_capi.txt | awk '{print $6, $10}') \
          <(grep -E "^ +[0-9]" $OUT/one_${c}_nccl.txt | awk '{print $6, $10}') | tee -a $S
done
started_mps=0
nvidia-cuda-mps-control -d 2>/dev/null && started_mps=1
note "MPS started: $started_mps"

# 1. Correctness.
if want matrix; then
matrix p2p 150 | tee -a $S
for p in LL LL128; do matrix proto_$p 150 NCCL_PROTO=$p | tee -a $S; done
matrix shm 150 NCCL_P2P_DISABLE=1 | tee -a $S
fi
want sweeps && for p in LL LL128 Simple; do
    NCCL_PROTO=$p timeout 120 $G/rustccl-bench all_reduce -N 2 -b 4 -e 256M -f 16 -c 1 -n 3 -w 1 > $OUT/sweep_$p.txt 2>&1
    note "sweep $p all_reduce 4 B..256 MiB: $(wrong $OUT/sweep_$p.txt) $(grep -h -E 'rror' $OUT/sweep_$p.txt | head -2 | tr '\n' ' ')"
done

# 2b. Host cost per call (the one-rank runs are before MPS starts).
want latency && enqueue_latency ", under MPS" && enqueue_latency ", under MPS" 1

# 3. cudarc example and PyTorch.
[ -x $G/cudarc_all_reduce ] && timeout 120 $G/cudarc_all_reduce > $OUT/cudarc.log 2>&1 &&
note "cudarc example (2 ranks, one GPU): rc $? $(tail -3 $OUT/cudarc.log | tr '\n' ' ' | cut -c1-400)"
want torch && LD_PRELOAD=$PWD/$G/libnccl.so.2 timeout 150 python3 tests/torch/torch_dist.py --out $OUT/torch_rustccl.json --sizes --graph --one-gpu --port 29544 > $OUT/torch_rustccl.log 2>&1
want torch && note "torch (rustccl preloaded): rc $? $(grep -h -E 'failures|version|Error' $OUT/torch_rustccl.log | head -4 | tr '\n' ' ' | cut -c1-400)"

# 4. Kernel before and after.
OLDKC=$RUSTCCL_KERNEL_CACHE_DIR.old
bench() {  # bench <new|old> <file> <args...>
    local which=$1 f=$2; shift 2
    if [ $which = new ]; then timeout 100 $G/rustccl-bench "$@" > $f 2>&1
    # (old kernels know only 8 Simple slots per connection)
    else RUSTCCL_SIMPLE_STEPS=8 RUSTCCL_KERNEL_SOURCE_DIR=$PWD/$OLD RUSTCCL_KERNEL_CACHE_DIR=$OLDKC timeout 100 $G/rustccl-bench "$@" > $f 2>&1; fi
}
PROTOS=${PROTOS:-Simple LL128 LL}
want ab && for p in $PROTOS; do
    case $p in Simple) e=256M;; LL128) e=32M;; LL) e=4M;; esac
    for which in new old new old; do
        NCCL_PROTO=$p NCCL_MIN_CTAS=1 NCCL_MAX_CTAS=1 bench $which $OUT/ch1_${p}_${which}_$((++k)).txt all_reduce -N 2 -b 8 -e $e -f 8 -c 1 -n 20 -w 5
    done
    note "== 1 channel, $p, all_reduce 2 ranks: size | us, busbw: new, old, new, old"
    paste <(grep -E "^ +[0-9]" $(ls $OUT/ch1_${p}_new_* | head -1) | awk '{print $1, $6, $8}') \
          <(grep -E "^ +[0-9]" $(ls $OUT/ch1_${p}_old_* | head -1) | awk '{print $6, $8}') \
          <(grep -E "^ +[0-9]" $(ls $OUT/ch1_${p}_new_* | tail -1) | awk '{print $6, $8}') \
          <(grep -E "^ +[0-9]" $(ls $OUT/ch1_${p}_old_* | tail -1) | awk '{print $6, $8}') | tee -a $S
    note "  checked: $(wrong $OUT/ch1_${p}_*)"
done
want defaults && for c in ${COLLS:-all_reduce all_gather}; do
    for which in new old; do bench $which $OUT/def_${c}_$which.txt $c -N 2 -b 8 -e 1G -f 8 -c 1 -n 20 -w 5; done
    note "== $c 2 ranks, default choices: size | us, busbw: new, old ($(wrong $OUT/def_${c}_*))"
    paste <(grep -E "^ +[0-9]" $OUT/def_${c}_new.txt | awk '{print $1, $6, $8}') \
          <(grep -E "^ +[0-9]" $OUT/def_${c}_old.txt | awk '{print $6, $8}') | tee -a $S
done
# 4b. Point-to-point channels: alltoall and sendrecv, 2 ranks, with NCCL_MAX_P2P_NCHANNELS
# from $P2P_CHANNELS (a list; unset: this section does not run).
for ch in ${P2P_CHANNELS:-}; do
    for c in alltoall sendrecv; do
        NCCL_MAX_P2P_NCHANNELS=$ch timeout 100 $G/rustccl-bench $c -N 2 -b 8 -e 1G -f 8 -c 1 -n 20 -w 5 > $OUT/p2p_${c}_$ch.txt 2>&1
    done
done
for c in alltoall sendrecv; do
    [ -n "${P2P_CHANNELS:-}" ] || break
    note "== $c 2 ranks: size | us, busbw with NCCL_MAX_P2P_NCHANNELS = ${P2P_CHANNELS} ($(wrong $OUT/p2p_${c}_*))"
    for ch in $P2P_CHANNELS; do grep -E "^ +[0-9]" $OUT/p2p_${c}_$ch.txt | awk '{print $1, $6, $8}' > /tmp/p2p_${c}_$ch.col; done
    paste $(for ch in $P2P_CHANNELS; do echo /tmp/p2p_${c}_$ch.col; done) | tee -a $S
done
# 5. Where a block's time goes (thread 0's clock: waiting for a ready step, building its view,
# the data between the two barriers, posting), one channel, per protocol.
for v in ${VARIANTS:-}; do
    proto=${v%%:*} rest=${v#*:}
    defs=${rest%%:*} envs=
    [ "$rest" != "$defs" ] && envs=${rest#*:}
    case $proto in Simple) e=256M;; LL128) e=32M;; *) e=4M;; esac
    vrun() { env ${envs//,/ } NCCL_PROTO=$proto RUSTCCL_KERNEL_DEFINES="${defs//,/ }" RUSTCCL_KERNEL_CACHE_DIR=$RUSTCCL_KERNEL_CACHE_DIR.v$k "$@"; }
    k=$((k + 1))
    NCCL_MIN_CTAS=1 NCCL_MAX_CTAS=1 vrun timeout 100 $G/rustccl-bench all_reduce -N 2 -b 2M -e $e -f 4 -c 1 -n 20 -w 5 > $OUT/variant_${proto}_$k.txt 2>&1
    vrun timeout 100 $G/rustccl-bench all_reduce -N 2 -b 4 -e $e -f 16 -c 1 -n 3 -w 1 > $OUT/variant_check_${proto}_$k.txt 2>&1
    note "== variant ${defs//,/ } ${envs//,/ }, 1 channel, $proto: size | us, busbw ($(wrong $OUT/variant_${proto}_$k.txt); default channels 4 B..$e: $(wrong $OUT/variant_check_${proto}_$k.txt))"
    grep -E "^ +[0-9]" $OUT/variant_${proto}_$k.txt | awk '{print "  ", $1, $6, $8}' | tee -a $S
done
want timing && for proto in $PROTOS; do
    case $proto in Simple) size=128M;; LL128) size=16M;; *) size=1M;; esac
    NCCL_PROTO=$proto NCCL_MIN_CTAS=1 NCCL_MAX_CTAS=1 RUSTCCL_KERNEL_DEFINES=-DRUSTCCL_KERNEL_TIMING=1 RUSTCCL_KERNEL_CACHE_DIR=$RUSTCCL_KERNEL_CACHE_DIR.timing \
        timeout 100 $G/rustccl-bench all_reduce -N 2 -b $size -e $size -c 1 -n 3 -w 1 > $OUT/timing_$proto.txt 2>&1
    note "timing $proto $size ($(wrong $OUT/timing_$proto.txt)): $(grep -h RUSTCCL_KERNEL_TIMING $OUT/timing_$proto.txt | tail -2 | tr '\n' ' ' | cut -c1-500)"
done
# 6. Driver calls per operation (nsys, where installed).
if want trace; then
    note "tools: $(command -v nsys ncu perf ltrace 2>/dev/null | tr '\n' ' ')"
    if command -v nsys > /dev/null; then
        trace() {  # trace <name> <bench args...>
            local name=$1; shift
            timeout 120 nsys profile -t cuda -o /tmp/trace_$name --force-overwrite true $G/rustccl-bench "$@" > $OUT/trace_${name}_run.txt 2>&1
            timeout 60 nsys stats -q -r cuda_api_sum -f csv /tmp/trace_$name.nsys-rep > $OUT/trace_$name.csv 2>&1
            note "trace $name ($*): calls, total ns, name (top 12 by time)"
            awk -F, 'NR > 1 && NF > 8 {gsub(/"/, ""); printf "   %s %s %s\n", $3, $2, $NF}' $OUT/trace_$name.csv | head -12 | tee -a $S
        }
        A="all_reduce -N 1 -b 8 -e 8 -c 0 -n 2000 -w 100"
        trace one_rust $A
        trace one_capi $A --lib $PWD/$G/libnccl.so.2
        [ -n "$NV" ] && trace one_nccl $A --lib "$NV"
        trace two_rust all_reduce -N 2 -b 8 -e 8 -c 0 -n 2000 -w 100
    fi
fi
[ $started_mps = 1 ] && echo quit | nvidia-cuda-mps-control
for d in $RUSTCCL_KERNEL_CACHE_DIR; do
    f=$(ls -S $d 2>/dev/null | head -1)
    [ -n "$f" ] && note "resources: $(cuobjdump -res-usage $d/$f 2>&1 | grep -E 'REG|STACK|LOCAL' | head -2 | tr -s ' ' | tr '\n' ' ' | cut -c1-300)"
done
tar czf $FINAL_OUT/kcache.tgz -C target kcache 2>/dev/null
tar czf $FINAL_OUT/logs.tgz -C $OUT . 2>/dev/null
