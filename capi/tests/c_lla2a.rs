//! The device API's LL all-to-all (NCCL 2.30): `tests/c/lla2a_test.cpp`, host C++ compiled
//! against rustccl's `nccl_device.h` (its `ncclLLA2ASession` running on the CPU) and linked to
//! the `libnccl.so` this package builds, runs as 1, 2 and 3 processes on the host backend:
//! `ncclLLA2ACreateRequirement` and its bad arguments, sessions over the LSA team with send,
//! bcast, recv, recvUnrolled and recvReduce on 4- to 20-byte elements checked exactly, the
//! epoch carried from session to session, the 32-bit epoch's wrap and the abort flag.

mod common;

use std::time::Duration;

#[test]
fn cpp_program_runs_ll_all_to_all_sessions_on_the_host_backend() {
    let exe = common::build("lla2a_test");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    for n in [1, 2, 3] {
        let id = rustccl::get_unique_id().unwrap();
        let children = common::spawn_ranks(&exe, n, &[("NCCL_TEST_ID", id.to_hex())]);
        common::expect_clean(children, Duration::from_secs(60), &format!("lla2a_test with {n} ranks"));
    }
}
