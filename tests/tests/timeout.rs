//! A rank that never arrives: every other rank's init fails after the timeout, with a
//! message naming the missing rank.

use std::time::{Duration, Instant};

use rustccl_tests::*;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn rank_that_never_arrives_fails_init_everywhere_with_a_clear_message() {
    // The root runs in this process: its limit comes from this process's environment (this
    // test has a binary of its own so that the short limit touches no other test).
    std::env::set_var("RUSTCCL_BOOTSTRAP_TIMEOUT", "2");
    let ids = ids_arg(&[new_id()]);
    let t0 = Instant::now();
    let out = finish_all(spawn("init-only", 4, &[0, 1, 3], &ids, &[("RUSTCCL_BOOTSTRAP_TIMEOUT", "2")]), LIMIT);
    let elapsed = t0.elapsed();
    for o in &out {
        assert!(!o.ok());
        let (code, msg) = o.error().unwrap_or_else(|| panic!("rank {} printed no error: {o:?}", o.rank));
        assert_eq!(code, "RemoteError", "{msg}");
        assert!(msg.contains("rank(s) 2 never arrived"), "{msg}");
    }
    // The configured 2 s, not more (the ranks' start-up takes a moment too).
    assert!(elapsed < Duration::from_secs(4), "took {elapsed:?}");
}

