"""The rustccl package's own tests: ranks as separate processes (ranks.py) on the host backend,
numpy arrays, every collective checked against numpy's own result on random data with
poisoned outputs; groups, split/shrink, abort, and bad arguments."""

import os
import pickle
import sys

import numpy as np
import pytest

import rustccl
from ranks import run_ranks

# One process-local communicator (a single rank) for the argument checks.
os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")

# Every collective, op and a few dtypes, in place and out of place, against numpy. Each rank
# makes every rank's input from one seed, so each can compute the expected result itself.
COLLECTIVES = """
DTYPES = ["float32", "float64", "float16", "int8", "uint8", "int32", "uint32", "int64", "uint64"]
OPS = {"sum": lambda x: x.sum(axis=0), "prod": lambda x: x.prod(axis=0),
       "max": lambda x: x.max(axis=0), "min": lambda x: x.min(axis=0)}
FLOATS = {"float32", "float64", "float16"}
COUNT = 37   # elements per rank: no multiple of anything the planner likes
checked = 0

def inputs(dtype, count, salt):
    # Small integers (exact in every type, no overflow in a product of 3 ranks).
    return np.stack([np.random.default_rng(1000 * salt + r).integers(1, 4, count).astype(dtype) for r in range(size)])

def poison(shape, dtype):
    return np.full(shape, 111, dtype)

def same(got, want, what):
    global checked
    checked += 1
    if got.dtype.kind == "f":
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-3)
    else:
        ok = np.array_equal(got, want)
    assert ok, f"rank {rank} {what}: got {got[:8]}..., want {want[:8]}..."

root = size - 1
for salt, dtype in enumerate(DTYPES):
    x = inputs(dtype, COUNT, salt)
    mine = x[rank]
    ops = dict(OPS)
    if dtype in FLOATS:
        ops["avg"] = lambda v: (v.astype(np.float64).sum(axis=0) / size).astype(v.dtype)
    for op, ref in ops.items():
        want = ref(x)
        # all_reduce, out of place (the input must stay as it was) and in place
        send, out = mine.copy(), poison(COUNT, dtype)
        comm.all_reduce(send, out, op)
        same(out, want, f"all_reduce {op} {dtype}")
        same(send, mine, f"all_reduce {op} {dtype}: input untouched")
        buf = mine.copy()
        comm.all_reduce(buf, op=rustccl.ReduceOp(op))
        same(buf, want, f"all_reduce in place {op} {dtype}")
        # reduce to the last rank; another rank's output is never written
        out = poison(COUNT, dtype)
        comm.reduce(mine.copy(), out, op, root=root)
        same(out, want if rank == root else poison(COUNT, dtype), f"reduce {op} {dtype}")
        buf = mine.copy()
        comm.reduce(buf, op=op, root=root)
        same(buf, want if rank == root else mine, f"reduce in place {op} {dtype}")
        # reduce_scatter: block `rank` of the reduction of size x COUNT inputs
        xs = inputs(dtype, COUNT * size, salt + 50)
        wants = ref(xs)[rank * COUNT:(rank + 1) * COUNT]
        out = poison(COUNT, dtype)
        comm.reduce_scatter(xs[rank].copy(), out, op)
        same(out, wants, f"reduce_scatter {op} {dtype}")
        buf = xs[rank].copy()
        comm.reduce_scatter(buf, buf[rank * COUNT:(rank + 1) * COUNT], op)
        same(buf[rank * COUNT:(rank + 1) * COUNT], wants, f"reduce_scatter in place {op} {dtype}")
    # broadcast from rank 1 % size
    b = 1 % size
    out = poison(COUNT, dtype)
    comm.broadcast(mine.copy(), out, root=b)
    same(out, x[b], f"broadcast {dtype}")
    buf = mine.copy()
    comm.broadcast(buf, root=b)
    same(buf, x[b], f"broadcast in place {dtype}")
    # all_gather, out of place and in place (sendbuf is this rank's block of recvbuf)
    out = poison(COUNT * size, dtype)
    comm.all_gather(mine.copy(), out)
    same(out, x.reshape(-1), f"all_gather {dtype}")
    out = poison(COUNT * size, dtype)
    out[rank * COUNT:(rank + 1) * COUNT] = mine
    comm.all_gather(out[rank * COUNT:(rank + 1) * COUNT], out)
    same(out, x.reshape(-1), f"all_gather in place {dtype}")
    # all_to_all: block j of rank i's input goes to block i of rank j's output
    xs = inputs(dtype, COUNT * size, salt + 90)
    out = poison(COUNT * size, dtype)
    comm.all_to_all(xs[rank].copy(), out)
    same(out, np.concatenate([xs[i][rank * COUNT:(rank + 1) * COUNT] for i in range(size)]), f"all_to_all {dtype}")
    # gather / scatter at the root; only the root passes the big buffer
    out = poison(COUNT * size, dtype) if rank == root else None
    comm.gather(mine.copy(), out, root)
    if rank == root:
        same(out, x.reshape(-1), f"gather {dtype}")
    xs = inputs(dtype, COUNT * size, salt + 130)
    out = poison(COUNT, dtype)
    comm.scatter(xs[root].copy() if rank == root else None, out, root)
    same(out, xs[root][rank * COUNT:(rank + 1) * COUNT], f"scatter {dtype}")

# One large float32 all_reduce (several chunks of the host backend's pipeline); integer
# values, so that any order of summation gives numpy's result exactly.
big = np.random.default_rng(7).integers(-1000, 1000, (size, 1 << 20)).astype(np.float32)
out = np.full(1 << 20, np.nan, np.float32)
comm.all_reduce(big[rank].copy(), out)
same(out, big.sum(axis=0), "large all_reduce")
print("checked", checked)
"""


@pytest.mark.parametrize("nranks", [2, 3])
def test_every_collective_op_and_dtype_matches_numpy(nranks):
    outs = run_ranks(nranks, "comm = rustccl.Communicator(size, uid, rank)\n" + COLLECTIVES, timeout=40)
    # Every rank checked each result it gets (the root one more per dtype: gather).
    assert all(o.startswith("checked ") and int(o.split()[1]) > 300 for o in outs), outs


def test_group_send_recv_ring_three_ranks():
    outs = run_ranks(
        3,
        """
        comm = rustccl.Communicator(size, uid, rank)
        right, left = (rank + 1) % size, (rank - 1) % size
        mine = np.arange(1000, dtype=np.float64) + 1000 * rank
        got = np.full(1000, -1.0)
        got2 = np.full(10, -1, np.int32)
        with rustccl.group():
            comm.send(mine, right)
            comm.recv(got, left)
            comm.send(np.full(10, rank, np.int32), left)   # a temporary: kept alive by the group
            comm.recv(got2, right)
        assert (got == np.arange(1000) + 1000 * left).all(), got[:4]
        assert (got2 == right).all(), got2
        # Outside a group, a pair in rank order: 0 sends, 1 receives.
        if rank == 0:
            comm.send(np.full(5, 9, np.uint8), 1)
        elif rank == 1:
            b = np.zeros(5, np.uint8)
            comm.recv(b, 0)
            assert (b == 9).all(), b
        print("ok")
        """,
    )
    assert outs == ["ok\n"] * 3


def test_split_and_shrink():
    outs = run_ranks(
        3,
        """
        comm = rustccl.Communicator(size, uid, rank)
        # rank 0 and 2 share color 0 (ordered by key: rank 2 first), rank 1 joins none
        child = comm.split(None if rank == 1 else 0, key=-rank)
        if rank == 1:
            assert child is None
        else:
            assert (child.size, child.rank, child.backend) == (2, 1 if rank == 0 else 0, "host"), child
            a = np.array([rank + 1.0])
            child.all_reduce(a)
            assert a[0] == 4.0, a
            child.destroy()
        # rank 2 fails once the others are past the split (they tell it so); they shrink it
        # away and go on
        if rank == 2:
            with rustccl.group():
                for peer in (0, 1):
                    comm.recv(np.zeros(1), peer)
            comm.abort()
            print("aborted")
            sys.exit(0)
        comm.send(np.ones(1), 2)
        small = comm.shrink([2], abort=True)
        assert (small.size, small.rank) == (2, rank), small
        a = np.array([10 * (rank + 1)], np.int64)
        small.all_reduce(a)
        assert a[0] == 30, a
        print("shrunk")
        """,
    )
    assert outs == ["shrunk\n", "shrunk\n", "aborted\n"]


def test_abort_fails_the_peer_with_an_error_not_a_hang():
    outs = run_ranks(
        2,
        """
        comm = rustccl.Communicator(size, uid, rank, op_timeout_ms=15000)
        comm.all_reduce(np.ones(8))
        if rank == 1:
            comm.abort()
            try:
                comm.all_reduce(np.ones(8))
            except rustccl.RustcclError as e:
                print("own", e.result_name)
            sys.exit(0)
        try:
            for _ in range(100):          # until the abort is seen
                comm.all_reduce(np.ones(8))
        except rustccl.RustcclError as e:
            assert e.result == 6 and isinstance(e, rustccl.RemoteError), (e.result_name, e.message)
            assert comm.async_error() is not None
            print("peer", e.result_name)
        """,
        timeout=30,
    )
    assert outs[0] == "peer ncclRemoteError\n", outs
    assert outs[1].startswith("own nccl"), outs


def test_backend_argument_wins_over_the_environment():
    # RUSTCCL_BACKEND names a backend this machine lacks; backend="host" must not look at it.
    outs = run_ranks(
        2,
        """
        comm = rustccl.Communicator(size, uid, rank, backend="host")
        a = np.array([rank], np.int32)
        comm.all_reduce(a)
        print(comm.backend, a[0])
        """,
        backend="cuda",
    )
    assert outs == ["host 1\n", "host 1\n"]


# --- one rank, in this process: ids, buffers, argument errors ------------------------------


@pytest.fixture(scope="module")
def comm():
    c = rustccl.Communicator(1, rustccl.get_unique_id(), 0, backend="host")
    yield c
    c.destroy()


def test_unique_id_bytes_hex_and_pickle():
    uid = rustccl.get_unique_id()
    assert len(bytes(uid)) == 128
    assert rustccl.UniqueId.from_bytes(bytes(uid)) == uid
    assert rustccl.UniqueId.from_hex(uid.hex()) == uid
    assert pickle.loads(pickle.dumps(uid)) == uid
    with pytest.raises(rustccl.InvalidArgumentError):
        rustccl.UniqueId.from_bytes(b"short")


def test_one_rank_properties_and_other_buffers(comm):
    assert (comm.rank, comm.size, comm.backend, comm.device) == (0, 1, "host", 0)
    assert comm.async_error() is None
    # bytearray, memoryview, Buffer.from_ptr
    b = bytearray(b"\x01\x02\x03")
    out = bytearray(3)
    comm.all_reduce(b, out, "max")
    assert out == b
    a = np.arange(6, dtype=np.float32)
    r = np.zeros(6, np.float32)
    comm.all_reduce(rustccl.Buffer.from_ptr(a.ctypes.data, 6, "float32"), memoryview(r))
    assert (r == a).all()


class DlpackOnly:
    """An object with DLPack and no buffer protocol (as a torch tensor or cupy array)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_dlpack_buffers_and_their_deleter(comm):
    a = np.arange(10, dtype=np.int64)
    out = np.zeros(10, np.int64)
    before = sys.getrefcount(a)
    comm.all_reduce(DlpackOnly(a), DlpackOnly(out))
    assert (out == a).all()
    # The capsule's deleter ran: numpy's export no longer references the array.
    assert sys.getrefcount(a) == before
    with pytest.raises(rustccl.InvalidArgumentError, match="contiguous"):
        comm.all_reduce(DlpackOnly(a[::2]))


def test_torch_cpu_tensors_through_dlpack(comm):
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.float8_e4m3fn, torch.float8_e5m2):
        t = torch.arange(5).to(dtype)
        out = torch.zeros(5, dtype=dtype)
        comm.all_reduce(t, out, "max")
        assert torch.equal(out.float(), t.float()), (dtype, out)
    comm.all_reduce(t)  # in place


def bad(comm, call, *words):
    with pytest.raises(rustccl.InvalidArgumentError) as e:
        call()
    err = e.value
    assert isinstance(err, rustccl.RustcclError)
    assert err.result == 4 and err.result_name == "ncclInvalidArgument"
    for w in words:
        assert w in err.message, err.message
    return err


def test_bad_arguments_raise_invalid_argument_with_a_message(comm):
    a = np.zeros(8, np.float32)
    bad(comm, lambda: comm.all_reduce(a[::2]), "not C-contiguous", "ascontiguousarray")
    bad(comm, lambda: comm.all_reduce(np.zeros((4, 4), np.float32)[:, 1]), "not C-contiguous")
    bad(comm, lambda: comm.all_reduce(a, np.zeros(7, np.float32)), "recvbuf has 7 elements", "8")
    bad(comm, lambda: comm.all_gather(a, np.zeros(4, np.float32)), "recvbuf")
    bad(comm, lambda: comm.reduce_scatter(np.zeros(3, np.float32), a), "sendbuf")
    bad(comm, lambda: comm.all_reduce(a, np.zeros(8, np.float64)), "data type")
    bad(comm, lambda: comm.broadcast(a, root=1), "root 1")
    bad(comm, lambda: comm.reduce(a, root=-1), "root -1")
    bad(comm, lambda: comm.send(a, 3), "peer 3")
    bad(comm, lambda: comm.gather(a, None, 0), "recvbuf is None")
    bad(comm, lambda: comm.all_reduce(a, op="xor"), "unknown op")
    bad(comm, lambda: comm.all_reduce(np.zeros(4, np.int16)), "no NCCL data type")
    bad(comm, lambda: comm.all_reduce(np.zeros(4, np.complex64)), "no NCCL data type")
    bad(comm, lambda: rustccl.Buffer.from_ptr(a.ctypes.data, 8, "complex64"), "unknown dtype")
    bad(comm, lambda: rustccl.Buffer.from_ptr(a.ctypes.data, 8, "float32", "tpu:0"), "device")
    bad(comm, lambda: comm.all_reduce([1.0, 2.0]), "not a buffer")
    ro = np.zeros(8, np.float32)
    ro.setflags(write=False)
    bad(comm, lambda: comm.all_reduce(a, ro), "read-only")
    bad(comm, lambda: comm.all_reduce(ro), "read-only")
    bad(comm, lambda: comm.recv(b"abcd", 0), "read-only")
    bad(comm, lambda: rustccl.Communicator(2, rustccl.get_unique_id(), 5, backend="host"), "rank 5")
    bad(comm, lambda: rustccl.Communicator(1, rustccl.get_unique_id(), 0, backend="tpu"), "backend")
    # A refused call inside a group fails the group's end too (nothing half-runs).
    out = np.full(8, 5.0, np.float32)
    with pytest.raises(rustccl.InvalidArgumentError, match="recvbuf has 7"):
        with rustccl.group():
            comm.all_reduce(np.ones(8, np.float32), out)
            try:
                comm.all_reduce(a, np.zeros(7, np.float32))
            except rustccl.InvalidArgumentError:
                pass
    assert (out == 5.0).all(), "the group's other operation did not run"
    comm.all_reduce(a)  # and the communicator still works


def test_destroyed_communicator_refuses_work():
    c = rustccl.Communicator(1, rustccl.get_unique_id(), 0, backend="host")
    c.destroy()
    with pytest.raises(rustccl.RustcclError) as e:
        c.all_reduce(np.zeros(2))
    assert e.value.result in (4, 5) and e.value.message


def test_non_blocking_communicator_completes_host_calls():
    outs = run_ranks(
        2,
        """
        import time
        comm = rustccl.Communicator(size, uid, rank, blocking=False)
        deadline = time.monotonic() + 20
        while isinstance(comm.async_error(), rustccl.InProgressError):   # init runs
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert comm.async_error() is None
        a = np.full(4, rank + 1.0, np.float32)
        comm.all_reduce(a)                 # host memory: complete when it returns
        assert (a == 3.0).all(), a
        with rustccl.group():
            comm.all_reduce(a)
        assert (a == 6.0).all(), a
        print("ok")
        """,
    )
    assert outs == ["ok\n", "ok\n"]


def test_init_from_env_with_torchrun_variables():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outs = run_ranks(
        2,
        """
        comm = rustccl.init_from_env(backend="host")
        a = np.array([comm.rank + 1], np.int64)
        comm.all_reduce(a)
        print(comm.rank, comm.size, a[0])
        """,
        env=lambda r: dict(RANK=r, WORLD_SIZE=2, LOCAL_RANK=r, MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                           TORCHELASTIC_USE_AGENT_STORE=None, NCCL_COMM_ID=None),
    )
    assert outs == ["0 2 3\n", "1 2 3\n"]
