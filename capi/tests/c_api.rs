//! The C API test: `tests/c/nccl_api_test.c`, compiled against rustccl's `nccl.h` and linked
//! to the `libnccl.so` this package builds, runs as 1, 2 and 3 processes on the host backend.

mod common;

use std::time::Duration;

#[test]
fn c_program_runs_every_call_on_the_host_backend() {
    let exe = common::build("nccl_api_test");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    for n in [1, 2, 3] {
        let id = rustccl::get_unique_id().unwrap();
        let id2 = rustccl::get_unique_id().unwrap();
        let children = common::spawn_ranks(&exe, n, &[("NCCL_TEST_ID", id.to_hex()), ("NCCL_TEST_ID2", id2.to_hex())]);
        common::expect_clean(children, Duration::from_secs(180), &format!("nccl_api_test with {n} ranks"));
    }
}

/// `tests/c/api_2_30_test.c`: parameters, the 2.30 config, suspend/resume and memory
/// statistics, one-sided puts, signals and waits on a window, with their bad arguments; 1 and
/// 2 processes.
#[test]
fn c_program_runs_the_2_29_and_2_30_host_api() {
    let exe = common::build("api_2_30_test");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    for n in [1, 2] {
        let id = rustccl::get_unique_id().unwrap();
        let id2 = rustccl::get_unique_id().unwrap();
        let env = [
            ("NCCL_TEST_ID", id.to_hex()),
            ("NCCL_TEST_ID2", id2.to_hex()),
            ("NCCL_CGA_CLUSTER_SIZE", "300".to_string()),
        ];
        let children = common::spawn_ranks(&exe, n, &env);
        common::expect_clean(children, Duration::from_secs(120), &format!("api_2_30_test with {n} ranks"));
    }
}

/// Two ranks (processes) grow to three: the third process joins with the id rank 0 got from
/// `ncclCommGetUniqueId` (handed over through a file).
#[test]
fn c_program_grows_two_ranks_to_three() {
    let exe = common::build("api_2_30_test");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    let id = rustccl::get_unique_id().unwrap();
    let file = std::env::temp_dir().join(format!("rustccl-grow-{}-{}", std::process::id(), id.hash()));
    let _ = std::fs::remove_file(&file);
    let children = (0..3)
        .map(|rank| {
            let env = [
                ("RANK", rank.to_string()),
                ("NRANKS", "2".to_string()),
                ("NCCL_TEST_ID", id.to_hex()),
                ("NCCL_TEST_GROW_FILE", file.display().to_string()),
            ];
            common::spawn(&exe, &["grow"], &env)
        })
        .collect();
    common::expect_clean(children, Duration::from_secs(120), "api_2_30_test grow");
    let _ = std::fs::remove_file(&file);
}

/// `tests/c/api_2_32_test.c`: every function of NCCL 2.32.3's nccl.h (and the device API's host
/// calls nccl4py 0.6 binds) exported under both names, the 2.32.3 `ncclConfig_t` and one from
/// a 2.28 header, the 2.31/2.32 window flags, and the CFT calls refused or answered as NCCL's
/// without CFT hardware; 1 and 2 processes.
#[test]
fn c_program_runs_the_2_31_and_2_32_host_api() {
    let exe = common::build("api_2_32_test");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    for n in [1, 2] {
        let id = rustccl::get_unique_id().unwrap();
        let children = common::spawn_ranks(&exe, n, &[("NCCL_TEST_ID", id.to_hex())]);
        common::expect_clean(children, Duration::from_secs(120), &format!("api_2_32_test with {n} ranks"));
    }
}
