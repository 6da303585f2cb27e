//! Broken plugin files must not crash the ranks. A plugin variable naming a truncated copy of
//! a real plugin (whose `PT_LOAD` segments reach past the end of the file, which made the
//! dynamic loader die of SIGBUS), an empty file, a library built for another machine, or a
//! directory: two ranks on the host backend run a checked all-reduce (the `tuned-sizes`
//! scenario), both exit 0, the built-in choice is used, and each rank's log has exactly one
//! WARN line naming the file and the reason; likewise for a truncated file that a bare name
//! would find through `LD_LIBRARY_PATH`. The fixtures are made here, in a temp directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustccl_tests::*;

/// A temp directory for one test's fixtures, removed on drop.
struct Fixtures(PathBuf);

impl Fixtures {
    fn new(test: &str) -> Fixtures {
        let dir = std::env::temp_dir().join(format!("rustccl-bad-plugins-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Fixtures(dir)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }

    /// The first 4 KiB of the built library `lib`: its ELF header and program headers intact,
    /// its segments cut off. (Half the file would not do: a release build with debug info is
    /// mostly debug sections after the segments.)
    fn truncated(&self, lib: &str) -> String {
        let bytes = std::fs::read(built_lib(lib)).unwrap();
        let path = self.path(&format!("truncated-{lib}"));
        std::fs::write(&path, &bytes[..4096]).unwrap();
        path
    }
}

impl Drop for Fixtures {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs two ranks of `tuned-sizes` (an all-reduce per size, each result checked by the
/// worker) with `var=value` (and `extra` variables), and checks what every plugin test here needs: both ranks exit 0
/// with every size done, and each rank logs exactly one WARN line, which names `file` and
/// contains `reason`. Returns rank 0's log.
fn run_with(var: &str, file: &str, reason: &str) -> String {
    run_with_env(&[(var, file)], file, reason)
}

fn run_with_env(extra: &[(&str, &str)], file: &str, reason: &str) -> String {
    let ids = ids_arg(&[new_id()]);
    let mut env = vec![
        ("RUSTCCL_BACKEND", "host"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "INIT,NET,TUNING,PROFILE,PLUGIN"),
        ("RUSTCCL_TEST_SIZES", "4096,1048576"),
    ];
    env.extend_from_slice(extra);
    let outs = finish_all(spawn("tuned-sizes", 2, &[0, 1], &ids, &env), Duration::from_secs(60));
    assert_all_ok(&outs);
    for o in &outs {
        let choices = o.results().iter().filter(|l| l.starts_with("choice ")).count();
        assert_eq!(choices, 2, "rank {}: every size's all-reduce ran and was checked: {o:?}", o.rank);
        let warns: Vec<&str> = o.stderr.lines().filter(|l| l.contains("WARN")).collect();
        assert_eq!(warns.len(), 1, "rank {}: one WARN line:\n{}", o.rank, o.stderr);
        assert!(warns[0].contains(file) && warns[0].contains(reason), "rank {}: the WARN names {file} and says {reason:?}: {}", o.rank, warns[0]);
    }
    outs[0].stderr.clone()
}

/// The net plugin the ranks used was the built-in Socket one.
fn assert_socket(log: &str) {
    let using: Vec<&str> = log.lines().filter(|l| l.contains("NET/Plugin: using")).collect();
    assert_eq!(using.len(), 1, "{log}");
    assert!(using[0].contains("Socket (rustccl net ABI v3) from built in"), "{log}");
}

#[test]
fn a_truncated_net_plugin_is_skipped_for_the_built_in() {
    let fx = Fixtures::new("net-truncated");
    let file = fx.truncated("librustccl_test_net_named.so");
    let log = run_with("NCCL_NET_PLUGIN", &file, "truncated: PT_LOAD segment");
    assert_socket(&log);
}

#[test]
fn an_empty_net_plugin_file_is_skipped() {
    let fx = Fixtures::new("net-empty");
    let file = fx.path("libempty.so");
    std::fs::write(&file, b"").unwrap();
    assert_socket(&run_with("NCCL_NET_PLUGIN", &file, "empty file"));
}

#[test]
fn a_net_plugin_for_another_machine_is_skipped() {
    let fx = Fixtures::new("net-machine");
    let mut bytes = std::fs::read(built_lib("librustccl_test_net_named.so")).unwrap();
    // e_machine (offset 18, two bytes in the file's byte order; the build's own order here).
    let other: u16 = if std::env::consts::ARCH == "aarch64" { 62 } else { 183 };
    bytes[18..20].copy_from_slice(&other.to_ne_bytes());
    let file = fx.path("libother-machine.so");
    std::fs::write(&file, &bytes).unwrap();
    let name = if other == 62 { "x86_64" } else { "aarch64" };
    assert_socket(&run_with("NCCL_NET_PLUGIN", &file, &format!("built for {name}")));
}

#[test]
fn a_directory_named_as_net_plugin_is_skipped() {
    let fx = Fixtures::new("net-dir");
    let dir = fx.path("libdir.so");
    std::fs::create_dir(Path::new(&dir)).unwrap();
    assert_socket(&run_with("NCCL_NET_PLUGIN", &dir, "is a directory"));
}

#[test]
fn a_truncated_net_plugin_found_by_name_in_ld_library_path_is_skipped() {
    let fx = Fixtures::new("net-name");
    let bytes = std::fs::read(built_lib("librustccl_test_net_named.so")).unwrap();
    let file = fx.path("librustccl-net-broken.so");
    std::fs::write(&file, &bytes[..4096]).unwrap();
    // `broken` expands to librustccl-net-broken.so, which the dynamic loader would find in
    // LD_LIBRARY_PATH: that file is checked, and the WARN says where it was found.
    let env = [("NCCL_NET_PLUGIN", "broken"), ("LD_LIBRARY_PATH", fx.0.to_str().unwrap())];
    let log = run_with_env(&env, &file, "truncated: PT_LOAD segment");
    assert!(log.contains(&format!("skipped librustccl-net-broken.so: found as {file}: truncated")), "{log}");
    assert_socket(&log);
}

#[test]
fn a_truncated_tuner_plugin_is_skipped_for_the_cost_model() {
    let fx = Fixtures::new("tuner-truncated");
    let file = fx.truncated("librustccl_tuner_default.so");
    let log = run_with("NCCL_TUNER_PLUGIN", &file, "truncated: PT_LOAD segment");
    assert!(!log.contains("TUNER/Plugin: using"), "no tuner is used: {log}");
}

#[test]
fn a_truncated_profiler_plugin_is_skipped() {
    let fx = Fixtures::new("profiler-truncated");
    let file = fx.truncated("librustccl_profiler_trace.so");
    let log = run_with("NCCL_PROFILER_PLUGIN", &file, "truncated: PT_LOAD segment");
    assert!(!log.contains("PROFILER/Plugin: using"), "no profiler is used: {log}");
}
