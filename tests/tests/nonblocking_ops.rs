//! Operations on non-blocking communicators through the Rust API, ranks as processes on the
//! host backend (`tests/src/bin/worker_nonblocking.rs` says what each scenario checks): calls
//! return `InProgress` and complete in the background in call order, stuck work is abandoned
//! with abort from the same thread, and blocking and non-blocking communicators cannot share
//! a group.

use std::time::Duration;

use rustccl_tests::*;

const LIMIT: Duration = Duration::from_secs(120);

fn run(scenario: &str, nranks: i32) -> Vec<Outcome> {
    let ids = ids_arg(&[new_id()]);
    let ranks: Vec<i32> = (0..nranks).collect();
    finish_all(spawn(scenario, nranks, &ranks, &ids, &[("RUSTCCL_BACKEND", "host")]), LIMIT)
}

fn results(out: &[Outcome]) -> Vec<String> {
    out.iter().map(|o| o.results().first().map(|s| s.to_string()).unwrap_or_default()).collect()
}

#[test]
fn operations_return_in_progress_and_complete_in_call_order() {
    let out = run("nb-ops", 2);
    assert_all_ok(&out);
    for r in results(&out) {
        assert!(r.starts_with("nb-ops polls "), "{r:?}");
    }
}

#[test]
fn three_ranks_queue_groups_and_finalize_too() {
    let out = run("nb-ops", 3);
    assert_all_ok(&out);
}

#[test]
fn abort_from_the_same_thread_stops_stuck_work_promptly() {
    let out = run("nb-stuck", 2);
    assert_all_ok(&out);
    let r = results(&out);
    let ms: u64 = r[0].strip_prefix("nb-stuck abort_ms ").and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("rank 0: {:?}", out[0]));
    assert!(ms < 1000, "abort took {ms} ms");
    assert_eq!(r[1], "nb-stuck peer RemoteError", "the peer sees the aborted rank as failed: {:?}", out[1]);
}

#[test]
fn blocking_and_non_blocking_communicators_cannot_share_a_group() {
    let out = run("nb-mixed", 2);
    assert_all_ok(&out);
    assert!(results(&out).iter().all(|r| r == "nb-mixed ok"));
}
