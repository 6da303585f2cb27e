//! Workers of tests/tests/encryption.rs: traffic with a known plaintext pattern, and the
//! all_reduce sweep of the encryption benchmark.

use std::time::Instant;

use rustccl::types::DataType;
use rustccl::{CommConfig, Communicator, Error, ReduceOp, UniqueId};

/// What every rank sends: a pattern a capture of the wire can look for.
pub const PATTERN: &[u8] = b"RUSTCCL-PLAINTEXT-PATTERN-";

/// All-gathers 4 MiB of the pattern per rank (every byte crosses the network between
/// namespaces as it is) and checks what arrived; `RESULT pattern ok`.
pub fn pattern(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, crate::worker_coll::test_device(rank), &CommConfig::default())?;
    let be = comm.backend().clone();
    let dev = comm.device()? as usize;
    let stream = be.create_stream(dev)?;
    let per = 4 << 20;
    let mine: Vec<u8> = PATTERN.iter().copied().cycle().take(per).collect();
    let send = be.alloc(dev, per)?;
    let recv = be.alloc(dev, per * nranks as usize)?;
    be.copy_to_device(send, &mine, stream)?;
    comm.all_gather(send, recv, per, DataType::Uint8, stream)?;
    let mut all = vec![0u8; per * nranks as usize];
    be.copy_from_device(&mut all, recv, stream)?;
    be.synchronize(stream)?;
    if all.chunks(per).any(|c| c != &mine[..]) {
        return Err(Error::internal("all_gather delivered wrong data"));
    }
    println!("RESULT pattern ok");
    comm.destroy()
}

/// All-reduce of f32 sums from 1 MiB to `SWEEP_MAX_MIB` (default 1024) MiB, doubling: per
/// size, the best of a few runs as algorithm bandwidth; `RESULT sweep <bytes> <GB/s>`.
pub fn sweep(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, crate::worker_coll::test_device(rank), &CommConfig::default())?;
    let be = comm.backend().clone();
    let dev = comm.device()? as usize;
    let stream = be.create_stream(dev)?;
    let max_mib: usize = std::env::var("SWEEP_MAX_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(1024);
    let buf = be.alloc(dev, max_mib << 20)?;
    be.memset(buf, 0, max_mib << 20, stream)?;
    let mut mib = 1;
    while mib <= max_mib {
        let bytes = mib << 20;
        let iters = (256 / mib).clamp(2, 8);
        comm.all_reduce(buf, buf, bytes / 4, DataType::Float32, ReduceOp::Sum, stream)?;
        be.synchronize(stream)?;
        let mut best = f64::MAX;
        for _ in 0..iters {
            comm.barrier()?;
            let t = Instant::now();
            comm.all_reduce(buf, buf, bytes / 4, DataType::Float32, ReduceOp::Sum, stream)?;
            be.synchronize(stream)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("RESULT sweep {bytes} {:.3}", bytes as f64 / best / 1e9);
        mib *= 2;
    }
    comm.destroy()
}
