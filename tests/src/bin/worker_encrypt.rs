//! Workers of tests/tests/encryption.rs: traffic with a known plaintext pattern, a checked
//! all_reduce (for a byte altered in flight), and the all_reduce sweep of the encryption
//! benchmark.

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

/// The encryption benchmark: all_reduce of f32 sums from 1 MiB to `SWEEP_MAX_MIB` (default
/// 1024) MiB, doubling, on two communicators of the same ranks: one without a key, then one
/// with the key `SWEEP_PSK` (set with [`rustccl::set_encryption`] between the two inits).
/// Per size, `SWEEP_ROUNDS` (default 3) rounds, each timing the plain communicator and then
/// the encrypted one (the best of a few runs each), so that both see the same machine (its
/// load moves by 2x from minute to minute). `RESULT sweep <bytes> <plain GB/s> <encrypted
/// GB/s> <ratio> cpu_s/GB <plain> <encrypted>`: the medians over the rounds of each rate and
/// of the per-round ratio, then this process's CPU seconds per GB all-reduced in each.
pub fn sweep(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let psk = std::env::var("SWEEP_PSK").map_err(|_| Error::invalid_argument("set SWEEP_PSK to the key of the encrypted communicator"))?;
    let plain = Communicator::init_rank_scalable(nranks, rank, ids, crate::worker_coll::test_device(rank), &CommConfig::default())?;
    rustccl::set_encryption(Some(psk.as_bytes()))?;
    let secure_ids = [rustccl::get_unique_id()?];
    let secure = Communicator::init_rank_scalable(nranks, rank, &secure_ids, crate::worker_coll::test_device(rank), &CommConfig::default())?;
    let be = plain.backend().clone();
    let dev = plain.device()? as usize;
    let stream = be.create_stream(dev)?;
    let max_mib: usize = std::env::var("SWEEP_MAX_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(1024);
    let rounds: usize = std::env::var("SWEEP_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3).max(1);
    let buf = be.alloc(dev, max_mib << 20)?;
    be.memset(buf, 0, max_mib << 20, stream)?;
    // The best of `iters` timed all_reduces of `bytes` on `comm`, as GB/s; `cpu` adds the
    // process's CPU time over them.
    let rate = |comm: &Communicator, bytes: usize, iters: usize, cpu: &mut f64| -> Result<f64, Error> {
        let mut best = f64::MAX;
        let cpu0 = cpu_seconds();
        for _ in 0..iters {
            comm.barrier()?;
            let t = Instant::now();
            comm.all_reduce(buf, buf, bytes / 4, DataType::Float32, ReduceOp::Sum, stream)?;
            be.synchronize(stream)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        *cpu += cpu_seconds() - cpu0;
        Ok(bytes as f64 / best / 1e9)
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut mib = 1;
    while mib <= max_mib {
        let bytes = mib << 20;
        let iters = (256 / mib).clamp(2, 8);
        let (mut pcpu, mut ecpu) = (0.0, 0.0);
        rate(&plain, bytes, 1, &mut 0.0)?;
        rate(&secure, bytes, 1, &mut 0.0)?;
        let (mut p, mut e, mut r) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            p.push(rate(&plain, bytes, iters, &mut pcpu)?);
            e.push(rate(&secure, bytes, iters, &mut ecpu)?);
            r.push(e[e.len() - 1] / p[p.len() - 1]);
        }
        // CPU seconds per GB all-reduced, this rank.
        let gb = (rounds * iters * bytes) as f64 / 1e9;
        println!(
            "RESULT sweep {bytes} {:.3} {:.3} {:.2} cpu_s/GB {:.2} {:.2}",
            median(p),
            median(e),
            median(r),
            pcpu / gb,
            ecpu / gb
        );
        mib *= 2;
    }
    secure.destroy()?;
    plain.destroy()
}

/// This process's CPU time so far (user and system, all threads), in seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given; a zeroed rusage is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// All-reduces 8 MiB of f32 (rank r contributes r + 1 + i % 7 at element i) and checks every
/// element: `RESULT checked ok`, or the error (an altered byte must give an error, never a
/// wrong sum: `Internal` "wrong data" is what the test must not see).
pub fn checked_all_reduce(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, crate::worker_coll::test_device(rank), &CommConfig::default())?;
    let be = comm.backend().clone();
    let dev = comm.device()? as usize;
    let stream = be.create_stream(dev)?;
    let count = 2 << 20;
    let mine: Vec<f32> = (0..count).map(|i| (rank + 1) as f32 + (i % 7) as f32).collect();
    let buf = be.alloc(dev, count * 4)?;
    let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
    be.copy_to_device(buf, &bytes, stream)?;
    comm.all_reduce(buf, buf, count, DataType::Float32, ReduceOp::Sum, stream)?;
    let mut out = vec![0u8; count * 4];
    be.copy_from_device(&mut out, buf, stream)?;
    be.synchronize(stream)?;
    let ranks_sum = (nranks * (nranks + 1) / 2) as f32;
    for (i, v) in out.chunks(4).enumerate() {
        let got = f32::from_le_bytes(v.try_into().unwrap());
        let want = ranks_sum + (nranks as usize * (i % 7)) as f32;
        if got != want {
            return Err(Error::internal(format!("all_reduce delivered wrong data: element {i} is {got}, not {want}")));
        }
    }
    println!("RESULT checked ok");
    comm.destroy()
}
