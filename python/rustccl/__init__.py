"""rustccl for Python (see python/README.md)."""

from ._native import version

__all__ = ["version"]
