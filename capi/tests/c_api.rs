//! The C API test: `tests/c/nccl_api_test.c`, compiled against rustccl's `nccl.h` and linked
//! to the `libnccl.so` this package builds, runs as 1, 2 and 3 processes on the host backend.

use std::path::PathBuf;
use std::process::Command;

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    if dir.ends_with("deps") { dir.parent().unwrap().to_path_buf() } else { dir.to_path_buf() }
}

fn build_c_test() -> PathBuf {
    let dir = target_dir();
    let lib = [dir.join("libnccl.so"), dir.join("deps/libnccl.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("libnccl.so not built in {}", dir.display()));
    // Programs load the library by its soname: lay it out as an installed libnccl would be.
    let libdir = dir.join("capi-test");
    std::fs::create_dir_all(&libdir).unwrap();
    std::fs::copy(&lib, libdir.join("libnccl.so.2")).unwrap();
    let _ = std::fs::remove_file(libdir.join("libnccl.so"));
    std::os::unix::fs::symlink("libnccl.so.2", libdir.join("libnccl.so")).unwrap();
    let libdir = libdir.as_path();
    let out = dir.join("nccl_api_test");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(root.join("tests/c/nccl_api_test.c"))
        .arg("-I")
        .arg(root.join("include"))
        .arg("-L")
        .arg(libdir)
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-lnccl")
        .status()
        .expect("run cc");
    assert!(status.success(), "compiling the C test failed");
    out
}

#[test]
fn c_program_runs_every_call_on_the_host_backend() {
    let exe = build_c_test();
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    for n in [1, 2, 3] {
        let id = rustccl::get_unique_id().unwrap();
        let id2 = rustccl::get_unique_id().unwrap();
        let children: Vec<_> = (0..n)
            .map(|rank| {
                Command::new(&exe)
                    .env("RUSTCCL_BACKEND", "host")
                    .env("NCCL_SOCKET_IFNAME", "lo")
                    .env("NCCL_DEBUG", "NONE")
                    .env("RANK", rank.to_string())
                    .env("NRANKS", n.to_string())
                    .env("NCCL_TEST_ID", id.to_hex())
                    .env("NCCL_TEST_ID2", id2.to_hex())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for (rank, c) in children.into_iter().enumerate() {
            let out = c.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            println!("{stdout}");
            assert!(out.status.success(), "{n} ranks, rank {rank}:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
            assert!(stdout.contains(", 0 failed"), "{stdout}");
        }
    }
}
