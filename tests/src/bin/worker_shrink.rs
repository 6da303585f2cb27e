//! A split that fails because a rank died, then a shrink of the survivors (issue 30): the
//! survivors' failed splits must not leave them disagreeing about the child they shrink to.
//!
//! `split-shrink` (3 or more ranks; the last one is the victim): every rank inits and meets
//! in a barrier; then the victim kills itself (SIGKILL, no goodbye) and the survivors call
//! `split`, which must fail, then `shrink` excluding the victim with `ShrinkFlags::Abort`, and
//! run an AllReduce on the child, checked element by element. `SPLIT_MODE`:
//!
//! - `late`: the victim dies 100 ms after the barrier; rank 0 calls split at once (it passes
//!   the communicator's checks and fails inside the split's all-gather when the death is
//!   seen), the other survivors only once their communicator knows of the death (refused by
//!   the checks at once);
//! - `together`: every survivor calls split 20 ms after the barrier, the moment the victim
//!   dies (shifted by -2..2 ms by `ROUND`, to sweep the race between the death's news and the
//!   checks).
//!
//! With `BAD_SHRINK_FIRST` set, a shrink in which one survivor (rank `ROUND % 2`: the
//! coordinator or another member) passes an invalid config comes first: it must fail on every
//! survivor within 5 s, with `InvalidArgument`, and the shrink that follows must work.
//!
//! `RESULT split-shrink healthy_at_split <bool> shrink_ms <ms>`: whether this rank's
//! communicator still looked healthy when split was called, and how long shrink took.

use std::time::{Duration, Instant};

use rustccl::types::DataType;
use rustccl::{CommConfig, Communicator, Error, ReduceOp, ResultCode, ShrinkFlags, UniqueId};

use crate::worker_coll::test_device;

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), Error> {
    if cond {
        Ok(())
    } else {
        Err(Error::internal(format!("check failed: {}", what())))
    }
}

fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

pub fn split_then_shrink(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let victim = nranks - 1;
    let mode = std::env::var("SPLIT_MODE").unwrap_or_default();
    let late = match mode.as_str() {
        "late" => true,
        "together" => false,
        other => return Err(Error::invalid_argument(format!("SPLIT_MODE {other:?}: expected late or together"))),
    };
    let round: u64 = std::env::var("ROUND").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, test_device(rank), &CommConfig::default())?;
    comm.barrier()?;
    let met = Instant::now();
    if rank == victim {
        let after = if late { 100 } else { 18 + round % 5 };
        sleep_until(met + Duration::from_millis(after));
        // SAFETY: ends this process at once, as a crash would (no goodbye to the peers).
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        std::thread::sleep(Duration::from_secs(60));
        return Err(Error::internal("the victim survived SIGKILL"));
    }
    // A hang is a failure with a message (the bootstrap timeout the test sets is 20 s).
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(30));
        println!("ERROR InternalError rank {rank} split-shrink: still running after 30 s (hang)");
        std::process::exit(3);
    });
    if late && rank != 0 {
        while comm.async_error() == ResultCode::Success {
            check(met.elapsed() < Duration::from_secs(10), || "the victim's death was not seen in 10 s".into())?;
            std::thread::sleep(Duration::from_millis(1));
        }
    } else if !late {
        sleep_until(met + Duration::from_millis(20));
    }
    let healthy = comm.async_error() == ResultCode::Success;
    let split = comm.split(0, rank, None);
    check(split.is_err(), || "split succeeded with a dead rank".into())?;
    if std::env::var_os("BAD_SHRINK_FIRST").is_some() {
        let bad_rank = (round % 2) as i32;
        let bad = CommConfig { shrink_share: 7, ..CommConfig::default() };
        let t0 = Instant::now();
        let e = match comm.shrink(&[victim], (rank == bad_rank).then_some(&bad), ShrinkFlags::Abort) {
            Ok(_) => return Err(Error::internal("a shrink with an invalid config succeeded")),
            Err(e) => e,
        };
        check(t0.elapsed() < Duration::from_secs(5), || format!("the refused shrink took {} ms", t0.elapsed().as_millis()))?;
        check(e.code == ResultCode::InvalidArgument, || format!("the refused shrink failed with {e}"))?;
        check(e.message.contains("shrinkShare"), || format!("the refusal does not say why: {e}"))?;
    }

    let t0 = Instant::now();
    let child = comm.shrink(&[victim], None, ShrinkFlags::Abort)?;
    let shrink_time = t0.elapsed();
    let members: Vec<i32> = (0..nranks).filter(|&r| r != victim).collect();
    check(child.count()? == members.len() as i32, || "child size".into())?;
    check(child.user_rank()? == rank, || format!("child rank {:?}, expected {rank}", child.user_rank()))?;

    // Each member contributes rank + 1 (plus the element's index).
    let be = std::sync::Arc::clone(child.backend());
    let device = child.device()? as usize;
    let stream = be.create_stream(device)?;
    let count = 4096;
    let buf = be.alloc(device, count * 4)?;
    let input: Vec<u8> = (0..count).flat_map(|i| ((rank + 1) as f32 + i as f32).to_ne_bytes()).collect();
    be.copy_to_device(buf, &input, stream)?;
    child.all_reduce(buf, buf, count, DataType::Float32, ReduceOp::Sum, stream)?;
    let mut out = vec![0u8; count * 4];
    be.copy_from_device(&mut out, buf, stream)?;
    be.synchronize(stream)?;
    let base: i32 = members.iter().map(|r| r + 1).sum();
    for (i, w) in out.chunks_exact(4).enumerate() {
        let got = f32::from_ne_bytes(w.try_into().unwrap());
        let want = base as f32 + (i * members.len()) as f32;
        check(got == want, || format!("child all_reduce: element {i} is {got}, expected {want}"))?;
    }
    be.free(buf)?;
    child.destroy()?;
    comm.destroy()?;
    println!("RESULT split-shrink healthy_at_split {healthy} shrink_ms {}", shrink_time.as_millis());
    Ok(())
}
