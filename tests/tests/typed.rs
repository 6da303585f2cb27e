//! The typed API (`rustccl::typed`) with ranks as processes on the host backend
//! (`tests/src/bin/worker_typed.rs` says what each scenario checks): every collective and its
//! in-place variant over nine element types, on host slices and `DeviceBuffer`s; typed errors
//! returned before anything is enqueued; non-blocking init and operations polled.

use std::time::Duration;

use rustccl_tests::*;

const LIMIT: Duration = Duration::from_secs(120);

fn run(scenario: &str, nranks: i32) -> Vec<Outcome> {
    let ids = ids_arg(&[new_id()]);
    let ranks: Vec<i32> = (0..nranks).collect();
    let out = finish_all(spawn(scenario, nranks, &ranks, &ids, &[("RUSTCCL_BACKEND", "host")]), LIMIT);
    assert_all_ok(&out);
    out
}

fn result(o: &Outcome) -> String {
    o.results().first().map(|s| s.to_string()).unwrap_or_default()
}

#[test]
fn every_collective_on_two_ranks() {
    for o in run("typed-colls", 2) {
        assert_eq!(result(&o), "typed-colls checked 130", "rank {}: {o:?}", o.rank);
    }
}

#[test]
fn every_collective_on_three_ranks() {
    for o in run("typed-colls", 3) {
        assert_eq!(result(&o), "typed-colls checked 130", "rank {}: {o:?}", o.rank);
    }
}

#[test]
fn typed_errors_come_before_anything_is_enqueued() {
    for o in run("typed-errors", 2) {
        assert_eq!(result(&o), "typed-errors ok");
    }
}

#[test]
fn non_blocking_init_and_operations_poll() {
    for o in run("typed-nonblocking", 3) {
        assert_eq!(result(&o), "typed-nonblocking ok");
    }
}
