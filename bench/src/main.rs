//! `rustccl-bench`: starts `-N` ranks as local processes (copies of itself) and measures an
//! operation. Today the operation is the bootstrap barrier (the collectives of a later issue
//! join it, with nccl-tests' flags and table).
//!
//! Usage: `rustccl-bench [-N ranks] [-n iters] [-w warmup] [--json] [barrier|allgather-oob]`

mod launch;

use std::time::Instant;

use rustccl::{CommConfig, Communicator, UniqueId};

#[derive(Clone, Debug)]
pub struct Options {
    pub nranks: i32,
    pub iters: usize,
    pub warmup: usize,
    pub json: bool,
    pub op: String,
}

fn usage() -> ! {
    eprintln!("usage: rustccl-bench [-N ranks] [-n iters] [-w warmup] [--json] [barrier|allgather-oob]");
    std::process::exit(2);
}

fn parse(args: &[String]) -> Options {
    let mut o = Options { nranks: 4, iters: 200, warmup: 20, json: false, op: "barrier".into() };
    let mut i = 0;
    let num = |i: usize| -> usize { args.get(i).and_then(|v| v.parse().ok()).unwrap_or_else(|| usage()) };
    while i < args.len() {
        match args[i].as_str() {
            "-N" | "--nranks" => {
                o.nranks = num(i + 1) as i32;
                i += 1;
            }
            "-n" | "--iters" => {
                o.iters = num(i + 1);
                i += 1;
            }
            "-w" | "--warmup_iters" => {
                o.warmup = num(i + 1);
                i += 1;
            }
            "--json" => o.json = true,
            "-h" | "--help" => usage(),
            op if !op.starts_with('-') => o.op = op.to_string(),
            _ => usage(),
        }
        i += 1;
    }
    if o.nranks < 1 || o.iters == 0 || !matches!(o.op.as_str(), "barrier" | "allgather-oob") {
        usage();
    }
    o
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = parse(&args);
    if let Some(rank) = launch::rank_from_env() {
        if let Err(e) = run_rank(&opts, rank) {
            eprintln!("rank {rank}: {e}");
            std::process::exit(1);
        }
        return;
    }
    std::process::exit(launch::launch(&opts, &args));
}

/// One rank: init, time the operation, report.
fn run_rank(opts: &Options, rank: i32) -> rustccl::Result<()> {
    let id = UniqueId::from_hex(&launch::id_from_env()?)?;
    let t_init = Instant::now();
    let comm = Communicator::init_rank_config(opts.nranks, &id, rank, 0, &CommConfig::default())?;
    let init_s = t_init.elapsed().as_secs_f64();
    let payload = vec![rank as u8; 64];
    let op = |comm: &Communicator| -> rustccl::Result<()> {
        match opts.op.as_str() {
            "barrier" => comm.barrier(),
            _ => comm.allgather_bytes(&payload).map(|_| ()),
        }
    };
    for _ in 0..opts.warmup {
        op(&comm)?;
    }
    comm.barrier()?;
    let t0 = Instant::now();
    for _ in 0..opts.iters {
        op(&comm)?;
    }
    let avg_us = t0.elapsed().as_secs_f64() * 1e6 / opts.iters as f64;
    // Rank 0 reports the slowest rank's average.
    let all = comm.allgather_bytes(&avg_us.to_le_bytes())?;
    let worst = all.iter().map(|b| f64::from_le_bytes(b.as_slice().try_into().unwrap())).fold(0.0, f64::max);
    comm.destroy()?;
    if rank == 0 {
        let backend = comm_backend_name();
        if opts.json {
            let j = serde_json::json!({
                "op": opts.op, "nranks": opts.nranks, "iters": opts.iters, "backend": backend,
                "init_s": init_s, "time_us": worst,
            });
            println!("{j}");
        } else {
            println!("# rustccl-bench: {} ranks (processes), backend {backend}, init {:.3} s", opts.nranks, init_s);
            println!("#  {:>14} {:>8} {:>12}", "op", "iters", "time (us)");
            println!("   {:>14} {:>8} {:>12.2}", opts.op, opts.iters, worst);
        }
    }
    Ok(())
}

fn comm_backend_name() -> String {
    std::env::var("RUSTCCL_BACKEND").unwrap_or_else(|_| "host".into())
}
