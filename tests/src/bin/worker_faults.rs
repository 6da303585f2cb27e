//! Fault scenarios: ranks that call different operations, ranks that never call, hang
//! reports and operation timeouts. Each runs on the host backend (CI) and on devices.
//!
//! - `fault-mismatch`: after a warm-up AllReduce and a barrier, rank `ODD_RANK` (1) calls a
//!   different operation (`MISMATCH`: `type` Int32 instead of Float32, `kind` Broadcast instead
//!   of AllReduce, `count` one element more). Every rank must see the operation end with an
//!   error (the call's, or the asynchronous error on devices): `RESULT mismatch <code> <ms>
//!   <message>`, where ms is the time from the call to the error. Later operations fail too,
//!   except after `RUSTCCL_CHECK_COLLECTIVES` refused the group before it ran.
//! - `fault-hang`: rank `ABSENT` (the last) stays away from an AllReduce for `ABSENT_S` seconds
//!   (3) while the others wait. `HANG_MODE=report`: it then joins and everyone completes (the
//!   log holds the hang reports). `HANG_MODE=timeout`: the others' operation ends with Timeout;
//!   the absent rank's late call fails with Timeout too; then every rank shrinks the
//!   communicator (excluding nobody) and runs an AllReduce on the new one.
//! - `fault-abort-stuck`: rank `ABSENT` (the last) never calls; the others start an AllReduce
//!   and another thread aborts the communicator 0.5 s later. The operation must end (the call
//!   on the host backend, the stream on devices) and the abort return, each within 1 s:
//!   `RESULT abort-stuck <abort ms> <end ms>`.
//! - `fault-report`: rank 0 asks for a report through the Rust API and by the signal SIGUSR1
//!   while the others wait in a barrier; every rank then destroys its communicator.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustccl::backend::{DeviceBackend, DevicePtr, Stream};
use rustccl::types::DataType;
use rustccl::{CommConfig, Communicator, Error, ReduceOp, ResultCode, ShrinkFlags, UniqueId};

use crate::worker_coll::test_device;

const COUNT: usize = 1024;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Setup {
    comm: Communicator,
    be: Arc<dyn DeviceBackend>,
    stream: Stream,
    x: DevicePtr,
    y: DevicePtr,
}

/// As `setup_then_barrier`, without the barrier.
fn setup_no_barrier(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<Setup, Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, test_device(rank), &CommConfig::default())?;
    let be = Arc::clone(comm.backend());
    let device = comm.device()? as usize;
    let stream = be.create_stream(device)?;
    let (x, y) = (be.alloc(device, (COUNT + 1) * 8)?, be.alloc(device, (COUNT + 1) * 8)?);
    be.copy_to_device(x, &vec![1u8; (COUNT + 1) * 8], stream)?;
    // Connections are made here, while everyone takes part.
    comm.all_reduce(x, y, COUNT, DataType::Float32, ReduceOp::Sum, stream)?;
    be.synchronize(stream)?;
    Ok(Setup { comm, be, stream, x, y })
}

/// A communicator, buffers, a warm-up AllReduce (connections are made while everyone takes
/// part) and a barrier.
fn setup(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<Setup, Error> {
    let s = setup_no_barrier(nranks, rank, ids)?;
    s.comm.barrier()?;
    Ok(s)
}

/// Waits for the operation's end: the call's error, the stream's, or the asynchronous error.
fn outcome(s: &Setup, call: Result<(), Error>, limit: Duration) -> Option<Error> {
    let t0 = Instant::now();
    if let Err(e) = call {
        return Some(e);
    }
    if let Err(e) = s.be.synchronize(s.stream) {
        return Some(e);
    }
    while t0.elapsed() < limit {
        if let Some(e) = s.comm.async_error_detail() {
            return Some(e);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// A watchdog of the scenario's own: a hang is a failure with a message.
fn hang_guard(rank: i32, secs: u64, what: &'static str) {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(secs));
        println!("ERROR InternalError rank {rank} {what}: still running after {secs} s (hang)");
        std::process::exit(3);
    });
}

pub fn mismatch(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let s = setup_no_barrier(nranks, rank, ids)?;
    hang_guard(rank, 30, "fault-mismatch");
    if let Err(e) = s.comm.barrier() {
        // A rank that left the barrier first may have failed and told this one, still in it:
        // the failure reached this rank in the operation it was in.
        println!("RESULT mismatch {:?} 0 {}", e.code, e.message.replace('\n', " "));
        s.comm.abort()?;
        return Ok(());
    }
    let odd = rank == env_or("ODD_RANK", 1);
    let what = std::env::var("MISMATCH").unwrap_or_else(|_| "type".into());
    let t0 = Instant::now();
    let call = match (what.as_str(), odd) {
        ("type", true) => s.comm.all_reduce(s.x, s.y, COUNT, DataType::Int32, ReduceOp::Sum, s.stream),
        ("kind", true) => s.comm.broadcast(s.x, s.y, COUNT, DataType::Float32, 0, s.stream),
        ("count", true) => s.comm.all_reduce(s.x, s.y, COUNT + 1, DataType::Float32, ReduceOp::Sum, s.stream),
        // On the host backend with RUSTCCL_HOST_SMALL_BYTES=64: the board of small collectives
        // for these ranks, the FIFOs for the odd one (COUNT is above the limit).
        ("way", false) => s.comm.all_reduce(s.x, s.y, 2, DataType::Float32, ReduceOp::Sum, s.stream),
        // With RUSTCCL_HOST_SINGLE_COPY_BYTES=64: single copies from the peers' buffers for
        // the odd rank (4 KiB per rank), the board for the others (32 B); then both ways
        // single copies, with other counts.
        ("gather-way", true) => s.comm.all_gather(s.x, s.y, COUNT, DataType::Float32, s.stream),
        ("gather-way", false) => s.comm.all_gather(s.x, s.y, 8, DataType::Float32, s.stream),
        ("gather-count", true) => s.comm.all_gather(s.x, s.y, COUNT - 24, DataType::Float32, s.stream),
        ("gather-count", false) => s.comm.all_gather(s.x, s.y, COUNT, DataType::Float32, s.stream),
        _ => s.comm.all_reduce(s.x, s.y, COUNT, DataType::Float32, ReduceOp::Sum, s.stream),
    };
    let e = outcome(&s, call, Duration::from_secs(20)).ok_or_else(|| Error::internal("the mismatched operation succeeded"))?;
    let ms = t0.elapsed().as_millis();
    let later = s.comm.all_reduce(s.x, s.y, COUNT, DataType::Float32, ReduceOp::Sum, s.stream);
    if e.message.contains("RUSTCCL_CHECK_COLLECTIVES") {
        // Caught before anything ran: the communicator goes on.
        if let Some(e) = outcome(&s, later, Duration::from_millis(100)) {
            return Err(e.context("the operation after a refused group"));
        }
        println!("RESULT mismatch {:?} {ms} {}", e.code, e.message.replace('\n', " "));
        s.comm.barrier()?;
        s.comm.destroy()?;
        return Ok(());
    } else if later.is_ok() && s.comm.async_error() == ResultCode::Success {
        // A later operation fails at once with the same cause.
        return Err(Error::internal("an operation after the failure was accepted"));
    }
    println!("RESULT mismatch {:?} {ms} {}", e.code, e.message.replace('\n', " "));
    s.comm.abort()?;
    Ok(())
}

pub fn hang(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let s = setup(nranks, rank, ids)?;
    hang_guard(rank, 40, "fault-hang");
    let absent = rank == nranks - 1;
    let mode = std::env::var("HANG_MODE").unwrap_or_else(|_| "report".into());
    if absent {
        std::thread::sleep(Duration::from_secs(env_or("ABSENT_S", 3)));
    }
    let t0 = Instant::now();
    let call = s.comm.all_reduce(s.x, s.y, COUNT, DataType::Float32, ReduceOp::Sum, s.stream);
    let end = outcome(&s, call, Duration::from_millis(if mode == "timeout" { 20_000 } else { 200 }));
    let ms = t0.elapsed().as_millis();
    match (mode.as_str(), end) {
        ("report", None) => {
            s.comm.destroy()?;
            println!("RESULT hang completed {ms}");
            Ok(())
        }
        ("timeout", Some(e)) => {
            println!("RESULT hang {:?} {ms} {}", e.code, e.message.replace('\n', " "));
            let child = s.comm.shrink(&[], None, ShrinkFlags::Default)?;
            let device = child.device()? as usize;
            let stream = s.be.create_stream(device)?;
            child.all_reduce(s.x, s.y, COUNT, DataType::Float32, ReduceOp::Sum, stream)?;
            s.be.synchronize(stream)?;
            child.destroy()?;
            s.comm.abort()?;
            println!("RESULT shrunk ok");
            Ok(())
        }
        (_, e) => Err(Error::internal(format!("mode {mode}: unexpected end {e:?} after {ms} ms"))),
    }
}

pub fn report(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let s = setup(nranks, rank, ids)?;
    hang_guard(rank, 30, "fault-report");
    if rank == 0 {
        let text = s.comm.hang_report()?;
        let lines = text.lines().count();
        if lines != 1 + nranks as usize {
            return Err(Error::internal(format!("the report has {lines} lines:\n{text}")));
        }
        println!("RESULT report api {}", text.lines().skip(1).filter(|l| l.contains("pid ")).count());
        // Peers log one report per RUSTCCL_HANG_REPORT_S: let the window pass.
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: sends this process the report signal; the library handles it.
        unsafe { libc::raise(libc::SIGUSR1) };
        std::thread::sleep(Duration::from_millis(500));
    }
    s.comm.barrier()?;
    s.comm.destroy()?;
    println!("RESULT report done");
    Ok(())
}

pub fn abort_stuck(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let s = setup(nranks, rank, ids)?;
    hang_guard(rank, 30, "fault-abort-stuck");
    if rank == nranks - 1 {
        // Never calls; leaves once the others have aborted (they are seen to go).
        let t0 = Instant::now();
        while s.comm.async_error() == ResultCode::Success && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
        s.comm.abort()?;
        println!("RESULT abort-stuck absent");
        return Ok(());
    }
    let (abort_ms, end_ms) = std::thread::scope(|scope| {
        let aborter = scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(500));
            let t0 = Instant::now();
            let r = s.comm.abort();
            (t0.elapsed().as_millis(), r)
        });
        let t0 = Instant::now();
        let call = s.comm.all_reduce(s.x, s.y, COUNT, DataType::Float32, ReduceOp::Sum, s.stream);
        let synced = s.be.synchronize(s.stream);
        let end = t0.elapsed().as_millis();
        let (abort_ms, r) = aborter.join().expect("aborter");
        r.map(|_| (abort_ms, end.saturating_sub(500), call, synced))
    })
    .map(|(a, e, call, synced)| {
        println!("NOTE call {call:?} synchronize {synced:?}");
        (a, e)
    })?;
    println!("RESULT abort-stuck {abort_ms} {end_ms}");
    Ok(())
}
