#!/usr/bin/env bash
# Rooflines and kernel knobs on one GPU (issue 12): the plain copy kernel per block count and
# cudaMemcpy; the interpreter's registers and local memory (cuobjdump on the kernel cache);
# one channel of Simple and LL128 (2 ranks under MPS) with other unroll depths
# (RUSTCCL_KERNEL_DEFINES); PyTorch with rustccl preloaded, both ranks on the one GPU.
# Uses target/gpu (and target/gpu/kcache.tgz when present); summary.txt and logs.tgz in $OUT.
set -u
. tests/gpu/env.sh
export RUSTCCL_BACKEND=cuda
results kernel_tuning
restore_kcache
copy_roofline
# Kernel cache entries: "RCCLKRN1", the 32-byte key, the length (u64), the CUBIN.
for f in $(ls -S $RUSTCCL_KERNEL_CACHE_DIR | head -2); do
    python3 - "$RUSTCCL_KERNEL_CACHE_DIR/$f" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack_from("<Q", b, 40)[0]
open("/tmp/k.cubin", "wb").write(b[48:48 + n])
PY
    note "resources $f: $(cuobjdump -res-usage /tmp/k.cubin 2>&1 | grep -E 'REG|Function' | tr -s ' ' | tr '\n' ' ' | cut -c1-400)"
done
started_mps=0
nvidia-cuda-mps-control -d 2>/dev/null && started_mps=1
LD_PRELOAD=$PWD/$G/libnccl.so.2 timeout 150 python3 tests/torch/torch_dist.py --out $OUT/torch_rustccl.json --sizes --graph --one-gpu --port 29544 > $OUT/torch_rustccl.log 2>&1
note "torch (rustccl preloaded, 2 ranks on one GPU): rc $? $(grep -h -E 'failures|SKIPPED|Error' $OUT/torch_rustccl.log | head -4 | tr '\n' ' ' | cut -c1-400)"
python3 -c "import json; d=json.load(open('$OUT/torch_rustccl.json')); [print(t['bytes'], round(t['time_us'],1)) for t in d.get('timings', [])]; print('graph', d.get('graph'))" 2>&1 | tr '\n' ' ' | tee -a $S; echo >> $S
for cfg in "Simple -DRUSTCCL_SIMPLE_UNROLL=8" "Simple -DRUSTCCL_SIMPLE_UNROLL=2" "LL128 -DRUSTCCL_LL128_UNROLL=8" "LL128 -DRUSTCCL_LL128_UNROLL=2" "Simple" "LL128"; do
    set -- $cfg
    p=$1; d=${2:-}
    case $p in Simple) e=128M;; LL128) e=16M;; esac
    f=$OUT/ch1_${p}_${d#-DRUSTCCL_}.txt
    RUSTCCL_KERNEL_DEFINES="$d" NCCL_PROTO=$p NCCL_MIN_CTAS=1 NCCL_MAX_CTAS=1 timeout 100 $G/rustccl-bench all_reduce -N 2 -b 2M -e $e -f 8 -c 1 -n 20 -w 5 > $f 2>&1
    note "1 channel $p ${d:-default}: $(grep -hE '^ +[0-9]' $f | awk '{printf "%s B %s us %s GB/s (wrong %d); ", $1, $6, $8, $9+$13}')"
done
[ $started_mps = 1 ] && echo quit | nvidia-cuda-mps-control
tar czf $FINAL_OUT/logs.tgz -C $OUT . 2>/dev/null
