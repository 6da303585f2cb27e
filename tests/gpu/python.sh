#!/usr/bin/env bash
# Issue 36 on one GPU (or more), in one device call: the rustccl wheel (python/build-wheel.sh,
# carried as python/dist) installed with no network into /tmp/pyrustccl (on PYTHONPATH: the
# machine's PyTorch and numpy stay as they are), then, 2 ranks as processes under MPS:
#  1. native: python/tests/test_native_cuda.py (torch CUDA tensors through DLPack and
#     Buffer.from_ptr on a cuda communicator, every checked collective against the CPU
#     reference, a host array refused);
#  2. torch: python/tests/test_torch_backend.py's CUDA test (the "rustccl" process group on
#     CUDA tensors; one GPU: against Gloo on CPU copies);
#  3. preload: `python -m rustccl.preload -- python3 tests/torch/torch_dist.py --one-gpu`:
#     PyTorch's own NCCL process group on the wheel's libnccl.so.2.
# Each step notes its result in summary.txt; logs in logs.tgz. The kernel cache comes from
# target/gpu/kcache.tgz as in the other scripts.
#   tests/gpu/python.sh
set -u
. tests/gpu/env.sh
results python
restore_kcache
nvidia-smi -L >> $S
python3 --version >> $S 2>&1
python3 -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__, 'cuda', torch.cuda.is_available())" >> $S 2>&1
rm -rf /tmp/pyrustccl
python3 -m pip install -q --no-index --no-deps --target /tmp/pyrustccl python/dist/rustccl-*.whl > $OUT/install.log 2>&1
note "install: rc $? $(tail -c 300 $OUT/install.log | tr '\n' ' ')"
export PYTHONPATH=/tmp/pyrustccl
python3 -c "import rustccl; print('rustccl', rustccl.version(), rustccl.library_path())" >> $S 2>&1

started_mps=0
nvidia-cuda-mps-control -d 2>/dev/null && started_mps=1
note "MPS started: $started_mps"

# pytest where the machine has it, else the test function called directly.
pyrun() {  # pyrun <name> <file> <test function>
    local name=$1 file=$2 fn=$3
    if python3 -c "import pytest" 2>/dev/null; then
        (cd python/tests && timeout 400 python3 -m pytest -q -x "$file::$fn") > $OUT/$name.log 2>&1
    else
        (cd python/tests && timeout 400 python3 -c "import ${file%.py} as t; t.$fn(); print('passed (called directly)')") > $OUT/$name.log 2>&1
    fi
    note "$name: rc $? $(tail -3 $OUT/$name.log | tr '\n' ' ' | cut -c1-400)"
}
pyrun native test_native_cuda.py test_collectives_on_cuda_tensors_match_the_cpu_reference
pyrun torch test_torch_backend.py test_cuda_tensors_match_nccl

timeout 200 python3 -m rustccl.preload -- python3 tests/torch/torch_dist.py --out $OUT/torch_preload.json --sizes --graph --one-gpu --port 29544 > $OUT/preload.log 2>&1
note "preload: rc $? $(grep -h -E 'failures|Error' $OUT/preload.log | head -4 | tr '\n' ' ' | cut -c1-400)"

[ $started_mps = 1 ] && echo quit | nvidia-cuda-mps-control
tar czf $FINAL_OUT/logs.tgz -C $OUT . 2>/dev/null
