"""The rustccl package's own tests: ranks as processes (tests/ranks.py) on the host backend,
numpy arrays, results checked against numpy's on random data."""

import pytest

from ranks import run_ranks


def test_all_reduce_and_broadcast_two_ranks():
    outs = run_ranks(
        2,
        """
        comm = rustccl.Communicator(size, uid, rank)
        a = np.full(4, rank + 1.0, np.float32)
        comm.all_reduce(a)
        assert (a == 3.0).all(), a
        b = np.arange(3, dtype=np.int64) * (rank + 1)
        comm.broadcast(b, root=1)
        assert (b == np.arange(3) * 2).all(), b
        print("ok", comm.rank, comm.size, comm.backend)
        """,
    )
    assert outs == ["ok 0 2 host\n", "ok 1 2 host\n"]
