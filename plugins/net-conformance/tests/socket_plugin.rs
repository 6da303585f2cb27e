//! The socket plugin, as a loaded library, passes the whole conformance suite.

use std::path::PathBuf;
use std::process::Command;

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    if dir.ends_with("deps") { dir.parent().unwrap().to_path_buf() } else { dir.to_path_buf() }
}

#[test]
fn socket_plugin_passes_the_conformance_suite() {
    let dir = target_dir();
    let lib = [dir.join("librustccl_net_socket.so"), dir.join("deps/librustccl_net_socket.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("librustccl_net_socket.so not built in {} (run `cargo build -p rustccl-net-socket`)", dir.display()));
    let bin = dir.join("rustccl-net-conformance");
    let out = Command::new(&bin).arg(&lib).env("NCCL_SOCKET_IFNAME", "lo").output().expect("run the suite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "conformance failures:\n{stdout}");
    assert!(stdout.contains("9 passed, 0 failed"), "{stdout}");
}
