//! What the C API tests share: compiling a C program from `tests/c/<name>.c` (or a C++ one
//! from `tests/c/<name>.cpp`, or a source elsewhere in the repository) against rustccl's
//! `nccl.h` and the `libnccl.so` this package builds, and running it as processes on the host
//! backend with a time limit.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The cargo target directory this test binary was built into (`target/release`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    if dir.ends_with("deps") { dir.parent().unwrap().to_path_buf() } else { dir.to_path_buf() }
}

/// The compiled `tests/c/<name>.c` (or `.cpp`), built once per test process (tests running in parallel
/// share it).
pub fn build(name: &str) -> PathBuf {
    let tests_c = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let cpp = tests_c.join(format!("{name}.cpp"));
    build_source(name, &if cpp.exists() { cpp } else { tests_c.join(format!("{name}.c")) })
}

/// The compiled `source` (a `.c` file, or `.cpp` for C++; a path relative to the repository
/// root, or absolute), as program `name`, built once per test process like [`build`]'s.
pub fn build_source(name: &str, source: &Path) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, exe)) = built.iter().find(|(n, _)| n == name) {
        return exe.clone();
    }
    let exe = compile(name, &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(source));
    built.push((name.to_string(), exe.clone()));
    exe
}

/// Lays the built library out as an installed `libnccl.so.2` (programs load it by its
/// soname) in a directory of the program's own, `capi-<name>` (so that test binaries running
/// at once never replace each other's files), and compiles the program there, linked to it.
fn compile(name: &str, source: &Path) -> PathBuf {
    let dir = target_dir();
    // The newer of the two: `cargo test` refreshes deps/ only, `cargo build` the top one, so
    // either may be stale.
    let lib = [dir.join("libnccl.so"), dir.join("deps/libnccl.so")]
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("libnccl.so not built in {}", dir.display()));
    let libdir = dir.join(format!("capi-{name}"));
    std::fs::create_dir_all(&libdir).unwrap();
    std::fs::copy(&lib, libdir.join("libnccl.so.2")).unwrap();
    let _ = std::fs::remove_file(libdir.join("libnccl.so"));
    std::os::unix::fs::symlink("libnccl.so.2", libdir.join("libnccl.so")).unwrap();
    let out = libdir.join(name);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let cpp = source.extension().is_some_and(|e| e == "cpp");
    let (compiler, std) = if cpp { ("c++", "-std=c++17") } else { ("cc", "-std=gnu99") };
    let status = Command::new(compiler)
        .args([std, "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&out)
        .arg(source)
        .arg("-I")
        .arg(root.join("tests/c"))
        .arg("-I")
        .arg(root.join("include"))
        .arg("-L")
        .arg(&libdir)
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-lnccl")
        .status()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(status.success(), "compiling {} failed", source.display());
    out
}

/// Starts the program on the host backend (loopback sockets, no library log), with its
/// output captured.
pub fn spawn(exe: &Path, args: &[&str], env: &[(&str, String)]) -> Child {
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

/// Starts `nranks` processes of the program, one per rank, with RANK, NRANKS and the
/// given environment.
pub fn spawn_ranks(exe: &Path, nranks: usize, env: &[(&str, String)]) -> Vec<Child> {
    (0..nranks)
        .map(|rank| {
            let mut env = env.to_vec();
            env.push(("RANK", rank.to_string()));
            env.push(("NRANKS", nranks.to_string()));
            spawn(exe, &[], &env)
        })
        .collect()
}

/// Waits for every process (killing them all after `limit`: a hang fails the test) and
/// asserts each exited 0 with no failed check.
pub fn expect_clean(children: Vec<Child>, limit: Duration, what: &str) {
    expect_clean_by(children, limit, what, |_, stdout| stdout.contains(", 0 failed"));
}

/// [`expect_clean`] for programs that say they passed in their own words: `passed(i, stdout)`
/// tells whether process `i`'s output says so (its exit status must be 0 as well).
pub fn expect_clean_by(children: Vec<Child>, limit: Duration, what: &str, passed: impl Fn(usize, &str) -> bool) {
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
        if !out.status.success() || !passed(i, &stdout) {
            problems.push(format!(
                "{what}, process {i}: {} (killed after {limit:?} if it hung)\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
