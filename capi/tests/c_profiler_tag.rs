//! The per-call profiler tag reaches a C profiler plugin: `tests/c/profiler_tag_test.c` on 2
//! ranks as processes (host backend) under `plugins/testing/c-profiler/profiler_v7.c`, which
//! exports NCCL's profiler v7 and v6 and writes what it is given. rustccl must take v7 (the
//! newest, as NCCL does) and hand it `userTag` 42 on the tagged all-reduce's CollApi and Coll
//! events, 0 on the plain all-reduce's and on the send / receive's, each call's own tag inside
//! a group (7 and 8), and no KernelPhase event.

mod common;

use common::{build, expect_clean, spawn_ranks};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The C profiler compiled into `dir`.
fn c_profiler_v7(dir: &Path) -> PathBuf {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plugins/testing/c-profiler/profiler_v7.c");
    let out = dir.join("libc_tagger.so");
    let status = Command::new("cc")
        .args(["-std=gnu99", "-Wall", "-Werror", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&source)
        .status()
        .unwrap_or_else(|e| panic!("running cc: {e}"));
    assert!(status.success(), "compiling {} failed", source.display());
    out
}

#[test]
fn a_c_profiler_v7_gets_the_callers_tag_on_that_call_only() {
    let exe = build("profiler_tag_test");
    let dir = std::env::temp_dir().join(format!("rustccl-profiler-tag-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let plugin = c_profiler_v7(&dir);
    let out = dir.join("seen");
    let id = rustccl::get_unique_id().unwrap();
    let env = [
        ("NCCL_TEST_ID", id.to_hex()),
        ("NCCL_PROFILER_PLUGIN", plugin.display().to_string()),
        ("RUSTCCL_C_PROFILER_OUT", out.display().to_string()),
    ];
    expect_clean(spawn_ranks(&exe, 2, &env), Duration::from_secs(120), "profiler_tag_test with 2 ranks");
    for rank in 0..2 {
        let path = format!("{}.{rank}", out.display());
        let seen = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e} (the plugin was not loaded)"));
        let lines: Vec<&str> = seen.lines().collect();
        assert_eq!(lines.first(), Some(&format!("init v7 rank {rank}").as_str()), "v7 is taken over v6:\n{seen}");
        assert_eq!(lines.last(), Some(&"finalize"), "{seen}");
        for expected in [
            "CollApi AllReduce 1000 42",
            "Coll AllReduce 1000 42",
            "CollApi AllReduce 2000 0",
            "Coll AllReduce 2000 0",
            "P2pApi Send 300 0",
            "P2pApi Recv 300 0",
            "P2p Send 300 0",
            "P2p Recv 300 0",
            "CollApi AllReduce 500 7",
            "Coll AllReduce 500 7",
            "CollApi AllReduce 600 8",
            "Coll AllReduce 600 8",
        ] {
            assert_eq!(lines.iter().filter(|l| **l == expected).count(), 1, "rank {rank}: once \"{expected}\" in\n{seen}");
        }
        assert_eq!(lines.len(), 14, "init, the twelve events, finalize; no KernelPhase:\n{seen}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
