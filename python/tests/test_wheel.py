"""The wheel that python/build-wheel.sh builds: it installs into a fresh venv with no index, and
its drop-in libnccl.so.2 (``python -m rustccl.preload``), headers and paths work there.

The wheel comes from RUSTCCL_TEST_WHEEL (CI builds it once and names it there, so these tests
run and never skip in CI); without it the tests build one with python/build-wheel.sh (minutes)
and skip when maturin or cargo is absent. The tests at the end need no wheel: they check the
error paths on a copy of the package's pure-Python modules.
"""

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

PYTHON_DIR = Path(__file__).resolve().parents[1]
PACKAGE_SOURCE = PYTHON_DIR / "rustccl"
NCCL_VERSION_CODE = 23203  # NCCL 2.32.3, what capi's ncclGetVersion reports

_WHEEL_ENV = "RUSTCCL_TEST_WHEEL"
_can_build = shutil.which("maturin") is not None and shutil.which("cargo") is not None
needs_wheel = pytest.mark.skipif(
    not os.environ.get(_WHEEL_ENV) and not _can_build,
    reason=f"needs {_WHEEL_ENV}=<wheel> or maturin and cargo to build one (python/build-wheel.sh)",
)


@pytest.fixture(scope="module")
def wheel() -> Path:
    named = os.environ.get(_WHEEL_ENV)
    if named:
        path = Path(named).resolve()
        assert path.is_file(), f"{_WHEEL_ENV}={named} is no file"
        return path
    subprocess.run([str(PYTHON_DIR / "build-wheel.sh")], check=True, timeout=1800)
    (path,) = (PYTHON_DIR / "dist").glob("rustccl-*.whl")  # the script clears older ones
    return path


@pytest.fixture(scope="module")
def venv_python(wheel, tmp_path_factory) -> Path:
    """A fresh venv (no system site packages) with only the wheel installed, offline."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", str(wheel)],
        check=True,
        timeout=300,
    )
    return python


def run_in(python: Path, *args: str, env=None) -> subprocess.CompletedProcess:
    """Runs the venv's python outside the source tree (so that python/rustccl cannot shadow
    the installed package)."""
    return subprocess.run(
        [str(python), *args],
        cwd=python.parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def installed_library(python: Path) -> str:
    out = run_in(python, "-c", "import rustccl.paths as p; print(p.library_path())")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@needs_wheel
def test_wheel_carries_library_headers_and_extension(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in (
        "rustccl/__init__.py",
        "rustccl/paths.py",
        "rustccl/preload.py",
        "rustccl/_native.abi3.so",
        "rustccl/lib/libnccl.so.2",
        "rustccl/include/nccl.h",
        "rustccl/include/nccl_device.h",
    ):
        assert name in names, f"{name} missing from {wheel.name}: {sorted(names)}"
    # One wheel for CPython >= 3.9, installable wherever glibc is at least the library's.
    assert "-cp39-abi3-manylinux_2_" in wheel.name, wheel.name


@needs_wheel
def test_installs_offline_into_fresh_venv_and_imports(venv_python):
    out = run_in(venv_python, "-c", "import rustccl; print(rustccl.__file__); print(rustccl.version())")
    assert out.returncode == 0, out.stderr
    package_file, versions = out.stdout.splitlines()
    assert Path(package_file).is_relative_to(venv_python.parent.parent), package_file
    assert "2.32.3" in versions, versions

    out = run_in(
        venv_python, "-c", "import rustccl.paths as p; print(p.library_path()); print(p.include_dir())"
    )
    assert out.returncode == 0, out.stderr
    library, include = out.stdout.splitlines()
    assert Path(library).is_file() and Path(library).name == "libnccl.so.2"
    assert (Path(include) / "nccl.h").is_file() and (Path(include) / "nccl_device.h").is_file()


# Run under `python -m rustccl.preload -- python -c ...`: loads "libnccl.so.2" by name as
# nccl4py and PyTorch do. The loader hands back the preloaded object only because its soname is
# libnccl.so.2 (build-wheel.sh's strip must keep it); the handle must be the packaged file's.
_PRELOADED_CHILD = textwrap.dedent(
    """
    import ctypes, os, sys
    packaged = os.path.realpath(sys.argv[1])
    by_name = ctypes.CDLL("libnccl.so.2")
    by_path = ctypes.CDLL(packaged)
    assert by_name._handle == by_path._handle, "libnccl.so.2 by name is not the packaged file"
    version = ctypes.c_int(0)
    assert by_name.ncclGetVersion(ctypes.byref(version)) == 0
    mapped = {line.split()[-1] for line in open("/proc/self/maps") if "/" in line}
    print(version.value, packaged in mapped, os.environ["LD_PRELOAD"])
    """
)


@needs_wheel
def test_preload_runs_command_on_packaged_library(venv_python):
    library = installed_library(venv_python)
    env = dict(os.environ, LD_PRELOAD="/nonexistent/libother.so")
    env.pop("LD_LIBRARY_PATH", None)
    out = run_in(
        venv_python, "-m", "rustccl.preload", "--",
        str(venv_python), "-c", _PRELOADED_CHILD, library,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    version, mapped, ld_preload = out.stdout.split()
    assert int(version) == NCCL_VERSION_CODE
    assert mapped == "True", "/proc/self/maps does not show the packaged libnccl.so.2"
    # Prepended, what was there kept.
    assert ld_preload == f"{library}:/nonexistent/libother.so"


@needs_wheel
def test_preload_passes_exit_status_through(venv_python):
    out = run_in(venv_python, "-m", "rustccl.preload", "--", str(venv_python), "-c", "raise SystemExit(7)")
    assert out.returncode == 7, out.stderr
    out = run_in(venv_python, "-m", "rustccl.preload", "--", "no-such-command-rustccl")
    assert out.returncode == 127 and "command not found: no-such-command-rustccl" in out.stderr


@needs_wheel
def test_preload_print(venv_python):
    out = run_in(venv_python, "-m", "rustccl.preload", "--print")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == installed_library(venv_python)


@needs_wheel
def test_headers_compile_and_link_a_c_program(venv_python, tmp_path):
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    out = run_in(venv_python, "-c", "import rustccl.paths as p; print(p.include_dir()); print(p.library_path())")
    assert out.returncode == 0, out.stderr
    include, library = out.stdout.splitlines()
    source = tmp_path / "app.c"
    source.write_text(
        '#include <stdio.h>\n#include "nccl.h"\n#include "nccl_device.h"\n'
        "int main(void) { int v = 0; if (ncclGetVersion(&v) != ncclSuccess) return 1;"
        ' printf("%d\\n", v); return 0; }\n'
    )
    subprocess.run([cc, f"-I{include}", str(source), library, "-o", str(tmp_path / "app")], check=True, timeout=120)
    env = dict(os.environ, LD_LIBRARY_PATH=str(Path(library).parent))
    ran = subprocess.run([str(tmp_path / "app")], env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert int(ran.stdout) == NCCL_VERSION_CODE


# Without a wheel: the package's pure-Python modules alone, as a development install
# (`maturin develop`) has them, with no lib/ or include/.


@pytest.fixture
def bare_package(tmp_path) -> Path:
    package = tmp_path / "rustccl"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("paths.py", "preload.py"):
        shutil.copy(PACKAGE_SOURCE / name, package / name)
    return tmp_path


def run_bare(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=root, capture_output=True, text=True, timeout=60
    )


def test_paths_say_how_to_get_missing_library_and_headers(bare_package):
    for function in ("library_path", "include_dir"):
        out = run_bare(bare_package, "-c", f"import rustccl.paths as p; p.{function}()")
        assert out.returncode == 1
        assert "FileNotFoundError" in out.stderr and "build-wheel.sh" in out.stderr, out.stderr
    out = run_bare(bare_package, "-m", "rustccl.preload", "--print")
    assert out.returncode == 1 and out.stdout == ""
    assert "libnccl.so.2 is not at" in out.stderr and "build-wheel.sh" in out.stderr, out.stderr
    out = run_bare(bare_package, "-m", "rustccl.preload", "--", "true")
    assert out.returncode == 1 and "build-wheel.sh" in out.stderr, out.stderr


def test_preload_without_command_prints_usage_and_exits_2(bare_package):
    for args in ([], ["--"], ["--bogus"]):
        out = run_bare(bare_package, "-m", "rustccl.preload", *args)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stdout == "" and "usage: python -m rustccl.preload -- <command>" in out.stderr
