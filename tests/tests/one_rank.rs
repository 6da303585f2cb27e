//! Issue 32 item 8: on a one-rank communicator every operation takes the one-rank route —
//! every collective, AlltoAll/AlltoAllv/Gather/Scatter and Send/Recv pairs to self, alone and
//! inside groups, blocking and non-blocking: in place nothing runs, out of place one copy per
//! operation, and it has completed when the call returns. One rank as a process on the host
//! backend (`tests/src/bin/worker_one_rank.rs` checks every result, that in-place calls start
//! nothing in the op log, and the errors); here each task's TRACE `COLL` way line.

use std::time::Duration;

use rustccl_tests::*;

fn run_one_rank(nonblocking: &str) {
    let env = [
        ("RUSTCCL_BACKEND", "host"),
        ("ONE_RANK_NONBLOCKING", nonblocking),
        ("NCCL_DEBUG", "TRACE"),
        ("NCCL_DEBUG_SUBSYS", "COLL"),
    ];
    let out = finish_all(spawn("one-rank", 1, &[0], &ids_arg(&[new_id()]), &env), Duration::from_secs(60));
    assert_all_ok(&out);
    let mode = if nonblocking == "1" { "non-blocking" } else { "blocking" };
    assert_eq!(out[0].results(), [format!("one-rank {mode} ok").as_str()]);
    let ways: Vec<&str> = out[0].stderr.lines().filter_map(|l| l.split_once(" B: way=").map(|(_, w)| w.trim())).collect();
    assert!(!ways.is_empty(), "no way lines:\n{}", out[0].stderr);
    assert!(ways.iter().all(|w| *w == "one-rank chosen by rustccl"), "{ways:?}");
    // The sends and receives to self of SendRecv, AlltoAll(v), Gather and Scatter say so too
    // (the planner logs no way line for point-to-point).
    for kind in ["Send", "Recv"] {
        let key = format!("{kind} 4004 B: way=one-rank");
        let n = out[0].stderr.lines().filter(|l| l.contains(&key)).count();
        assert!(n >= 10, "{n} lines with \"{key}\":\n{}", out[0].stderr);
    }
}

#[test]
fn every_operation_on_one_rank_takes_the_one_rank_route_blocking() {
    run_one_rank("0");
}

#[test]
fn every_operation_on_one_rank_takes_the_one_rank_route_non_blocking() {
    run_one_rank("1");
}
