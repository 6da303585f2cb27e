//! End-to-end runs of the built `rustccl-bench` (cargo builds it next to the tests, in
//! target/<profile>/, and names it in CARGO_BIN_EXE_rustccl-bench) on the host backend: ranks
//! are real processes, every element is checked, and nothing may be wrong.

use std::process::{Command, Output};

fn bench(args: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rustccl-bench"));
    c.args(args.split_whitespace());
    c.env("RUSTCCL_BACKEND", "host");
    c.env_remove("RUSTCCL_BENCH_RANK");
    c.env_remove("RUSTCCL_BENCH_INJECT_ERROR");
    c
}

fn run(mut c: Command) -> (Output, String, String) {
    let out = c.output().expect("run rustccl-bench");
    let so = String::from_utf8_lossy(&out.stdout).into_owned();
    let se = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, so, se)
}

/// The table rows (lines that are not comments).
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

#[test]
fn all_reduce_sweep_on_two_ranks() {
    let (out, so, se) = run(bench("-N 2 -b 8 -e 64K -f 8 -n 2 -w 1 -c 1"));
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{so}\nstderr:\n{se}",
        out.status
    );
    assert!(so.starts_with("# rustccl-bench version "), "{so}");
    assert!(so.contains("# nThread 1 nGpus 1 minBytes 8 maxBytes 65536 step: 8(factor) warmup iters: 1 iters: 2 agg iters: 1 validation: 1 graph: 0"), "{so}");
    assert!(
        so.contains("# Using devices\n#  Rank  0 Group  0 Pid "),
        "{so}"
    );
    assert!(so.contains("#  Rank  1 Group  0 Pid "), "{so}");
    assert!(so.contains("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"));
    let r = rows(&so);
    let sizes: Vec<&str> = r.iter().map(|c| c[0].as_str()).collect();
    assert_eq!(sizes, ["8", "64", "512", "4096", "32768"], "{so}");
    for c in &r {
        assert_eq!(c.len(), 13, "{c:?}");
        assert_eq!(&c[2..5], ["float", "sum", "-1"]);
        assert_eq!((c[8].as_str(), c[12].as_str()), ("0", "0"), "{c:?}");
        assert!(c[5].parse::<f64>().unwrap() > 0.0);
        // Two ranks: busbw = algbw for all-reduce.
        assert_eq!(c[6], c[7]);
    }
    assert_eq!(r[4][1], "8192");
    assert!(
        so.contains("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : "),
        "{so}"
    );
}

#[test]
fn every_operation_type_and_operator_on_a_tiny_range() {
    let (out, so, se) = run(bench(
        "all -N 2 -b 8 -e 128 -f 16 -n 1 -w 0 -d all -o all -r all",
    ));
    assert!(
        out.status.success(),
        "status {:?}\nstderr:\n{se}\nstdout:\n{so}",
        out.status
    );
    assert!(so.contains("# Out of bounds values : 0 OK"), "{so}");
    let r = rows(&so);
    // Two sizes per (operation, type, operator, root): 12 types; 6 operators for the three
    // reductions; 2 roots for the four rooted operations.
    let per_type = 6 /* all_reduce */ + 6 /* reduce_scatter */ + 6 * 2 /* reduce */
        + 1 + 2 /* all_gather, broadcast */ + 1 + 1 /* alltoall(v) */ + 2 + 2 /* gather, scatter */ + 1 /* sendrecv */;
    assert_eq!(r.len(), 2 * 12 * per_type, "{so}");
    for c in &r {
        assert!(c[8] == "0", "{c:?}");
        assert!(c[12] == "0" || c[12] == "N/A", "{c:?}");
    }
    for name in [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "alltoall",
        "alltoallv",
        "gather",
        "scatter",
        "sendrecv",
    ] {
        assert!(
            so.contains(&format!("# Collective test starting: {name}\n")),
            "{name}"
        );
    }
    for t in [
        "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double",
        "bfloat16", "f8e4m3", "f8e5m2",
    ] {
        assert!(r.iter().any(|c| c[2] == t), "{t}");
    }
    for op in ["sum", "prod", "max", "min", "avg", "mulsum", "none"] {
        assert!(r.iter().any(|c| c[3] == op), "{op}");
    }
    // In place, alltoall, alltoallv and sendrecv are not checked (as in nccl-tests).
    assert!(r.iter().filter(|c| c[12] == "N/A").count() == 2 * 12 * 3);
}

#[test]
fn three_ranks_reductions_and_rooted_operations() {
    // An odd rank count: float Avg takes its other path, and roots go up to 2.
    let (out, so, se) = run(bench(
        "all -N 3 -b 48 -e 3K -f 64 -n 1 -w 0 -d half,int32,f8e4m3 -o avg,prod,mulsum -r all",
    ));
    assert!(out.status.success(), "{se}\n{so}");
    assert!(so.contains("# Out of bounds values : 0 OK"), "{so}");
    assert!(rows(&so).iter().any(|c| c[4] == "2"));
}

#[test]
fn json_report_to_a_file_and_to_stdout() {
    let dir = std::env::temp_dir().join(format!("rustccl-bench-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("out.json");
    let (out, so, se) = run(bench(&format!(
        "broadcast -N 2 -b 1K -e 4K -f 2 -n 1 -w 0 -r all -J {}",
        path.display()
    )));
    assert!(out.status.success(), "{se}");
    assert!(so.contains("# Out of bounds values : 0 OK"));
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(j["nranks"], 2);
    assert_eq!(j["out_of_bounds"], 0);
    let res = j["results"].as_array().unwrap();
    assert_eq!(res.len(), 6);
    assert_eq!(res[0]["op"], "broadcast");
    assert_eq!(res[0]["size"], 1024);
    assert_eq!(res[0]["count"], 256);
    assert_eq!(res[3]["root"], 1);
    assert_eq!(res[5]["in_place"]["wrong"], 0);
    assert!(res[5]["out_of_place"]["busbw_gbs"].as_f64().unwrap() > 0.0);
    assert_eq!(j["devices"].as_array().unwrap().len(), 2);
    let _ = std::fs::remove_dir_all(&dir);

    // '-' puts the JSON alone on stdout; the table goes to stderr.
    let (out, so, se) = run(bench("gather -N 2 -b 64 -e 64 -n 1 -w 0 -J -"));
    assert!(out.status.success(), "{se}");
    let j: serde_json::Value = serde_json::from_str(&so).unwrap_or_else(|e| panic!("{e}: {so}"));
    assert_eq!(j["results"].as_array().unwrap().len(), 1);
    assert_eq!(j["results"][0]["op"], "gather");
    assert!(se.contains("# Out of bounds values : 0 OK"), "{se}");
}

#[test]
fn a_wrong_element_is_reported_and_fails_the_run() {
    let mut c = bench("reduce_scatter -N 2 -b 64 -e 512 -f 8 -n 1 -w 0");
    c.env("RUSTCCL_BENCH_INJECT_ERROR", "1");
    let (out, so, se) = run(c);
    assert_eq!(out.status.code(), Some(1), "{so}\n{se}");
    let r = rows(&so);
    assert_eq!(r.len(), 2);
    for c in &r {
        assert_eq!((c[8].as_str(), c[12].as_str()), ("1", "1"), "{c:?}");
    }
    assert!(so.contains("# Out of bounds values : 4 FAILED"), "{so}");
    assert!(
        se.contains(
            "rank 1: reduce_scatter float sum root 0 count 8 out-of-place: element 0: expected"
        ),
        "{se}"
    );
}

#[test]
fn no_check_means_na_and_other_timings() {
    let (out, so, se) = run(bench(
        "alltoallv -N 2 -b 1K -e 1K -c 0 -n 3 -w 0 -a 0 -m 2 -d uint8",
    ));
    assert!(out.status.success(), "{se}");
    let r = rows(&so);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (
            r[0][2].as_str(),
            r[0][3].as_str(),
            r[0][8].as_str(),
            r[0][12].as_str()
        ),
        ("uint8", "none", "N/A", "N/A")
    );
    assert!(so.contains("agg iters: 2 validation: 0"));
}

#[test]
fn help_and_bad_arguments() {
    let (out, so, _) = run(bench("--help"));
    assert!(out.status.success());
    assert!(so.contains("USAGE: rustccl-bench"), "{so}");
    assert!(
        so.contains("(default 8)") && so.contains("(default 128M)") && so.contains("(default 2)"),
        "{so}"
    );
    let (out, _, se) = run(bench("-N 2 -b 1G -e 1K"));
    assert_eq!(out.status.code(), Some(2));
    assert!(se.contains("minbytes"), "{se}");
    let (out, _, se) = run(bench("frobnicate"));
    assert_eq!(out.status.code(), Some(2));
    assert!(se.contains("unknown operation"), "{se}");
}

#[test]
fn a_missing_library_is_a_clear_error() {
    let (out, _, se) = run(bench("-N 1 -b 8 -e 8 --lib /nonexistent/libnccl.so.2"));
    assert_eq!(out.status.code(), Some(1));
    assert!(se.contains("cannot load /nonexistent/libnccl.so.2"), "{se}");
}

#[test]
fn without_n_the_host_backend_runs_four_ranks() {
    // --start-mps changes nothing on the host backend: no GPU is shared, no MPS line.
    let (out, so, se) = run(bench("broadcast -b 8 -e 64 -n 1 -r 3 --start-mps"));
    assert!(out.status.success(), "stdout:\n{so}\nstderr:\n{se}");
    let ranks: Vec<&str> = so.lines().filter(|l| l.starts_with("#  Rank ")).collect();
    assert_eq!(ranks.len(), 4, "{so}");
    assert!(so.contains("#  Rank  3 Group  0 Pid "), "{so}");
    assert!(!se.contains("MPS"), "{se}");
    // The root is checked against the ranks the launcher picked.
    let (out, _, se) = run(bench("broadcast -b 8 -e 64 -n 1 -r 4"));
    assert_eq!(out.status.code(), Some(2), "{se}");
    assert!(se.contains("root 4 is out of range for 4 ranks"), "{se}");
}

/// rustccl's own C library (`capi`), built by `cargo build` next to this program.
fn rustccl_c_lib() -> String {
    let dir = std::path::Path::new(env!("CARGO_BIN_EXE_rustccl-bench")).parent().unwrap().to_path_buf();
    let lib = dir.join("libnccl.so");
    assert!(lib.exists(), "{} is not built; run `cargo build --release` first", lib.display());
    lib.to_string_lossy().into_owned()
}

#[test]
fn plot_draws_every_library_of_the_run() {
    let svg = std::env::temp_dir().join(format!("rustccl-bench-plot-{}.svg", std::process::id()));
    let _ = std::fs::remove_file(&svg);
    let lib = rustccl_c_lib();
    let args = format!("-N 2 -b 8 -e 4K -f 8 -n 2 -w 0 --host-memory --lib rustccl --lib {lib} --plot {}", svg.display());
    let (out, so, se) = run(bench(&args));
    assert!(out.status.success(), "status {:?}\nstdout:\n{so}\nstderr:\n{se}", out.status);
    // One table per library, each with its own header line.
    assert!(so.contains("# Library: rustccl (Rust API)"), "{so}");
    assert!(so.contains("# Library: release/libnccl.so"), "{so}");
    assert_eq!(rows(&so).len(), 2 * 4, "4 sizes per library: {so}");
    assert!(se.contains(&format!("wrote {} (2 series)", svg.display())), "{se}");
    let text = std::fs::read_to_string(&svg).expect("the SVG");
    let _ = std::fs::remove_file(&svg);
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"), "{}", &text[..text.len().min(300)]);
    for name in ["rustccl (Rust API)", "release/libnccl.so", "time against size", "bus bandwidth against size", "all_reduce, 2 ranks"] {
        assert!(text.contains(name), "{name:?} missing from the SVG");
    }
    // A marker per point: 2 series x 4 sizes x 2 panels.
    assert_eq!(text.matches("<circle").count(), 16, "every point of both series in both panels");
}

#[test]
fn plot_without_rows_and_tune_with_several_libraries_are_refused() {
    let (out, _, se) = run(bench("-N 1 --tune --lib a.so --lib b.so"));
    assert_eq!(out.status.code(), Some(2));
    assert!(se.contains("--tune takes one library"), "{se}");
    let (out, _, se) = run(bench("-N 1 -b 8 -e 8 --plot="));
    assert_eq!(out.status.code(), Some(2));
    assert!(se.contains("--plot needs a file name"), "{se}");
}

#[test]
fn cudagraph_without_cuda_is_a_clear_error() {
    // The Rust API on the host backend: no CUDA stream to capture.
    let (out, so, se) = run(bench("-N 2 -b 8 -e 64 -n 2 -G 2"));
    assert_eq!(out.status.code(), Some(1), "stdout:\n{so}\nstderr:\n{se}");
    assert!(so.contains("validation: 1 graph: 2"), "{so}");
    assert!(
        se.contains("CUDA graphs (-G/--cudagraph) need a CUDA device and a CUDA stream: the host backend has none (RUSTCCL_BACKEND=host)"),
        "{se}"
    );
    // Nothing ran uncaptured in its place: no row was printed.
    assert!(rows(&so).is_empty(), "{so}");
    // rustccl's C library with --host-memory: the NULL stream cannot be captured.
    let lib = rustccl_c_lib();
    let (out, so, se) = run(bench(&format!("-N 1 -b 8 -e 64 -n 2 -G 2 --host-memory --lib {lib}")));
    assert_eq!(out.status.code(), Some(1), "stdout:\n{so}\nstderr:\n{se}");
    assert!(
        se.contains("CUDA graphs (-G/--cudagraph) need a CUDA device and a CUDA stream: --host-memory runs on host memory and the NULL stream"),
        "{se}"
    );
    assert!(rows(&so).is_empty(), "{so}");
    // -G 0 is the default: timed without a graph.
    let (out, so, se) = run(bench("-N 1 -b 8 -e 64 -n 2 -G 0"));
    assert!(out.status.success(), "stdout:\n{so}\nstderr:\n{se}");
    assert!(so.contains("graph: 0"), "{so}");
}

/// `-R 2`: the send and receive buffers are symmetric windows (the backend's symmetric memory
/// through the Rust API; ncclMemAlloc + ncclCommWindowRegister through rustccl's C library);
/// `-R 1`: ncclCommRegister through the C library, `Communicator::register_buffer` through the
/// Rust API.
#[test]
fn local_register_modes_on_two_ranks() {
    let check = |args: &str, mode: &str| {
        let (out, so, se) = run(bench(args));
        assert!(out.status.success(), "{args}: status {:?}\nstdout:\n{so}\nstderr:\n{se}", out.status);
        assert!(so.contains(&format!("\n# local register: {mode}")), "{so}");
        let r = rows(&so);
        assert_eq!(r.len(), 9, "8 B to 1 MiB in steps of 4: {so}");
        for c in &r {
            assert_eq!((c[8].as_str(), c[12].as_str()), ("0", "0"), "{c:?}");
        }
        assert!(so.contains("# Out of bounds values : 0 OK"), "{so}");
        so
    };
    let dir = std::env::temp_dir().join(format!("rustccl-bench-register-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("out.json");
    check(&format!("-R 2 -N 2 -b 8 -e 1M -f 4 -c 1 -n 2 -w 1 -J {}", path.display()), "2 (symmetric windows: ncclMemAlloc + ncclCommWindowRegister, send and receive buffers)");
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(j["params"]["localRegister"], 2);
    let _ = std::fs::remove_dir_all(&dir);
    // Several operations on the windows, in and out of place.
    let (out, so, se) = run(bench("all -R 2 -N 2 -b 64 -e 4K -f 64 -n 1 -w 0 -r all"));
    assert!(out.status.success(), "stdout:\n{so}\nstderr:\n{se}");
    assert!(so.contains("# Out of bounds values : 0 OK"), "{so}");
    // Without -R: no line, and 0 in the JSON.
    let (out, so, se) = run(bench("-N 2 -b 64 -e 64 -n 1 -w 0 -J -"));
    assert!(out.status.success(), "{se}");
    assert!(!se.contains("# local register"), "{se}");
    let j: serde_json::Value = serde_json::from_str(&so).unwrap_or_else(|e| panic!("{e}: {so}"));
    assert_eq!(j["params"]["localRegister"], 0);

    let lib = rustccl_c_lib();
    check(&format!("-R 2 -N 2 -b 8 -e 1M -f 4 -c 1 -n 2 -w 1 --host-memory --lib {lib}"), "2 (symmetric windows");
    check(&format!("-R 1 -N 2 -b 8 -e 1M -f 4 -c 1 -n 2 -w 1 --host-memory --lib {lib}"), "1 (local registration: ncclCommRegister, send and receive buffers)");

    // The Rust API registers too (Communicator::register_buffer), point-to-point included.
    check("-R 1 -N 2 -b 8 -e 1M -f 4 -c 1 -n 2 -w 1", "1 (local registration: ncclCommRegister, send and receive buffers)");
    let (out, so, se) = run(bench("sendrecv -R 1 -N 2 -b 8 -e 1M -f 16 -c 1 -n 2 -w 1"));
    assert!(out.status.success(), "stdout:\n{so}\nstderr:\n{se}");
    assert!(so.contains("# Out of bounds values : 0 OK"), "{so}");
}
