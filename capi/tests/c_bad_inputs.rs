//! Bad inputs against the C API, as a C caller makes them, on the host backend with ranks as
//! processes: `tests/c/race_test.c` (abort, destroy and finalize racing collectives on
//! another thread) and `tests/c/bad_input_test.c` (overflowing and impossible counts, argument
//! errors inside groups, the last error of a communicator, a PreMulSum used with another type).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    if dir.ends_with("deps") { dir.parent().unwrap().to_path_buf() } else { dir.to_path_buf() }
}

/// Lays the built library out as an installed `libnccl.so.2` (programs load it by its
/// soname) in a folder of this test's own, and compiles `tests/c/<name>.c` against it (once
/// per test process: tests running in parallel share it).
fn build(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, exe)) = built.iter().find(|(n, _)| n == name) {
        return exe.clone();
    }
    let exe = compile(name);
    built.push((name.to_string(), exe.clone()));
    exe
}

fn compile(name: &str) -> PathBuf {
    let dir = target_dir();
    let lib = [dir.join("libnccl.so"), dir.join("deps/libnccl.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("libnccl.so not built in {}", dir.display()));
    let libdir = dir.join(format!("capi-{name}"));
    std::fs::create_dir_all(&libdir).unwrap();
    std::fs::copy(&lib, libdir.join("libnccl.so.2")).unwrap();
    let _ = std::fs::remove_file(libdir.join("libnccl.so"));
    std::os::unix::fs::symlink("libnccl.so.2", libdir.join("libnccl.so")).unwrap();
    let out = libdir.join(name);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new("cc")
        .args(["-std=gnu99", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&out)
        .arg(root.join(format!("tests/c/{name}.c")))
        .arg("-I")
        .arg(root.join("include"))
        .arg("-L")
        .arg(&libdir)
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-lnccl")
        .status()
        .expect("run cc");
    assert!(status.success(), "compiling {name}.c failed");
    out
}

fn spawn(exe: &Path, args: &[&str], env: &[(&str, String)]) -> Child {
    Command::new(exe)
        .args(args)
        .env("RUSTCCL_BACKEND", "host")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_DEBUG", "NONE")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for every process (killing them all after `limit`) and asserts each exited 0 with
/// no failed check.
fn expect_clean(children: Vec<Child>, limit: Duration, what: &str) {
    let deadline = Instant::now() + limit;
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    while children.iter_mut().flatten().any(|c| c.try_wait().unwrap().is_none()) {
        if Instant::now() > deadline {
            for c in children.iter_mut().flatten() {
                let _ = c.kill();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut problems = Vec::new();
    for (i, c) in children.iter_mut().enumerate() {
        let out = c.take().unwrap().wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        println!("{what}, process {i}: {}\n{stdout}", out.status);
        if !out.status.success() || !stdout.contains(", 0 failed") {
            problems.push(format!(
                "{what}, process {i}: {} (killed after {limit:?} if it hung)\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn abort_destroy_and_finalize_racing_collectives_never_crash() {
    let exe = build("race_test");
    // Two processes at once, 500 rounds each: 1000 rounds of one-rank communicators.
    let children = (0..2).map(|_| spawn(&exe, &["500"], &[])).collect();
    expect_clean(children, Duration::from_secs(120), "race_test");
}

#[test]
fn abort_during_a_two_rank_collective_ends_the_peers_collective_with_an_error() {
    let exe = build("race_test");
    let ids: Vec<String> = (0..20).map(|_| rustccl::get_unique_id().unwrap().to_hex()).collect();
    let ids = ids.join(",");
    let children =
        (0..2).map(|rank| spawn(&exe, &["pair"], &[("RANK", rank.to_string()), ("NCCL_TEST_IDS", ids.clone())])).collect();
    expect_clean(children, Duration::from_secs(120), "race_test pair");
}

#[test]
fn bad_counts_groups_last_errors_and_premulsum_types_fail_cleanly() {
    let exe = build("bad_input_test");
    for n in [1, 2] {
        let id = rustccl::get_unique_id().unwrap();
        let children = (0..n)
            .map(|rank| {
                spawn(&exe, &[], &[("RANK", rank.to_string()), ("NRANKS", n.to_string()), ("NCCL_TEST_ID", id.to_hex())])
            })
            .collect();
        expect_clean(children, Duration::from_secs(60), &format!("bad_input_test with {n} ranks"));
    }
}
