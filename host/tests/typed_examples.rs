//! Runs the typed API's host-backend examples (`host/examples/`): `cargo test` builds them
//! next to the test programs (`target/<profile>/examples/`); each must succeed, within a time
//! limit, and print what it checked. (`cudarc_all_reduce` needs a GPU and is not run here.)

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);

fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current executable");
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} does not exist: `cargo test` builds the examples; alone, build them with `cargo build --release -p rustccl --examples`",
        path.display()
    );
    path
}

/// Runs an example; its standard output. Fails on a non-zero exit or after `LIMIT`.
fn run(name: &str, args: &[&str]) -> String {
    let mut child = Command::new(example(name))
        .args(args)
        .env("RUSTCCL_BACKEND", "host")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_DEBUG", "WARN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the example");
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{name} ran past {} s", LIMIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{name} failed ({})\nstdout:\n{stdout}\nstderr:\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn typed_all_reduce_with_three_rank_processes() {
    let out = run("typed_all_reduce", &["3"]);
    for r in 0..3 {
        assert!(out.contains(&format!("rank {r} of 3: all_reduce gave 6 in every element")), "{out}");
    }
    assert!(out.contains("all 3 ranks done"), "{out}");
}

#[test]
fn multi_device_drives_four_communicators_from_one_thread() {
    let out = run("multi_device", &["4"]);
    assert!(out.contains("4 devices: all_reduce gave 6 everywhere; all_gather gave [0, 1, 2, 3]"), "{out}");
}

#[test]
fn training_loop_converges_with_identical_weights() {
    let out = run("training_loop", &["2"]);
    assert!(out.contains("2 ranks, 200 steps: loss"), "{out}");
    assert!(out.contains("bias 0.500"), "the model recovers the bias it was made with: {out}");
}
