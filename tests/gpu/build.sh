#!/usr/bin/env bash
# Builds, here, what the GPU scripts run and strips it into target/gpu/ (what a device call
# carries: at most 64 MiB). One cargo command per package set: `--bin rank-worker` given with
# other packages would build only that binary and leave the others stale.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p rustccl-tests --bin rank-worker
cargo build --release -p rustccl-bench -p rustccl-capi -p rustccl-net-ib
mkdir -p target/gpu
for b in rank-worker rustccl-bench; do strip -o target/gpu/$b target/release/$b; done
strip -o target/gpu/libnccl.so.2 target/release/libnccl.so
cp target/gpu/libnccl.so.2 target/gpu/libnccl.so
# The IB transport beside the binaries (where the loader looks), and the verbs double to run it
# on machines without RDMA (tests/gpu/issue33.sh).
strip -o target/gpu/librustccl_net_ib.so target/release/librustccl_net_ib.so
make -s -C plugins/net-ib/verbs-double BUILD=$PWD/target/gpu/verbs-double $PWD/target/gpu/verbs-double/libibverbs.so.1
du -sh target/gpu
