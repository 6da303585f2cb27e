"""The torch.distributed backend "rustccl" (issue 36).

Importing this module registers the backend::

    import rustccl.torch  # noqa: F401
    torch.distributed.init_process_group("rustccl")            # CPU and CUDA tensors
    torch.distributed.init_process_group("cpu:rustccl,cuda:nccl")

It is a Python backend as PyTorch documents it (a subclass of
``torch._C._distributed_c10d.Backend`` given to ``Backend.register_backend``), so nothing is
compiled against PyTorch's C++ headers. One backend object serves a process group; it holds
up to two rustccl communicators, made on first use (every rank of the group makes them in the
same call order, as every collective is): a "host" one for CPU tensors and a "cuda" one for
CUDA tensors. Their unique ids travel through the group's store.

Each tensor reaches rustccl as ``rustccl.Buffer.from_ptr(data_ptr, count, dtype, device)``:
no DLPack capsule per call, so an 8-byte call costs little more than PyTorch's own dispatch.

Completion follows the two memories: on CPU tensors rustccl's host backend returns once the
operation has completed, so the Work handed back is already done (as Gloo's after wait()); on
CUDA tensors the operation is enqueued on the current stream, as NCCL's backend does, and the
Work's wait() makes the caller's current stream wait for it.

Point-to-point calls (send/recv, isend/irecv, batch_isend_irecv) are queued and issued
together in one rustccl group when one of their Works is waited on, when a coalescing block
ends, or before the next collective: a blocking host send would otherwise wait for a receive
that its peer posts only after its own send (the usual isend-then-irecv exchange).
"""

# Absolute imports only: this module is rustccl.torch, and `import torch` must reach PyTorch.
import datetime
import os

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch._C import Future as _CFuture
from torch._C._distributed_c10d import _create_work_from_future

import rustccl

__all__ = ["RustcclBackend", "BACKEND_NAME", "register"]

BACKEND_NAME = "rustccl"

_RedOp = dist.ReduceOp.RedOpType
_REDUCE_OPS = {
    _RedOp.SUM: "sum",
    _RedOp.PRODUCT: "prod",
    _RedOp.MAX: "max",
    _RedOp.MIN: "min",
    _RedOp.AVG: "avg",
}

# torch dtype -> rustccl dtype name, for reductions (data movement goes as bytes).
_REDUCE_DTYPES = {
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int32: "int32",
    torch.uint32: "uint32",
    torch.int64: "int64",
    torch.uint64: "uint64",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.bfloat16: "bfloat16",
    torch.float8_e4m3fn: "float8_e4m3",
    torch.float8_e5m2: "float8_e5m2",
}
# Complex numbers add as pairs of reals; the other operators have no meaning on them.
_COMPLEX_PARTS = {torch.complex64: "float32", torch.complex128: "float64"}


def _reduce_op(op):
    """rustccl's name for a torch ReduceOp (or the options' reduceOp)."""
    if op == _RedOp.SUM:  # the common case first: a dict lookup of a pybind enum costs more
        return "sum"
    kind = getattr(op, "op", op)
    name = _REDUCE_OPS.get(kind)
    if name is None:
        raise ValueError(
            f"rustccl backend: reduce operation {kind} is not supported; use SUM, PRODUCT, "
            "MAX, MIN or AVG (PREMUL_SUM and the bitwise operators have no rustccl equivalent)"
        )
    return name


def _reduce_type(t, op_name):
    """(dtype name, element count) under which a tensor is reduced."""
    name = _REDUCE_DTYPES.get(t.dtype)
    if name is not None:
        return name, t.numel()
    part = _COMPLEX_PARTS.get(t.dtype)
    if part is not None and op_name in ("sum", "avg"):
        return part, 2 * t.numel()
    if t.dtype == torch.bool and op_name in ("max", "min"):
        return "uint8", t.numel()
    raise ValueError(
        f"rustccl backend: cannot reduce {t.dtype} tensors with {op_name!r}; reductions take "
        f"{', '.join(str(d) for d in _REDUCE_DTYPES)} (complex: sum and avg; bool: max and min)"
    )


def _check_dense(t):
    if not t.is_contiguous():
        raise ValueError(
            "rustccl backend: tensors must be contiguous (pass t.contiguous() and copy the "
            "result back)"
        )


def _done_work(result):
    """A Work that has completed, whose future holds `result` (host memory)."""
    fut = _CFuture([])  # the C++ future itself: a third of torch.futures.Future's cost
    fut.set_result(result)
    return _create_work_from_future(fut)


class _CudaWork(dist._Work):
    """Work of an operation enqueued on a CUDA stream.

    wait() makes the caller's current stream wait for the operation (as NCCL's backend);
    the future holds the result at once: its callbacks enqueue their work on the current
    stream, after the operation when that is the stream it ran on.
    """

    def __init__(self, result, event, device):
        super().__init__()
        self._result = result
        self._event = event
        self._device = device

    def wait(self, timeout=None):
        torch.cuda.current_stream(self._device).wait_event(self._event)
        return True

    def is_completed(self):
        return self._event.query()

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut


class _P2PWork(dist._Work):
    """Work of a queued send or receive: waiting on it issues the queue (see the module doc)."""

    def __init__(self, backend, tensors):
        super().__init__()
        self._backend = backend
        self._tensors = tensors
        self._inner = None

    def _issued(self):
        if self._inner is None:
            self._backend._flush_p2p()
        return self._inner

    def wait(self, timeout=None):
        return self._issued().wait()

    def is_completed(self):
        return self._inner is not None and self._inner.is_completed()

    def get_future(self):
        return self._issued().get_future()


def _backend_base():
    """The C++ class the backend subclasses: c10d's Backend where Python may construct it (as
    PyTorch documents for Python backends), else ProcessGroup (PyTorch 2.11's Backend has no
    Python constructor: "No constructor defined"). A ProcessGroup subclass replaces the whole
    group, so there the device mapping ("cpu:rustccl,cuda:nccl") takes rustccl for every
    device. RUSTCCL_TORCH_BASE=processgroup forces the second (to test it on a newer torch)."""
    if os.environ.get("RUSTCCL_TORCH_BASE", "").lower() != "processgroup":
        try:
            _C10dBackend(0, 1)
            return _C10dBackend
        except TypeError:
            pass
    return dist.ProcessGroup


class RustcclBackend(_backend_base()):
    """One process group's rustccl communicators (see the module doc)."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._store = store
        self._rank = rank
        self._size = size
        if isinstance(timeout, datetime.timedelta):
            self._timeout_ms = max(1, int(timeout.total_seconds() * 1000))
        else:
            self._timeout_ms = None
        self._host = None
        self._cuda = None
        self._cuda_device = None
        self._p2p = []  # queued (kind, tensor, peer, stream, work)
        self._coalescing = False

    # -- communicators -------------------------------------------------------------------

    def _new_comm(self, kind, device):
        key = f"rustccl/{kind}/unique_id"
        if self._rank == 0:
            uid = rustccl.get_unique_id()
            self._store.set(key, bytes(uid))
        else:
            uid = rustccl.UniqueId.from_bytes(bytes(self._store.get(key)))
        return rustccl.Communicator(
            self._size, uid, self._rank, device=device, backend=kind,
            op_timeout_ms=self._timeout_ms,
        )

    def _host_comm(self):
        if self._host is None:
            self._host = self._new_comm("host", 0)
        return self._host

    def _cuda_comm(self, t):
        index = t.get_device()
        if self._cuda is None:
            self._cuda = self._new_comm("cuda", index)
            self._cuda_device = index
        elif index != self._cuda_device:
            raise ValueError(
                f"rustccl backend: this process group runs on cuda:{self._cuda_device}, the "
                f"tensor is on cuda:{index}; use one device per process (torch.cuda.set_device)"
            )
        return self._cuda

    def _buf(self, t, count=None, dtype="uint8"):
        """rustccl buffer over a tensor (bytes unless dtype/count say otherwise)."""
        if count is None:
            count = t.numel() * t.element_size()
        if t.is_cuda:
            return rustccl.Buffer.from_ptr(t.data_ptr(), count, dtype, f"cuda:{t.get_device()}")
        return rustccl.Buffer.from_ptr(t.data_ptr(), count, dtype, "cpu")

    def _target(self, t):
        """(communicator, stream) for a tensor's memory; issues queued point-to-point first."""
        if self._p2p and not self._coalescing:
            self._flush_p2p()
        _check_dense(t)
        if t.is_cuda:
            comm = self._cuda_comm(t)
            return comm, torch.cuda.current_stream(t.device).cuda_stream
        if self._host is None:
            self._host_comm()
        return self._host, None

    def _work(self, t, result):
        if t.is_cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(t.device))
            return _CudaWork(result, event, t.device)
        return _done_work(result)

    # -- collectives ---------------------------------------------------------------------

    def allreduce(self, tensors, opts):
        op = _reduce_op(opts.reduceOp)
        for t in tensors:
            comm, stream = self._target(t)
            dtype, count = _reduce_type(t, op)
            comm.all_reduce(self._buf(t, count, dtype), None, op, stream=stream)
        return self._work(tensors[0], tensors)

    def allreduce_coalesced(self, tensors, opts):
        op = _reduce_op(opts.reduceOp)
        comm, stream = self._target(tensors[0])
        with rustccl.group():
            for t in tensors:
                _check_dense(t)
                dtype, count = _reduce_type(t, op)
                comm.all_reduce(self._buf(t, count, dtype), None, op, stream=stream)
        return self._work(tensors[0], tensors)

    def broadcast(self, tensors, opts):
        for t in tensors:
            comm, stream = self._target(t)
            comm.broadcast(self._buf(t), None, opts.rootRank, stream=stream)
        return self._work(tensors[0], tensors)

    def reduce(self, tensors, opts):
        op = _reduce_op(opts.reduceOp)
        t = tensors[0]
        comm, stream = self._target(t)
        dtype, count = _reduce_type(t, op)
        comm.reduce(self._buf(t, count, dtype), None, op, opts.rootRank, stream=stream)
        return self._work(t, tensors)

    def all_gather_single(self, output, input, opts):
        comm, stream = self._target(input)
        _check_dense(output)
        if output.numel() != input.numel() * self._size or output.dtype != input.dtype:
            raise ValueError(
                "rustccl backend: all_gather_into_tensor needs an output of the input's dtype "
                f"and world size ({self._size}) times its elements; got {output.numel()} "
                f"{output.dtype} for {input.numel()} {input.dtype}"
            )
        comm.all_gather(self._buf(input), self._buf(output), stream=stream)
        return self._work(input, [output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        comm, stream = self._target(inputs[0])
        with rustccl.group():
            for o, i in zip(outputs, inputs):
                _check_dense(i)
                _check_dense(o)
                comm.all_gather(self._buf(i), self._buf(o), stream=stream)
        return self._work(inputs[0], outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather(self, output_lists, inputs, opts):
        for outs, t in zip(output_lists, inputs):
            flat = torch.empty((self._size,) + tuple(t.shape), dtype=t.dtype, device=t.device)
            self.all_gather_single(flat, t, opts)
            for r, o in enumerate(outs):
                o.copy_(flat[r])
        return self._work(inputs[0], output_lists)

    def reduce_scatter_single(self, output, input, opts):
        op = _reduce_op(opts.reduceOp)
        comm, stream = self._target(output)
        _check_dense(input)
        if input.numel() != output.numel() * self._size or output.dtype != input.dtype:
            raise ValueError(
                "rustccl backend: reduce_scatter_tensor needs an input of the output's dtype "
                f"and world size ({self._size}) times its elements; got {input.numel()} "
                f"{input.dtype} for {output.numel()} {output.dtype}"
            )
        dtype, count = _reduce_type(output, op)
        comm.reduce_scatter(
            self._buf(input, count * self._size, dtype), self._buf(output, count, dtype), op,
            stream=stream,
        )
        return self._work(output, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        op = _reduce_op(opts.reduceOp)
        comm, stream = self._target(outputs[0])
        with rustccl.group():
            for o, i in zip(outputs, inputs):
                _check_dense(i)
                _check_dense(o)
                dtype, count = _reduce_type(o, op)
                comm.reduce_scatter(
                    self._buf(i, count * self._size, dtype), self._buf(o, count, dtype), op,
                    stream=stream,
                )
        return self._work(outputs[0], outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, outputs, input_lists, opts):
        for o, ins in zip(outputs, input_lists):
            self.reduce_scatter_single(o, torch.cat([i.reshape(-1) for i in ins]), opts)
        return self._work(outputs[0], outputs)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts):
        comm, stream = self._target(input)
        _check_dense(output)
        if not output_splits and not input_splits:
            comm.all_to_all(self._buf(input), self._buf(output), stream=stream)
            return self._work(input, [output])
        # Uneven splits (rows of dim 0): one send and one receive per peer, grouped.
        in_row = input.numel() // max(1, input.shape[0]) if input.dim() else 1
        out_row = output.numel() // max(1, output.shape[0]) if output.dim() else 1
        in_splits = input_splits or [input.shape[0] // self._size] * self._size
        out_splits = output_splits or [output.shape[0] // self._size] * self._size
        flat_in, flat_out = input.reshape(-1), output.reshape(-1)
        with rustccl.group():
            off = 0
            for peer, n in enumerate(in_splits):
                comm.send(self._buf(flat_in[off:off + n * in_row]), peer, stream=stream)
                off += n * in_row
            off = 0
            for peer, n in enumerate(out_splits):
                comm.recv(self._buf(flat_out[off:off + n * out_row]), peer, stream=stream)
                off += n * out_row
        return self._work(input, [output])

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts):
        comm, stream = self._target(inputs[0])
        with rustccl.group():
            for peer, (o, i) in enumerate(zip(outputs, inputs)):
                _check_dense(i)
                _check_dense(o)
                comm.send(self._buf(i), peer, stream=stream)
                comm.recv(self._buf(o), peer, stream=stream)
        return self._work(inputs[0], outputs)

    def gather(self, output_lists, inputs, opts):
        t = inputs[0]
        comm, stream = self._target(t)
        root = opts.rootRank
        flat = None
        if self._rank == root:
            flat = torch.empty((self._size,) + tuple(t.shape), dtype=t.dtype, device=t.device)
        comm.gather(self._buf(t), None if flat is None else self._buf(flat), root, stream=stream)
        if flat is not None:
            for r, o in enumerate(output_lists[0]):
                o.copy_(flat[r])
        return self._work(t, output_lists)

    def scatter(self, outputs, input_lists, opts):
        t = outputs[0]
        comm, stream = self._target(t)
        root = opts.rootRank
        flat = None
        if self._rank == root:
            flat = torch.stack([i.reshape(t.shape) for i in input_lists[0]])
        comm.scatter(None if flat is None else self._buf(flat), self._buf(t), root, stream=stream)
        return self._work(t, outputs)

    def barrier(self, opts):
        if self._p2p:
            self._flush_p2p()
        self._host_comm().barrier()
        return _done_work(None)

    # -- point-to-point ------------------------------------------------------------------

    def send(self, tensors, dst, tag):
        return self._queue_p2p("send", tensors, dst)

    def recv(self, tensors, src, tag):
        return self._queue_p2p("recv", tensors, src)

    def _queue_p2p(self, kind, tensors, peer):
        t = tensors[0]
        _check_dense(t)
        stream = torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None
        work = _P2PWork(self, tensors)
        self._p2p.append((kind, t, peer, stream, work))
        return work

    def _flush_p2p(self):
        """Issues every queued send and receive in one rustccl group."""
        queued, self._p2p = self._p2p, []
        if not queued:
            return
        comm = self._cuda_comm(queued[0][1]) if queued[0][1].is_cuda else self._host_comm()
        with rustccl.group():
            for kind, t, peer, stream, _ in queued:
                call = comm.send if kind == "send" else comm.recv
                call(self._buf(t), peer, stream=stream)
        for _, t, _, _, work in queued:
            work._inner = self._work(t, work._tensors)

    @property
    def supports_coalescing(self):
        return True

    def start_coalescing(self, device=None):
        if self._p2p:
            self._flush_p2p()
        self._coalescing = True

    def end_coalescing(self, device=None):
        self._coalescing = False
        queued = list(self._p2p)
        self._flush_p2p()
        if queued:
            return queued[-1][4]._inner
        return _done_work(None)

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    # -- identity ------------------------------------------------------------------------

    def getBackendName(self):
        return BACKEND_NAME

    def abort(self):
        for comm in (self._host, self._cuda):
            if comm is not None:
                comm.abort()
        self._host = self._cuda = None

    def shutdown(self):
        for comm in (self._host, self._cuda):
            if comm is not None:
                comm.destroy()
        self._host = self._cuda = None


def _create(store, rank, size, timeout):
    return RustcclBackend(store, rank, size, timeout)


def register():
    """Registers the backend under "rustccl" for CPU and CUDA (done once, on import)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])


register()
