//! One-sided operations on symmetric windows on the host backend, ranks as processes
//! (`rank-worker one-sided`): rounds of a ring of puts with signals and waits (bytes exact,
//! expected counts running on), signals without data waited for on several peers in one
//! call, the bad arguments; a peer killed while the others wait for it.

use std::time::Duration;

use rustccl_tests::*;

#[test]
fn puts_signals_and_waits_run_a_ring_on_windows() {
    for n in [2, 3, 4] {
        let ranks: Vec<i32> = (0..n).collect();
        let out = finish_all(spawn("one-sided", n, &ranks, &ids_arg(&[new_id()]), &[]), Duration::from_secs(120));
        assert_all_ok(&out);
        assert!(out.iter().all(|o| o.results() == ["one-sided ok 6"]), "{n} ranks: {out:?}");
    }
}

/// The last rank dies while the others wait for its signal: an error within seconds.
#[test]
fn a_peer_dying_while_others_wait_for_its_signal_is_an_error_not_a_hang() {
    let ranks: Vec<i32> = (0..3).collect();
    let out = finish_all(spawn("one-sided-death", 3, &ranks, &ids_arg(&[new_id()]), &[]), Duration::from_secs(120));
    for r in survivor_results(&out, 2) {
        eprintln!("{r}");
        assert!(r.starts_with("one-sided-death ok "), "{r:?}");
        let ms: u64 = r.split_whitespace().nth(2).and_then(|v| v.parse().ok()).unwrap_or(u64::MAX);
        assert!(ms < 15_000, "the wait took {ms} ms to fail");
    }
}

/// The calls inside groups (`ncclGroupStart`/`End`): rounds of the ring whose puts, a signal
/// and the wait are one group; a group mixing them with an all_reduce (both results right);
/// a group with a refused call runs nothing and ends with its error.
#[test]
fn puts_signals_and_waits_run_inside_groups() {
    for n in [2, 3] {
        let ranks: Vec<i32> = (0..n).collect();
        let out = finish_all(spawn("one-sided-group", n, &ranks, &ids_arg(&[new_id()]), &[]), Duration::from_secs(120));
        assert_all_ok(&out);
        assert!(out.iter().all(|o| o.results() == ["one-sided-group ok 7"]), "{n} ranks: {out:?}");
    }
}
