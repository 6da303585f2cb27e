//! Starting ranks as local processes: the launcher makes the unique id (its rendezvous root
//! runs in the launcher: rustccl's `get_unique_id`, or the library's `ncclGetUniqueId` with
//! `--lib`), starts one copy of this program per rank with the rank and the id (hex) in the
//! environment, and waits for all of them. When a rank fails the others are stopped after a
//! short grace, and `-T` stops them all after that many seconds. Before that it picks the
//! ranks and deals with MPS ([`crate::layout`]).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench::EXIT_WRONG_DATA;
use crate::layout::{self, MpsAction};
use crate::mps;
use crate::opts::Options;

pub const RANK_VAR: &str = "RUSTCCL_BENCH_RANK";
pub const ID_VAR: &str = "RUSTCCL_BENCH_ID";

/// How long the other ranks may run on after one failed.
const GRACE: Duration = Duration::from_secs(3);

/// The rank this process runs, when the launcher started it.
pub fn rank_from_env() -> Option<usize> {
    std::env::var(RANK_VAR).ok().and_then(|v| v.parse().ok())
}

pub fn id_from_env() -> Result<String, String> {
    std::env::var(ID_VAR).map_err(|_| format!("{ID_VAR} is not set"))
}

/// The unique id the ranks join, as hex.
fn make_id(opts: &Options) -> Result<String, String> {
    match &opts.lib {
        Some(lib) => {
            let api = crate::driver::cabi::NcclApi::load(lib)?;
            let id = api.unique_id()?;
            Ok(crate::driver::cabi::id_to_hex(&id))
        }
        None => rustccl::get_unique_id()
            .map(|id| id.to_hex())
            .map_err(|e| format!("get_unique_id: {e}")),
    }
}

fn kill_all(children: &mut [(usize, Child, Option<i32>)]) {
    for (_, c, status) in children.iter_mut() {
        if status.is_none() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Picks the ranks ([`layout::plan`]), starts MPS when asked and needed or says in one line
/// that ranks time-slice, runs them (`run_ranks`) and stops the MPS daemon it started.
/// Returns the exit status for the launcher (2 for a root beyond the picked ranks, as for
/// other bad arguments).
pub fn launch(opts: &Options, args: &[String]) -> i32 {
    let plan = layout::plan(
        layout::probe_gpus(opts),
        opts.nranks_given.then_some(opts.nranks),
        mps::running(),
        opts.start_mps
            || layout::start_allowed_by_env(std::env::var(layout::START_MPS_VAR).ok().as_deref()),
    );
    let mut opts = opts.clone();
    let mut args = args.to_vec();
    if !opts.nranks_given {
        opts.nranks = plan.nranks;
        args.push(format!("--nranks={}", plan.nranks));
        if let Err(e) = opts.check_root() {
            eprintln!("rustccl-bench: {e}");
            return 2;
        }
    }
    let daemon = match &plan.mps {
        MpsAction::Nothing => None,
        MpsAction::Warn(line) => {
            eprintln!("{line}");
            None
        }
        MpsAction::Start(line) => {
            eprintln!("{line}");
            match mps::Daemon::start() {
                Ok(d) => Some(d),
                Err(e) => {
                    eprintln!("rustccl-bench: could not start MPS: {e}; the ranks that share a GPU time-slice");
                    None
                }
            }
        }
    };
    let status = if opts.libs.len() > 1 || opts.plot.is_some() {
        run_series(&opts, &args)
    } else {
        run_ranks(&opts, &args, &[])
    };
    if let Some(d) = daemon {
        if let Err(e) = d.stop() {
            eprintln!("rustccl-bench: stopping MPS: {e}");
        }
    }
    status
}

/// Runs the sweep once per library of `--lib` (one after the other, each under a `# Library:`
/// line), and with `--plot` draws every run's rows into one SVG ([`crate::plot`]).
fn run_series(opts: &Options, args: &[String]) -> i32 {
    use crate::plot::{self, ROWS_VAR};
    let runs = plot::series_runs(&opts.libs, args);
    let mut status = 0;
    let mut series = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let mut o = opts.clone();
        o.lib = run.lib.clone();
        if runs.len() > 1 {
            println!("# Library: {}", run.label);
        }
        let rows = std::env::temp_dir().join(format!("rustccl-bench-rows-{}-{i}.json", std::process::id()));
        let _ = std::fs::remove_file(&rows);
        let rows_env = rows.to_string_lossy().into_owned();
        let st = run_ranks(&o, &run.args, &[(ROWS_VAR, rows_env.as_str())]);
        if st != 0 {
            status = st;
        }
        let doc = std::fs::read_to_string(&rows)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(|e| e.to_string()));
        match doc {
            Ok(doc) => series.extend(plot::series_from_doc(&run.label, &doc)),
            Err(e) => eprintln!("rustccl-bench: no rows from the {} run ({e})", run.label),
        }
        let _ = std::fs::remove_file(&rows);
    }
    if let Some(path) = &opts.plot {
        let title = format!("{}, {} ranks, {} {}", opts.op_arg, opts.nranks, opts.dtype_arg, opts.redop_arg);
        match plot::write_svg(path, &title, &series) {
            Ok(()) => eprintln!("rustccl-bench: wrote {path} ({} series)", series.len()),
            Err(e) => {
                eprintln!("rustccl-bench: {e}");
                status = 1;
            }
        }
    }
    status
}

/// Starts every rank of `opts.nranks` (with `env` added) and returns the exit status for the
/// launcher.
fn run_ranks(opts: &Options, args: &[String], env: &[(&str, &str)]) -> i32 {
    let id = match make_id(opts) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("rustccl-bench: {e}");
            return 1;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rustccl-bench: cannot find my own executable: {e}");
            return 1;
        }
    };
    let mut children: Vec<(usize, Child, Option<i32>)> = Vec::new();
    for rank in 0..opts.nranks {
        let child = Command::new(&exe)
            .args(args)
            .env(RANK_VAR, rank.to_string())
            .env(ID_VAR, &id)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .spawn();
        match child {
            Ok(c) => children.push((rank, c, None)),
            Err(e) => {
                eprintln!("rustccl-bench: cannot start rank {rank}: {e}");
                kill_all(&mut children);
                return 1;
            }
        }
    }
    let start = Instant::now();
    let mut failed_at: Option<Instant> = None;
    let mut status = 0;
    loop {
        let mut running = 0;
        for (rank, c, st) in children.iter_mut() {
            if st.is_some() {
                continue;
            }
            match c.try_wait() {
                Ok(Some(s)) => {
                    let code = s.code().unwrap_or(-1);
                    *st = Some(code);
                    if code == EXIT_WRONG_DATA {
                        status = 1;
                    } else if code != 0 {
                        eprintln!("rustccl-bench: rank {rank} exited with {s}");
                        status = 1;
                        failed_at.get_or_insert_with(Instant::now);
                    }
                }
                Ok(None) => running += 1,
                Err(e) => {
                    eprintln!("rustccl-bench: waiting for rank {rank}: {e}");
                    *st = Some(-1);
                    status = 1;
                }
            }
        }
        if running == 0 {
            break;
        }
        if let Some(t) = failed_at {
            if t.elapsed() > GRACE {
                eprintln!("rustccl-bench: stopping the {running} rank(s) still running after a rank failed");
                kill_all(&mut children);
                break;
            }
        }
        if opts.timeout_s > 0 && start.elapsed() > Duration::from_secs(opts.timeout_s) {
            eprintln!(
                "rustccl-bench: timeout after {} s; stopping the {running} rank(s) still running",
                opts.timeout_s
            );
            kill_all(&mut children);
            status = 1;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    status
}
