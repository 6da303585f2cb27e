#!/usr/bin/env bash
# rustccl's host backend side by side with Open MPI's shared-memory collectives on this machine:
# all_reduce, all_gather and broadcast (float32, sum, root 0), 2 and 4 ranks, 8 B to 128 MiB.
# rustccl-bench and bench/mpi/mpi_bench.c (built here when mpicc exists) run alternately,
# ROUNDS times each; the table holds the median of the rounds, with the load average seen
# before and after. Figures on a shared machine are noisy: compare medians, not one run.
#
#   bench/mpi/compare.sh                 # writes target/mpi-compare/compare.md
#   ROUNDS=5 RANKS="2" OPS=all_reduce bench/mpi/compare.sh
#   BEFORE=/path/to/older/rustccl-bench bench/mpi/compare.sh   # before/after in the same rounds
#
# Settings (environment): ROUNDS (3), RANKS ("2 4"), OPS ("all_reduce all_gather broadcast"),
# MIN (8), MAX (128M), FACTOR (4), SMALL_ITERS (500: timed calls per size up to 128 KiB; larger
# sizes run as many as fit in 0.25 s, at most 20), OUT (target/mpi-compare), BEFORE (an older
# build's rustccl-bench: it runs in every round too, and the table adds its in-place time and
# the ratio before / after).
# MPI runs as root with --allow-run-as-root and with more ranks than cores (--oversubscribe).
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${ROUNDS:-3}
RANKS=${RANKS:-"2 4"}
OPS=${OPS:-"all_reduce all_gather broadcast"}
MIN=${MIN:-8}
MAX=${MAX:-128M}
FACTOR=${FACTOR:-4}
SMALL_ITERS=${SMALL_ITERS:-500}
OUT=${OUT:-target/mpi-compare}

if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    echo "compare.sh: mpicc/mpirun not found (apt-get install openmpi-bin libopenmpi-dev): skipping the MPI comparison"
    exit 0
fi
command -v python3 >/dev/null || { echo "compare.sh: python3 is needed to build the table"; exit 1; }

mkdir -p "$OUT/raw"
mpicc -O2 -o "$OUT/mpi_bench" bench/mpi/mpi_bench.c
cargo build --release -q -p rustccl-bench
BENCH=target/release/rustccl-bench
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

# Two ranges: small sizes with many calls, large ones within the time budget.
SPLIT=$((128 * 1024))
ranges() {
    echo "$MIN $SPLIT -n $SMALL_ITERS"
    echo "$((SPLIT * FACTOR)) $MAX"
}

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "load before: $(load)" | tee "$OUT/load.txt"
for round in $(seq 1 "$ROUNDS"); do
    for n in $RANKS; do
        for op in $OPS; do
            while read -r lo hi iters; do
                tag="$op.$n.$lo.$round"
                RUSTCCL_BACKEND=host "$BENCH" "$op" -N "$n" -b "$lo" -e "$hi" -f "$FACTOR" -c 0 -w 5 $iters </dev/null \
                    >"$OUT/raw/rustccl.$tag.txt" 2>&1 || echo "rustccl-bench failed: $tag"
                if [ -n "${BEFORE:-}" ]; then
                    RUSTCCL_BACKEND=host "$BEFORE" "$op" -N "$n" -b "$lo" -e "$hi" -f "$FACTOR" -c 0 -w 5 $iters </dev/null \
                        >"$OUT/raw/before.$tag.txt" 2>&1 || echo "the earlier rustccl-bench failed: $tag"
                fi
                "${MPIRUN[@]}" -np "$n" "$OUT/mpi_bench" -o "$op" -b "$lo" -e "$hi" -f "$FACTOR" -w 5 \
                    $iters </dev/null >"$OUT/raw/mpi.$tag.txt" 2>&1 || echo "mpi_bench failed: $tag"
            done < <(ranges)
        done
    done
    echo "round $round done, load: $(load)" | tee -a "$OUT/load.txt"
done

python3 - "$OUT" "$ROUNDS" "$RANKS" "$OPS" <<'EOF'
import glob, os, re, statistics, subprocess, sys, datetime
out, rounds, ranks, ops = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()

def rows(path):
    """size -> (oop time, oop busbw, ip time, ip busbw); None where N/A."""
    res = {}
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) < 13 or line.startswith("#") or not f[0].isdigit():
            continue
        num = lambda s: None if s == "N/A" else float(s)
        res[int(f[0])] = (num(f[5]), num(f[7]), num(f[9]), num(f[11]))
    return res

def median(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None

def human(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"

def fmt(v, d=2):
    return "—" if v is None else f"{v:.{d}f}"

def ratio(mpi, ours):
    return "—" if mpi is None or ours is None or ours == 0 else f"{mpi / ours:.2f}"

commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
mpi_version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
lines = [f"# rustccl host backend vs {mpi_version[0] if mpi_version else 'Open MPI'}", "",
         f"{datetime.date.today()}, commit {commit}{' (with local changes)' if dirty else ''}, {os.cpu_count()} cores, "
         f"median of {rounds} alternating rounds. Load average (1/5/15 min):",
         ""] + ["    " + l.rstrip() for l in open(os.path.join(out, "load.txt"))] + [
         "", "Time in µs (out of place / in place); ratio = MPI's time / rustccl's (above 1: rustccl faster);",
         "busbw in GB/s, in place. MPI_Bcast has no out-of-place form.", ""]
for n in ranks:
    for op in ops:
        data = {"rustccl": {}, "mpi": {}, "before": {}}
        for who in data:
            for path in glob.glob(os.path.join(out, "raw", f"{who}.{op}.{n}.*.txt")):
                for size, v in rows(path).items():
                    data[who].setdefault(size, []).append(v)
        # (An all-gather's smallest sizes give some ranks no element: rustccl-bench prints 0.)
        sizes = sorted(s for s in set(data["rustccl"]) | set(data["mpi"]) if s > 0)
        before = bool(data["before"])
        extra = " before in | before / rustccl in |" if before else ""
        lines += [f"## {op}, {n} ranks", "",
                  "| size | rustccl oop | MPI oop | ratio oop | rustccl in | MPI in | ratio in | rustccl busbw | MPI busbw |" + extra,
                  "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if before else "")]
        for s in sizes:
            r = [median(col) for col in zip(*data["rustccl"].get(s, [(None,) * 4]))]
            m = [median(col) for col in zip(*data["mpi"].get(s, [(None,) * 4]))]
            row = (f"| {human(s)} | {fmt(r[0])} | {fmt(m[0])} | {ratio(m[0], r[0])} | {fmt(r[2])} | {fmt(m[2])} | "
                   f"{ratio(m[2], r[2])} | {fmt(r[3])} | {fmt(m[3])} |")
            if before:
                b = [median(col) for col in zip(*data["before"].get(s, [(None,) * 4]))]
                row += f" {fmt(b[2])} | {ratio(b[2], r[2])} |"
            lines.append(row)
        lines.append("")
open(os.path.join(out, "compare.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
print(f"written to {out}/compare.md")
EOF
