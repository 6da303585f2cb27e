//! Several communicators in one process, one per device, driven by one thread
//! (`Comm::init_all`, NCCL's `ncclCommInitAll`), on the host backend: every rank's
//! operations go into one group, which runs them together.
//!
//! Run: `cargo run --release --example multi_device [ndevices]` (default 4).

use rustccl::typed::prelude::*;

fn main() -> Result<(), rustccl::typed::Error> {
    std::env::set_var("RUSTCCL_BACKEND", std::env::var("RUSTCCL_BACKEND").unwrap_or_else(|_| "host".into()));
    let n: i32 = std::env::args().nth(1).map(|a| a.parse().expect("ndevices")).unwrap_or(4);
    let devices: Vec<i32> = (0..n).collect();
    let comms = Comm::init_all(&devices)?;

    // One buffer per device, in that device's memory (a DeviceBuffer works on GPUs too).
    let mut bufs = comms
        .iter()
        .map(|c| c.buffer_from(&vec![c.rank().get() as f64; 1000]))
        .collect::<Result<Vec<_>, _>>()?;

    // One thread drives every rank: without a group, rank 0's all-reduce would wait for the
    // others forever.
    comms[0].group(|g| {
        for (comm, buf) in comms.iter().zip(bufs.iter_mut()) {
            g.on(comm).all_reduce_in_place(buf, Op::Sum, &Stream::DEFAULT)?;
        }
        Ok(())
    })?;

    let want = (n * (n - 1) / 2) as f64;
    for (comm, buf) in comms.iter().zip(&bufs) {
        let v = buf.to_vec()?;
        assert!(v.iter().all(|&x| x == want), "device {}: got {}, expected {want}", comm.device(), v[0]);
    }

    // Then an all-gather of each device's rank, host memory this time.
    let mut gathered = vec![vec![0u32; n as usize]; n as usize];
    let mine: Vec<[u32; 1]> = comms.iter().map(|c| [c.rank().get()]).collect();
    comms[0].group(|g| {
        for ((comm, out), m) in comms.iter().zip(gathered.iter_mut()).zip(&mine) {
            g.on(comm).all_gather(m, out, &Stream::DEFAULT)?;
        }
        Ok(())
    })?;
    assert!(gathered.iter().all(|g| g.iter().copied().eq(0..n as u32)));
    println!("{n} devices: all_reduce gave {want} everywhere; all_gather gave {:?}", gathered[0]);
    Ok(()) // the communicators are finalized and destroyed as they drop
}
