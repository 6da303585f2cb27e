//! `rustccl-bench`: nccl-tests for rustccl. Starts `-N` ranks (default: one per GPU on the
//! CUDA backend, 4 on the host backend; see `layout`) as local processes (copies of itself)
//! and sweeps an operation over sizes; rank 0 prints nccl-tests' table. See `--help`.

use rustccl_bench::driver::cabi::{id_from_hex, CDriver};
use rustccl_bench::driver::rust::RustDriver;
use rustccl_bench::driver::Driver;
use rustccl_bench::{bench, launch, opts, tune};

fn main() {
    let mut argv = std::env::args();
    let prog = argv.next().and_then(|p| {
        std::path::Path::new(&p)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
    });
    let args: Vec<String> = argv.collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{}", opts::USAGE);
        return;
    }
    let o = match opts::parse(&args, prog.as_deref()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("rustccl-bench: {e}");
            std::process::exit(2);
        }
    };
    if let Some(rank) = launch::rank_from_env() {
        std::process::exit(run_rank(&o, rank));
    }
    if o.tune {
        std::process::exit(tune::run(&o));
    }
    std::process::exit(launch::launch(&o, &args));
}

/// One rank: join, run the sweep, leave. Returns the exit status.
fn run_rank(o: &opts::Options, rank: usize) -> i32 {
    let result = (|| -> Result<bench::Outcome, String> {
        let id = launch::id_from_env()?;
        let mut drv: Box<dyn Driver> = match &o.lib {
            Some(lib) => Box::new(CDriver::new(
                lib,
                o.cudart.as_deref(),
                o.host_memory,
                o.nranks,
                rank,
                &id_from_hex(&id)?,
            )?),
            None => {
                let id = rustccl::UniqueId::from_hex(&id).map_err(|e| format!("unique id: {e}"))?;
                Box::new(RustDriver::new(o.nranks, rank, &id)?.with_cudart(o.cudart.clone()))
            }
        };
        let outcome = bench::run(o, drv.as_mut());
        let finish = drv.finish();
        let outcome = outcome?;
        finish?;
        Ok(outcome)
    })();
    match result {
        Ok(out) if out.wrong_total > 0 => bench::EXIT_WRONG_DATA,
        Ok(_) => 0,
        Err(e) => {
            eprintln!("rustccl-bench: rank {rank}: {e}");
            1
        }
    }
}
