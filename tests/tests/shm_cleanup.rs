//! Shared memory the host backend's shm transport makes (/dev/shm files named
//! `rustccl-<creator pid>-...`) does not outlive the ranks: not after a clean run, and not
//! after a rank is SIGKILLed mid-run and the survivor fails and exits.
//!
//! Tests run in parallel, so only files named after the pids of this test's ranks count.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use rustccl_tests::*;

const LIMIT: Duration = Duration::from_secs(120);
const SHM_DIR: &str = "/dev/shm";

/// Names of /dev/shm files created by process `pid`.
fn files_of(pid: i32) -> BTreeSet<String> {
    let prefix = format!("rustccl-{pid}-");
    std::fs::read_dir(SHM_DIR)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with(&prefix)).collect()
        })
        .unwrap_or_default()
}

/// rustccl shared memory files that process `pid` has mapped now (linked or not).
fn mapped_by(pid: i32) -> BTreeSet<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines()
        .filter_map(|l| l.split_once("/dev/shm/rustccl-").map(|(_, rest)| rest))
        .map(|rest| format!("rustccl-{}", rest.trim_end_matches(" (deleted)")))
        .collect()
}

/// Runs `procs` to the end; meanwhile records the rustccl shm files they map (so the test
/// knows the shm transport was in use and what names to look for afterwards).
fn run_watching(mut procs: Vec<RankProc>) -> (Vec<Outcome>, BTreeSet<String>, Vec<i32>) {
    let pids: Vec<i32> = procs.iter().map(|p| p.pid()).collect();
    let mut seen = BTreeSet::new();
    let t0 = Instant::now();
    // Poll until every rank has exited (its maps are gone) or the limit passes.
    while t0.elapsed() < LIMIT {
        let mut alive = 0;
        for &pid in &pids {
            if Path::new(&format!("/proc/{pid}/maps")).exists() {
                seen.extend(mapped_by(pid));
                alive += 1;
            }
        }
        // A finished child stays a zombie (no maps, /proc entry kept) until reaped below.
        let zombies = pids
            .iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')))
                    .unwrap_or(true)
            })
            .count();
        if zombies == pids.len() || alive == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for p in procs.iter_mut() {
        p.tell("GO");
    }
    (finish_all(procs, LIMIT), seen, pids)
}

fn assert_nothing_left(pids: &[i32], seen: &BTreeSet<String>, out: &[Outcome]) {
    assert!(
        seen.iter().any(|n| pids.iter().any(|p| n.starts_with(&format!("rustccl-{p}-")))),
        "the ranks never mapped a rustccl shared memory file (was the shm transport used?): {seen:?}\n{out:?}"
    );
    for pid in pids {
        let left = files_of(*pid);
        assert!(left.is_empty(), "/dev/shm files of process {pid} outlived it: {left:?}");
    }
    let left: Vec<&String> = seen.iter().filter(|n| Path::new(SHM_DIR).join(n).exists()).collect();
    assert!(left.is_empty(), "shared memory files the ranks mapped outlived them: {left:?}");
}

#[test]
fn a_clean_run_leaves_no_shared_memory_files() {
    let ids = ids_arg(&[new_id()]);
    let procs = spawn("coll-streams", 2, &[0, 1], &ids, &[("STREAM_ITERS", "40")]);
    let (out, seen, pids) = run_watching(procs);
    assert_all_ok(&out);
    assert_nothing_left(&pids, &seen, &out);
}

#[test]
fn a_sigkilled_rank_leaves_no_shared_memory_files() {
    // Rank 1 SIGKILLs itself while rank 0 runs an AllReduce that needs it; rank 0 sees
    // RemoteError, aborts and exits. Neither process's files may remain.
    let ids = ids_arg(&[new_id()]);
    let procs = spawn("coll-peer-death", 2, &[0, 1], &ids, &[("VICTIM", "1")]);
    let (out, seen, pids) = run_watching(procs);
    assert!(!out[1].ok(), "the victim should have died: {:?}", out[1]);
    assert!(out[0].ok(), "the survivor failed: {:?}", out[0]);
    assert!(out[0].results().iter().any(|r| r.ends_with("error RemoteError")), "{:?}", out[0]);
    assert_nothing_left(&pids, &seen, &out);
}
