//! Starting ranks as local processes: the launcher makes a unique id (its root runs in the
//! launcher), starts one copy of this program per rank with the rank and id in the
//! environment, and waits for all of them.

use std::process::{Command, Stdio};

use crate::Options;

const RANK_VAR: &str = "RUSTCCL_BENCH_RANK";
const ID_VAR: &str = "RUSTCCL_BENCH_ID";

/// The rank this process runs, when the launcher started it.
pub fn rank_from_env() -> Option<i32> {
    std::env::var(RANK_VAR).ok().and_then(|v| v.parse().ok())
}

pub fn id_from_env() -> rustccl::Result<String> {
    std::env::var(ID_VAR).map_err(|_| rustccl::Error::invalid_usage(format!("{ID_VAR} is not set")))
}

/// Starts every rank and returns the exit status for the launcher.
pub fn launch(opts: &Options, args: &[String]) -> i32 {
    let id = match rustccl::get_unique_id() {
        Ok(id) => id,
        Err(e) => {
            eprintln!("rustccl-bench: {e}");
            return 1;
        }
    };
    let exe = std::env::current_exe().expect("own executable");
    let mut children = Vec::new();
    for rank in 0..opts.nranks {
        let child = Command::new(&exe)
            .args(args)
            .env(RANK_VAR, rank.to_string())
            .env(ID_VAR, id.to_hex())
            .stdin(Stdio::null())
            .spawn();
        match child {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                eprintln!("rustccl-bench: cannot start rank {rank}: {e}");
                for (_, c) in children.iter_mut() {
                    let _ = c.kill();
                }
                return 1;
            }
        }
    }
    let mut status = 0;
    for (rank, mut c) in children {
        match c.wait() {
            Ok(s) if s.success() => {}
            Ok(s) => {
                eprintln!("rustccl-bench: rank {rank} exited with {s}");
                status = 1;
            }
            Err(e) => {
                eprintln!("rustccl-bench: waiting for rank {rank}: {e}");
                status = 1;
            }
        }
    }
    status
}
