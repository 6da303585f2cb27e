//! Faults seen by one rank reach every rank; hangs explain themselves (ranks as processes,
//! host backend): ranks that call different operations, a rank that never calls (hang
//! report, operation timeout), reports on request and by signal.

use std::time::Duration;

use rustccl_tests::*;

const LIMIT: Duration = Duration::from_secs(60);

fn host() -> Vec<(&'static str, &'static str)> {
    vec![("RUSTCCL_BACKEND", "host")]
}

/// `RESULT mismatch <code> <ms> <message>` of every rank.
fn mismatch_results(nranks: i32, extra: &[(&str, &str)]) -> Vec<(String, u64, String)> {
    let mut env = host();
    env.extend_from_slice(extra);
    let out = finish_all(spawn("fault-mismatch", nranks, &(0..nranks).collect::<Vec<_>>(), &ids_arg(&[new_id()]), &env), LIMIT);
    assert_all_ok(&out);
    out.iter()
        .map(|o| {
            let r = o.results().into_iter().find_map(|l| l.strip_prefix("mismatch ")).unwrap_or_else(|| panic!("{o:?}")).to_string();
            let mut parts = r.splitn(3, ' ');
            let code = parts.next().unwrap().to_string();
            let ms: u64 = parts.next().unwrap().parse().unwrap();
            (code, ms, parts.next().unwrap_or("").to_string())
        })
        .collect()
}

/// On the host backend a small all_reduce goes through the board of small collectives
/// (`coll::small`) and a large one through the FIFOs: ranks whose counts differ that much take
/// different ways, and still learn of it (not a hang).
#[test]
fn ranks_whose_counts_send_them_different_ways_are_caught_on_every_rank() {
    // 8 bytes on the board, 4 KiB (the scenario's count) above its limit here.
    let res = mismatch_results(2, &[("MISMATCH", "way"), ("RUSTCCL_HOST_SMALL_BYTES", "64")]);
    for (rank, (code, ms, msg)) in res.iter().enumerate() {
        assert_eq!(code, "InvalidUsage", "rank {rank}: {msg}");
        assert!(*ms < 5000, "rank {rank} learnt of it after {ms} ms: {msg}");
    }
}

/// all_gather calls that copy straight from the peers' buffers (`coll::single_copy`) meet a
/// rank on the board, or one with another count: caught on every rank, not a hang.
#[test]
fn single_copies_that_meet_other_counts_are_caught_on_every_rank() {
    for what in ["gather-way", "gather-count"] {
        let res = mismatch_results(2, &[("MISMATCH", what), ("RUSTCCL_HOST_SINGLE_COPY_BYTES", "64")]);
        for (rank, (code, ms, msg)) in res.iter().enumerate() {
            assert_eq!(code, "InvalidUsage", "{what}, rank {rank}: {msg}");
            assert!(*ms < 5000, "{what}: rank {rank} learnt of it after {ms} ms: {msg}");
        }
    }
}

#[test]
fn different_datatypes_of_the_same_size_are_caught_on_every_rank_naming_both_sides() {
    let res = mismatch_results(2, &[("MISMATCH", "type")]);
    for (rank, (code, ms, msg)) in res.iter().enumerate() {
        assert_eq!(code, "InvalidUsage", "rank {rank}: {msg}");
        assert!(msg.contains("Float32") && msg.contains("Int32"), "rank {rank} does not name both sides: {msg}");
        assert!(*ms < 1000, "rank {rank} learnt of it after {ms} ms");
    }
}

#[test]
fn a_rank_in_another_collective_ends_every_ranks_operation_within_a_second() {
    // Rank 1 broadcasts while 0 and 2 all-reduce: rank 0 used to wait until rank 1 aborted.
    let res = mismatch_results(3, &[("MISMATCH", "kind")]);
    for (rank, (code, ms, msg)) in res.iter().enumerate() {
        assert_eq!(code, "InvalidUsage", "rank {rank}: {msg}");
        assert!(msg.contains("Broadcast") && msg.contains("AllReduce"), "rank {rank}: {msg}");
        assert!(*ms < 1000, "rank {rank} learnt of it after {ms} ms: {msg}");
    }
}

#[test]
fn a_count_mismatch_reaches_the_ranks_that_did_not_see_it() {
    // On the ring (the one-shot exchange, Ring/LL, links every rank with every other).
    let res = mismatch_results(3, &[("MISMATCH", "count"), ("ODD_RANK", "2"), ("NCCL_PROTO", "Simple")]);
    for (rank, (code, ms, msg)) in res.iter().enumerate() {
        assert_eq!(code, "InvalidUsage", "rank {rank}: {msg}");
        assert!(*ms < 1000, "rank {rank} learnt of it after {ms} ms: {msg}");
    }
    // Rank 1 exchanges nothing with rank 2 directly in the first ring step: it hears of it
    // (the failure's announcement), or finds it in rank 2's route entry (the host executor's
    // periodic look), whichever comes first; either way it names rank 2's count.
    assert!(res.iter().all(|(_, _, m)| m.contains("failed:") || m.contains("count 1025")), "{res:?}");
}

#[test]
fn mismatches_are_caught_on_the_one_shot_exchange_and_on_the_ring() {
    // Ring/LL is the host backend's one-shot exchange (every rank reads every peer's slot);
    // Simple the ring: both compare the signatures their FIFO slots carry.
    for proto in ["LL", "Simple"] {
        for (what, names) in [("type", ["Float32", "Int32"]), ("kind", ["Broadcast", "AllReduce"]), ("count", ["1024", "1025"])] {
            let res = mismatch_results(3, &[("MISMATCH", what), ("NCCL_PROTO", proto)]);
            for (rank, (code, ms, msg)) in res.iter().enumerate() {
                assert_eq!(code, "InvalidUsage", "{proto} {what}, rank {rank}: {msg}");
                assert!(*ms < 1000, "{proto} {what}: rank {rank} learnt of it after {ms} ms: {msg}");
            }
            // The ranks that saw it themselves name both sides.
            assert!(res.iter().any(|(_, _, m)| names.iter().all(|n| m.contains(n))), "{proto} {what}: {res:?}");
        }
    }
}

#[test]
fn the_explicit_check_catches_a_mismatch_over_the_network_transport() {
    // Slots over the network carry no signature; RUSTCCL_CHECK_COLLECTIVES=1 compares first.
    let res = mismatch_results(2, &[("MISMATCH", "type"), ("NCCL_SHM_DISABLE", "1"), ("RUSTCCL_CHECK_COLLECTIVES", "1")]);
    for (rank, (code, _, msg)) in res.iter().enumerate() {
        assert_eq!(code, "InvalidUsage", "rank {rank}: {msg}");
        assert!(msg.contains("RUSTCCL_CHECK_COLLECTIVES") && msg.contains("Int32") && msg.contains("Float32"), "rank {rank}: {msg}");
    }
}

#[test]
fn a_rank_that_never_calls_gets_one_hang_report_on_every_rank() {
    let mut env = host();
    env.extend_from_slice(&[("HANG_MODE", "report"), ("RUSTCCL_HANG_REPORT_S", "1"), ("ABSENT_S", "3")]);
    let out = finish_all(spawn("fault-hang", 3, &[0, 1, 2], &ids_arg(&[new_id()]), &env), LIMIT);
    assert_all_ok(&out);
    for o in &out {
        let reports = o.stderr.matches("rustccl hang report for communicator").count();
        assert_eq!(reports, 1, "rank {} logged {reports} reports:\n{}", o.rank, o.stderr);
        assert!(o.stderr.contains("never arrived: 2"), "rank {}:\n{}", o.rank, o.stderr);
        assert!(o.stderr.contains("in no operation"), "rank {}:\n{}", o.rank, o.stderr);
    }
    assert!(out[2].stderr.contains("hang report received from rank"), "{}", out[2].stderr);
}

#[test]
fn an_operation_timeout_ends_the_operation_on_every_rank_and_shrink_goes_on() {
    let mut env = host();
    env.extend_from_slice(&[("HANG_MODE", "timeout"), ("NCCL_OP_TIMEOUT_MS", "1500"), ("ABSENT_S", "3")]);
    let out = finish_all(spawn("fault-hang", 3, &[0, 1, 2], &ids_arg(&[new_id()]), &env), LIMIT);
    assert_all_ok(&out);
    for o in &out {
        let r = o.results().into_iter().find_map(|l| l.strip_prefix("hang ")).unwrap_or_else(|| panic!("{o:?}")).to_string();
        assert!(r.starts_with("Timeout "), "rank {}: {r}", o.rank);
        let ms: u64 = r.split(' ').nth(1).unwrap().parse().unwrap();
        if o.rank < 2 {
            assert!((1400..6000).contains(&ms), "rank {} timed out after {ms} ms", o.rank);
            assert!(r.contains("never arrived: 2"), "rank {}: {r}", o.rank);
        } else {
            assert!(ms < 500, "the late rank's call took {ms} ms");
        }
        assert!(o.results().contains(&"shrunk ok"), "{o:?}");
        assert!(o.stderr.contains("rustccl hang report"), "rank {}:\n{}", o.rank, o.stderr);
    }
}

#[test]
fn reports_on_request_and_by_signal() {
    let mut env = host();
    env.push(("RUSTCCL_HANG_REPORT_S", "0.2"));
    let out = finish_all(spawn("fault-report", 3, &[0, 1, 2], &ids_arg(&[new_id()]), &env), LIMIT);
    assert_all_ok(&out);
    assert!(out[0].results().contains(&"report api 3"), "{:?}", out[0]);
    assert_eq!(out[0].stderr.matches("report requested").count(), 2, "API and signal:\n{}", out[0].stderr);
    for o in &out[1..] {
        assert!(o.stderr.contains("hang report received from rank 0"), "rank {}:\n{}", o.rank, o.stderr);
    }
}

#[test]
fn abort_from_another_thread_ends_a_stuck_operation_at_once() {
    let out = finish_all(spawn("fault-abort-stuck", 3, &[0, 1, 2], &ids_arg(&[new_id()]), &host()), LIMIT);
    assert_all_ok(&out);
    for o in &out[..2] {
        let r = o.results().into_iter().find_map(|l| l.strip_prefix("abort-stuck ")).unwrap_or_else(|| panic!("{o:?}")).to_string();
        let ms: Vec<u64> = r.split(' ').map(|v| v.parse().unwrap()).collect();
        assert!(ms[0] < 1000 && ms[1] < 1000, "rank {}: abort took {} ms, the operation ended {} ms after it", o.rank, ms[0], ms[1]);
    }
}
