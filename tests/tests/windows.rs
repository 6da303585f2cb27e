//! Symmetric memory windows on the host backend, ranks as processes (`rank-worker windows`):
//! registration, peers' pointers both ways, 1000 register/deregister cycles without leftover
//! mappings, refused registrations on every rank, release at destroy; a SIGKILLed peer.

use std::time::Duration;

use rustccl_tests::*;

#[test]
fn windows_reach_every_peer_and_leave_nothing_behind() {
    for n in [1, 3] {
        let ranks: Vec<i32> = (0..n).collect();
        let out = finish_all(spawn("windows", n, &ranks, &ids_arg(&[new_id()]), &[]), Duration::from_secs(120));
        assert_all_ok(&out);
        assert!(out.iter().all(|o| o.results() == ["windows ok 1000"]), "{n} ranks: {out:?}");
    }
}

#[test]
fn a_dead_peer_is_an_error_for_the_next_registration_not_a_crash() {
    let ranks: Vec<i32> = (0..3).collect();
    let out = finish_all(spawn("windows-peer-death", 3, &ranks, &ids_arg(&[new_id()]), &[]), Duration::from_secs(120));
    for r in survivor_results(&out, 2) {
        assert!(r.starts_with("windows-peer-death ok "), "{r:?}");
        let ms: u64 = r.split_whitespace().nth(2).and_then(|v| v.parse().ok()).unwrap_or(u64::MAX);
        assert!(ms < 15_000, "the registration took {ms} ms to fail");
    }
}

/// A rank dies while the others run an all_to_all on symmetric windows: they get an error,
/// not a hang.
#[test]
fn a_peer_dying_during_an_operation_on_windows_is_an_error_not_a_hang() {
    let ranks: Vec<i32> = (0..3).collect();
    let out = finish_all(spawn("windows-op-death", 3, &ranks, &ids_arg(&[new_id()]), &[]), Duration::from_secs(120));
    for r in survivor_results(&out, 2) {
        assert!(r.starts_with("windows-op-death ok "), "{r:?}");
    }
}

/// One rank passes window buffers, the others plain ones: an error on every rank (rank 0's
/// names the cause), not a hang.
#[test]
fn ranks_passing_windows_and_plain_buffers_get_an_error_not_a_hang() {
    for n in [2, 3] {
        let ranks: Vec<i32> = (0..n).collect();
        let out = finish_all(spawn("windows-mismatch", n, &ranks, &ids_arg(&[new_id()]), &[]), Duration::from_secs(120));
        assert_all_ok(&out);
        for o in &out {
            assert!(o.results().iter().any(|r| r.starts_with("windows-mismatch ok ")), "{n} ranks: {o:?}");
        }
    }
}

#[test]
fn windows_of_ranks_as_threads_share_one_backend() {
    // Two ranks in this process: each maps both ranks' memory in its own range, and a store
    // through one rank's view of the other's window is seen by the owner.
    use rustccl::backend::DevicePtr;
    use rustccl::{CommConfig, Communicator};
    let ids = vec![new_id()];
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let ids = ids.clone();
            std::thread::spawn(move || {
                let comm = Communicator::init_rank_scalable(2, rank, &ids, 0, &CommConfig::default()).expect("init");
                let b = std::sync::Arc::clone(comm.backend());
                let (mem, _) = b.alloc_shareable(0, 1 << 20).unwrap();
                let w = comm.window_register(mem, 8192, rustccl::window::WIN_DEFAULT).unwrap();
                let other = w.peer_ptr(1 - rank as usize, 8 * rank as usize).unwrap();
                // SAFETY: inside the other rank's live window.
                unsafe { std::ptr::write_volatile(other.0 as *mut u64, 70 + rank as u64) };
                comm.barrier().unwrap();
                // SAFETY: this rank's own buffer.
                let got = unsafe { std::ptr::read_volatile((mem.0 + 8 * (1 - rank as u64)) as *const u64) };
                comm.barrier().unwrap();
                comm.window_deregister(&w).unwrap();
                comm.destroy().unwrap();
                b.free(DevicePtr(mem.0)).unwrap();
                got
            })
        })
        .collect();
    let got: Vec<u64> = handles.into_iter().map(|h| h.join().expect("rank thread")).collect();
    assert_eq!(got, vec![71, 70]);
}
