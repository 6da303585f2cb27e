//! The router's ways inside groups and on non-blocking communicators, ranks as processes on
//! the host backend (`rank-worker routes-*`, tests/src/bin/worker_routes.rs): a group mixing
//! the board, the symmetric CPU twin, the planner and point-to-point gives right results and
//! each collective takes the way a single call would; the same on a non-blocking
//! communicator; ranks that would choose differently inside a group get an error, not a hang.

use std::time::Duration;

use rustccl_tests::*;

const LIMIT: Duration = Duration::from_secs(120);

fn run(scenario: &str, n: i32, env: &[(&str, &str)]) -> Vec<Outcome> {
    let ranks: Vec<i32> = (0..n).collect();
    finish_all(spawn(scenario, n, &ranks, &ids_arg(&[new_id()]), env), LIMIT)
}

#[test]
fn a_group_mixes_the_board_the_symmetric_twin_and_the_planner() {
    for n in [2, 3, 4] {
        let out = run("routes-group", n, &[]);
        assert_all_ok(&out);
        assert!(out.iter().all(|o| o.results() == ["routes-group ok"]), "{n} ranks: {out:?}");
    }
}

#[test]
fn non_blocking_calls_and_groups_take_the_same_ways() {
    for n in [2, 3] {
        let out = run("routes-nonblocking", n, &[]);
        assert_all_ok(&out);
        assert!(out.iter().all(|o| o.results() == ["routes-nonblocking ok"]), "{n} ranks: {out:?}");
    }
}

#[test]
fn ranks_that_route_a_grouped_task_differently_get_an_error_not_a_hang() {
    for (n, nonblocking) in [(2, "0"), (3, "0"), (2, "1"), (3, "1")] {
        let out = run("routes-disagree", n, &[("RUSTCCL_TEST_NONBLOCKING", nonblocking)]);
        assert_all_ok(&out);
        for o in &out {
            assert!(o.results().iter().any(|r| r.starts_with("routes-disagree ok ")), "{n} ranks, non-blocking {nonblocking}: {o:?}");
        }
    }
}
