//! How many ranks the launcher starts, and what it does when several of them share a GPU.
//!
//! Without `-N`, ranks default to one per GPU on the CUDA backend (and with `--lib` on CUDA
//! memory), and to [`DEFAULT_HOST_RANKS`] on the host backend. Rank `r` uses GPU
//! `r % gpus`, so with more ranks than GPUs some ranks share a GPU: without NVIDIA's
//! Multi-Process Service (MPS) their kernels time-slice, and every call then takes
//! milliseconds (4.5 ms per all_reduce at every size up to 8 MiB for two ranks on one H200).
//! MPS is started only when asked (`--start-mps` or `RUSTCCL_BENCH_START_MPS=1`, never by
//! default); otherwise the launcher says so in one line and how to start it.
//!
//! [`plan`] is the decision (pure); [`probe_gpus`] finds the GPUs the ranks will use and
//! [`crate::mps`] finds, starts and stops the daemon.

use crate::opts::{Options, DEFAULT_HOST_RANKS};

/// The variable that allows the launcher to start MPS, like `--start-mps`.
pub const START_MPS_VAR: &str = "RUSTCCL_BENCH_START_MPS";

/// What to do about MPS before starting the ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MpsAction {
    /// Nothing: no GPU is shared, or MPS is already running.
    Nothing,
    /// Start the daemon (and stop it at the end); the line says so.
    Start(String),
    /// Several ranks share a GPU without MPS: print this one line.
    Warn(String),
}

/// The launcher's layout: the ranks and the MPS action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankLayout {
    pub nranks: usize,
    pub mps: MpsAction,
}

fn gpus_text(n: usize) -> String {
    if n == 1 {
        "1 GPU".into()
    } else {
        format!("{n} GPUs")
    }
}

/// The one line for ranks that share GPUs without MPS (`ranks` > `gpus`).
pub fn time_slice_line(ranks: usize, gpus: usize) -> String {
    format!(
        "rustccl-bench: {ranks} ranks on {} without MPS: ranks that share a GPU time-slice their \
         kernels (milliseconds per call); start MPS with `nvidia-cuda-mps-control -d` (stop it \
         with `echo quit | nvidia-cuda-mps-control`) or pass --start-mps, or run -N {gpus}",
        gpus_text(gpus)
    )
}

/// The line said when the launcher starts MPS.
pub fn start_line(ranks: usize, gpus: usize) -> String {
    format!(
        "rustccl-bench: {ranks} ranks on {}: starting MPS (nvidia-cuda-mps-control -d); it is \
         stopped when the benchmark ends",
        gpus_text(gpus)
    )
}

/// The layout: `gpus` is the GPU count when the ranks run on CUDA GPUs (`None` on the host
/// backend, with `--host-memory`, or when the GPUs could not be counted: the ranks then
/// report why), `asked` the `-N` value, `mps_running` whether the MPS control daemon runs,
/// `start_allowed` whether the user allowed starting it.
pub fn plan(
    gpus: Option<usize>,
    asked: Option<usize>,
    mps_running: bool,
    start_allowed: bool,
) -> RankLayout {
    let gpus = gpus.filter(|&g| g > 0);
    let nranks = asked.or(gpus).unwrap_or(DEFAULT_HOST_RANKS);
    let mps = match gpus {
        Some(g) if nranks > g && !mps_running => {
            if start_allowed {
                MpsAction::Start(start_line(nranks, g))
            } else {
                MpsAction::Warn(time_slice_line(nranks, g))
            }
        }
        _ => MpsAction::Nothing,
    };
    RankLayout { nranks, mps }
}

/// Whether a `RUSTCCL_BENCH_START_MPS` value allows starting MPS (`1`, `true`, `yes`, `on`).
pub fn start_allowed_by_env(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// The CUDA GPUs the ranks of `o` will use: `None` when they do not run on CUDA GPUs (the host
/// backend, `--lib` with `--host-memory`) or when the driver cannot count them (the ranks
/// then fail with the driver's error themselves). Initialises the CUDA driver in this process
/// but creates no context.
pub fn probe_gpus(o: &Options) -> Option<usize> {
    use rustccl::backend::{CudaBackend, DeviceBackend};
    let count = if o.lib.is_some() {
        if o.host_memory {
            return None;
        }
        CudaBackend::shared().ok()?.device_count()
    } else {
        let backend = rustccl::backend::select_backend().ok()?;
        // Host memory: no GPU to share.
        if backend.capabilities().host_addressable {
            return None;
        }
        backend.device_count()
    };
    count.ok().filter(|&n| n > 0)
}
