//! Device communicators: `tests/c/devcomm_test.cpp`, host C++ compiled against rustccl's
//! `nccl_device.h` (its inline device API running on the CPU) and linked to the `libnccl.so`
//! this package builds, runs as 1, 2 and 3 processes on the host backend: requirements and
//! their layout, resource memory, window pointers, 100 rounds of write / LSA barrier / read
//! of every peer's window, the abort flag and the bad inputs.

mod common;

use std::time::Duration;

#[test]
fn cpp_program_uses_device_communicators_and_lsa_barriers_on_the_host_backend() {
    let exe = common::build("devcomm_test");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    for n in [1, 2, 3] {
        let id = rustccl::get_unique_id().unwrap();
        let children = common::spawn_ranks(&exe, n, &[("NCCL_TEST_ID", id.to_hex())]);
        common::expect_clean(children, Duration::from_secs(120), &format!("devcomm_test with {n} ranks"));
    }
}
