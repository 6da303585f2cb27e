//! The host backend's plan cache (the planned route's memo, `rustccl::coll::planned`), with ranks as processes: repeated
//! single collectives interleaved with calls that differ from a cached one in one thing
//! (count, type, operator, PreMulSum scalar by value and by address, root, buffers, in place),
//! every result checked (`tests/src/bin/worker_cache.rs`); on 2 and 3 ranks, and with
//! `NCCL_PROTO` / `NCCL_ALGO` set (read once per process, so they cannot change between
//! calls: the cached plans are then rings, trees, Simple), so that every kind of program is
//! served from the cache. That a tuner's choice still applies on every call is checked by
//! `plugins.rs` / `c_tuner.rs` (a communicator with a tuner does not cache plans). The same
//! calls run through the board of small collectives (`rustccl::coll::small`) too.

use std::time::Duration;

use rustccl_tests::*;

fn run(nranks: i32, env: &[(&str, &str)]) -> Vec<u64> {
    let ids = ids_arg(&[new_id()]);
    let ranks: Vec<i32> = (0..nranks).collect();
    let mut env = env.to_vec();
    env.push(("RUSTCCL_BACKEND", "host"));
    // Small calls take the board of small collectives (`coll::small`) unless told otherwise:
    // here they must go through the cache, but for the test of the board below.
    if !env.iter().any(|(k, _)| *k == "RUSTCCL_HOST_SMALL_BYTES") {
        env.push(("RUSTCCL_HOST_SMALL_BYTES", "0"));
    }
    let out = finish_all(spawn("plan-cache", nranks, &ranks, &ids, &env), Duration::from_secs(120));
    assert_all_ok(&out);
    for o in &out {
        let line = o.results().into_iter().find(|l| l.starts_with("checked ")).unwrap_or_else(|| panic!("rank {} printed no result: {o:?}", o.rank));
        assert!(line.split_whitespace().nth(1).and_then(|w| w.parse::<usize>().ok()).is_some_and(|n| n > 50), "{line}");
    }
    // Every rank's count of all_gather calls copied straight from the peers' buffers.
    out.iter()
        .map(|o| {
            let line = o.results().into_iter().find(|l| l.starts_with("single_copies ")).unwrap_or_else(|| panic!("rank {} printed no count: {o:?}", o.rank));
            line.split_whitespace().nth(1).and_then(|w| w.parse().ok()).unwrap_or_else(|| panic!("{line}"))
        })
        .collect()
}

#[test]
fn cached_plans_never_serve_a_call_of_another_shape_two_ranks() {
    run(2, &[("RUSTCCL_HOST_SINGLE_COPY_BYTES", "0")]);
}

#[test]
fn cached_plans_never_serve_a_call_of_another_shape_three_ranks() {
    run(3, &[("RUSTCCL_HOST_SINGLE_COPY_BYTES", "0")]);
}

/// The same calls through the board of small collectives (every call of up to 32 KiB per
/// rank): interleaved shapes, in place and out of place, PreMulSum scalars by value and by
/// address, roots, every result checked.
#[test]
fn the_board_of_small_collectives_serves_calls_of_every_shape() {
    run(2, &[("RUSTCCL_HOST_SMALL_BYTES", "32768")]);
    run(3, &[("RUSTCCL_HOST_SMALL_BYTES", "32768")]);
}

/// Calls copied straight between the ranks' buffers (`rustccl::exec::host::single_copy`,
/// process_vm_readv/writev): every all_gather, all_reduce, reduce_scatter and broadcast of at
/// least 4 bytes per rank (broadcasts 32), then only the large ones (the default thresholds),
/// then none (turned off); every result checked.
#[test]
fn single_copies_between_the_ranks_buffers_serve_calls_of_every_shape() {
    // Per round: 16 all_reduces (PreMulSum by value and by address, in place and out of place
    // among them), 9 all_gathers, 3 reduce_scatters, 4 broadcasts of 70 and 280 KB.
    let every = run(3, &[("RUSTCCL_HOST_SINGLE_COPY_BYTES", "4")]);
    assert!(every.iter().all(|&c| c == 3 * 32), "every call of those kinds should copy once: {every:?}");
    let large = run(2, &[]);
    assert!(large.iter().all(|&c| c == 3 * 6), "the four all_gathers of 70 and 280 KB and the two 280 KB broadcasts of each round: {large:?}");
    let off = run(2, &[("RUSTCCL_HOST_SINGLE_COPY_BYTES", "0")]);
    assert!(off.iter().all(|&c| c == 0), "{off:?}");
}

#[test]
fn cached_plans_under_forced_algorithms_and_protocols() {
    run(3, &[("NCCL_PROTO", "Simple")]);
    run(2, &[("NCCL_PROTO", "LL128")]);
}
