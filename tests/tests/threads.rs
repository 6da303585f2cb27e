//! Ranks as threads of one process: sizes, init_all, several ids, non-blocking init, split,
//! abort of a blocked operation, revoke, an init that stays in progress.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustccl::{CommConfig, Communicator, ResultCode, ShrinkFlags, UniqueId, SPLIT_NOCOLOR};
use rustccl_tests::new_id;

/// Runs `f(rank, comm)` on `n` threads, each with its rank of one communicator.
fn with_ranks<T: Send + 'static>(
    n: i32,
    ids: Vec<UniqueId>,
    config: CommConfig,
    f: impl Fn(i32, Communicator) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let (ids, f, config) = (ids.clone(), Arc::clone(&f), config.clone());
            std::thread::spawn(move || {
                let comm = Communicator::init_rank_scalable(n, rank, &ids, 0, &config).expect("init");
                f(rank, comm)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

fn gather_ranks(comm: &Communicator, me: i32) -> Vec<i32> {
    comm.allgather_bytes(&me.to_le_bytes())
        .unwrap()
        .iter()
        .map(|b| i32::from_le_bytes(b.as_slice().try_into().unwrap()))
        .collect()
}

#[test]
fn init_barrier_destroy_at_several_sizes() {
    for n in [1, 2, 3, 8, 16] {
        let out = with_ranks(n, vec![new_id()], CommConfig::default(), move |rank, comm| {
            assert_eq!(comm.count().unwrap(), n);
            assert_eq!(comm.user_rank().unwrap(), rank);
            comm.barrier().unwrap();
            let all = gather_ranks(&comm, rank);
            comm.destroy().unwrap();
            all
        });
        for all in out {
            assert_eq!(all, (0..n).collect::<Vec<_>>());
        }
    }
}

#[test]
fn init_all_makes_one_communicator_per_device() {
    let comms = Communicator::init_all(&[3, 1, 2, 0]).unwrap();
    assert_eq!(comms.len(), 4);
    for (i, c) in comms.iter().enumerate() {
        assert_eq!(c.user_rank().unwrap(), i as i32);
        assert_eq!(c.count().unwrap(), 4);
    }
    assert_eq!(comms[0].device().unwrap(), 3);
    let comms = Arc::new(comms);
    let hs: Vec<_> = (0..4)
        .map(|i| {
            let comms = Arc::clone(&comms);
            std::thread::spawn(move || comms[i].barrier().unwrap())
        })
        .collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
    for c in comms.iter() {
        c.destroy().unwrap();
    }
}

#[test]
fn several_ids_spread_ranks_over_roots() {
    let ids = vec![new_id(), new_id(), new_id()];
    let out = with_ranks(7, ids, CommConfig::default(), |rank, comm| {
        comm.barrier().unwrap();
        let all = gather_ranks(&comm, rank);
        comm.destroy().unwrap();
        all
    });
    assert!(out.iter().all(|a| *a == (0..7).collect::<Vec<_>>()));
}

#[test]
fn nonblocking_init_reports_in_progress_then_success() {
    let out = with_ranks(3, vec![new_id()], CommConfig::non_blocking(), |_, comm| {
        let mut saw_in_progress = false;
        let deadline = Instant::now() + Duration::from_secs(60);
        while comm.async_error() == ResultCode::InProgress {
            saw_in_progress = true;
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(comm.async_error(), ResultCode::Success);
        comm.barrier().unwrap();
        comm.destroy().unwrap();
        saw_in_progress
    });
    // Rank threads start at different times, so at least one sees its init still running.
    assert!(out.iter().any(|&s| s));
}

#[test]
fn split_shares_resources_only_when_asked() {
    with_ranks(4, vec![new_id()], CommConfig::default(), |rank, comm| {
        let shared = CommConfig { split_share: 1, ..Default::default() };
        let a = comm.split(rank % 2, rank, Some(&shared)).unwrap().unwrap();
        assert!(a.shares_resources_with(&comm));
        assert_eq!(a.config().split_share, true);
        let b = comm.split(0, rank, None).unwrap().unwrap();
        assert!(!b.shares_resources_with(&comm));
        assert_eq!(b.count().unwrap(), 4);
        let none = comm.split(SPLIT_NOCOLOR, 0, None).unwrap();
        assert!(none.is_none());
        for c in [a, b] {
            c.barrier().unwrap();
            c.destroy().unwrap();
        }
        comm.destroy().unwrap();
    });
}

#[test]
fn shrink_without_failure_keeps_order() {
    with_ranks(5, vec![new_id()], CommConfig::default(), |rank, comm| {
        if rank == 1 || rank == 3 {
            // Excluded ranks do not call shrink; they wait until the others are done.
            std::thread::sleep(Duration::from_millis(1500));
            comm.destroy().unwrap();
            return;
        }
        let child = comm.shrink(&[1, 3], None, ShrinkFlags::Default).unwrap();
        assert_eq!(child.count().unwrap(), 3);
        assert_eq!(gather_ranks(&child, rank), vec![0, 2, 4]);
        child.destroy().unwrap();
        comm.destroy().unwrap();
    });
}

#[test]
fn abort_ends_a_blocked_barrier_promptly() {
    let out = with_ranks(2, vec![new_id()], CommConfig::default(), |rank, comm| {
        if rank == 1 {
            // Never enters the barrier; waits for rank 0's abort to show up as a failure.
            let deadline = Instant::now() + Duration::from_secs(30);
            while comm.async_error() == ResultCode::Success && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let code = comm.async_error();
            comm.destroy().unwrap();
            return (code, Duration::ZERO);
        }
        let comm = Arc::new(comm);
        let c2 = Arc::clone(&comm);
        let waiter = std::thread::spawn(move || c2.barrier());
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        comm.abort().unwrap();
        let r = waiter.join().unwrap();
        let took = t0.elapsed();
        (r.unwrap_err().code, took)
    });
    assert_eq!(out[0].0, ResultCode::InvalidUsage, "the aborted barrier reports the abort");
    assert!(out[0].1 < Duration::from_secs(2), "abort took {:?}", out[0].1);
    assert_eq!(out[1].0, ResultCode::RemoteError, "the peer sees the aborted rank as failed");
}

#[test]
fn revoke_stops_new_operations_but_allows_shrink_and_destroy() {
    with_ranks(2, vec![new_id()], CommConfig::default(), |rank, comm| {
        assert_eq!(comm.revoke(3).unwrap_err().code, ResultCode::InvalidArgument);
        comm.revoke(0).unwrap();
        let e = comm.barrier().unwrap_err();
        assert_eq!(e.code, ResultCode::InvalidUsage);
        assert!(e.message.contains("revoked"));
        let child = comm.shrink(&[], None, ShrinkFlags::Default).unwrap();
        assert_eq!(gather_ranks(&child, rank), vec![0, 1]);
        child.destroy().unwrap();
        comm.destroy().unwrap();
    });
}

#[test]
fn in_progress_communicator_refuses_calls_and_aborts_promptly() {
    // Two ranks expected, one arrives: init stays in progress.
    let comm = Communicator::init_rank_config(2, &new_id(), 0, 0, &CommConfig::non_blocking()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(comm.async_error(), ResultCode::InProgress);
    let e = comm.count().unwrap_err();
    assert_eq!(e.code, ResultCode::InvalidArgument);
    assert!(e.message.contains("still being initialised"));
    let t0 = Instant::now();
    comm.abort().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "abort took {:?}", t0.elapsed());
    assert_ne!(comm.async_error(), ResultCode::Success);
}

#[test]
fn all_reduce_across_threads_and_one_group_driving_every_rank() {
    use rustccl::backend::Stream;
    use rustccl::types::DataType;
    let n = 4usize;
    let comms = Communicator::init_all(&[0, 1, 2, 3]).unwrap();
    let count = 300_001usize;
    let backend = comms[0].backend().clone();
    let bufs: Vec<_> = (0..n)
        .map(|r| {
            let p = backend.alloc(r, count * 4).unwrap();
            let data: Vec<u8> = (0..count).flat_map(|i| ((r * 10 + i % 7) as f32).to_ne_bytes()).collect();
            backend.copy_to_device(p, &data, Stream::DEFAULT).unwrap();
            p
        })
        .collect();
    // One thread drives all four ranks through one group.
    rustccl::group_start();
    for (r, c) in comms.iter().enumerate() {
        c.all_reduce(bufs[r], bufs[r], count, DataType::Float32, rustccl::ReduceOp::Sum, Stream::DEFAULT).unwrap();
    }
    rustccl::group_end().unwrap();
    for r in 0..n {
        let mut out = vec![0u8; count * 4];
        backend.copy_from_device(&mut out, bufs[r], Stream::DEFAULT).unwrap();
        for i in [0usize, 1, 6, count / 2, count - 1] {
            let got = f32::from_ne_bytes(out[i * 4..i * 4 + 4].try_into().unwrap());
            let want: f32 = (0..n).map(|q| (q * 10 + i % 7) as f32).sum();
            assert_eq!(got, want, "rank {r} element {i}");
        }
    }
    for c in &comms {
        c.destroy().unwrap();
    }
}
