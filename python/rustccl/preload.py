"""Run a command with rustccl's ``libnccl.so.2`` preloaded.

    python -m rustccl.preload -- <command> [args...]
    python -m rustccl.preload --print

The first form puts the packaged library (``rustccl.paths.library_path()``) first in
``LD_PRELOAD`` (keeping what was there) and replaces this process with the command, so the
command's exit status is this one's. ``LD_PRELOAD`` rather than ``LD_LIBRARY_PATH`` because
PyTorch's wheel loads NVIDIA's ``libnccl.so.2`` from a path of its own at import: only a
preloaded library with the soname ``libnccl.so.2`` takes its place. The variable is inherited,
so the processes the command starts (torchrun's workers) load rustccl too, e.g.

    python -m rustccl.preload -- torchrun --nproc-per-node 2 train.py

The second form prints the library's path (for ``LD_PRELOAD=$(...)`` by hand).
Exit status 2 with a usage message when no command is given, 1 when this installation carries
no library, 127 or 126 when the command cannot be found or run.
"""

from __future__ import annotations

import os
import sys

from .paths import library_path

USAGE = """usage: python -m rustccl.preload -- <command> [args...]
       python -m rustccl.preload --print

Runs the command with rustccl's libnccl.so.2 first in LD_PRELOAD, so that it and the
processes it starts (e.g. `torchrun ...`) use rustccl wherever they would load NCCL.
--print prints the library's path instead."""


def with_preloaded(library: str, ld_preload: str | None) -> str:
    """``LD_PRELOAD``'s new value: ``library`` first, then the entries already there (the
    loader takes colons or spaces between them), without a second copy of ``library``."""
    entries = (ld_preload or "").replace(" ", ":").split(":")
    return ":".join([library] + [e for e in entries if e and e != library])


def _usage_error(what: str) -> int:
    print(f"rustccl.preload: {what}\n{USAGE}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if argv == ["--print"]:
        try:
            print(library_path())
        except FileNotFoundError as e:
            print(f"rustccl.preload: {e}", file=sys.stderr)
            return 1
        return 0
    if argv[:1] == ["--"]:
        command = argv[1:]
    elif argv[:1] and argv[0].startswith("-"):
        return _usage_error(f"unknown option {argv[0]}")
    else:
        command = argv
    if not command:
        return _usage_error("no command given")
    try:
        library = library_path()
    except FileNotFoundError as e:
        print(f"rustccl.preload: {e}", file=sys.stderr)
        return 1
    env = dict(os.environ)
    env["LD_PRELOAD"] = with_preloaded(library, env.get("LD_PRELOAD"))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        print(f"rustccl.preload: command not found: {command[0]}", file=sys.stderr)
        return 127
    except PermissionError as e:
        print(f"rustccl.preload: cannot run {command[0]}: {e}", file=sys.stderr)
        return 126
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
