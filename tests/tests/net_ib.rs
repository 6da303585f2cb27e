//! The collective matrix over the IB transport (`plugins/net-ib`, NCCL's IB design over verbs)
//! on the userspace verbs stand-in (`plugins/net-ib/verbs-double`, built once per run of this
//! file with make), ranks as processes, `NCCL_NET=IB` and `NCCL_SHM_DISABLE=1` so that every
//! byte between ranks goes through the transport's RDMA writes: the whole matrix on 2, 3, 4
//! and 8 ranks, and on 4 ranks across two network namespaces (each namespace's double on its
//! veth address, so the GIDs are the veth addresses); and the check, a 2-rank
//! all_reduce sweep from 8 B to 64 MiB.
//!
//! No `NCCL_NET_PLUGIN`: the loader finds the IB transport as cargo builds it,
//! `librustccl_net_ib.so` beside `target/release/rank-worker` (`host/src/plugin/net_order.rs`).
//! Each rank's log must name the double's device (`NET/IB : Using [0]dbl_0:1/RoCE`) and the
//! network chosen (IB, from that file), and the double's counters (`IBV_DOUBLE_STATS=1`, printed
//! at exit) must show RDMA writes posted by the rank and placed in its memory.
//!
//! Skipped, saying why, only when the double cannot be built (no `cc` or `make`) and, for the
//! namespaces, where `RUSTCCL_SKIP_NETNS=1` (the other two-node tests' rule).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustccl_tests::*;

const LIMIT: Duration = Duration::from_secs(120);

/// The double's library, or `None` (after printing why) to skip.
fn double() -> Option<String> {
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/net-ib/verbs-double");
    let build = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verbs-double");
    match verbs_double::build(&sources, &build) {
        Ok(lib) => Some(lib.to_string_lossy().into_owned()),
        Err(why) => {
            println!("SKIPPED: {why}");
            None
        }
    }
}

/// The IB transport cargo built beside the rank worker, which the loader must find by itself.
fn ib_library() -> PathBuf {
    worker_path().parent().unwrap().join("librustccl_net_ib.so")
}

fn seed() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    (t.as_nanos() as u64 ^ (std::process::id() as u64) << 32).to_string()
}

/// The environment of every rank: IB on the double, no shared memory, the transport's INFO
/// lines, the double's counters at exit, the matrix's seed.
fn ib_env<'a>(double: &'a str, seed: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("NCCL_NET", "IB"),
        ("NCCL_SHM_DISABLE", "1"),
        ("NCCL_IBVERBS_LIB", double),
        ("IBV_DOUBLE_STATS", "1"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        ("COLL_SEED", seed),
    ]
}

/// What the double counted in one rank: (RDMA write bytes posted, RDMA write bytes placed in
/// this rank's memory), from its `stats:` line.
fn rdma_write_bytes(what: &str, o: &Outcome) -> (u64, u64) {
    let line = o
        .stderr
        .lines()
        .find(|l| l.contains("ibverbs-double[") && l.contains("stats: RDMA writes posted"))
        .unwrap_or_else(|| panic!("{what}: rank {} printed no double counters:\n{}", o.rank, o.stderr));
    // "... RDMA writes posted N (B bytes), placed here N (B bytes); ..."
    let bytes_after = |key: &str| -> u64 {
        let rest = &line[line.find(key).unwrap_or_else(|| panic!("{key} in {line}")) + key.len()..];
        let inside = rest.split('(').nth(1).and_then(|t| t.split(' ').next());
        inside.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no byte count after {key} in {line}"))
    };
    (bytes_after("writes posted"), bytes_after("placed here"))
}

/// Checks that every rank succeeded, checked the same non-zero number of cases, ran over the
/// double's device through the IB transport found beside the worker, and moved bytes by RDMA
/// write both ways. Returns each rank's (case count, write bytes posted, write bytes placed).
fn check_ib_matrix(what: &str, seed: &str, out: &[Outcome]) -> Vec<(usize, u64, u64)> {
    let using = format!("NET/Plugin: using IB (rustccl net ABI v2) from {}", ib_library().display());
    let mut per_rank = Vec::new();
    for o in out {
        assert!(
            o.ok(),
            "{what}: rank {} failed ({:?}); repeat with COLL_SEED={seed}\nstdout:\n{}\nstderr:\n{}",
            o.rank,
            o.status,
            o.stdout,
            o.stderr
        );
        assert!(o.stderr.contains("NET/IB : Using [0]dbl_0:1/RoCE"), "{what}: rank {} does not name the double's device:\n{}", o.rank, o.stderr);
        assert!(o.stderr.contains(&using), "{what}: rank {} did not choose the IB transport beside the worker:\n{}", o.rank, o.stderr);
        let line = o.results().into_iter().find(|l| l.starts_with("checked ")).unwrap_or_else(|| panic!("{what}: rank {}: {o:?}", o.rank));
        let n: usize = line.split_whitespace().nth(1).and_then(|w| w.parse().ok()).expect("case count");
        let (posted, placed) = rdma_write_bytes(what, o);
        assert!(posted > 0 && placed > 0, "{what}: rank {}: RDMA writes posted {posted} B, placed {placed} B", o.rank);
        println!("{what}: rank {}: {line}; RDMA write bytes posted {posted}, placed {placed}", o.rank);
        per_rank.push((n, posted, placed));
    }
    assert!(per_rank[0].0 > 0 && per_rank.iter().all(|r| r.0 == per_rank[0].0), "{what}: {per_rank:?}");
    per_rank
}

/// The matrix on `nranks` processes of this host over IB, `extra` added to the environment.
fn ib_matrix(what: &str, nranks: i32, extra: &[(&str, &str)]) -> Option<usize> {
    let double = double()?;
    let seed = seed();
    let mut env = ib_env(&double, &seed);
    env.extend_from_slice(extra);
    let ranks: Vec<i32> = (0..nranks).collect();
    let out = finish_all(spawn("coll-matrix", nranks, &ranks, &ids_arg(&[new_id()]), &env), LIMIT);
    Some(check_ib_matrix(what, &seed, &out)[0].0)
}

#[test]
fn matrix_over_ib_2_ranks() {
    // Every collective, op and type at 1, 7 and 1001 elements plus the large cases: 1956.
    assert!(ib_matrix("IB, 2 ranks", 2, &[]).is_none_or(|n| n > 1900));
}

#[test]
fn matrix_over_ib_3_ranks_every_root() {
    assert!(ib_matrix("IB, 3 ranks", 3, &[]).is_none_or(|n| n > 3400));
}

#[test]
fn matrix_over_ib_4_ranks() {
    ib_matrix("IB, 4 ranks", 4, &[]);
}

#[test]
fn matrix_over_ib_8_ranks() {
    // The whole matrix: about 25 s for 8 processes on 2 busy cores, so nothing is left out.
    ib_matrix("IB, 8 ranks", 8, &[]);
}

#[test]
fn matrix_over_ib_across_two_namespaces() {
    let Some(double) = double() else { return };
    let Some(nodes) = Nodes::for_test("rcib", 216) else { return };
    let seed = seed();
    // 2 ranks per namespace; each namespace's double answers on its veth address (its GIDs are
    // that address), as the transport's out-of-band socket does (NCCL_SOCKET_IFNAME = the veth).
    let comm_id = format!("{}:29520", nodes.addr[0]);
    let mut procs = Vec::new();
    for rank in 0..4 {
        let mut cmd = nodes.rank_command("coll-matrix", 4, rank, &comm_id);
        for (k, v) in ib_env(&double, &seed) {
            cmd.env(k, v);
        }
        cmd.env("IBV_DOUBLE_IP", &nodes.addr[rank as usize / 2]).env("COLL_EXPECT_HOSTS", "2").env("COLL_ROOTS", "one");
        procs.push(spawn_command(rank, cmd));
    }
    let out = finish_all(procs, LIMIT);
    check_ib_matrix("IB across two namespaces", &seed, &out);
    for o in &out {
        let node = o.rank as usize / 2;
        let oob = format!("NET/IB : Using [0]dbl_0:1/RoCE ; OOB {}:{}", nodes.dev[node], nodes.addr[node]);
        assert!(o.stderr.contains(&oob), "rank {}: {}", o.rank, o.stderr);
    }
}

/// The check: a 2-rank all_reduce (sum, float32) of every power of two from 8 B to
/// 64 MiB, in and out of place, every element checked, over IB without shared memory. Each
/// rank's result depends on all of the other rank's buffer, so at least that many bytes must
/// reach it: the peer's RDMA writes placed at least the sweep's payload in each rank's memory,
/// so the data went through verbs calls (and the ranks posted as much between them).
#[test]
fn all_reduce_sweep_8_bytes_to_64_mib_goes_through_rdma_writes() {
    let Some(double) = double() else { return };
    let seed = seed();
    let counts: Vec<String> = (1..=24).map(|p| (1u64 << p).to_string()).collect();
    let counts = counts.join(",");
    let mut env = ib_env(&double, &seed);
    env.extend([("COLL_COLLS", "AllReduce"), ("COLL_OPS", "sum"), ("COLL_DTYPES", "float32"), ("COLL_LARGE", "none"), ("COLL_COUNTS", &counts)]);
    let out = finish_all(spawn("coll-matrix", 2, &[0, 1], &ids_arg(&[new_id()]), &env), LIMIT);
    let per_rank = check_ib_matrix("all_reduce sweep over IB", &seed, &out);
    // Two cases (in and out of place) per size: 2 * (8 B + 16 B + ... + 64 MiB).
    let payload: u64 = 2 * (1..=24).map(|p| 4u64 << p).sum::<u64>();
    for (rank, (cases, _, placed)) in per_rank.iter().enumerate() {
        assert_eq!(*cases, 48, "rank {rank}");
        assert!(*placed >= payload, "rank {rank}: RDMA writes placed {placed} B here, less than the sweep's {payload} B");
    }
    let posted: u64 = per_rank.iter().map(|r| r.1).sum();
    assert!(posted >= 2 * payload, "the ranks posted RDMA writes of {posted} B, less than 2 x {payload} B");
}
