//! One rank of a multi-process test: `rank-worker <scenario> <nranks> <rank> <ids>` where
//! `<ids>` is a comma-separated list of hex unique ids (or `env` to derive the id from
//! NCCL_COMM_ID). Prints `READY`/`RESULT ...` lines for the harness, checks what it can
//! itself, and on failure prints `ERROR <code> <message>` and exits with status 1.

use std::io::BufRead;
use std::time::{Duration, Instant};

use rustccl::{CommConfig, Communicator, Error, ResultCode, ShrinkFlags, UniqueId, SPLIT_NOCOLOR};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: rank-worker <scenario> <nranks> <rank> <ids|env>");
        std::process::exit(2);
    }
    let nranks: i32 = args[2].parse().expect("nranks");
    let rank: i32 = args[3].parse().expect("rank");
    let ids: Vec<UniqueId> = if args[4] == "env" {
        vec![rustccl::get_unique_id().unwrap_or_else(|e| fail(e))]
    } else {
        args[4].split(',').map(|h| UniqueId::from_hex(h).unwrap_or_else(|e| fail(e))).collect()
    };
    let result = match args[1].as_str() {
        "init-barrier" => init_barrier(nranks, rank, &ids),
        "nonblocking" => nonblocking(nranks, rank, &ids),
        "split" => split(nranks, rank, &ids),
        "kill-shrink" => kill_shrink(nranks, rank, &ids),
        "init-only" => Communicator::init_rank_scalable(nranks, rank, &ids, 0, &CommConfig::default()).map(|c| {
            let _ = c.destroy();
        }),
        other => {
            eprintln!("unknown scenario {other}");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        fail(e);
    }
}

fn fail(e: Error) -> ! {
    println!("ERROR {:?} {}", e.code, e.message);
    std::process::exit(1);
}

fn check(cond: bool, what: String) -> Result<(), Error> {
    if cond {
        Ok(())
    } else {
        Err(Error::internal(format!("check failed: {what}")))
    }
}

/// Everyone's rank arrives at everyone, in order.
fn check_allgather(comm: &Communicator, expect: &[i32], me: i32) -> Result<(), Error> {
    let all = comm.allgather_bytes(&me.to_le_bytes())?;
    let got: Vec<i32> = all.iter().map(|b| i32::from_le_bytes(b.as_slice().try_into().unwrap())).collect();
    check(got == expect, format!("allgather gave {got:?}, expected {expect:?}"))
}

fn init_barrier(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, 0, &CommConfig::default())?;
    check(comm.count()? == nranks && comm.user_rank()? == rank, "count/rank".into())?;
    comm.barrier()?;
    let expect: Vec<i32> = (0..nranks).collect();
    check_allgather(&comm, &expect, rank)?;
    // Ring of point-to-point messages.
    if nranks > 1 {
        let next = (rank + 1) % nranks;
        let prev = (rank + nranks - 1) % nranks;
        comm.send_bytes(next, 7, format!("from {rank}").as_bytes())?;
        let got = comm.recv_bytes(prev, 7)?;
        check(got == format!("from {prev}").as_bytes(), "ring message".into())?;
    }
    comm.barrier()?;
    comm.finalize()?;
    comm.destroy()?;
    println!("RESULT ok");
    Ok(())
}

fn nonblocking(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, 0, &CommConfig::non_blocking())?;
    let mut polls = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match comm.async_error() {
            ResultCode::InProgress => {
                polls += 1;
                check(Instant::now() < deadline, "non-blocking init never finished".into())?;
                std::thread::sleep(Duration::from_millis(1));
            }
            ResultCode::Success => break,
            code => return Err(comm.async_error_detail().unwrap_or_else(|| Error::new(code, "init failed"))),
        }
    }
    comm.barrier()?;
    comm.destroy()?;
    println!("RESULT polls {polls}");
    Ok(())
}

/// Split by colour `rank % 3` with keys reversing the order, NOCOLOR for every fifth rank,
/// then a nested split of each child in halves.
fn split(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, 0, &CommConfig::default())?;
    let color = |r: i32| if r % 5 == 4 { SPLIT_NOCOLOR } else { r % 3 };
    let child = comm.split(color(rank), -rank, None)?;
    if color(rank) == SPLIT_NOCOLOR {
        check(child.is_none(), "NOCOLOR got a communicator".into())?;
        comm.barrier()?;
        comm.destroy()?;
        println!("RESULT nocolor");
        return Ok(());
    }
    let child = child.ok_or_else(|| Error::internal("no child"))?;
    // Members of my colour, ordered by key (-rank), i.e. descending rank.
    let mut members: Vec<i32> = (0..nranks).filter(|&r| color(r) == color(rank)).collect();
    members.reverse();
    let my_child_rank = members.iter().position(|&r| r == rank).unwrap() as i32;
    check(child.count()? == members.len() as i32, format!("child size {} vs {members:?}", child.count()?))?;
    check(child.user_rank()? == my_child_rank, "child rank".into())?;
    check_allgather(&child, &members, rank)?;
    // Nested: halves of the child, same key order as the child.
    let half = (my_child_rank * 2 >= members.len() as i32) as i32;
    let grandchild = child.split(half, my_child_rank, None)?.ok_or_else(|| Error::internal("no grandchild"))?;
    let gmembers: Vec<i32> =
        members.iter().enumerate().filter(|(i, _)| ((*i as i32) * 2 >= members.len() as i32) as i32 == half).map(|(_, &r)| r).collect();
    check_allgather(&grandchild, &gmembers, rank)?;
    grandchild.destroy()?;
    child.destroy()?;
    comm.barrier()?;
    comm.destroy()?;
    println!("RESULT child {my_child_rank} of {}", members.len());
    Ok(())
}

/// Init, report READY, wait for GO (the harness kills the victim in between), then expect
/// the next operation to fail with a remote error quickly, shrink without the victim, and
/// check that the shrunk communicator works.
fn kill_shrink(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let victim: i32 = std::env::var("VICTIM").ok().and_then(|v| v.parse().ok()).unwrap_or(nranks - 1);
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, 0, &CommConfig::default())?;
    comm.barrier()?;
    println!("READY");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).map_err(|e| Error::io("stdin", &e))?;
    if rank == victim {
        // The harness kills this process; it must not get further.
        std::thread::sleep(Duration::from_secs(60));
        return Err(Error::internal("victim was not killed"));
    }
    let t0 = Instant::now();
    let err = match comm.barrier() {
        Ok(()) => return Err(Error::internal("barrier succeeded with a dead rank")),
        Err(e) => e,
    };
    let detect = t0.elapsed();
    check(err.code == ResultCode::RemoteError, format!("barrier failed with {err}"))?;
    check(comm.async_error() == ResultCode::RemoteError, "async error is not RemoteError".into())?;
    check(!comm.last_error().is_empty(), "no last error recorded".into())?;
    let child = comm.shrink(&[victim], None, ShrinkFlags::Abort)?;
    let expect: Vec<i32> = (0..nranks).filter(|&r| r != victim).collect();
    check(child.count()? == nranks - 1, "shrunk size".into())?;
    check_allgather(&child, &expect, rank)?;
    child.barrier()?;
    let t1 = Instant::now();
    comm.abort()?;
    let abort_time = t1.elapsed();
    child.destroy()?;
    println!("RESULT detect_ms {} abort_ms {} error {}", detect.as_millis(), abort_time.as_millis(), err.message);
    Ok(())
}
