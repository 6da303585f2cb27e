//! The C-ABI driver end to end against a one-rank stand-in library (tests/mock_nccl.c, built
//! with the system C compiler when there is one): symbol resolution, the unique id passed by
//! value, every operation's arguments, PreMulSum's scalar, host memory with the NULL stream,
//! and error reporting. NVIDIA's library is not available here.

use std::path::PathBuf;
use std::process::Command;

fn build_mock() -> Option<PathBuf> {
    let dir = std::env::temp_dir().join(format!("rustccl-bench-mock-{}", std::process::id()));
    build_c(&dir, "libmocknccl.so", "mock_nccl.c")
}

/// Compiles tests/<src> into <dir>/<name> as a shared library (None, with a line, without a
/// C compiler).
fn build_c(dir: &std::path::Path, name: &str, src: &str) -> Option<PathBuf> {
    std::fs::create_dir_all(dir).ok()?;
    let lib = dir.join(name);
    let src = format!("{}/tests/{src}", env!("CARGO_MANIFEST_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    match Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
    {
        Ok(s) if s.success() => Some(lib),
        other => {
            eprintln!("skipping: cannot build {name} with {cc}: {other:?}");
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
        so.contains("(C ABI ") && so.contains("(ncclGetVersion 23203), host memory, NULL stream)"),
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
    // -R needs functions the stand-in does not export: said before anything runs.
    for (mode, name) in [(2, "ncclMemAlloc"), (1, "ncclCommRegister")] {
        let out = bench(&lib, &format!("all_reduce -N 1 -b 8 -e 8 -n 1 -R {mode}")).output().unwrap();
        let se = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{se}");
        assert!(se.contains(&format!("-R {mode} (")) && se.contains(&format!("needs {name}, which {} does not export", lib.display())), "{se}");
    }
    let _ = std::fs::remove_dir_all(lib.parent().unwrap());
}

/// `-G` on a stand-in CUDA runtime (tests/mock_cudart.c: host memory, one fixed stream, graph
/// calls checked and counted): per row half one capture of the timed iterations, one
/// instantiation, `-G` launches and both destroys, in that order, with the thread-local
/// capture mode; checks and the barrier uncaptured; every call on the driver's stream.
#[test]
fn cudagraph_on_a_mock_cuda_runtime() {
    let dir = std::env::temp_dir().join(format!("rustccl-bench-mock-graph-{}", std::process::id()));
    let (Some(lib), Some(rt)) = (
        build_c(&dir, "libmocknccl.so", "mock_nccl.c"),
        build_c(&dir, "libmockcudart.so", "mock_cudart.c"),
    ) else {
        return;
    };
    let run = |args: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rustccl-bench"));
        c.args(args.split_whitespace()).arg("--lib").arg(&lib).arg("--cudart").arg(&rt);
        c.env_remove("RUSTCCL_BENCH_RANK");
        c.env_remove("MOCK_NCCL_FAIL");
        c.env("MOCK_NCCL_STREAM", "5157ea");
        let out = c.output().unwrap();
        let so = String::from_utf8_lossy(&out.stdout).into_owned();
        let se = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args}\n{so}\n{se}");
        assert!(so.contains("# Out of bounds values : 0 OK"), "{so}");
        (so, se)
    };
    // Two sizes x (out-of-place, in-place): four graphs, each launched 4 times.
    let (so, se) = run("all_reduce -N 1 -b 8 -e 64 -f 8 -n 3 -w 1 -G 4");
    assert!(so.contains("validation: 1 graph: 4"), "{so}");
    assert_eq!(so.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).count(), 2, "{so}");
    assert!(
        se.contains("mock cudart: begin 4 end 4 instantiate 4 launch 16 exec-destroy 4 destroy 4 live 0 bad 0"),
        "{se}"
    );
    // -m 2: each captured iteration is a group of two; the counts of graph calls do not change.
    let (_, se) = run("all_reduce -N 1 -b 8 -e 8 -n 2 -m 2 -G 3");
    assert!(
        se.contains("mock cudart: begin 2 end 2 instantiate 2 launch 6 exec-destroy 2 destroy 2 live 0 bad 0"),
        "{se}"
    );
    // Without -G nothing is captured.
    let (so, se) = run("all_reduce -N 1 -b 8 -e 64 -f 8 -n 3");
    assert!(so.contains("graph: 0"), "{so}");
    assert!(
        se.contains("mock cudart: begin 0 end 0 instantiate 0 launch 0 exec-destroy 0 destroy 0 live 0 bad 0"),
        "{se}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
