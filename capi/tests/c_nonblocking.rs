//! Non-blocking communicators through the C API: `tests/c/nonblocking_test.c`, compiled
//! against rustccl's `nccl.h` and linked to the `libnccl.so` this package builds, runs as 2
//! processes on the host backend (the program says what it checks). A process that outlives
//! its time limit (a hang) is killed and fails the test.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    if dir.ends_with("deps") { dir.parent().unwrap().to_path_buf() } else { dir.to_path_buf() }
}

/// Compiles the program, linked to the library laid out as an installed libnccl would be
/// (its own directory, so this test and the other C test never replace each other's files).
fn build() -> PathBuf {
    let dir = target_dir();
    let lib = [dir.join("libnccl.so"), dir.join("deps/libnccl.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("libnccl.so not built in {}", dir.display()));
    let libdir = dir.join("capi-nonblocking-test");
    std::fs::create_dir_all(&libdir).unwrap();
    std::fs::copy(&lib, libdir.join("libnccl.so.2")).unwrap();
    let _ = std::fs::remove_file(libdir.join("libnccl.so"));
    std::os::unix::fs::symlink("libnccl.so.2", libdir.join("libnccl.so")).unwrap();
    let out = libdir.join("nonblocking_test");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(root.join("tests/c/nonblocking_test.c"))
        .arg("-I")
        .arg(root.join("include"))
        .arg("-L")
        .arg(&libdir)
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-lnccl")
        .status()
        .expect("run cc");
    assert!(status.success(), "compiling the C test failed");
    out
}

#[test]
fn c_program_polls_queued_operations_and_aborts_stuck_ones() {
    let exe = build();
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    let n = 2;
    let id = rustccl::get_unique_id().unwrap();
    let mut children: Vec<_> = (0..n)
        .map(|rank| {
            Command::new(&exe)
                .env("RUSTCCL_BACKEND", "host")
                .env("NCCL_SOCKET_IFNAME", "lo")
                .env("NCCL_DEBUG", "NONE")
                .env("RANK", rank.to_string())
                .env("NRANKS", n.to_string())
                .env("NCCL_TEST_ID", id.to_hex())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline && children.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for c in &mut children {
        let _ = c.kill();
    }
    for (rank, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        println!("{stdout}");
        assert!(out.status.success(), "rank {rank} ({:?}):\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains(", 0 failed"), "{stdout}");
    }
}
