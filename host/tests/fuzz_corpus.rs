//! Every file of the fuzz corpora (`fuzz/corpus/<target>/`) through the entry points the fuzz
//! targets use, on stable: the seeds and every input the fuzzer once found stay handled
//! (no panic) in every CI run, with or without a nightly toolchain to fuzz with.
//! (The tuner table's corpus is checked in `plugins/tuner-default/tests/fuzz_corpus.rs`.)

use std::path::PathBuf;

/// The files of `fuzz/corpus/<target>/`; a target without seed files is a failure.
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no corpus files", dir.display());
    files
}

fn run_all(target: &str, entry: impl Fn(&[u8])) {
    for (path, bytes) in corpus(target) {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| entry(&bytes)));
        assert!(outcome.is_ok(), "{target}: {} panicked", path.display());
    }
}

fn text(f: impl Fn(&str)) -> impl Fn(&[u8]) {
    move |b| f(&String::from_utf8_lossy(b))
}

#[test]
fn bootstrap_frame() {
    run_all("bootstrap_frame", rustccl::fuzzing::bootstrap_frames);
}

#[test]
fn bootstrap_control() {
    run_all("bootstrap_control", rustccl::fuzzing::root_message);
}

#[test]
fn unique_id() {
    run_all("unique_id", rustccl::fuzzing::unique_id);
}

#[test]
fn comm_id() {
    run_all("comm_id", text(rustccl::bootstrap::netif::fuzzing::comm_id));
}

#[test]
fn socket_ifname() {
    run_all("socket_ifname", text(rustccl::bootstrap::netif::fuzzing::socket_ifname));
}

#[test]
fn net_socket_wire() {
    run_all("net_socket_wire", rustccl_net_socket::wire::fuzzing::wire);
}
