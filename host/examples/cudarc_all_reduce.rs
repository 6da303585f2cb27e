//! An all-reduce on GPU memory owned by cudarc (`CudaSlice<f32>`, `CudaStream`), ranks as
//! processes: by default 2 ranks on device 0, which needs NVIDIA's MPS
//! (`nvidia-cuda-mps-control -d`) so that their kernels run side by side; with several GPUs,
//! `--per-gpu` puts rank r on device r.
//!
//! Needs the `cudarc` feature and a CUDA driver:
//! `RUSTCCL_BACKEND=cuda cargo run --release --features cudarc --example cudarc_all_reduce`.
//!
//! Run on one H200 with MPS (2026-12-01, session 5): both ranks got 3 and the ring check passed.

use std::process::Command;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use rustccl::typed::prelude::*;
use rustccl::UniqueId;

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn rank_main(rank: u32, nranks: u32, device: i32, id: &UniqueId) -> Res {
    let config = rustccl::CommConfig::default();
    let comm = Comm::init_config(nranks, id, Rank::new(rank), device, &config)?;
    let stream: Arc<CudaStream> = CudaContext::new(device as usize)?.new_stream()?;
    let n = 1 << 20;
    let mut grads = stream.clone_htod(&vec![(rank + 1) as f32; n])?;
    // cudarc orders this after the upload and records the all-reduce on `grads`, so the
    // download below waits for it even before `wait()`.
    let pending = comm.all_reduce_in_place(&mut grads, Op::Sum, &stream)?;
    pending.wait()?;
    let host = stream.clone_dtoh(&grads)?;
    let want = (nranks * (nranks + 1) / 2) as f32;
    if let Some(bad) = host.iter().position(|&x| x != want) {
        return Err(format!("rank {rank}: element {bad} is {}, expected {want}", host[bad]).into());
    }
    // A typed group of a send and a receive on cudarc views.
    let next = Rank::new((rank + 1) % nranks);
    let prev = Rank::new((rank + nranks - 1) % nranks);
    let out = stream.clone_htod(&[rank as f32; 4])?;
    let mut got = stream.alloc_zeros::<f32>(8)?;
    let mut first_half = got.slice_mut(0..4); // a view: it must outlive the group
    comm.group(|g| {
        g.send(&out, next, &stream)?;
        g.recv(&mut first_half, prev, &stream)
    })?;
    drop(first_half);
    let got = stream.clone_dtoh(&got)?;
    if got[..4] != [prev.get() as f32; 4] || got[4..] != [0.0; 4] {
        return Err(format!("rank {rank}: ring gave {got:?}").into());
    }
    println!("rank {rank} on device {device}: all_reduce gave {want}, ring ok");
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let get = |flag: &str| args.iter().position(|a| a == flag).and_then(|j| args.get(j + 1)).cloned();
    if let Some(rank) = get("--rank") {
        let rank: u32 = rank.parse().expect("--rank");
        let nranks: u32 = get("--nranks").expect("--nranks").parse().expect("--nranks");
        let device: i32 = get("--device").expect("--device").parse().expect("--device");
        let id = UniqueId::from_hex(&get("--id").expect("--id")).expect("--id");
        if let Err(e) = rank_main(rank, nranks, device, &id) {
            eprintln!("rank {rank}: {e}");
            std::process::exit(1);
        }
        return;
    }
    std::env::set_var("RUSTCCL_BACKEND", "cuda");
    let per_gpu = args.iter().any(|a| a == "--per-gpu");
    let nranks: u32 = get("--nranks").map(|n| n.parse().expect("--nranks")).unwrap_or(2);
    let id = rustccl::get_unique_id().expect("get_unique_id");
    let me = std::env::current_exe().expect("current_exe");
    let children: Vec<_> = (0..nranks)
        .map(|r| {
            let device = if per_gpu { r } else { 0 };
            Command::new(&me)
                .args(["--rank", &r.to_string(), "--nranks", &nranks.to_string(), "--device", &device.to_string(), "--id", &id.to_hex()])
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let failed = children.into_iter().map(|mut c| c.wait().expect("wait")).filter(|s| !s.success()).count();
    if failed > 0 {
        eprintln!("{failed} of {nranks} ranks failed");
        std::process::exit(1);
    }
    println!("all {nranks} ranks done");
}
