//! Destroy loses nothing: ranks that destroy their communicator as soon as their last
//! collective returned, over the network transport (`NCCL_SHM_DISABLE=1`, the socket plugin
//! between processes of this host), 300 cycles each with 2 and with 3 ranks, sizes from 8 B
//! to 4 MiB; and over shared memory (the default between processes of one host). Before the proxy delivered what the FIFOs held at destroy, the peer's broadcast
//! failed with "peer ... closed the connection before sending the message this receive waits
//! for" within the first hundred cycles.

use std::time::Duration;

use rustccl_tests::*;

fn cycles(nranks: i32) {
    cycles_with(nranks, &[("NCCL_SHM_DISABLE", "1")]);
}

fn cycles_with(nranks: i32, extra: &[(&str, &str)]) {
    let mut env = vec![("RUSTCCL_BACKEND", "host"), ("CYCLES", "300")];
    env.extend_from_slice(extra);
    let ranks: Vec<i32> = (0..nranks).collect();
    let out = finish_all(spawn("destroy-cycles", nranks, &ranks, &ids_arg(&[new_id()]), &env), Duration::from_secs(240));
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results(), ["cycles 300"], "{o:?}");
    }
}

#[test]
fn two_ranks_destroy_right_after_their_last_collective_300_times() {
    cycles(2);
}

#[test]
fn three_ranks_destroy_right_after_their_last_collective_300_times() {
    cycles(3);
}

#[test]
fn three_ranks_over_shared_memory_destroy_right_after_their_last_collective_300_times() {
    cycles_with(3, &[]);
}
