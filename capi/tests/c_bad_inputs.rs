//! Bad inputs against the C API, as a C caller makes them, on the host backend with ranks as
//! processes: `tests/c/race_test.c` (abort, destroy and finalize racing collectives on
//! another thread) and `tests/c/bad_input_test.c` (overflowing and impossible counts, argument
//! errors inside groups, the last error of a communicator, a PreMulSum used with another type).

mod common;

use common::{build, expect_clean, spawn, spawn_ranks};
use std::time::Duration;

#[test]
fn abort_destroy_and_finalize_racing_collectives_never_crash() {
    let exe = build("race_test");
    // Two processes at once, 500 rounds each: 1000 rounds of one-rank communicators.
    let children = (0..2).map(|_| spawn(&exe, &["500"], &[])).collect();
    expect_clean(children, Duration::from_secs(120), "race_test");
}

#[test]
fn abort_during_a_two_rank_collective_ends_the_peers_collective_with_an_error() {
    let exe = build("race_test");
    let ids: Vec<String> = (0..20).map(|_| rustccl::get_unique_id().unwrap().to_hex()).collect();
    let ids = ids.join(",");
    let children =
        (0..2).map(|rank| spawn(&exe, &["pair"], &[("RANK", rank.to_string()), ("NCCL_TEST_IDS", ids.clone())])).collect();
    expect_clean(children, Duration::from_secs(120), "race_test pair");
}

#[test]
fn bad_counts_groups_last_errors_and_premulsum_types_fail_cleanly() {
    let exe = build("bad_input_test");
    for n in [1, 2] {
        let id = rustccl::get_unique_id().unwrap();
        let children = spawn_ranks(&exe, n, &[("NCCL_TEST_ID", id.to_hex())]);
        expect_clean(children, Duration::from_secs(60), &format!("bad_input_test with {n} ranks"));
    }
}
