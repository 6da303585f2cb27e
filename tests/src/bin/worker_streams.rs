//! `coll-streams`: operations of one communicator issued on different streams run in the order
//! they were issued (as NCCL orders them), with no synchronisation by the caller between them.
//!
//! Each rank makes two non-default streams A and B and, for `STREAM_ITERS` rounds: writes fresh
//! inputs X (small integers as float32, from `COLL_SEED`, the round and the rank), then issues
//! AllReduce X → Y on A, AllReduce Y → Z on B, and AllGather Z → W on A, synchronising only at
//! the end of the round. Z is n times the sum of every rank's X, W every rank's Z; both are
//! compared bit for bit with the host's reference (float32 sums of small integers are exact).
//! Output: `RESULT streams: <n> checks, <m> failures`; exit status 1 on any failure.

use rustccl::backend::DevicePtr;
use rustccl::types::DataType;
use rustccl::{CommConfig, Communicator, Error, ReduceOp, UniqueId};

use crate::worker_coll::{mix, test_device, Rng};

const COUNT: usize = 262_147;

fn input(seed: u64, round: u64, rank: usize) -> Vec<f32> {
    let mut rng = Rng::new(mix(&[seed, round, rank as u64, 0x5354]));
    (0..COUNT).map(|_| rng.sym(100) as f32).collect()
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

pub fn streams(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, test_device(rank), &CommConfig::default())?;
    let be = std::sync::Arc::clone(comm.backend());
    let device = comm.device()? as usize;
    let (n, me) = (nranks as usize, rank as usize);
    let seed: u64 = std::env::var("COLL_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let rounds: u64 = std::env::var("STREAM_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let (a, b) = (be.create_stream(device)?, be.create_stream(device)?);
    let bytes = COUNT * 4;
    let alloc = |len: usize| be.alloc(device, len);
    let (x, y, z, w): (DevicePtr, DevicePtr, DevicePtr, DevicePtr) = (alloc(bytes)?, alloc(bytes)?, alloc(bytes)?, alloc(bytes * n)?);
    let (mut checks, mut failures) = (0usize, 0usize);
    for round in 0..rounds {
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(seed, round, r)).collect();
        be.copy_to_device(x, &to_bytes(&inputs[me]), a)?;
        be.synchronize(a)?;
        comm.all_reduce(x, y, COUNT, DataType::Float32, ReduceOp::Sum, a)?;
        comm.all_reduce(y, z, COUNT, DataType::Float32, ReduceOp::Sum, b)?;
        comm.all_gather(z, w, COUNT, DataType::Float32, a)?;
        be.synchronize(a)?;
        be.synchronize(b)?;
        let sum: Vec<f32> = (0..COUNT).map(|i| inputs.iter().map(|v| v[i]).sum::<f32>()).collect();
        let want_z: Vec<f32> = sum.iter().map(|s| s * n as f32).collect();
        let mut got = vec![0u8; bytes * n];
        be.copy_from_device(&mut got[..bytes], z, a)?;
        checks += 1;
        if got[..bytes] != to_bytes(&want_z)[..] {
            failures += 1;
            println!("MISMATCH streams: rank {me} round {round}: Z (AllReduce on B of A's result) differs");
        }
        be.copy_from_device(&mut got, w, a)?;
        checks += 1;
        if got != to_bytes(&want_z.repeat(n)) {
            failures += 1;
            println!("MISMATCH streams: rank {me} round {round}: W (AllGather on A of B's result) differs");
        }
    }
    for p in [x, y, z, w] {
        be.free(p)?;
    }
    be.destroy_stream(a)?;
    be.destroy_stream(b)?;
    comm.destroy()?;
    println!("RESULT streams: {checks} checks, {failures} failures");
    if failures > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// `coll-peer-death`: a rank dies (SIGKILL, by itself) while the others run an AllReduce that
/// needs it. The survivors' operation must end — on a device backend the kernel is stopped by
/// the watchdog and the stream synchronises — within `DEATH_LIMIT_S` (20 s), with `RemoteError`
/// as the communicator's asynchronous error, and abort must return. Prints `RESULT peer-death
/// ended_ms <t> error <code>`; the victim is `VICTIM` (the last rank by default).
pub fn peer_death(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    use rustccl::ResultCode;
    let victim: i32 = std::env::var("VICTIM").ok().and_then(|v| v.parse().ok()).unwrap_or(nranks - 1);
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, test_device(rank), &CommConfig::default())?;
    let be = std::sync::Arc::clone(comm.backend());
    let device = comm.device()? as usize;
    let stream = be.create_stream(device)?;
    let count = 16 << 20;
    let (x, y) = (be.alloc(device, count * 4)?, be.alloc(device, count * 4)?);
    // Connections are made here, while everyone is alive.
    comm.all_reduce(x, y, count, DataType::Float32, ReduceOp::Sum, stream)?;
    be.synchronize(stream)?;
    comm.barrier()?;
    if rank == victim {
        std::thread::sleep(std::time::Duration::from_millis(300));
        // SAFETY: ends this process at once, as a crash would (no goodbye to the peers).
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        std::thread::sleep(std::time::Duration::from_secs(60));
        return Err(Error::internal("the victim survived SIGKILL"));
    }
    let limit: u64 = std::env::var("DEATH_LIMIT_S").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    // A watchdog of the test's own: a hang is a failure with a message, not a silent timeout.
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(limit + 10));
        println!("ERROR InternalError rank {rank} peer-death: still waiting after {} s (hang)", limit + 10);
        std::process::exit(3);
    });
    let t0 = std::time::Instant::now();
    let call = comm.all_reduce(x, y, count, DataType::Float32, ReduceOp::Sum, stream);
    let synced = be.synchronize(stream);
    // The device executor reports through the asynchronous error; give its watchdog a moment.
    while comm.async_error() == ResultCode::Success && t0.elapsed().as_secs() < limit {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let ended = t0.elapsed();
    let code = comm.async_error();
    if code != ResultCode::RemoteError {
        return Err(Error::internal(format!(
            "after the peer died: async error {code:?} (call: {call:?}, synchronize: {synced:?}), expected RemoteError"
        )));
    }
    if ended.as_secs() >= limit {
        return Err(Error::internal(format!("the operation took {} ms to end (limit {limit} s)", ended.as_millis())));
    }
    comm.abort()?;
    println!("RESULT peer-death ended_ms {} error {code:?}", ended.as_millis());
    Ok(())
}
