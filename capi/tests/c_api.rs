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
