//! End-of-life and network-failure scenarios (host backend):
//!
//! - `destroy-cycles`: `CYCLES` (300) times, a fresh child of one parent communicator (split,
//!   so every cycle makes new connections, and a new proxy), a broadcast from a rotating root
//!   and an all_reduce of a rotating size (`SIZES`, bytes), checked, then destroy at once, with
//!   no barrier: a rank whose last send is still in its network FIFO must deliver it before
//!   its connections close. Run with `NCCL_SHM_DISABLE=1` so that the ranks of this host talk
//!   through the network plugin. `RESULT cycles <n>`.
//! - `net-cut`: a communicator whose ranks run all_reduce calls until one fails (the harness
//!   cuts the network between them after `READY`); each rank prints `RESULT cut <code> <ms>
//!   <message>` where ms is the time from the start of the failing call to its end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustccl::backend::{DeviceBackend, DevicePtr, Stream};
use rustccl::types::DataType;
use rustccl::{CommConfig, Communicator, Error, ReduceOp, UniqueId};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(Error::internal(what()))
    }
}

/// A value every rank can compute for element `i` of rank `r` in cycle `c`.
fn value(c: usize, r: i32, i: usize) -> f32 {
    ((c * 7 + r as usize * 13 + i) % 251) as f32
}

struct Buffers {
    be: Arc<dyn DeviceBackend>,
    stream: Stream,
    x: DevicePtr,
    y: DevicePtr,
}

impl Buffers {
    fn new(comm: &Communicator, bytes: usize) -> Result<Buffers, Error> {
        let be = Arc::clone(comm.backend());
        let device = comm.device()? as usize;
        let stream = be.create_stream(device)?;
        Ok(Buffers { x: be.alloc(device, bytes)?, y: be.alloc(device, bytes)?, be, stream })
    }

    fn put(&self, at: DevicePtr, vals: &[f32]) -> Result<(), Error> {
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.be.copy_to_device(at, &bytes, self.stream)?;
        self.be.synchronize(self.stream)
    }

    fn get(&self, at: DevicePtr, n: usize) -> Result<Vec<f32>, Error> {
        let mut bytes = vec![0u8; n * 4];
        self.be.copy_from_device(&mut bytes, at, self.stream)?;
        Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect())
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        let _ = self.be.free(self.x);
        let _ = self.be.free(self.y);
    }
}

pub fn destroy_cycles(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let cycles: usize = env_or("CYCLES", 300);
    let sizes: Vec<usize> = std::env::var("SIZES")
        .unwrap_or_else(|_| "8,4096,65536,1048576,4194308".into())
        .split(',')
        .map(|s| s.parse().expect("SIZES: byte counts"))
        .collect();
    let parent = Communicator::init_rank_scalable(nranks, rank, ids, 0, &CommConfig::default())?;
    let largest = sizes.iter().max().copied().unwrap_or(8);
    let bufs = Buffers::new(&parent, largest)?;
    for c in 0..cycles {
        let n = sizes[c % sizes.len()] / 4;
        let root = (c % nranks as usize) as i32;
        let child = parent.split(0, rank, None)?.ok_or_else(|| Error::internal("no child"))?;
        let what = |op: &str| format!("cycle {c} ({} bytes, root {root}): {op}", n * 4);
        // Broadcast from the root; the others' destination is poisoned first.
        let mine: Vec<f32> = (0..n).map(|i| value(c, rank, i)).collect();
        bufs.put(bufs.x, &mine)?;
        bufs.put(bufs.y, &vec![f32::NAN; n])?;
        child.broadcast(bufs.x, bufs.y, n, DataType::Float32, root, bufs.stream).map_err(|e| e.context(what("broadcast")))?;
        let got = bufs.get(bufs.y, n)?;
        let bad = (0..n).find(|&i| got[i] != value(c, root, i));
        check(bad.is_none(), || format!("{}: element {} is {}", what("broadcast"), bad.unwrap(), got[bad.unwrap()]))?;
        // An all_reduce last: every rank sends in it.
        child.all_reduce(bufs.x, bufs.y, n, DataType::Float32, ReduceOp::Sum, bufs.stream).map_err(|e| e.context(what("all_reduce")))?;
        let got = bufs.get(bufs.y, n)?;
        let expect = |i: usize| (0..nranks).map(|r| value(c, r, i)).sum::<f32>();
        let bad = (0..n).find(|&i| got[i] != expect(i));
        check(bad.is_none(), || format!("{}: element {} is {}", what("all_reduce"), bad.unwrap(), got[bad.unwrap()]))?;
        // No barrier: destroy as soon as the last call returned.
        child.destroy().map_err(|e| e.context(what("destroy")))?;
    }
    parent.destroy()?;
    println!("RESULT cycles {cycles}");
    Ok(())
}

pub fn net_cut(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let n = env_or("COUNT", 64 << 10);
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, 0, &CommConfig::default())?;
    let bufs = Buffers::new(&comm, n * 4)?;
    bufs.put(bufs.x, &vec![1.0; n])?;
    let run = || comm.all_reduce(bufs.x, bufs.y, n, DataType::Float32, ReduceOp::Sum, bufs.stream);
    // Connections are made while every rank takes part.
    run()?;
    comm.barrier()?;
    println!("READY");
    let limit = Instant::now() + Duration::from_secs(env_or("CUT_LIMIT_S", 120));
    loop {
        let t0 = Instant::now();
        if let Err(e) = run() {
            println!("RESULT cut {:?} {} {}", e.code, t0.elapsed().as_millis(), e.message);
            break;
        }
        check(Instant::now() < limit, || "no call failed after the cut".into())?;
    }
    // The communicator is unusable now: later calls fail at once.
    check(run().is_err(), || "a call after the failure succeeded".into())?;
    comm.abort()?;
    Ok(())
}
