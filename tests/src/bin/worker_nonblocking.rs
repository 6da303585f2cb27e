//! Operations on non-blocking communicators (`CommConfig::blocking = 0`), through the Rust API:
//! a call (or a group's end) returns `InProgress` at once, the work runs in the background in
//! call order, and the caller polls `async_error` until it is no longer `InProgress`.
//!
//! - `nb-ops`: one AllReduce; three AllReduces queued in a row, each on the previous one's
//!   result (so only call order gives the right answer), with an argument error returned at
//!   once meanwhile; a group of AllReduce, Broadcast, AllGather and a Send/Recv ring; an
//!   AllReduce followed at once by finalize (which may itself return `InProgress`). Every
//!   result is checked element by element (int32, exact). `RESULT nb-ops polls <n>`.
//! - `nb-stuck`: after a first AllReduce, rank 1 stops calling; rank 0's next AllReduce returns
//!   `InProgress` and stays so, then abort from the same thread returns within 1 s and the
//!   process exits cleanly. Rank 1 sees rank 0's abort as `RemoteError`, and aborts too.
//!   `RESULT nb-stuck abort_ms <t>` / `RESULT nb-stuck peer <code>`.
//! - `nb-mixed`: a blocking communicator and a non-blocking child split from it in one group
//!   are refused (`InvalidUsage`, in either order, and the group runs nothing); each alone
//!   works; destroy waits for a queued operation. `RESULT nb-mixed ok`.

use std::time::{Duration, Instant};

use rustccl::backend::{DeviceBackend, DevicePtr, Stream};
use rustccl::types::DataType;
use rustccl::{CommConfig, Communicator, Error, ReduceOp, ResultCode, UniqueId};

use crate::worker_coll::test_device;

const COUNT: usize = 100_003;
const S: Stream = Stream::DEFAULT;

pub fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), Error> {
    if cond {
        Ok(())
    } else {
        Err(Error::internal(format!("check failed: {}", what())))
    }
}

/// A hang is a failure with a message, not a silent timeout of the harness.
pub fn hang_guard(rank: i32, what: &'static str, secs: u64) {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(secs));
        println!("ERROR InternalError rank {rank} {what}: still running after {secs} s (hang)");
        std::process::exit(3);
    });
}

/// The call must have returned `InProgress` (the work was queued).
fn queued(r: Result<(), Error>, what: &str) -> Result<(), Error> {
    match r {
        Err(e) if e.code == ResultCode::InProgress => Ok(()),
        other => Err(Error::internal(format!("{what}: returned {other:?}, expected InProgress"))),
    }
}

/// Polls `async_error` until it is no longer `InProgress`; the polls it took.
pub fn poll_done(comm: &Communicator, what: &str) -> Result<u32, Error> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut polls = 0;
    loop {
        match comm.async_error() {
            ResultCode::InProgress => {
                check(Instant::now() < deadline, || format!("{what}: still InProgress after 60 s"))?;
                polls += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
            ResultCode::Success => return Ok(polls),
            code => {
                let e = comm.async_error_detail().unwrap_or_else(|| Error::new(code, "no detail"));
                return Err(e.context(format!("{what}: async error")));
            }
        }
    }
}

fn nonblocking_comm(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<Communicator, Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, test_device(rank), &CommConfig::non_blocking())?;
    poll_done(&comm, "init")?;
    Ok(comm)
}

pub fn upload(be: &dyn DeviceBackend, device: usize, v: &[i32]) -> Result<DevicePtr, Error> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
    let p = be.alloc(device, bytes.len().max(1))?;
    be.copy_to_device(p, &bytes, S)?;
    be.synchronize(S)?;
    Ok(p)
}

pub fn download(be: &dyn DeviceBackend, p: DevicePtr, n: usize) -> Result<Vec<i32>, Error> {
    let mut bytes = vec![0u8; n * 4];
    be.copy_from_device(&mut bytes, p, S)?;
    Ok(bytes.chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap())).collect())
}

pub fn expect_eq(got: &[i32], want: &[i32], what: &str) -> Result<(), Error> {
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None if got.len() == want.len() => Ok(()),
        None => Err(Error::internal(format!("{what}: {} elements, expected {}", got.len(), want.len()))),
        Some(i) => Err(Error::internal(format!("{what}: element {i} is {}, expected {}", got[i], want[i]))),
    }
}

/// Rank `r`'s input: small values, so sums of sums stay exact in int32.
fn input(r: usize) -> Vec<i32> {
    (0..COUNT).map(|i| (r as i32 + 1) * 3 + (i % 17) as i32 - 8).collect()
}

/// Element-wise reduction of every rank's input.
fn reduced(n: usize, f: fn(i32, i32) -> i32) -> Vec<i32> {
    let inputs: Vec<Vec<i32>> = (0..n).map(input).collect();
    (0..COUNT).map(|i| inputs.iter().map(|v| v[i]).reduce(f).unwrap()).collect()
}

pub fn ops(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    hang_guard(rank, "nb-ops", 120);
    let comm = nonblocking_comm(nranks, rank, ids)?;
    let be = std::sync::Arc::clone(comm.backend());
    let device = comm.device()? as usize;
    let (n, me) = (nranks as usize, rank as usize);
    let ai = DataType::Int32;
    let sum = reduced(n, |a, b| a + b);
    let x = upload(&*be, device, &input(me))?;
    let mut polls = 0;

    // One operation.
    let y = be.alloc(device, COUNT * 4)?;
    queued(comm.all_reduce(x, y, COUNT, ai, ReduceOp::Sum, S), "AllReduce")?;
    polls += poll_done(&comm, "AllReduce")?;
    expect_eq(&download(&*be, y, COUNT)?, &sum, "AllReduce")?;

    // Three in a row, each on the previous result, without waiting in between.
    let ys: Vec<DevicePtr> = (0..3).map(|_| be.alloc(device, COUNT * 4)).collect::<Result<_, _>>()?;
    queued(comm.all_reduce(x, ys[0], COUNT, ai, ReduceOp::Sum, S), "queued AllReduce 1")?;
    queued(comm.all_reduce(ys[0], ys[1], COUNT, ai, ReduceOp::Sum, S), "queued AllReduce 2")?;
    queued(comm.all_reduce(ys[1], ys[2], COUNT, ai, ReduceOp::Sum, S), "queued AllReduce 3")?;
    // An argument error is returned at once, and queues nothing.
    let e = comm.broadcast(x, y, COUNT, ai, nranks, S).unwrap_err();
    check(e.code == ResultCode::InvalidArgument, || format!("bad root while work is queued: {e:?}"))?;
    polls += poll_done(&comm, "queued AllReduces")?;
    let mut want = sum.clone();
    for (k, p) in ys.iter().enumerate() {
        expect_eq(&download(&*be, *p, COUNT)?, &want, &format!("queued AllReduce {}", k + 1))?;
        want = want.iter().map(|v| v * n as i32).collect();
    }

    // A group of several operations.
    let bx = upload(&*be, device, &(0..COUNT as i32).map(|i| i * 2 + me as i32).collect::<Vec<_>>())?;
    let (mx, bc, ag, rv) = (be.alloc(device, COUNT * 4)?, be.alloc(device, COUNT * 4)?, be.alloc(device, COUNT * 4 * n)?, be.alloc(device, COUNT * 4)?);
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    rustccl::group_start();
    let calls = [
        comm.all_reduce(x, mx, COUNT, ai, ReduceOp::Max, S),
        comm.broadcast(bx, bc, COUNT, ai, 0, S),
        comm.all_gather(x, ag, COUNT, ai, S),
        comm.send(bx, COUNT, ai, next as i32, S),
        comm.recv(rv, COUNT, ai, prev as i32, S),
    ];
    let end = rustccl::group_end();
    for (i, c) in calls.iter().enumerate() {
        check(c.is_ok(), || format!("group call {i} returned {c:?}; inside a group calls only queue"))?;
    }
    queued(end, "group_end")?;
    polls += poll_done(&comm, "group")?;
    let max = reduced(n, i32::max);
    expect_eq(&download(&*be, mx, COUNT)?, &max, "group AllReduce max")?;
    expect_eq(&download(&*be, bc, COUNT)?, &(0..COUNT as i32).map(|i| i * 2).collect::<Vec<_>>(), "group Broadcast")?;
    let gathered: Vec<i32> = (0..n).flat_map(input).collect();
    expect_eq(&download(&*be, ag, COUNT * n)?, &gathered, "group AllGather")?;
    expect_eq(&download(&*be, rv, COUNT)?, &(0..COUNT as i32).map(|i| i * 2 + prev as i32).collect::<Vec<_>>(), "group Recv")?;

    // Finalize right behind a queued operation completes it.
    let z = be.alloc(device, COUNT * 4)?;
    queued(comm.all_reduce(x, z, COUNT, ai, ReduceOp::Sum, S), "AllReduce before finalize")?;
    match comm.finalize() {
        Ok(()) => {}
        Err(e) if e.code == ResultCode::InProgress => {}
        Err(e) => return Err(e.context("finalize")),
    }
    polls += poll_done(&comm, "finalize")?;
    expect_eq(&download(&*be, z, COUNT)?, &sum, "AllReduce before finalize")?;
    comm.destroy()?;
    println!("RESULT nb-ops polls {polls}");
    Ok(())
}

pub fn stuck(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    hang_guard(rank, "nb-stuck", 60);
    let comm = nonblocking_comm(nranks, rank, ids)?;
    let be = std::sync::Arc::clone(comm.backend());
    let device = comm.device()? as usize;
    let x = upload(&*be, device, &input(rank as usize))?;
    let y = be.alloc(device, COUNT * 4)?;
    // Connections are made here, while everyone calls.
    queued(comm.all_reduce(x, y, COUNT, DataType::Int32, ReduceOp::Sum, S), "first AllReduce")?;
    comm.wait_idle()?;
    comm.barrier()?;
    if rank != 0 {
        // Never calls again; rank 0's abort shows here as a failed peer.
        let deadline = Instant::now() + Duration::from_secs(30);
        while comm.async_error() == ResultCode::Success && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let code = comm.async_error();
        comm.abort()?;
        println!("RESULT nb-stuck peer {code:?}");
        return Ok(());
    }
    queued(comm.all_reduce(x, y, COUNT, DataType::Int32, ReduceOp::Sum, S), "stuck AllReduce")?;
    std::thread::sleep(Duration::from_millis(300));
    let code = comm.async_error();
    check(code == ResultCode::InProgress, || format!("async error {code:?} while the peer never called, expected InProgress"))?;
    let t0 = Instant::now();
    comm.abort()?;
    let took = t0.elapsed();
    check(took < Duration::from_secs(1), || format!("abort took {} ms", took.as_millis()))?;
    let after = comm.async_error();
    check(after != ResultCode::InProgress && after != ResultCode::Success, || format!("async error after abort: {after:?}"))?;
    println!("RESULT nb-stuck abort_ms {}", took.as_millis());
    Ok(())
}

pub fn mixed(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    hang_guard(rank, "nb-mixed", 60);
    let parent = Communicator::init_rank_scalable(nranks, rank, ids, test_device(rank), &CommConfig::default())?;
    let child = parent.split(0, rank, Some(&CommConfig::non_blocking()))?.ok_or_else(|| Error::internal("no child"))?;
    poll_done(&child, "split")?;
    let be = std::sync::Arc::clone(parent.backend());
    let device = parent.device()? as usize;
    let n = nranks as usize;
    let ai = DataType::Int32;
    let sum = reduced(n, |a, b| a + b);
    let x = upload(&*be, device, &input(rank as usize))?;
    let untouched = vec![-1i32; COUNT];
    let (y, z) = (upload(&*be, device, &untouched)?, upload(&*be, device, &untouched)?);
    for (first, second, order) in [(&parent, &child, "blocking first"), (&child, &parent, "non-blocking first")] {
        rustccl::group_start();
        let a = first.all_reduce(x, y, COUNT, ai, ReduceOp::Sum, S);
        let b = second.all_reduce(x, z, COUNT, ai, ReduceOp::Sum, S);
        let end = rustccl::group_end();
        check(a.is_ok(), || format!("{order}: the first call returned {a:?}"))?;
        let e = b.err().ok_or_else(|| Error::internal(format!("{order}: mixing was accepted")))?;
        check(e.code == ResultCode::InvalidUsage && e.message.contains("blocking and non-blocking"), || {
            format!("{order}: the mixing call: {e:?}")
        })?;
        let e = end.err().ok_or_else(|| Error::internal(format!("{order}: group_end succeeded")))?;
        check(e.code == ResultCode::InvalidUsage, || format!("{order}: group_end: {e:?}"))?;
        expect_eq(&download(&*be, y, COUNT)?, &untouched, &format!("{order}: the refused group ran"))?;
        expect_eq(&download(&*be, z, COUNT)?, &untouched, &format!("{order}: the refused group ran"))?;
    }
    // Each alone works.
    parent.all_reduce(x, y, COUNT, ai, ReduceOp::Sum, S)?;
    expect_eq(&download(&*be, y, COUNT)?, &sum, "blocking AllReduce")?;
    queued(child.all_reduce(x, z, COUNT, ai, ReduceOp::Sum, S), "non-blocking AllReduce")?;
    child.wait_idle()?;
    expect_eq(&download(&*be, z, COUNT)?, &sum, "non-blocking AllReduce")?;
    // Destroy right behind a queued operation waits for it.
    let w = be.alloc(device, COUNT * 4)?;
    queued(child.all_reduce(z, w, COUNT, ai, ReduceOp::Sum, S), "AllReduce before destroy")?;
    child.destroy()?;
    expect_eq(&download(&*be, w, COUNT)?, &sum.iter().map(|v| v * n as i32).collect::<Vec<_>>(), "AllReduce before destroy")?;
    parent.destroy()?;
    println!("RESULT nb-mixed ok");
    Ok(())
}
