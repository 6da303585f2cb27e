//! The collective correctness matrix, with ranks as processes: every collective (AllReduce,
//! AllGather, ReduceScatter, Broadcast, Reduce, AlltoAll, AlltoAllv with uneven counts, Gather,
//! Scatter, a Send/Recv ring exchange) × every reduction op (Sum, Prod, Min, Max, Avg,
//! PreMulSum with a host scalar and with a device scalar, each rank its own) × every data type,
//! at counts 1, 7, 1001 (and 100003 for float32 and bfloat16, plus a 4 MiB AllReduce that the
//! planner splits over two channels), in-place and out-of-place, with send and receive
//! pointers 0..3 elements into their allocations, every root with 3 ranks and varying
//! non-zero roots otherwise. Each rank checks its own outputs against a reference computed
//! independently in the worker (`tests/src/bin/worker_coll.rs`, which documents how inputs keep
//! results exact and the one tolerance) and prints `RESULT checked N cases ...`, or
//! `MISMATCH` lines and an `ERROR` with the first one.
//!
//! The matrix runs on 2, 3, 4 and 8 ranks; over the network transport on one host
//! (`NCCL_SHM_DISABLE=1`); with `NCCL_ALGO` and `NCCL_PROTO` forcing each algorithm and
//! protocol; and across two network namespaces, as two "nodes" joined by the socket plugin.
//!
//! Data is fresh on each run: the seed comes from the clock unless `RUSTCCL_TEST_SEED` is set,
//! and every failure message names it, so a failing run can be repeated exactly.

use std::time::Duration;

use rustccl_tests::*;

const LIMIT: Duration = Duration::from_secs(180);

fn seed() -> u64 {
    if let Some(s) = std::env::var("RUSTCCL_TEST_SEED").ok().and_then(|s| s.parse().ok()) {
        return s;
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
}

/// Checks that every rank succeeded and printed its `RESULT checked` line; returns the cases
/// each checked.
fn check_outcomes(what: &str, seed: u64, out: &[Outcome]) -> Vec<usize> {
    let mut cases = Vec::new();
    for o in out {
        assert!(
            o.ok(),
            "{what}: rank {} failed ({:?}); repeat with RUSTCCL_TEST_SEED={seed}\nstdout:\n{}\nstderr:\n{}",
            o.rank,
            o.status,
            o.stdout,
            o.stderr
        );
        let line = o
            .results()
            .into_iter()
            .find(|l| l.starts_with("checked "))
            .unwrap_or_else(|| panic!("{what}: rank {} printed no result: {o:?}", o.rank));
        let n: usize = line.split_whitespace().nth(1).and_then(|w| w.parse().ok()).expect("case count");
        assert!(n > 0, "{what}: rank {} checked nothing", o.rank);
        println!("{what}: rank {}: {line}", o.rank);
        cases.push(n);
    }
    assert!(cases.windows(2).all(|w| w[0] == w[1]), "{what}: ranks ran different case lists: {cases:?}");
    cases
}

/// Runs the matrix on `nranks` processes of this host with extra environment.
fn matrix(what: &str, nranks: i32, env: &[(&str, &str)]) -> usize {
    let seed = seed();
    let seed_s = seed.to_string();
    let mut env = env.to_vec();
    env.push(("COLL_SEED", &seed_s));
    let ids = ids_arg(&[new_id()]);
    let ranks: Vec<i32> = (0..nranks).collect();
    let out = finish_all(spawn("coll-matrix", nranks, &ranks, &ids, &env), LIMIT);
    check_outcomes(what, seed, &out)[0]
}

#[test]
fn matrix_2_ranks() {
    // 10 collectives, 7 ops, 12 types, 3 counts (+ large), in and out of place: 1956 cases.
    assert!(matrix("2 ranks", 2, &[]) > 1900);
}

#[test]
fn matrix_3_ranks_every_root() {
    // With 3 ranks every root of Broadcast, Reduce, Gather and Scatter; float Avg is the case
    // compared with a tolerance (1/3 is not exact).
    assert!(matrix("3 ranks", 3, &[]) > 3400);
}

#[test]
fn matrix_4_ranks() {
    matrix("4 ranks", 4, &[]);
}

#[test]
fn matrix_8_ranks() {
    // The whole matrix: it takes about 10 s on 2 cores, so nothing is left out.
    matrix("8 ranks", 8, &[]);
}

#[test]
fn matrix_over_the_net_transport_on_one_host() {
    // No shared memory: every connection goes through the socket plugin and the proxy thread.
    matrix("4 ranks, NCCL_SHM_DISABLE=1", 4, &[("NCCL_SHM_DISABLE", "1")]);
}

#[test]
fn allreduce_with_each_algorithm_and_protocol() {
    // Tree exists only for AllReduce (the other collectives have no algorithm left with
    // NCCL_ALGO=Tree); 5 and 8 ranks give trees with one and two levels below the root.
    let allreduce = ("COLL_COLLS", "AllReduce");
    matrix("Tree, 5 ranks", 5, &[("NCCL_ALGO", "Tree"), allreduce]);
    matrix("Tree LL, 8 ranks", 8, &[("NCCL_ALGO", "Tree"), ("NCCL_PROTO", "LL"), allreduce]);
    matrix("Tree Simple, 3 ranks", 3, &[("NCCL_ALGO", "Tree"), ("NCCL_PROTO", "Simple"), allreduce]);
    matrix("Ring, 4 ranks", 4, &[("NCCL_ALGO", "Ring"), allreduce]);
}

#[test]
fn matrix_with_each_protocol() {
    // LL cuts 100003-element cases into many 16 KiB chunks; Simple uses 512 KiB slots.
    matrix("LL, 4 ranks", 4, &[("NCCL_PROTO", "LL")]);
    matrix("Simple, 3 ranks", 3, &[("NCCL_PROTO", "Simple"), ("COLL_ROOTS", "one")]);
    matrix("LL128, 2 ranks", 2, &[("NCCL_PROTO", "LL128")]);
}

#[test]
fn matrix_with_four_channels() {
    // Every collective split over 4 channels, some of them empty at count 1 and 7.
    matrix("4 channels, 3 ranks", 3, &[("NCCL_MIN_CTAS", "4"), ("COLL_ROOTS", "one")]);
}

/// Every buffer in a symmetric window (`ncclMemAlloc` memory registered with
/// `NCCL_WIN_COLL_SYMMETRIC`): all_reduce, all_gather, reduce_scatter, broadcast and
/// all_to_all take the symmetric collectives (the host backend's twins of the GPU kernels,
/// `coll::symmetric::host`), the others the usual way; with them off, everything the usual way.
#[test]
fn matrix_on_symmetric_windows() {
    for (nranks, env) in [(2, vec![]), (3, vec![("COLL_ROOTS", "all")]), (3, vec![("RUSTCCL_SYM_KERNEL", "off")])] {
        let seed = seed();
        let seed_s = seed.to_string();
        let mut env = env.clone();
        env.extend([("COLL_WINDOWS", "1"), ("COLL_SEED", seed_s.as_str())]);
        let off = env.contains(&("RUSTCCL_SYM_KERNEL", "off"));
        let what = format!("windows, {nranks} ranks{}", if off { ", symmetric off" } else { "" });
        let ranks: Vec<i32> = (0..nranks).collect();
        let out = finish_all(spawn("coll-matrix", nranks, &ranks, &ids_arg(&[new_id()]), &env), LIMIT);
        check_outcomes(&what, seed, &out);
        for o in &out {
            let line = o.results().into_iter().find(|l| l.starts_with("checked ")).expect("result");
            let launches: usize = line
                .split("windows: ")
                .nth(1)
                .and_then(|t| t.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what}: no launch count in {line:?}"));
            if off {
                assert_eq!(launches, 0, "{what}: {line}");
            } else {
                assert!(launches > 300, "{what}: only {launches} symmetric collectives in {line}");
            }
        }
    }
}

#[test]
fn matrix_checker_catches_corruption() {
    // COLL_SELFTEST=1 corrupts one expected element (or guard byte) of every case, the
    // tolerance-compared ones included: the worker must see every case fail.
    let seed = seed();
    let seed_s = seed.to_string();
    let ids = ids_arg(&[new_id()]);
    let env = [("COLL_SELFTEST", "1"), ("COLL_SEED", seed_s.as_str())];
    let out = finish_all(spawn("coll-matrix", 3, &[0, 1, 2], &ids, &env), LIMIT);
    for o in &out {
        assert!(o.ok(), "seed {seed}: {o:?}");
        let r = o.results();
        assert!(r.iter().any(|l| l.starts_with("selftest caught")), "{o:?}");
    }
}

#[test]
fn matrix_across_two_namespaces() {
    let Some(nodes) = Nodes::for_test("rcol", 214) else { return };
    let seed = seed();
    // 4 ranks, 2 per namespace: within a namespace shared memory, between them the socket
    // plugin over the veth (the worker checks that it sees two hosts). The whole matrix: it
    // takes a few seconds.
    let comm_id = format!("{}:29518", nodes.addr[0]);
    let mut procs = Vec::new();
    for rank in 0..4 {
        let mut cmd = nodes.rank_command("coll-matrix", 4, rank, &comm_id);
        cmd.env("NCCL_DEBUG", "WARN")
            .env("COLL_SEED", seed.to_string())
            .env("COLL_EXPECT_HOSTS", "2");
        procs.push(spawn_command(rank, cmd));
    }
    let out = finish_all(procs, LIMIT);
    check_outcomes("two namespaces", seed, &out);
}
