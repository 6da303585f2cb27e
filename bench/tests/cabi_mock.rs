//! The C-ABI driver end to end against a one-rank stand-in library (tests/mock_nccl.c, built
//! with the system C compiler when there is one): symbol resolution, the unique id passed by
//! value, every operation's arguments, PreMulSum's scalar, host memory with the NULL stream,
//! and error reporting. NVIDIA's library is not available here.

use std::path::PathBuf;
use std::process::Command;

fn build_mock() -> Option<PathBuf> {
    let dir = std::env::temp_dir().join(format!("rustccl-bench-mock-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let lib = dir.join("libmocknccl.so");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mock_nccl.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    match Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(src)
        .status()
    {
        Ok(s) if s.success() => Some(lib),
        other => {
            eprintln!("skipping: cannot build the mock library with {cc}: {other:?}");
            None
        }
    }
}

fn bench(lib: &PathBuf, args: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rustccl-bench"));
    c.args(args.split_whitespace())
        .arg("--lib")
        .arg(lib)
        .arg("--host-memory");
    c.env_remove("RUSTCCL_BENCH_RANK");
    c.env_remove("MOCK_NCCL_FAIL");
    c
}

#[test]
fn c_abi_driver_against_a_one_rank_library() {
    let Some(lib) = build_mock() else { return };
    let out = bench(
        &lib,
        "all -N 1 -b 8 -e 4K -f 8 -n 2 -w 1 -m 2 -d all -o all -r all",
    )
    .output()
    .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{so}\n{se}");
    assert!(
        so.contains("(C ABI ") && so.contains("(ncclGetVersion 22809), host memory, NULL stream)"),
        "{so}"
    );
    assert!(so.contains("[host memory] NULL stream"), "{so}");
    assert!(so.contains("# Out of bounds values : 0 OK"), "{so}");
    let rows = so.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(rows, 4 * 12 * 34 - 4 * 12 * (2 + 6 + 1), "{so}"); // one root per rooted op

    // A failing call is reported with the library's words.
    let mut c = bench(&lib, "all_reduce -N 1 -b 8 -e 8 -n 1");
    c.env("MOCK_NCCL_FAIL", "ncclAllReduce");
    let out = c.output().unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{se}");
    assert!(
        se.contains("ncclAllReduce (AllReduce {")
            && se.contains(
                "failed: internal error (mock) (ncclResult_t 3); last error: forced failure"
            ),
        "{se}"
    );

    let mut c = bench(&lib, "all_reduce -N 1 -b 8 -e 8 -n 1");
    c.env("MOCK_NCCL_FAIL", "ncclCommInitRank");
    let out = c.output().unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{se}");
    assert!(
        se.contains("ncclCommInitRank(nranks 1, rank 0) failed: internal error (mock)"),
        "{se}"
    );
    let _ = std::fs::remove_dir_all(lib.parent().unwrap());
}
