//! The `nccl*Config` collectives (NCCL 2.31 / 2.32) as a C caller makes them:
//! `tests/c/coll_config_test.c` on 1 and 2 ranks as processes on the host backend (the
//! struct's layout, each call with good and bad configs, groups). Its COLL trace then shows
//! that what a config asks for is what the planner did: the algorithm named, the channels
//! bounded, and each field rustccl does not honour said once.

mod common;

use common::{build, expect_clean, spawn_ranks};
use std::time::Duration;

#[test]
fn configured_collectives_check_their_config_and_steer_the_planner() {
    let exe = build("coll_config_test");
    for n in [1usize, 2] {
        let logs = std::env::temp_dir().join(format!("rustccl-coll-config-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs).unwrap();
        let id = rustccl::get_unique_id().unwrap();
        let env = [
            ("NCCL_TEST_ID", id.to_hex()),
            ("NCCL_DEBUG", "TRACE".to_string()),
            ("NCCL_DEBUG_SUBSYS", "COLL".to_string()),
            ("NCCL_DEBUG_FILE", logs.join("log.%p").display().to_string()),
        ];
        expect_clean(spawn_ranks(&exe, n, &env), Duration::from_secs(120), &format!("coll_config_test with {n} ranks"));
        let files: Vec<String> = std::fs::read_dir(&logs).unwrap().map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap()).collect();
        assert_eq!(files.len(), n, "one log per rank");
        for log in &files {
            for field in ["nvlsCTAs", "cgaClusterSize", "CTAPolicy", "ext"] {
                let said = format!("ncclCollConfig_t.{field} is accepted but not honoured");
                assert_eq!(log.matches(&said).count(), 1, "{said}: once per process\n{log}");
            }
            if n == 1 {
                continue; // one rank runs no algorithm
            }
            for line in [
                "AllReduce 4096 B: way=planner TREE/",
                "AllReduce 4096 B: way=planner RING/LL128 1 ch",
                "AllGather 8192 B: way=planner RING/",
                "AllReduce 8388608 B: way=planner RING/SIMPLE 1 ch",
                "AllReduce 8388608 B: way=planner RING/SIMPLE 2 ch",
            ] {
                assert!(log.contains(line), "the trace lacks \"{line}\"\n{log}");
            }
        }
        let _ = std::fs::remove_dir_all(&logs);
    }
}
