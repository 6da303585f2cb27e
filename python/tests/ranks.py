"""Runs ranks as separate processes for the package's tests (also the torch backend's).

    outs = run_ranks(2, '''
        comm = rustccl.Communicator(size, uid, rank)
        a = np.full(4, rank + 1.0, np.float32)
        comm.all_reduce(a)
        print(a.sum())
    ''')

Each rank runs `python -c PREAMBLE + code` with `rank`, `size` and `uid` (a
rustccl.UniqueId this process made, passed as hex in RUSTCCL_TEST_UID) defined, on the
backend `backend` (RUSTCCL_BACKEND; "host" by default) and the loopback interface. It returns
every rank's stdout; a rank that exits non-zero fails the test with every rank's output, and
ranks still running after `timeout` seconds are killed and fail it (a hang never blocks CI).
"""

import os
import subprocess
import sys
import textwrap
import time

import rustccl

PREAMBLE = """\
import os, sys
import numpy as np
import rustccl
rank = int(os.environ["RUSTCCL_TEST_RANK"])
size = int(os.environ["RUSTCCL_TEST_NRANKS"])
uid = rustccl.UniqueId.from_hex(os.environ["RUSTCCL_TEST_UID"])
"""


class RanksFailed(AssertionError):
    pass


def rank_env(rank, nranks, uid, backend="host", env=None):
    """The environment of rank `rank`: the test variables, the backend, loopback sockets."""
    e = dict(os.environ)
    e.update(
        RUSTCCL_TEST_RANK=str(rank),
        RUSTCCL_TEST_NRANKS=str(nranks),
        RUSTCCL_TEST_UID=uid.hex(),
        NCCL_SOCKET_IFNAME=e.get("NCCL_SOCKET_IFNAME", "lo"),
    )
    if backend is not None:
        e["RUSTCCL_BACKEND"] = backend
    if env:
        for k, v in env.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = str(v)
    return e


def run_ranks(nranks, code, *, timeout=30, backend="host", env=None, expect_fail=(), preamble=PREAMBLE):
    """Runs `code` as `nranks` processes; returns their stdouts (rank order). Ranks in
    `expect_fail` must exit non-zero (their stderr is returned instead)."""
    uid = rustccl.get_unique_id()
    script = preamble + textwrap.dedent(code)
    procs = []
    for r in range(nranks):
        renv = rank_env(r, nranks, uid, backend, env(r) if callable(env) else env)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", script],
                env=renv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + timeout
    outs = [None] * nranks
    hung = []
    for r, p in enumerate(procs):
        try:
            outs[r] = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung.append(r)
    for r in hung:
        procs[r].kill()
        outs[r] = procs[r].communicate()
    report = "\n".join(
        f"--- rank {r} (exit {procs[r].returncode}) ---\nstdout:\n{o[0]}\nstderr:\n{o[1][-4000:]}" for r, o in enumerate(outs)
    )
    if hung:
        raise RanksFailed(f"ranks {hung} still ran after {timeout} s and were killed\n{report}")
    bad = [r for r, p in enumerate(procs) if (p.returncode != 0) != (r in expect_fail)]
    if bad:
        raise RanksFailed(f"ranks {bad} exited unexpectedly\n{report}")
    return [o[1] if r in expect_fail else o[0] for r, o in enumerate(outs)]
