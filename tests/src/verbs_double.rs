//! The userspace verbs stand-in (`plugins/net-ib/verbs-double`, a replacement
//! `libibverbs.so.1`), built with make for the tests that run the IB transport on it: this
//! crate's `tests/net_ib.rs`, and net-ib's own tests, whose `tests/common` includes this file
//! by path (net-ib does not depend on this crate), so that there is one copy.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The stand-in's sources: `RUSTCCL_VERBS_DOUBLE_DIR` if set, else `default`; `None` when the
/// directory lacks them.
pub fn sources(default: &Path) -> Option<PathBuf> {
    let dir = std::env::var_os("RUSTCCL_VERBS_DOUBLE_DIR").map(PathBuf::from).unwrap_or_else(|| default.to_path_buf());
    (dir.join("Makefile").is_file() && dir.join("ibverbs_double.c").is_file()).then_some(dir)
}

/// Whether `tool --version` runs.
pub fn tool_runs(tool: &str) -> bool {
    Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Builds the stand-in from [`sources`]`(default_sources)` into `build_dir` with make, once per
/// process (later calls return the first answer): the library's path, or `Err(reason)` to skip
/// the test (no sources, no `cc` or `make`). A failing build panics with make's output.
pub fn build(default_sources: &Path, build_dir: &Path) -> Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT.get_or_init(|| make(default_sources, build_dir)).clone()
}

fn make(default_sources: &Path, build_dir: &Path) -> Result<PathBuf, String> {
    let src = sources(default_sources).ok_or("the verbs stand-in's sources (plugins/net-ib/verbs-double) are not in this checkout")?;
    for tool in ["cc", "make"] {
        if !tool_runs(tool) {
            return Err(format!("`{tool}` is not installed (the verbs stand-in is C, built with make)"));
        }
    }
    let lib = build_dir.join("libibverbs.so.1");
    let out = Command::new("make")
        .arg("-C")
        .arg(&src)
        .arg(format!("BUILD={}", build_dir.display()))
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
