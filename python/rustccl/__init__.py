"""rustccl for Python: communicators and NCCL's collectives on numpy arrays, torch tensors and
cupy arrays (any buffer-protocol or DLPack object), on the host backend (CPU memory, ranks as
processes) or on GPUs. See python/README.md.

    uid = rustccl.get_unique_id()            # on one rank; send bytes(uid) to the others
    comm = rustccl.Communicator(nranks, uid, rank)
    comm.all_reduce(array)                   # in place, sum
"""

import contextlib
import enum

from ._native import (
    DTYPES,
    Buffer,
    Communicator,
    InProgressError,
    InternalError,
    InvalidArgumentError,
    InvalidUsageError,
    RemoteError,
    RustcclError,
    RustcclSystemError,
    RustcclTimeoutError,
    UnhandledCudaError,
    UniqueId,
    get_unique_id,
    group_end,
    group_start,
    version,
)


class ReduceOp(str, enum.Enum):
    """Reduction operators; each is also accepted as its string ("sum", ...)."""

    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    AVG = "avg"

    def __str__(self):
        return self.value


@contextlib.contextmanager
def group():
    """`with rustccl.group(): ...`: the operations in the block run together at its end
    (NCCL's group_start / group_end); on host memory they have completed when it exits, so
    their buffers must stay alive until then. If the block raises, the group still ends
    (its error, if any, is chained)."""
    group_start()
    try:
        yield
    except BaseException:
        try:
            group_end()
        except RustcclError:
            pass
        raise
    group_end()

from .paths import include_dir, library_path


def init_from_env(*, backend=None):
    """This process's communicator of the job a launcher started: torchrun (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Slurm (SLURM_PROCID, ...) or Open MPI
    (OMPI_COMM_WORLD_RANK, ...); NCCL_COMM_ID may give the rendezvous address. Every process
    calls it; it blocks until all have joined."""
    return Communicator.from_env(backend=backend)


__all__ = [
    "DTYPES",
    "Buffer",
    "Communicator",
    "InProgressError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidUsageError",
    "ReduceOp",
    "RemoteError",
    "RustcclError",
    "RustcclSystemError",
    "RustcclTimeoutError",
    "UnhandledCudaError",
    "UniqueId",
    "get_unique_id",
    "group",
    "group_end",
    "group_start",
    "include_dir",
    "init_from_env",
    "library_path",
    "version",
]
