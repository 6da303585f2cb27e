#!/usr/bin/env bash
# Builds the `rustccl` wheel into python/dist/: the extension module `rustccl._native` plus the
# drop-in C library and its headers, so that `pip install` of the wheel is all a user needs to
# run PyTorch's NCCL process group or nccl4py on rustccl (`python -m rustccl.preload -- ...`),
# with no Rust toolchain on their machine.
#   python/build-wheel.sh [extra maturin build options]
# Needs cargo, maturin (1.x) and binutils (strip, readelf, objdump).
#
# What goes into the package directory first (git-ignored; pyproject.toml's `include` puts them
# in the wheel):
#   rustccl/lib/libnccl.so.2   capi's library, stripped (its soname libnccl.so.2 stays: it is in
#                              the dynamic section, which strip keeps)
#   rustccl/include/           nccl.h, nccl_device.h (and a nccl_device/ folder when capi has one)
#
# Platform tag: manylinux_2_<N>, where 2.<N> is the newest glibc symbol version that
# libnccl.so.2 needs (`--compatibility manylinux_2_<N>`; maturin checks the extension module
# against the same policy and fails if it needs more). pip then installs the wheel on this
# machine and on any x86_64/aarch64 Linux whose glibc is the same or newer (the GPU machines),
# and refuses it, with a clear message, on an older one, instead of failing at dlopen.
# The tag is abi3 cp39 (pyo3's abi3-py39 feature): one wheel for CPython 3.9 and later.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py="$root/python"
target_dir=${CARGO_TARGET_DIR:-$root/target}

echo "== cargo build --release -p rustccl-capi"
cargo build --release -p rustccl-capi --manifest-path "$root/Cargo.toml"
lib="$target_dir/release/libnccl.so"

rm -rf "$py/rustccl/lib" "$py/rustccl/include"
install -d "$py/rustccl/lib" "$py/rustccl/include"
strip -o "$py/rustccl/lib/libnccl.so.2" "$lib"
chmod 755 "$py/rustccl/lib/libnccl.so.2"
if ! readelf -d "$py/rustccl/lib/libnccl.so.2" | grep -q 'SONAME.*\[libnccl\.so\.2\]'; then
    echo "build-wheel.sh: $lib has no soname libnccl.so.2 (capi/build.rs sets it)" >&2
    exit 1
fi
install -m 644 "$root/capi/include/nccl.h" "$py/rustccl/include/"
if [ -f "$root/capi/include/nccl_device.h" ]; then
    install -m 644 "$root/capi/include/nccl_device.h" "$py/rustccl/include/"
fi
if [ -d "$root/capi/include/nccl_device" ]; then
    cp -r "$root/capi/include/nccl_device" "$py/rustccl/include/"
fi

# The oldest manylinux policy the library fits: its newest GLIBC_2.<N> symbol version.
glibc_minor=$(objdump -T "$py/rustccl/lib/libnccl.so.2" | grep -o 'GLIBC_2\.[0-9]*' | sed 's/GLIBC_2\.//' | sort -n | tail -1)
compat="manylinux_2_${glibc_minor:?no GLIBC symbol version found in libnccl.so.2}"

# A target directory of its own: the extension's build resolves the shared crates' features
# differently from capi's, and crates that are also cdylibs (net-socket) have no hash in their
# file names, so in one directory each build would overwrite the other's and every later
# `cargo build`/`cargo test` (and the next wheel) would compile rustccl again.
# RUSTCCL_WHEEL_TARGET_DIR moves it (CI keeps it in its cache, as the fuzz targets' build).
wheel_target_dir=${RUSTCCL_WHEEL_TARGET_DIR:-$target_dir/python-wheel}
echo "== maturin build --release --compatibility $compat"
rm -f "$py"/dist/rustccl-*.whl
(cd "$py" && maturin build --release --strip --compatibility "$compat" \
    --target-dir "$wheel_target_dir" --out "$py/dist" "$@")
ls -l "$py"/dist/rustccl-*.whl
