"""Where the wheel's drop-in C library and headers are.

A wheel built by python/build-wheel.sh carries rustccl's ``libnccl.so.2`` (NCCL's soname and C
ABI) in ``rustccl/lib/`` and NCCL's headers for it in ``rustccl/include/``, so that programs
and Python packages that use NCCL (PyTorch's NCCL process group, nccl4py, C programs) can run
on rustccl without a Rust toolchain: ``python -m rustccl.preload -- <command>`` preloads the
library, ``cc -I"$(python -c 'import rustccl.paths as p; print(p.include_dir())')"`` compiles
against the headers.

A development install (``maturin develop``) has neither: these functions then raise
``FileNotFoundError`` saying how to get them.

This module imports nothing from the rest of the package, so it works without the native
extension.
"""

import os

__all__ = ["library_path", "include_dir"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

_HOW_TO_GET_THEM = (
    "This installation of the rustccl package does not carry it (a development install such as "
    "`maturin develop` has only the Python module). Install the wheel that python/build-wheel.sh "
    "builds (`python/build-wheel.sh && pip install python/dist/rustccl-*.whl`), or build the "
    "library with `cargo build --release -p rustccl-capi` (target/release/libnccl.so) and use "
    "capi/include/ for the headers."
)


def library_path() -> str:
    """The absolute path of the packaged drop-in ``libnccl.so.2`` (for ``LD_PRELOAD``,
    ``ctypes.CDLL`` or a linker command line)."""
    path = os.path.join(_PACKAGE_DIR, "lib", "libnccl.so.2")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"rustccl's libnccl.so.2 is not at {path}. {_HOW_TO_GET_THEM}")
    return path


def include_dir() -> str:
    """The absolute path of the directory holding the packaged ``nccl.h`` (and
    ``nccl_device.h``), for a compiler's ``-I``."""
    path = os.path.join(_PACKAGE_DIR, "include")
    if not os.path.isfile(os.path.join(path, "nccl.h")):
        raise FileNotFoundError(f"rustccl's nccl.h is not in {path}. {_HOW_TO_GET_THEM}")
    return path
