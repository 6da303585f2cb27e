"""One rank of the torch backend tests (python/tests/test_torch_backend.py starts them).

Usage: torch_worker.py SCENARIO, with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set
(torchrun or the tests' launcher). Each scenario runs the same operations through the
"rustccl" backend and through a reference backend (Gloo on CPU, NCCL on CUDA) in one process
and compares the results; any mismatch raises, so the rank exits non-zero. A rank prints
"RANK <r> OK <scenario>" at the end.
"""

import os
import sys

import torch
import torch.distributed as dist

import rustccl.torch  # noqa: F401  (registers "rustccl")


def check(name, got, want):
    if isinstance(got, (list, tuple)):
        for i, (g, w) in enumerate(zip(got, want)):
            check(f"{name}[{i}]", g, w)
        return
    if not torch.equal(got.cpu(), want.cpu()):
        raise AssertionError(f"{name}: rustccl gave {got}, the reference {want}")


def data(rank, n, dtype, device, salt=0):
    """Distinct per rank and position; small integers so that float sums are exact."""
    base = torch.arange(n, dtype=torch.float64) % 7 + 1 + rank * 3 + salt
    return base.to(dtype=dtype, device=device)


def compare_collectives(pg, ref, device):
    """Every collective the backend offers, on `pg` and `ref`, results compared."""
    rank, size = dist.get_rank(pg), dist.get_world_size(pg)

    def both(name, fn):
        got, want = fn(pg), fn(ref)
        check(name, got, want)

    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16,
                  torch.uint8):
        for n in (1, 1000, 70000) if dtype == torch.float32 else (3, 1000):
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN):
                if dtype == torch.uint8 and op == dist.ReduceOp.SUM:
                    continue

                def ar(g, op=op, n=n, dtype=dtype):
                    t = data(rank, n, dtype, device)
                    dist.all_reduce(t, op=op, group=g)
                    return t
                both(f"all_reduce {dtype} {n} {op}", ar)
    both("all_reduce product", lambda g: _ar_op(g, rank, device, dist.ReduceOp.PRODUCT))
    both("all_reduce async", lambda g: _ar_async(g, rank, device))

    for n in (1, 4097):
        def ag(g, n=n):
            out = torch.empty(n * size, device=device)
            dist.all_gather_into_tensor(out, data(rank, n, torch.float32, device), group=g)
            return out
        both(f"all_gather_into_tensor {n}", ag)

        def ag_list(g, n=n):
            outs = [torch.empty(n, device=device) for _ in range(size)]
            dist.all_gather(outs, data(rank, n, torch.float32, device), group=g)
            return outs
        both(f"all_gather {n}", ag_list)

        def rs(g, n=n):
            out = torch.empty(n, device=device)
            dist.reduce_scatter_tensor(out, data(rank, n * size, torch.float32, device),
                                       group=g)
            return out
        both(f"reduce_scatter_tensor {n}", rs)

        def rs_list(g, n=n):
            out = torch.empty(n, device=device)
            ins = [data(rank, n, torch.float32, device, salt=i) for i in range(size)]
            dist.reduce_scatter(out, ins, group=g)
            return out
        if device.type != "cpu":  # Gloo has no list reduce_scatter
            both(f"reduce_scatter {n}", rs_list)
        else:
            check(f"reduce_scatter {n}", rs_list(pg), _rs_expected(rank, n, size, device))

        for root in range(size):
            def bc(g, n=n, root=root):
                t = data(rank, n, torch.int64, device)
                dist.broadcast(t, group_src=root, group=g)
                return t
            both(f"broadcast {n} root {root}", bc)

            def red(g, n=n, root=root):
                t = data(rank, n, torch.float32, device)
                dist.reduce(t, group_dst=root, group=g)
                return t if rank == root else torch.zeros(0)
            both(f"reduce {n} root {root}", red)

        def a2a_single(g, n=n):
            out = torch.empty(n * size, device=device)
            dist.all_to_all_single(out, data(rank, n * size, torch.float32, device), group=g)
            return out
        both(f"all_to_all_single {n}", a2a_single)

    def a2a_uneven(g):
        # rank r sends r + p + 1 rows of 3 to peer p
        ins = [r_ + p + 1 for r_ in [rank] for p in range(size)]
        outs = [p + rank + 1 for p in range(size)]
        inp = data(rank, sum(ins) * 3, torch.float32, device).reshape(-1, 3)
        out = torch.empty(sum(outs), 3, device=device)
        dist.all_to_all_single(out, inp, outs, ins, group=g)
        return out
    both("all_to_all_single uneven", a2a_uneven)

    def a2a_list(g):
        ins = [data(rank, 4, torch.float32, device, salt=p) for p in range(size)]
        outs = [torch.empty(4, device=device) for _ in range(size)]
        dist.all_to_all(outs, ins, group=g)
        return outs
    if device.type != "cpu":  # Gloo has no list all_to_all
        both("all_to_all", a2a_list)

    def p2p(g):
        send = data(rank, 9, torch.float32, device)
        recv = torch.empty(9, device=device)
        ops = [dist.P2POp(dist.isend, send, group_peer=(rank + 1) % size, group=g),
               dist.P2POp(dist.irecv, recv, group_peer=(rank - 1) % size, group=g)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return recv
    both("batch_isend_irecv ring", p2p)

    def sendrecv(g):
        t = data(rank, 6, torch.float32, device)
        if rank == 0:
            dist.send(t, group_dst=1, group=g)
            dist.recv(t, group_src=1, group=g)
        elif rank == 1:
            dist.recv(t, group_src=0, group=g)
            t.add_(10)
            dist.send(t, group_dst=0, group=g)
        return t
    both("send/recv", sendrecv)

    def isend_irecv(g):
        t = data(rank, 6, torch.float32, device)
        r = torch.empty(6, device=device)
        peer = (rank + 1) % size
        w1 = dist.isend(t, group_dst=peer, group=g)
        w2 = dist.irecv(r, group_src=(rank - 1) % size, group=g)
        w1.wait()
        w2.wait()
        return r
    both("isend/irecv", isend_irecv)

    if device.type == "cpu":
        def gather(g):
            outs = [torch.empty(3) for _ in range(size)] if rank == 0 else None
            dist.gather(data(rank, 3, torch.float32, device), outs, group_dst=0, group=g)
            return outs if rank == 0 else []
        both("gather", gather)

        def scatter(g):
            ins = [data(p, 3, torch.float32, device) for p in range(size)] if rank == 1 else None
            out = torch.empty(3)
            dist.scatter(out, ins, group_src=1, group=g)
            return out
        both("scatter", scatter)

    def coalesced_all_reduce(g):
        ts = [data(rank, n, torch.float32, device, salt=n) for n in (3, 100, 5000)]
        with dist._coalescing_manager(group=g, async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t, group=g)
        cm.wait()
        return ts
    both("coalesced all_reduce", coalesced_all_reduce)

    def coalesced_all_gather(g):
        ins = [data(rank, n, torch.float32, device, salt=n) for n in (3, 100)]
        outs = [torch.empty(n * size, device=device) for n in (3, 100)]
        with dist._coalescing_manager(group=g, async_ops=True) as cm:
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i, group=g)
        cm.wait()
        return outs
    both("coalesced all_gather_into_tensor", coalesced_all_gather)

    def coalesced_reduce_scatter(g):
        ins = [data(rank, n * size, torch.float32, device, salt=n) for n in (3, 100)]
        outs = [torch.empty(n, device=device) for n in (3, 100)]
        with dist._coalescing_manager(group=g, async_ops=True) as cm:
            for o, i in zip(outs, ins):
                dist.reduce_scatter_tensor(o, i, group=g)
        cm.wait()
        return outs
    both("coalesced reduce_scatter_tensor", coalesced_reduce_scatter)

    dist.barrier(group=pg)


def _ar_op(g, rank, device, op):
    t = data(rank, 10, torch.float64, device) / 2
    dist.all_reduce(t, op=op, group=g)
    return t


def _ar_async(g, rank, device):
    ts = [data(rank, 100, torch.float32, device, salt=i) for i in range(3)]
    works = [dist.all_reduce(t, group=g, async_op=True) for t in ts]
    futs = [w.get_future() for w in works]
    for w in works:
        w.wait()
    torch.futures.wait_all(futs)
    return ts


def _rs_expected(rank, n, size, device):
    return sum(data(r, n, torch.float32, device, salt=rank) for r in range(size))


def _small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _train(model, steps):
    """`steps` SGD steps on this rank's random batches; the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def ddp_losses(pg, steps=5):
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = _small_model()
    losses = _train(DDP(model, process_group=pg, bucket_cap_mb=0.001), steps)  # several buckets
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return losses, params


def fsdp_losses(pg, steps=4, version=2):
    """Losses of a small model under FSDP2 (fully_shard, per layer) or FSDP1."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    model = _small_model()
    if version == 2:
        mesh = DeviceMesh.from_group(pg, "cpu")
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = FullyShardedDataParallel(model, process_group=pg, device_id=torch.device("cpu"))
    return _train(model, steps)


def main():
    scenario = sys.argv[1]
    if scenario == "cuda":
        local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
        # Two GPUs or more: NCCL is the reference; one GPU (two ranks on it, which NCCL
        # refuses): Gloo on CPU copies of the same data, compared after .cpu().
        nccl = torch.cuda.device_count() >= 2
        dist.init_process_group("cpu:gloo,cuda:nccl" if nccl else "gloo", device_id=None)
        pg = dist.new_group(backend="rustccl")
        if nccl:
            compare_collectives(pg, dist.group.WORLD, device)
            _check_mapping(dist.new_group(backend="cpu:rustccl,cuda:nccl"))
        else:
            _compare_cuda_against_cpu(pg, device)
    else:
        dist.init_process_group("gloo")
        pg = dist.new_group(backend="rustccl")
        if scenario == "collectives":
            compare_collectives(pg, dist.group.WORLD, torch.device("cpu"))
        elif scenario == "ddp":
            got_l, got_p = ddp_losses(pg)
            want_l, want_p = ddp_losses(dist.group.WORLD)
            check("DDP losses", got_l, want_l)
            check("DDP parameters", got_p, want_p)
            print(f"RANK {dist.get_rank()} losses {got_l.tolist()}")
        elif scenario == "fsdp":
            for version in (2, 1):
                got = fsdp_losses(pg, version=version)
                want = fsdp_losses(dist.group.WORLD, version=version)
                check(f"FSDP{version} losses", got, want)
                print(f"RANK {dist.get_rank()} FSDP{version} losses {got.tolist()}")
        elif scenario == "default":
            # init_process_group("rustccl") itself (the launcher's default group)
            dist.destroy_process_group()
            dist.init_process_group("rustccl")
            t = torch.full((4,), float(dist.get_rank() + 1))
            dist.all_reduce(t)
            size = dist.get_world_size()
            check("default group all_reduce", t, torch.full((4,), size * (size + 1) / 2))
            if dist.get_backend() != "rustccl":
                raise AssertionError(f"get_backend() says {dist.get_backend()}")
        elif scenario == "mapping":
            # a device_type -> backend map: CPU tensors to rustccl, CUDA ones to another
            # backend (NCCL in practice; Gloo here, as NCCL refuses a machine without GPUs)
            dist.destroy_process_group()
            dist.init_process_group("cpu:rustccl,cuda:gloo")
            _check_mapping(dist.group.WORLD)
        elif scenario == "bad_op":
            t = torch.ones(4, dtype=torch.int32)
            try:
                dist.all_reduce(t, op=dist.ReduceOp.BXOR, group=pg)
            except Exception as e:  # noqa: BLE001 (the message is what is checked)
                if "BXOR" not in str(e) and "bitwise" not in str(e):
                    raise
                print(f"RANK {dist.get_rank()} refused: {e}")
            else:
                raise AssertionError("BXOR was accepted")
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    dist.barrier()
    print(f"RANK {dist.get_rank()} OK {scenario}", flush=True)
    dist.destroy_process_group()


def _check_mapping(pg):
    """CPU tensors of a "cpu:rustccl,cuda:..." group run on rustccl, with the right sums."""
    backend = pg._get_backend(torch.device("cpu"))
    if not isinstance(backend, rustccl.torch.RustcclBackend):
        raise AssertionError(f"CPU tensors go to {backend}, not rustccl")
    size = dist.get_world_size(pg)
    t = torch.full((4,), float(dist.get_rank(pg) + 1))
    dist.all_reduce(t, group=pg)
    check("mapped group all_reduce", t, torch.full((4,), size * (size + 1) / 2))


def _compare_cuda_against_cpu(pg, device):
    """rustccl on CUDA tensors against Gloo on the same data in host memory."""
    rank, size = dist.get_rank(), dist.get_world_size()
    for n in (1, 1000, 70000):
        t = data(rank, n, torch.float32, device)
        ref = t.cpu()
        dist.all_reduce(t, group=pg)
        dist.all_reduce(ref)
        torch.cuda.synchronize()
        check(f"cuda all_reduce {n}", t, ref)
        out = torch.empty(n * size, device=device)
        ref_out = torch.empty(n * size)
        dist.all_gather_into_tensor(out, data(rank, n, torch.float32, device), group=pg)
        dist.all_gather_into_tensor(ref_out, data(rank, n, torch.float32, "cpu"))
        torch.cuda.synchronize()
        check(f"cuda all_gather_into_tensor {n}", out, ref_out)
        b = data(rank, n, torch.float32, device)
        ref_b = b.cpu()
        dist.broadcast(b, group_src=1, group=pg)
        dist.broadcast(ref_b, src=1)
        torch.cuda.synchronize()
        check(f"cuda broadcast {n}", b, ref_b)


if __name__ == "__main__":
    main()
