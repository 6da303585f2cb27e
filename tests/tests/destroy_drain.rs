//! Destroy loses nothing: ranks that destroy their communicator as soon as their last
//! collective returned, over the network transport (`NCCL_SHM_DISABLE=1`, the socket plugin
//! between processes of this host), 300 cycles each with 2 and with 3 ranks, sizes from 8 B
//! to 4 MiB. Before the proxy delivered what the FIFOs held at destroy, the peer's broadcast
//! failed with "peer ... closed the connection before sending the message this receive waits
//! for" within the first hundred cycles.

use std::time::Duration;

use rustccl_tests::*;

fn cycles(nranks: i32) {
    let env = [("RUSTCCL_BACKEND", "host"), ("NCCL_SHM_DISABLE", "1"), ("CYCLES", "300")];
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
