//! The drop-in as a user meets it (README "Using rustccl in place of NCCL"): `capi/install.sh`
//! lays out a prefix, a C program is built against the installed `nccl.h` and linked to the
//! installed `libnccl.so` (`cc -I PREFIX/include -L PREFIX/lib -lnccl`, no rpath), and runs
//! with `LD_LIBRARY_PATH=PREFIX/lib` and `NCCL_DEBUG=VERSION`: it finds the version it was built
//! for, and the version line names the installed library.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn an_installed_prefix_builds_and_runs_a_c_program_and_says_which_library_it_is() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let exe = std::env::current_exe().unwrap();
    // target/release/deps/install-… → target
    let target = exe.parent().unwrap().parent().unwrap().parent().unwrap().to_path_buf();
    let prefix = target.join(format!("install-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    let out = Command::new("bash").arg(manifest.join("install.sh")).arg(&prefix).env("CARGO_TARGET_DIR", &target).output().unwrap();
    assert!(out.status.success(), "install.sh: {}", String::from_utf8_lossy(&out.stderr));
    for f in ["lib/libnccl.so.2", "lib/libnccl.so", "include/nccl.h", "include/nccl_device.h"] {
        assert!(prefix.join(f).exists(), "{f} is not installed");
    }
    let program = prefix.join("installed_test");
    let status = Command::new("cc")
        .args(["-std=gnu99", "-Wall", "-Werror", "-o"])
        .arg(&program)
        .arg(manifest.join("tests/c/installed_test.c"))
        .arg("-I")
        .arg(prefix.join("include"))
        .arg("-L")
        .arg(prefix.join("lib"))
        .arg("-lnccl")
        .status()
        .unwrap();
    assert!(status.success(), "compiling against the installed header failed");
    let run = Command::new(&program)
        .env("LD_LIBRARY_PATH", prefix.join("lib"))
        .env("NCCL_DEBUG", "VERSION")
        .env("RUSTCCL_BACKEND", "host")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "the program failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("built for 23203, running 23203") && stdout.contains("all_reduce ok"), "{stdout}");
    let installed = prefix.join("lib/libnccl.so.2").display().to_string();
    let banner = stderr.lines().find(|l| l.contains("NCCL version 2.32.3")).unwrap_or_else(|| panic!("no version line:\n{stderr}"));
    assert!(banner.contains("rustccl ") && banner.contains(&installed), "the version line does not name {installed}: {banner}");
    let _ = std::fs::remove_dir_all(&prefix);
}
