#!/usr/bin/env bash
# Installs rustccl as NCCL under a prefix: PREFIX/lib/libnccl.so.2 (with the libnccl.so link
# a linker looks for) and PREFIX/include/nccl.h and nccl_device.h. Builds the library first
# when it is not built yet (cargo's target directory: CARGO_TARGET_DIR, else target/).
#   capi/install.sh PREFIX        e.g. capi/install.sh "$HOME/.local/rustccl"
set -euo pipefail
prefix=${1:?usage: capi/install.sh PREFIX}
root=$(cd "$(dirname "$0")/.." && pwd)
lib=${CARGO_TARGET_DIR:-$root/target}/release/libnccl.so
if [ ! -f "$lib" ]; then
    cargo build --release -p rustccl-capi --manifest-path "$root/Cargo.toml"
fi
install -d "$prefix/lib" "$prefix/include"
install -m 755 "$lib" "$prefix/lib/libnccl.so.2"
ln -sfn libnccl.so.2 "$prefix/lib/libnccl.so"
install -m 644 "$root/capi/include/nccl.h" "$root/capi/include/nccl_device.h" "$prefix/include/"
echo "rustccl installed as NCCL: $prefix/lib/libnccl.so.2, $prefix/include/nccl.h"
