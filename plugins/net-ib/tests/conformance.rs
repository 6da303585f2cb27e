//! The IB plugin, loaded as a library, passes the net conformance suite (every check,
//! 0 B to 1 GiB, the peer killed mid-transfer included) on the userspace verbs stand-in
//! (`verbs-double/`, a replacement libibverbs.so.1 chosen with `NCCL_IBVERBS_LIB`), with one
//! and with four QPs per connection (messages split over QPs at 128-byte boundaries).
//!
//! The stand-in is built here with `make` into Cargo's temporary directory. The test is
//! skipped, with the reason printed, only when a C compiler or `make` is missing or the
//! stand-in's sources are not there (`RUSTCCL_VERBS_DOUBLE_DIR` names another copy).
//!
//! The suite runs in a child process (this test binary again, `suite_child`), so its
//! environment is its own and a hang is killed at [`LIMIT`]; the "peer killed" check's peer
//! is a third process (`peer_child`).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustccl_net_conformance::{check_peer_killed, handle_from_hex, load, run_sending_peer, Env, CHECKS};

/// The whole suite's time limit (it takes about 15 s on a busy 2-core machine).
const LIMIT: Duration = Duration::from_secs(240);
const ROLE: &str = "RUSTCCL_IB_CONFORMANCE_ROLE";
const PLUGIN: &str = "RUSTCCL_IB_CONFORMANCE_PLUGIN";
const HANDLE: &str = "RUSTCCL_IB_CONFORMANCE_HANDLE";

/// The stand-in's sources, if present.
fn double_sources() -> Option<PathBuf> {
    let dir = std::env::var_os("RUSTCCL_VERBS_DOUBLE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("verbs-double"));
    (dir.join("Makefile").is_file() && dir.join("ibverbs_double.c").is_file()).then_some(dir)
}

fn tool_runs(tool: &str) -> bool {
    Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Builds the stand-in; `Err(reason)` to skip.
fn build_double() -> Result<PathBuf, String> {
    let src = double_sources().ok_or("the verbs stand-in's sources (plugins/net-ib/verbs-double) are not in this checkout")?;
    for tool in ["cc", "make"] {
        if !tool_runs(tool) {
            return Err(format!("`{tool}` is not installed (the verbs stand-in is C, built with make)"));
        }
    }
    let build = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verbs-double");
    let lib = build.join("libibverbs.so.1");
    let out = Command::new("make")
        .arg("-C")
        .arg(&src)
        .arg(format!("BUILD={}", build.display()))
        .arg(&lib)
        .output()
        .expect("run make");
    assert!(
        out.status.success(),
        "building the verbs stand-in failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(lib)
}

/// This package's cdylib, which Cargo builds before the integration tests.
fn plugin_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    let file = format!("{}rustccl_net_ib{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    [Some(deps.join(&file)), deps.parent().map(|p| p.join(&file))]
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{file} not found next to {}", exe.display()))
}

/// This test binary running only `test` (a child role), with `env`.
fn child(test: &str, env: &[(&str, String)]) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("test executable path"));
    c.args(["--exact", test, "--nocapture", "--test-threads=1"]);
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Runs the suite in a child with `qps` QPs per connection; returns its output.
fn run_suite(lib: &Path, qps: u32) -> String {
    let mut c = child(
        "suite_child",
        &[
            (ROLE, "suite".into()),
            (PLUGIN, plugin_path().display().to_string()),
            ("NCCL_IBVERBS_LIB", lib.display().to_string()),
            ("NCCL_SOCKET_IFNAME", "lo".into()),
            ("NCCL_IB_QPS_PER_CONNECTION", qps.to_string()),
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start the suite");
    let mut stdout = c.stdout.take().unwrap();
    let mut stderr = c.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = c.try_wait().expect("wait for the suite") {
            break Some(s);
        }
        if start.elapsed() > LIMIT {
            let _ = c.kill();
            let _ = c.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = format!("{}\n{}", out.join().unwrap(), err.join().unwrap());
    assert!(status.is_some(), "the suite ({qps} QPs) ran past {LIMIT:?} (hang):\n{text}");
    text
}

#[test]
fn ib_plugin_passes_the_conformance_suite_on_the_verbs_stand_in() {
    let lib = match build_double() {
        Ok(lib) => lib,
        Err(why) => {
            println!("SKIPPED: {why}");
            return;
        }
    };
    for qps in [1, 4] {
        let out = run_suite(&lib, qps);
        println!("--- {qps} QP(s) per connection ---\n{out}");
        assert!(out.contains("# net plugin IB"), "{out}");
        assert!(out.contains("7 passed, 0 failed"), "conformance failures with {qps} QP(s):\n{out}");
    }
}

/// Child role: the suite, as `rustccl-net-conformance` runs it.
#[test]
fn suite_child() {
    if std::env::var(ROLE).as_deref() != Ok("suite") {
        return;
    }
    let plugin = std::env::var(PLUGIN).expect("plugin path");
    let loaded = load(&plugin).expect("load the plugin");
    println!("# net plugin {} ({}) from {plugin}", loaded.name, loaded.abi);
    let env = Env::new(&*loaded.net, 1 << 30).expect("init");
    let (mut passed, mut failed) = (0, 0);
    let mut report = |name: &str, r: Result<(), String>| match r {
        Ok(()) => {
            passed += 1;
            println!("PASS {name}");
        }
        Err(e) => {
            failed += 1;
            println!("FAIL {name}: {e}");
        }
    };
    for (name, check) in CHECKS {
        report(name, check(&env));
    }
    let peer: std::cell::RefCell<Option<std::process::Child>> = std::cell::RefCell::new(None);
    let r = check_peer_killed(
        &env,
        &mut |handle| {
            let mut c = child("peer_child", &[(ROLE, "peer".into()), (PLUGIN, plugin.clone()), (HANDLE, handle.to_string())])
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| format!("starting the peer: {e}"))?;
            let lines = BufReader::new(c.stdout.take().unwrap()).lines();
            *peer.borrow_mut() = Some(c);
            for line in lines {
                // libtest may print "test peer_child ... " before it on the same line.
                if line.map_err(|e| e.to_string())?.trim_end().ends_with("CONNECTED") {
                    return Ok(());
                }
            }
            Err("the peer exited before connecting".into())
        },
        &mut || {
            if let Some(c) = peer.borrow_mut().as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        },
    );
    report("peer killed mid-transfer", r);
    println!("{passed} passed, {failed} failed");
}

/// Child role: the sending peer of the "peer killed" check (runs until killed).
#[test]
fn peer_child() {
    if std::env::var(ROLE).as_deref() != Ok("peer") {
        return;
    }
    let loaded = load(&std::env::var(PLUGIN).expect("plugin path")).expect("load the plugin");
    let env = Env::new(&*loaded.net, 0).expect("init");
    let handle = handle_from_hex(&std::env::var(HANDLE).expect("handle")).expect("a handle");
    if let Err(e) = run_sending_peer(&env, &handle) {
        panic!("peer: {e}");
    }
}
