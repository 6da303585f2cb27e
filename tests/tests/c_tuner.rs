//! NCCL's C tuner ABI: `plugins/testing/c-tuner/c_tuner.c` compiled here for each ABI version
//! (and once with a failing init), loaded by ranks running as processes on the host backend.
//! The tuner forces TREE/LL on 3 channels for all-reduces up to 64 KiB: the planner must pick
//! that inside the range and its own choice outside, the data must still be right, and the log
//! must name the ABI version in one line.

use std::sync::Mutex;
use std::time::Duration;

use rustccl_tests::*;

/// `c_tuner.c` compiled with `flags` into the target directory (once per test process).
fn c_tuner(tag: &str, flags: &[&str]) -> String {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let out = worker_path().parent().unwrap().join("c-tuner").join(format!("libnccl-tuner-c-{tag}.so"));
    let mut options = vec!["-std=gnu99", "-Wall", "-Werror"];
    options.extend_from_slice(flags);
    compile_c_plugin(&["c-tuner/c_tuner.c"], &out, &options);
    out.to_string_lossy().into_owned()
}

const SIZES: &str = "4096,65536,131072,1048576";

/// Two ranks run `tuned-sizes` with `env`; returns rank 0's `choice` lines and its log.
fn run(env: &[(&str, &str)]) -> (Vec<String>, String) {
    let ids = ids_arg(&[new_id()]);
    let mut all = vec![
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "INIT,TUNING,PLUGIN"),
        ("RUSTCCL_TEST_SIZES", SIZES),
        ("RUSTCCL_C_TUNER_CHANNELS", "3"),
    ];
    all.extend_from_slice(env);
    let outs = finish_all(spawn("tuned-sizes", 2, &[0, 1], &ids, &all), Duration::from_secs(90));
    assert_all_ok(&outs);
    let choices = outs[0].results().iter().filter_map(|l| l.strip_prefix("choice ")).map(str::to_string).collect();
    (choices, outs[0].stderr.clone())
}

fn choice_of(choices: &[String], bytes: usize) -> String {
    let prefix = format!("{bytes} ");
    let line = choices.iter().find(|c| c.starts_with(&prefix)).unwrap_or_else(|| panic!("no choice for {bytes}: {choices:?}"));
    line[prefix.len()..].to_string()
}

#[test]
fn a_v5_c_tuner_forces_its_choice_inside_its_range_only() {
    let (base, _) = run(&[("NCCL_TUNER_PLUGIN", "none")]);
    let path = c_tuner("v5", &["-DTUNER_VERSION=5"]);
    let (tuned, log) = run(&[("NCCL_TUNER_PLUGIN", &path)]);
    for bytes in [4096, 65536] {
        assert_eq!(choice_of(&tuned, bytes), "TREE LL 3", "inside the range: {tuned:?}");
        assert_ne!(choice_of(&base, bytes), "TREE LL 3", "the cost model alone chooses otherwise: {base:?}");
    }
    for bytes in [131072, 1048576] {
        assert_eq!(choice_of(&tuned, bytes), choice_of(&base, bytes), "outside the range the host decides");
    }
    let using: Vec<&str> = log.lines().filter(|l| l.contains("TUNER/Plugin: using")).collect();
    assert_eq!(using.len(), 1, "{log}");
    assert!(using[0].contains(&format!("using c-tuner (NCCL C tuner ABI v5) from {path}: NCCL_TUNER_PLUGIN={path}")), "{log}");
    assert!(log.contains("c-tuner: v5 init for 2 ranks on 1 nodes"), "the plugin's own log line reaches rustccl's: {log}");
    assert!(log.contains("c-tuner: 1 NVLink domains of 2..2 ranks"), "domain info filled: {log}");
    assert!(log.contains("changed ncclTunerConstants at init"), "{log}");
}

#[test]
fn every_older_c_abi_loads_as_itself() {
    for v in [2, 3, 4, 6] {
        let path = c_tuner(&format!("v{v}"), &[&format!("-DTUNER_VERSION={v}")]);
        let (tuned, log) = run(&[("NCCL_TUNER_PLUGIN", &path)]);
        assert!(log.contains(&format!("using c-tuner (NCCL C tuner ABI v{v}) from {path}")), "v{v}: {log}");
        assert_eq!(choice_of(&tuned, 4096), "TREE LL 3", "v{v}: {tuned:?}");
        assert_ne!(choice_of(&tuned, 1048576), "TREE LL 3", "v{v}: {tuned:?}");
    }
}

#[test]
fn a_c_tuner_whose_init_fails_is_skipped_with_one_line() {
    let path = c_tuner("init-fails", &["-DTUNER_INIT_FAILS"]);
    let (tuned, log) = run(&[("NCCL_TUNER_PLUGIN", &path)]);
    let (base, _) = run(&[("NCCL_TUNER_PLUGIN", "none")]);
    assert_eq!(tuned, base, "the cost model decides");
    let skipped: Vec<&str> = log.lines().filter(|l| l.contains("TUNER/Plugin: skipped")).collect();
    assert_eq!(skipped.len(), 1, "{log}");
    assert!(
        skipped[0].contains(&format!("skipped c-tuner ({path}): init failed: c-tuner (NCCL C tuner v5) init returned ncclInternalError")),
        "{log}"
    );
    assert!(!log.contains("TUNER/Plugin: using"), "{log}");
}

#[test]
fn a_c_tuner_table_missing_a_mandatory_member_is_refused_with_the_reason() {
    let path = c_tuner("null-coll-info", &["-DTUNER_NULL_COLL_INFO"]);
    let (tuned, log) = run(&[("NCCL_TUNER_PLUGIN", &path)]);
    let (base, _) = run(&[("NCCL_TUNER_PLUGIN", "none")]);
    assert_eq!(tuned, base, "the cost model decides");
    assert!(log.contains("ncclTunerPlugin_v5 has a NULL getCollInfo, which NCCL's tuner ABI requires"), "{log}");
    assert!(!log.contains("TUNER/Plugin: using"), "{log}");
}
