"""The native API on CUDA tensors (torch, through DLPack and Buffer.from_ptr): 2 ranks as
processes on the GPU(s) (one GPU: both ranks on it, MPS started first, as tests/gpu/*.sh do).
Skipped without torch or a CUDA GPU; run on the GPU machine by tests/gpu/python.sh.

Each rank fills fresh random data (seeded by rank and round), poisons the outputs, runs the
collective on a side stream (stream=torch.cuda.Stream), synchronizes that stream only, and
compares with the result computed on the CPU from every rank's inputs (regenerated from the
seeds): all_reduce (sum, max, avg; float32, bfloat16, int32), all_gather, reduce_scatter,
broadcast, all_to_all, a send/recv pair in a group, and Buffer.from_ptr on device memory.
Then the bad arguments: a CPU array on a cuda communicator, a tensor of another device kind.
"""
import pytest

torch = pytest.importorskip("torch")

from ranks import run_ranks  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CODE = r"""
import torch
dev = rank % torch.cuda.device_count()
torch.cuda.set_device(dev)
comm = rustccl.Communicator(size, uid, rank, device=dev, backend="cuda")
assert comm.backend == "cuda", comm.backend
side = torch.cuda.Stream()
checked = 0

def inputs(seed, n, dtype):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.rand(n, generator=g) * 8 - 4).to(dtype)
    return torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)

def check(name, got, want):
    global checked
    got = got.cpu()
    ok = torch.equal(got, want) if not got.dtype.is_floating_point else torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    if not ok:
        raise SystemExit(f"rank {rank}: {name}: got {got[:6]} want {want[:6]}")
    checked += 1

for rnd, n in enumerate([1, 1000, 1 << 20]):
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        ins = [inputs(1000 * rnd + r, n, dtype) for r in range(size)]
        mine = ins[rank].to(f"cuda:{dev}")
        for op in ("sum", "max", "avg"):
            if op == "avg" and not dtype.is_floating_point:
                continue
            out = torch.full_like(mine, -77)
            with torch.cuda.stream(side):
                comm.all_reduce(mine, out, op=op, stream=side)
            side.synchronize()
            stack = torch.stack([i.double() for i in ins])
            want = {"sum": stack.sum(0), "max": stack.max(0).values, "avg": stack.mean(0)}[op].to(dtype)
            check(f"all_reduce {op} {dtype} {n}", out, want)
        gathered = torch.full((size * n,), -77, dtype=dtype, device=f"cuda:{dev}")
        comm.all_gather(mine, gathered, stream=side)
        side.synchronize()
        check(f"all_gather {dtype} {n}", gathered, torch.cat(ins))
        if n % size == 0 or n == 1000:
            per = n // size
            rs = torch.full((per,), -77, dtype=dtype, device=f"cuda:{dev}")
            comm.reduce_scatter(mine[: per * size], rs, op="sum", stream=side)
            side.synchronize()
            total = torch.stack([i[: per * size].double() for i in ins]).sum(0).to(dtype)
            check(f"reduce_scatter {dtype} {n}", rs, total[rank * per:(rank + 1) * per])
            a2a = torch.full((per * size,), -77, dtype=dtype, device=f"cuda:{dev}")
            comm.all_to_all(mine[: per * size], a2a, stream=side)
            side.synchronize()
            check(f"all_to_all {dtype} {n}", a2a, torch.cat([ins[r][rank * per:(rank + 1) * per] for r in range(size)]))
        b = mine.clone() if rank == 1 else torch.full_like(mine, -77)
        comm.broadcast(b, root=1, stream=side)
        side.synchronize()
        check(f"broadcast {dtype} {n}", b, ins[1])

# A send/recv pair in a group, on the current (default) stream, through Buffer.from_ptr.
peer = (rank + 1) % size
src = (rank - 1) % size
x = torch.arange(4096, dtype=torch.float32, device=f"cuda:{dev}") + rank
y = torch.full_like(x, -77)
with rustccl.group():
    comm.send(rustccl.Buffer.from_ptr(x.data_ptr(), x.numel(), "float32", f"cuda:{dev}"), peer)
    comm.recv(rustccl.Buffer.from_ptr(y.data_ptr(), y.numel(), "float32", f"cuda:{dev}"), src)
torch.cuda.synchronize()
check("send/recv", y, torch.arange(4096, dtype=torch.float32) + src)

import numpy as np
for bad, why in ((np.zeros(4, np.float32), "host array"),):
    try:
        comm.all_reduce(bad)
    except rustccl.InvalidArgumentError as e:
        print(f"refused {why}: {e.message[:120]}")
    else:
        raise SystemExit(f"rank {rank}: a {why} on a cuda communicator was accepted")
comm.destroy()
print(f"RESULT rank {rank} checked {checked}")
"""


def test_collectives_on_cuda_tensors_match_the_cpu_reference():
    outs = run_ranks(2, CODE, timeout=300, backend=None)
    for r, out in enumerate(outs):
        assert f"RESULT rank {r} checked" in out, out
        assert "refused host array" in out, out
