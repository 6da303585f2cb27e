//! Helpers of the tests that run on the verbs stand-in: building it, and running this test
//! binary again as a child process in a given role with its own environment and a time
//! limit.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
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
