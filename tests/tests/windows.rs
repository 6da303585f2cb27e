//! Symmetric memory windows on the host backend, ranks as processes (`rank-worker windows`):
//! registration, peers' pointers both ways, 300 register/deregister cycles without leftover
//! mappings, refused registrations on every rank, release at destroy.

use std::time::Duration;

use rustccl_tests::*;

#[test]
fn windows_reach_every_peer_and_leave_nothing_behind() {
    for n in [1, 3] {
        let ranks: Vec<i32> = (0..n).collect();
        let out = finish_all(spawn("windows", n, &ranks, &ids_arg(&[new_id()]), &[]), Duration::from_secs(120));
        assert_all_ok(&out);
        assert!(out.iter().all(|o| o.results() == ["windows ok 300"]), "{n} ranks: {out:?}");
    }
}
