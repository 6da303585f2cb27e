"""torch.distributed on CPU tensors: Gloo against the "rustccl" backend, same script, same
processes (issue 36).

    python -m torch.distributed.run --nproc-per-node 2 python/bench/torch_vs_gloo.py
        [--ops all_reduce,all_gather,broadcast] [--min-bytes 8] [--max-bytes 256M] [--step 32]
        [--rounds 5] [--budget 0.1] [--max-calls 2000] [--json out.json]

(`python -m torch.distributed.run` is torchrun run by this Python: in a virtual environment
the `torchrun` on PATH may be another Python's, without rustccl.)

Each rank holds two process groups over the same ranks, one per backend, and times each
(operation, size) on both in alternation (Gloo then rustccl, --rounds times), after warm-up
calls; a backend's figure is the median of its rounds, so that a burst of load from other
processes on the machine moves one round, not the result. A size is the bytes
of a rank's tensor (all_reduce, broadcast) or of the gathered output (all_gather_into_tensor,
as nccl-tests count it), float32. The time of a call is the slowest rank's mean over the
timed calls; the number of calls follows --budget (seconds per measurement, 3 calls at least,
2000 at most). Rank 0 prints a Markdown table: microseconds per call for each backend and
Gloo's time over rustccl's (the speedup; the goal is >= 3 at every size).
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import rustccl.torch  # noqa: F401  (registers "rustccl")


def parse_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B") or "0"
    if text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def fmt_bytes(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def make_call(op, nbytes, group, rank, size):
    """A closure running one call of `op` moving `nbytes`, on `group`."""
    if op == "all_reduce":
        t = torch.ones(max(1, nbytes // 4))
        return lambda: dist.all_reduce(t, group=group)
    if op == "broadcast":
        t = torch.ones(max(1, nbytes // 4))
        return lambda: dist.broadcast(t, group_src=0, group=group)
    if op == "all_gather":
        per_rank = max(1, nbytes // 4 // size)
        inp = torch.ones(per_rank)
        out = torch.empty(per_rank * size)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    raise SystemExit(f"unknown operation {op}")


def measure(call, group, budget_s, max_calls):
    """Slowest rank's mean seconds per call."""
    for _ in range(2):
        call()
    dist.barrier(group=group)
    # calibrate on one call (every rank agrees on the count: the max over ranks)
    t0 = time.perf_counter()
    call()
    one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(one, op=dist.ReduceOp.MAX, group=group)
    calls = int(min(max_calls, max(3, budget_s / max(one.item(), 1e-7))))
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = torch.tensor([(time.perf_counter() - t0) / calls], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return elapsed.item(), calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="all_reduce,all_gather,broadcast")
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="256M")
    ap.add_argument("--step", type=int, default=32, help="size factor between rows")
    ap.add_argument("--rounds", type=int, default=5, help="alternations per measurement")
    ap.add_argument("--budget", type=float, default=0.1, help="seconds per round")
    ap.add_argument("--max-calls", type=int, default=2000)
    ap.add_argument("--json", help="also write the rows here (rank 0)")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": dist.group.WORLD, "rustccl": dist.new_group(backend="rustccl")}
    sizes = []
    n = parse_bytes(args.min_bytes)
    while n <= parse_bytes(args.max_bytes):
        sizes.append(n)
        n *= args.step
    if sizes[-1] != parse_bytes(args.max_bytes):
        sizes.append(parse_bytes(args.max_bytes))

    rows = []
    for op in args.ops.split(","):
        for nbytes in sizes:
            row = {"op": op, "ranks": size, "bytes": nbytes}
            calls = {name: make_call(op, nbytes, g, rank, size) for name, g in groups.items()}
            times = {name: [] for name in groups}
            for _ in range(args.rounds):
                for name, group in groups.items():
                    secs, count = measure(calls[name], group, args.budget, args.max_calls)
                    times[name].append(secs)
                    row[name + "_calls"] = count
            for name in groups:
                row[name + "_us"] = statistics.median(times[name]) * 1e6
                row[name + "_rounds_us"] = [t * 1e6 for t in times[name]]
            del calls
            row["speedup"] = row["gloo_us"] / row["rustccl_us"]
            rows.append(row)
            if rank == 0:
                print(f"{op:11s} {size} ranks {fmt_bytes(nbytes):>8s}: gloo "
                      f"{row['gloo_us']:12.1f} us  rustccl {row['rustccl_us']:12.1f} us  "
                      f"x{row['speedup']:.2f}", flush=True)

    if rank == 0:
        print()
        print(f"| operation | ranks | size | Gloo µs | rustccl µs | Gloo / rustccl |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['op']} | {r['ranks']} | {fmt_bytes(r['bytes'])} | {r['gloo_us']:.1f} "
                  f"| {r['rustccl_us']:.1f} | {r['speedup']:.2f} |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
