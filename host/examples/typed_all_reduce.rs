//! An all-reduce with the typed API, ranks as processes on the host backend.
//!
//! Run: `cargo run --release --example typed_all_reduce [nranks]` (default 2). The program
//! starts as the launcher: it makes the unique id and starts `nranks` copies of itself, one
//! per rank (`--rank R --nranks N --id HEX`), as an MPI or Slurm launcher would (under
//! torchrun or Slurm, `Communicator::from_env` reads the rank and id from the environment
//! instead). Each rank all-reduces a vector, checks the sum, and exits 0.

use std::process::Command;

use rustccl::typed::prelude::*;
use rustccl::UniqueId;

fn rank_main(rank: u32, nranks: u32, id: &UniqueId) -> Result<(), rustccl::typed::Error> {
    let comm = Comm::init(nranks, id, Rank::new(rank))?;
    // Rank r contributes r + 1 everywhere; the sum is n (n + 1) / 2.
    let mine = vec![(rank + 1) as f32; 1 << 16];
    let mut sum = vec![0.0f32; mine.len()];
    comm.all_reduce(&mine, &mut sum, Op::Sum, &Stream::DEFAULT)?.wait()?;
    let want = (nranks * (nranks + 1) / 2) as f32;
    assert!(sum.iter().all(|&x| x == want), "rank {rank}: got {}, expected {want}", sum[0]);
    println!("rank {rank} of {nranks}: all_reduce gave {want} in every element");
    Ok(()) // dropping `comm` finalizes and destroys it
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // A rank: --rank R --nranks N --id HEX.
    if let Some(i) = args.iter().position(|a| a == "--rank") {
        let get = |flag: &str| args.iter().position(|a| a == flag).and_then(|j| args.get(j + 1)).expect(flag).clone();
        let rank: u32 = args[i + 1].parse().expect("--rank");
        let nranks: u32 = get("--nranks").parse().expect("--nranks");
        let id = UniqueId::from_hex(&get("--id")).expect("--id");
        if let Err(e) = rank_main(rank, nranks, &id) {
            eprintln!("rank {rank}: {e}");
            std::process::exit(1);
        }
        return;
    }
    // The launcher.
    let nranks: u32 = args.get(1).map(|n| n.parse().expect("nranks")).unwrap_or(2);
    std::env::set_var("RUSTCCL_BACKEND", std::env::var("RUSTCCL_BACKEND").unwrap_or_else(|_| "host".into()));
    let id = rustccl::get_unique_id().expect("get_unique_id");
    let me = std::env::current_exe().expect("current_exe");
    let children: Vec<_> = (0..nranks)
        .map(|r| {
            Command::new(&me)
                .args(["--rank", &r.to_string(), "--nranks", &nranks.to_string(), "--id", &id.to_hex()])
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
