//! Helpers of the tests that run on the verbs stand-in: building it, and running a test's
//! body in a child process (this test binary again) with the stand-in, its own environment
//! and a time limit. Inside the child, [`pair`] gives the plugin: a connected send/receive
//! pair in one process and checked transfers over it.
#![allow(dead_code)]

pub mod pair;

// Not every test binary uses the pair (conformance.rs loads the plugin as a library).
#[allow(unused_imports)]
pub use pair::*;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The variable that tells a child which role (test) it plays.
pub const ROLE: &str = "RUSTCCL_IB_TEST_ROLE";

/// Building the stand-in: shared with rustccl-tests, whose `src/verbs_double.rs` this is.
#[path = "../../../../tests/src/verbs_double.rs"]
mod verbs_double;

/// Where the stand-in's sources are in this checkout.
fn default_sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("verbs-double")
}

/// The stand-in's sources, if present.
pub fn double_sources() -> Option<PathBuf> {
    verbs_double::sources(&default_sources())
}

/// Builds the stand-in (once per test binary); `Err(reason)` to skip.
pub fn build_double() -> Result<PathBuf, String> {
    verbs_double::build(
        &default_sources(),
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("verbs-double"),
    )
}

/// This package's cdylib, which Cargo builds before the integration tests.
pub fn plugin_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    let file = format!(
        "{}rustccl_net_ib{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    [Some(deps.join(&file)), deps.parent().map(|p| p.join(&file))]
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{file} not found next to {}", exe.display()))
}

/// This test binary running only `test` (a child role), with `env`.
pub fn child(test: &str, env: &[(&str, String)]) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("test executable path"));
    c.args(["--exact", test, "--nocapture", "--test-threads=1"]);
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Waits for `c` (stdout and stderr piped) at most `limit`, killing it past that; returns
/// its status (`None`: killed) and its output.
pub fn wait_with_limit(mut c: Child, limit: Duration) -> (Option<ExitStatus>, String) {
    let mut stdout = c.stdout.take().expect("piped stdout");
    let mut stderr = c.stderr.take().expect("piped stderr");
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
        if let Some(s) = c.try_wait().expect("wait for the child") {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status,
        format!("{}\n{}", out.join().unwrap(), err.join().unwrap()),
    )
}

/// Whether this process plays `role`.
pub fn is_role(role: &str) -> bool {
    std::env::var(ROLE).as_deref() == Ok(role)
}

/// A child's time limit: past it the child is killed and the test fails (a hang).
pub const CHILD_LIMIT: Duration = Duration::from_secs(120);

/// Runs test `role` of the calling test binary (one that does its work only when
/// [`is_role`]`(role)`) in a child with the stand-in and `env`; returns its output (stdout and
/// stderr), asserting that it passed within [`CHILD_LIMIT`]. `None`: skipped, the stand-in
/// cannot be built here (the reason is printed).
pub fn run(role: &str, env: &[(&str, &str)]) -> Option<String> {
    run_within(role, env, CHILD_LIMIT)
}

/// [`run`] with the time limit `limit`.
pub fn run_within(role: &str, env: &[(&str, &str)], limit: Duration) -> Option<String> {
    let lib = match build_double() {
        Ok(lib) => lib,
        Err(why) => {
            println!("SKIPPED: {why}");
            return None;
        }
    };
    let mut vars = vec![
        (ROLE, role.to_string()),
        ("NCCL_IBVERBS_LIB", lib.display().to_string()),
        ("NCCL_SOCKET_IFNAME", "lo".to_string()),
    ];
    vars.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
    let c = child(role, &vars)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the child");
    let (status, out) = wait_with_limit(c, limit);
    println!("{out}");
    assert!(status.is_some(), "{role} ran past {limit:?} (hang):\n{out}");
    assert!(status.unwrap().success(), "{role} failed:\n{out}");
    assert!(
        out.contains("test result: ok. 1 passed"),
        "{role} did not run:\n{out}"
    );
    Some(out)
}

/// The frame of a test whose work needs an environment of its own: called by test `name`
/// (its own name), runs `body` in a child process, this binary running only `name` with the
/// stand-in and `env` (see [`run`]), and returns the child's output for the test's checks on
/// it. In that child it runs `body` and returns `None`, as it does when skipped: the checks
/// on the output are the parent's.
pub fn in_child(name: &str, env: &[(&str, &str)], body: impl FnOnce()) -> Option<String> {
    if is_role(name) {
        body();
        None
    } else {
        run(name, env)
    }
}
