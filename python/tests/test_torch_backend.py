"""The torch.distributed backend "rustccl" against Gloo (CPU) and NCCL (CUDA).

Each test starts two ranks as processes running torch_worker.py, which compares rustccl's
results with the reference backend's inside each rank; a rank that finds a difference exits
non-zero. Every launch is bounded by a timeout, so a hang fails the test.
"""

import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
rustccl = pytest.importorskip("rustccl")
if not hasattr(rustccl, "Communicator"):
    pytest.skip("rustccl's native API (python/src) is not built", allow_module_level=True)

from ranks import run_ranks  # noqa: E402  (after the skips: it imports rustccl)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_worker.py")
TIMEOUT_S = 60


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch_ranks(scenario, nranks=2, backend="host"):
    """Runs the worker's scenario as `nranks` processes (tests/ranks.py: killed and failed
    after TIMEOUT_S); checks each rank finished it; returns their outputs."""
    port = _free_port()
    code = f"""
import runpy
sys.argv = [{WORKER!r}, {scenario!r}]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
    outs = run_ranks(
        nranks, code, timeout=TIMEOUT_S, backend=backend,
        env=lambda r: dict(RANK=r, LOCAL_RANK=r, WORLD_SIZE=nranks, LOCAL_WORLD_SIZE=nranks,
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS=1),
    )
    for rank, out in enumerate(outs):
        assert f"RANK {rank} OK {scenario}" in out, out
    return outs


def test_collectives_match_gloo():
    run_torch_ranks("collectives")


def test_ddp_losses_match_gloo():
    run_torch_ranks("ddp")


def test_fsdp_losses_match_gloo():
    run_torch_ranks("fsdp")


def test_device_backend_map():
    run_torch_ranks("mapping")


def test_bitwise_op_is_refused_with_message():
    outs = run_torch_ranks("bad_op")
    assert all("not supported; use SUM" in o for o in outs)


def test_init_process_group_under_torchrun():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(_free_port()), WORKER, "default"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "RANK 0 OK default" in p.stdout and "RANK 1 OK default" in p.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tensors_match_nccl():
    """Two GPUs or more: every collective against NCCL's, and "cpu:rustccl,cuda:nccl". One
    GPU: all_reduce, all_gather_into_tensor and broadcast against Gloo on the same data in
    host memory, two ranks on the GPU (start MPS first, as tests/gpu/*.sh do)."""
    run_torch_ranks("cuda", backend=None)  # each communicator names its backend
