#!/usr/bin/env bash
# Runs every fuzz target for a bounded time over its corpus (fuzz/corpus/<target>/), as CI does.
#
#   fuzz/run-bounded.sh [SECONDS_PER_TARGET] [TARGET...]      (default: 15 s, every target)
#
# It builds the targets with nightly and the flags cargo-fuzz uses (so cargo-fuzz itself is
# not needed), with AddressSanitizer where the toolchain supports it. Inputs the fuzzer finds
# go to a scratch directory (FUZZ_KEEP=1: those that add coverage are merged into the corpus,
# to commit); a crash leaves its input under fuzz/artifacts/<target>/ and fails the script.
# FUZZ_TARGET_DIR sets where the build goes (default fuzz/target; CI keeps one across runs).
#
# Without a nightly toolchain it says so and falls back to the stable corpus regression test
# (every corpus file through the same entry points), so CI still checks the corpus.
set -euo pipefail
cd "$(dirname "$0")"

secs="${1:-15}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=()
    for f in fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi

stable_fallback() {
    echo "== fuzz: $1; running the stable corpus regression test instead"
    cd ..
    cargo test --release -p rustccl -p rustccl-tuner-default --test fuzz_corpus
    exit 0
}

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    stable_fallback "no nightly toolchain (rustup toolchain install nightly)"
fi

triple="$(rustc +nightly -vV | sed -n 's/^host: //p')"
flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
sanitizer=""
if [ "${FUZZ_SANITIZER:-address}" = address ] && rustc +nightly -Zsanitizer=address --print cfg >/dev/null 2>&1; then
    sanitizer="-Zsanitizer=address"
fi
export RUSTFLAGS="$flags $sanitizer"
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$PWD/target}"
echo "== fuzz: building ${#targets[@]} targets with nightly ($triple${sanitizer:+, AddressSanitizer})"
bins=()
for t in "${targets[@]}"; do bins+=(--bin "$t"); done
if ! cargo +nightly build --release --target "$triple" "${bins[@]}"; then
    stable_fallback "the nightly build failed"
fi

# New inputs go to a scratch directory; FUZZ_KEEP=1 merges those that add coverage into the
# corpus afterwards (libFuzzer's -merge=1), for committing.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
failed=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t" "$scratch/$t"
    dirs=("$scratch/$t" "corpus/$t")
    echo "== fuzz: $t for ${secs}s over $(find "corpus/$t" -type f | wc -l) corpus files"
    # -rss_limit_mb and -malloc_limit_mb catch huge allocations; -timeout catches hangs.
    if ! "$CARGO_TARGET_DIR/$triple/release/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -malloc_limit_mb=512 -max_len=4096 -print_final_stats=1 \
        -artifact_prefix="artifacts/$t/" "${dirs[@]}" 2>"artifacts/$t/log.txt"; then
        tail -40 "artifacts/$t/log.txt"
        failed+=("$t")
    else
        grep -E '^(stat::number_of_executed_units|stat::new_units_added)' "artifacts/$t/log.txt" | tr '\n' ' '
        echo
        rm -f "artifacts/$t/log.txt"
        if [ "${FUZZ_KEEP:-0}" = 1 ]; then
            "$CARGO_TARGET_DIR/$triple/release/$t" -merge=1 -max_len=4096 "corpus/$t" "$scratch/$t" 2>/dev/null
            echo "   corpus/$t now holds $(find "corpus/$t" -type f | wc -l) files"
        fi
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "== fuzz: FAILED: ${failed[*]} (inputs under fuzz/artifacts/)"
    exit 1
fi
echo "== fuzz: every target ran ${secs}s without a finding"
