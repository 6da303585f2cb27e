"""torch.distributed with the nccl backend, 2 processes (one GPU each), run unchanged on
whichever libnccl.so.2 the process loads: NVIDIA's (plain run) or rustccl's (LD_PRELOAD).

    python3 tests/torch/torch_dist.py --out results.json [--sizes] [--graph]

Every collective's result is checked against the value computed here, and saved, so that
the two libraries' runs can be compared; with --sizes, all_reduce is timed from 8 B to 1 GiB;
with --graph, an all_reduce is captured in a CUDA graph and the graph replayed with fresh
inputs (pass/fail under the JSON's "graph" key, a failure counted in "failures").
Skipped (exit 0 with a message) when there is no GPU.
"""
import argparse
import json
import os
import sys
import time


def graph_check(rank, world, dev, replays=10, n=65537):
    """dist.all_reduce captured in a CUDA graph, replayed `replays` times with fresh inputs
    copied into the captured tensor; returns a dict for the JSON (its "ok" says pass/fail)."""
    import torch
    import torch.distributed as dist

    def data(i, r):
        # Small integers: the float32 sum is exact in any order.
        return torch.randint(-100, 101, (n,), generator=torch.Generator().manual_seed(4321 + 1000 * i + r)).float()

    def want(i):
        return sum(data(i, r) for r in range(world))

    out = {"ok": False, "replays": replays, "count": n, "bad_replays": [], "error": None}
    static = torch.empty(n, device=dev)
    g = torch.cuda.CUDAGraph()
    captured = False
    try:
        # Warm-up outside capture, on a side stream (as PyTorch's CUDA graph docs require).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            static.copy_(data(0, rank))
            dist.all_reduce(static)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        out["warmup_ok"] = torch.equal(static.cpu(), want(0))
        dist.barrier()
        torch.cuda.synchronize()
        # Let the process group's watchdog retire the work enqueued so far before capturing.
        time.sleep(1)
        with torch.cuda.graph(g):
            dist.all_reduce(static)
        torch.cuda.synchronize()
        captured = True
    except Exception as e:  # capture unsupported, CUDA error, ...: a failure, not a crash
        out["error"] = f"capture: {type(e).__name__}: {e}"
    # Replay only if every rank captured (a lone replay would wait for its peer forever).
    try:
        flag = torch.tensor([1.0 if captured else 0.0], device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        everyone = flag.item() == 1.0
    except Exception as e:
        out["error"] = out["error"] or f"agreeing after capture: {type(e).__name__}: {e}"
        everyone = False
    if not everyone:
        out["error"] = out["error"] or "capture failed on another rank"
        return out
    try:
        for i in range(1, replays + 1):
            static.copy_(data(i, rank))
            g.replay()
            torch.cuda.synchronize()
            if not torch.equal(static.cpu(), want(i)):
                out["bad_replays"].append(i)
        del g
        torch.cuda.synchronize()
        out["ok_this_rank"] = out["warmup_ok"] and not out["bad_replays"]
        # "ok" is every rank's verdict (rank 0 writes the JSON).
        flag = torch.tensor([1.0 if out["ok_this_rank"] else 0.0], device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        out["ok"] = flag.item() == 1.0
    except Exception as e:
        out["error"] = f"replay: {type(e).__name__}: {e}"
    return out


def worker(rank, world, out_path, sizes, port, graph=False):
    import torch
    import torch.distributed as dist

    # Rank r on GPU r; with one GPU (--one-gpu) both ranks share it (rustccl allows that,
    # NVIDIA's NCCL refuses it; start MPS so that their kernels run side by side).
    gpu = rank % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", gpu))
    dev = torch.device("cuda", gpu)
    results = {}
    failures = []

    def check(name, got, want):
        ok = torch.equal(got.cpu(), want.cpu())
        results[name] = got.double().sum().item()
        if not ok:
            failures.append(name)

    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.randint(-50, 50, (1001,), generator=g).float().to(dev)
    allx = [torch.randint(-50, 50, (1001,), generator=torch.Generator().manual_seed(1234 + r)).float() for r in range(world)]

    t = x.clone()
    dist.all_reduce(t)
    check("all_reduce_sum", t, sum(allx))
    t = x.clone()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check("all_reduce_max", t, torch.stack(allx).max(0).values)
    outs = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(outs, x)
    check("all_gather", torch.cat(outs), torch.cat(allx))
    big = torch.cat([x + i for i in range(world)])
    rs = torch.empty_like(x)
    dist.reduce_scatter_tensor(rs, big)
    check("reduce_scatter", rs, sum(a + rank for a in allx))
    t = x.clone()
    dist.broadcast(t, src=1)
    check("broadcast", t, allx[1])
    a2a_in = torch.arange(world * 4, dtype=torch.float32, device=dev) + 100 * rank
    a2a_out = torch.empty_like(a2a_in)
    dist.all_to_all_single(a2a_out, a2a_in)
    want = torch.cat([torch.arange(world * 4, dtype=torch.float32)[rank * 4:(rank + 1) * 4] + 100 * r for r in range(world)])
    check("all_to_all", a2a_out, want)
    peer = 1 - rank
    s = torch.full((257,), float(rank + 7), device=dev)
    r = torch.empty_like(s)
    if rank == 0:
        dist.send(s, peer)
        dist.recv(r, peer)
    else:
        dist.recv(r, peer)
        dist.send(s, peer)
    check("send_recv", r, torch.full((257,), float(peer + 7)))
    dist.barrier()

    # A small DDP training step.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    inp = torch.randn(16, 32, generator=torch.Generator().manual_seed(rank)).to(dev)
    loss = ddp(inp).square().mean()
    loss.backward()
    opt.step()
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    ws = [torch.empty_like(w) for _ in range(world)]
    dist.all_gather(ws, w)
    if not torch.equal(ws[0], ws[1]):
        failures.append("ddp_weights_differ")
    results["ddp_weight_sum"] = w.double().sum().item()

    timings = []
    if sizes:
        n = 8
        while n <= (1 << 30):
            t = torch.ones(n // 4 if n >= 4 else 1, device=dev)
            iters = 20 if n < (64 << 20) else 5
            for _ in range(3):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / iters * 1e6
            nbytes = t.numel() * 4
            timings.append({"bytes": nbytes, "time_us": us, "busbw_GBps": nbytes / us / 1e3 * 2 * (world - 1) / world})
            n *= 8
    graph_result = None
    if graph:
        graph_result = graph_check(rank, world, dev)
        if not graph_result["ok"]:
            failures.append("graph")
    if rank == 0:
        out = {"results": results, "failures": failures, "timings": timings}
        if graph_result is not None:
            out["graph"] = graph_result
        with open(out_path, "w") as f:
            json.dump(out, f, indent=1)
    print(f"rank {rank}: {len(failures)} failures {failures}", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", action="store_true")
    ap.add_argument("--graph", action="store_true", help="also check an all_reduce captured in a CUDA graph")
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--one-gpu", action="store_true", help="both ranks on one GPU (rustccl only; start MPS first)")
    a = ap.parse_args()
    import torch
    import torch.multiprocessing as mp
    if not torch.cuda.is_available() or torch.cuda.device_count() < (1 if a.one_gpu else 2):
        print("SKIPPED: needs 2 CUDA devices (or --one-gpu)")
        return
    mp.spawn(worker, args=(2, a.out, a.sizes, a.port, a.graph), nprocs=2, join=True)


if __name__ == "__main__":
    main()
