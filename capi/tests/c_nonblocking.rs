//! Non-blocking communicators through the C API: `tests/c/nonblocking_test.c`, compiled
//! against rustccl's `nccl.h` and linked to the `libnccl.so` this package builds, runs as 2
//! processes on the host backend (the program says what it checks). A process that outlives
//! its time limit (a hang) is killed and fails the test.

mod common;

use std::time::Duration;

#[test]
fn c_program_polls_queued_operations_and_aborts_stuck_ones() {
    let exe = common::build("nonblocking_test");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    let id = rustccl::get_unique_id().unwrap();
    let children = common::spawn_ranks(&exe, 2, &[("NCCL_TEST_ID", id.to_hex())]);
    common::expect_clean(children, Duration::from_secs(120), "nonblocking_test with 2 ranks");
}
