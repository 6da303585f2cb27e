//! The example plugins under `plugins/examples/` work as their documentation says: the net
//! skeleton carries all-reduces between two processes, and the tuner skeleton's choice is the
//! one the planner makes (and only inside its range). Both are built by `cargo build`.

use std::time::Duration;

use rustccl_tests::*;


/// Two ranks run `tuned-sizes` (all-reduces of `sizes`, checked by the workers) with `env`.
fn two_ranks(sizes: &str, env: &[(&str, &str)]) -> Vec<Outcome> {
    let ids = ids_arg(&[new_id()]);
    let mut all = vec![("NCCL_DEBUG", "INFO"), ("RUSTCCL_TEST_SIZES", sizes), ("RUSTCCL_BACKEND", "host")];
    all.extend_from_slice(env);
    let outs = finish_all(spawn("tuned-sizes", 2, &[0, 1], &ids, &all), Duration::from_secs(60));
    assert_all_ok(&outs);
    outs
}

#[test]
fn the_net_skeleton_carries_all_reduces_between_two_processes() {
    let path = built_lib("librustccl_example_net_skeleton.so");
    let outs = two_ranks(
        "4096,1048576,3000000",
        &[("NCCL_NET_PLUGIN", &path), ("NCCL_SHM_DISABLE", "1"), ("NCCL_DEBUG_SUBSYS", "INIT,NET")],
    );
    for o in &outs {
        let log = &o.stderr;
        assert!(log.contains(&format!("NET/Plugin: using Skeleton (rustccl net ABI v1) from {path}")), "rank {}: {log}", o.rank);
        assert!(log.contains("Skeleton: init for communicator"), "the plugin's log reaches rustccl's: {log}");
        let sent: u64 = log
            .lines()
            .find_map(|l| l.split("Skeleton: finalize; ").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no finalize line: {log}"));
        assert!(sent > 0, "the all-reduces went through the skeleton: {log}");
    }
}

fn choice_of(out: &Outcome, bytes: usize) -> String {
    let prefix = format!("choice {bytes} ");
    let line = out.results().into_iter().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no choice for {bytes}: {out:?}"));
    line[prefix.len()..].to_string()
}

#[test]
fn the_tuner_skeletons_choice_takes_effect_inside_its_range_only() {
    let sizes = "4096,65536,1048576";
    let base = two_ranks(sizes, &[("NCCL_TUNER_PLUGIN", "none")]);
    let path = built_lib("librustccl_example_tuner_skeleton.so");
    let tuned = two_ranks(sizes, &[("NCCL_TUNER_PLUGIN", &path), ("NCCL_DEBUG_SUBSYS", "INIT,TUNING,PLUGIN")]);
    for bytes in [4096, 65536] {
        assert_eq!(choice_of(&tuned[0], bytes), "TREE SIMPLE 2", "inside the range");
        assert_ne!(choice_of(&base[0], bytes), "TREE SIMPLE 2", "the host alone chooses otherwise");
    }
    assert_eq!(choice_of(&tuned[0], 1048576), choice_of(&base[0], 1048576), "outside the range the host decides");
    let log = &tuned[0].stderr;
    assert!(log.contains("TUNER/Plugin: using tuner-skeleton"), "{log}");
    assert!(log.contains("tuner-skeleton: init for 2 ranks on 1 nodes"), "{log}");
}
