//! The examples of this crate run as a user would run them: `from_env_all_reduce` as 2 and 4
//! processes with the variables torchrun sets (cargo builds the examples before the tests).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `target/<profile>/examples/<name>` (the tests run from `target/<profile>/deps`).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(|d| d.parent()).unwrap();
    let path = profile.join("examples").join(name);
    assert!(path.exists(), "{} is not built: run `cargo build --release --examples`", path.display());
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Runs `nranks` copies like `torchrun --nproc-per-node nranks --no-python` would; returns
/// each one's (success, stdout, stderr), killing any still running after 30 s.
fn torchrun_like(name: &str, nranks: usize) -> Vec<(bool, String, String)> {
    let port = free_port().to_string();
    let mut children: Vec<_> = (0..nranks)
        .map(|r| {
            Command::new(example(name))
                .env("RUSTCCL_BACKEND", "host")
                .env("NCCL_SOCKET_IFNAME", "lo")
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", nranks.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("LOCAL_WORLD_SIZE", nranks.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start the example")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline && children.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        std::thread::sleep(Duration::from_millis(20));
    }
    children
        .into_iter()
        .map(|mut c| {
            let _ = c.kill();
            let out = c.wait_with_output().unwrap();
            (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
        })
        .collect()
}

#[test]
fn from_env_all_reduce_runs_as_two_and_four_torchrun_processes() {
    for n in [2, 4] {
        let outs = torchrun_like("from_env_all_reduce", n);
        for (r, (ok, stdout, stderr)) in outs.iter().enumerate() {
            assert!(ok, "rank {r} of {n} failed:\n{stdout}\n{stderr}");
            assert_eq!(stdout.trim(), format!("rank {r} of {n} on host device 0: all_reduce of 65536 floats ok"), "{stderr}");
        }
    }
}

#[test]
fn from_env_all_reduce_without_a_launcher_says_what_to_set() {
    let out = Command::new(example("from_env_all_reduce"))
        .env("RUSTCCL_BACKEND", "host")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("from_env: no launcher variables") && err.contains("start the program with torchrun"), "{err}");
}
