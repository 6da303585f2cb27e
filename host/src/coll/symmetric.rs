//! The planner's choice of the symmetric kernels (`kernels/src/device/symmetric.h`): a single
//! all_reduce, all_gather or reduce_scatter (outside a group, on a blocking communicator)
//! whose send and receive buffers both lie in `NCCL_WIN_COLL_SYMMETRIC` windows runs one
//! kernel that reads and writes the peers' windows directly, instead of the ring through the
//! FIFOs. As with NCCL, every rank must pass window buffers at the same offsets for the same
//! call (the windows are collective, so ranks that do see the same windows): a rank that
//! passes a window buffer where another passes other memory takes another kernel, and the
//! two wait for each other until the watchdog's timeout reports the hang.
//!
//! Which kernel, by size (`choose`; `RUSTCCL_SYM_KERNEL` forces one: `ll`, `ld`, `rsag` for
//! all_reduce; `off` turns the symmetric kernels off):
//! - all_reduce up to [`LL_MAX`] bytes (and what fits the LL scratch): one shot through
//!   flag-tagged LL lines, no barrier;
//! - up to [`LD_MAX`]: one shot by loads of every peer's whole buffer between two barriers;
//! - above: two shots, each rank reducing its slice and storing it into every peer.
//!
//! all_gather and reduce_scatter each have one kernel.

use rustccl_kernels::exec::SymArgs;
use rustccl_kernels::symmetric::SymKernel;

use super::{CollKind, Task};
use crate::comm::Communicator;
use crate::error::Result;

/// all_reduce takes the LL one-shot kernel up to this many bytes.
pub const LL_MAX: u64 = 64 << 10;
/// all_reduce takes the one-shot load kernel up to this many bytes (the two-shot one above).
pub const LD_MAX: u64 = 512 << 10;
/// Bytes per block of the barrier kernels (blocks up to `SYM_MAX_BLOCKS`).
const BLOCK_BYTES: u64 = 32 << 10;

/// Symmetric launches made by this process (for tests and tools: proof that a run took them).
static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many symmetric kernels this process has launched.
pub fn launches() -> u64 {
    LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// `RUSTCCL_SYM_KERNEL`: a forced kernel, `Some(None)` for `off`.
fn forced() -> Option<Option<&'static str>> {
    static FORCED: std::sync::OnceLock<Option<Option<&'static str>>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| {
        let v = crate::params::env_str("RUSTCCL_SYM_KERNEL")?;
        let v = v.trim().to_ascii_lowercase();
        match v.as_str() {
            "" | "auto" => None,
            "off" | "0" | "none" => Some(None),
            k => match SymKernel::ALL.iter().find(|s| s.short() == k) {
                Some(s) => Some(Some(s.short())),
                None => {
                    tracing::warn!(target: "INIT", "RUSTCCL_SYM_KERNEL={v}: not one of auto, off, ll, ld, rsag, ag, rs; ignored");
                    None
                }
            },
        }
    })
}

/// The kernel for a collective of `kind` on `bytes` (all_reduce: the buffer; all_gather and
/// reduce_scatter: one rank's part) with `nranks` ranks, if a symmetric one takes it. The same
/// on every rank for the same call.
pub fn choose(kind: &CollKind, bytes: u64, nranks: usize) -> Option<SymKernel> {
    let forced = forced();
    if forced == Some(None) {
        return None;
    }
    let force = forced.flatten();
    match kind {
        CollKind::AllReduce => {
            let ll_fits = bytes <= SymKernel::ll_max_bytes(nranks);
            match force {
                Some("ll") if ll_fits => Some(SymKernel::AllReduceLl),
                Some("ld") => Some(SymKernel::AllReduceLd),
                Some("rsag") => Some(SymKernel::AllReduceRsAg),
                _ if bytes <= LL_MAX && ll_fits => Some(SymKernel::AllReduceLl),
                _ if bytes <= LD_MAX => Some(SymKernel::AllReduceLd),
                _ => Some(SymKernel::AllReduceRsAg),
            }
        }
        CollKind::AllGather => Some(SymKernel::AllGather),
        CollKind::ReduceScatter => Some(SymKernel::ReduceScatter),
        _ => None,
    }
}

/// Blocks of a launch of `kernel` on `bytes` (the same on every rank: the barrier kernels
/// pair block b of every rank).
pub fn blocks(kernel: SymKernel, bytes: u64) -> u32 {
    let max = rustccl_kernels::exec::SYM_MAX_BLOCKS as u64;
    let per = match kernel {
        // One 8-byte word per thread and pass: a block per 16 KiB up to 16.
        SymKernel::AllReduceLl => return bytes.div_ceil(16 << 10).clamp(1, 16) as u32,
        _ => BLOCK_BYTES,
    };
    bytes.div_ceil(per).clamp(1, max) as u32
}

/// Runs `task` with a symmetric kernel if its buffers lie in symmetric windows; `None` when
/// it must take the usual way.
pub(crate) fn try_run(comm: &Communicator, task: &Task) -> Option<Result<()>> {
    let caps = comm.backend().capabilities();
    if !caps.symmetric_kernels || task.count == 0 || !comm.config().blocking || super::check::enabled() {
        return None;
    }
    let n = comm.nranks_unchecked() as usize;
    if n < 2 {
        return None;
    }
    let part = (task.count * task.dtype.size()) as u64;
    let (send_bytes, recv_bytes) = match task.kind {
        CollKind::AllReduce => (part, part),
        CollKind::AllGather => (part, part * n as u64),
        CollKind::ReduceScatter => (part * n as u64, part),
        _ => return None,
    };
    let kernel = choose(&task.kind, part, n)?;
    let place = comm.symmetric_place(task.send, send_bytes as usize, task.recv, recv_bytes as usize)?;
    let start = crate::profile::start();
    comm.op_log().started(std::slice::from_ref(&task.shape()));
    let r = launch(comm, task, kernel, place, part, n);
    if let Err(e) = &r {
        comm.mark_broken(e);
        comm.op_log().all_finished();
    }
    crate::profile::stage(crate::profile::Stage::Total, start);
    Some(r)
}

fn launch(comm: &Communicator, task: &Task, kernel: SymKernel, place: crate::window::SymmetricPlace, bytes: u64, n: usize) -> Result<()> {
    let ctx = super::plan::PlanEnv::with(comm, |env| super::plan::op_ctx(env, task)).map_err(|e| comm.record_error(e))?;
    let (op, scalar, divisor) = crate::exec::gpu::ops::coll_device_op(ctx.reducer.op, ctx.reducer.dtype);
    let (op, dtype) = if kernel.reduces() { (op, task.dtype) } else { (rustccl_kernels::DeviceOp::Sum, crate::types::DataType::Uint8) };
    let rank = comm.rank_unchecked() as u32;
    let r = comm.with_device_exec(|backend, device, state| {
        let stream = task.stream;
        let capturing = backend.is_capturing(stream)?;
        let control = state.control(backend)?;
        if !capturing {
            // Launches of one communicator run in order, whatever streams they come on.
            if state.last.is_some_and(|s| s != stream) {
                if let Some(e) = state.last_event() {
                    backend.stream_wait_event(stream, e)?;
                }
            }
        }
        let args = SymArgs {
            send: place.send,
            recv: place.recv,
            res: place.res,
            stride: place.stride,
            bytes,
            scalar,
            scalar_ptr: ctx.scalar_at as u64,
            divisor,
            control: control.0,
            rank,
            nranks: n as u32,
        };
        backend.launch_symmetric(device, op, dtype, kernel, &args, blocks(kernel, bytes), stream)?;
        LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !capturing {
            state.launched(backend, device, stream)?;
        }
        Ok(())
    });
    tracing::debug!(target: "COLL", "{} of {bytes} bytes: symmetric kernel {}", task.kind.name(), kernel.name());
    r.map_err(|e| comm.record_error(e.context(format!("{} (symmetric kernel {})", task.kind.name(), kernel.name()))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_reduce_takes_ll_then_loads_then_two_shots() {
        assert_eq!(choose(&CollKind::AllReduce, 8, 2), Some(SymKernel::AllReduceLl));
        assert_eq!(choose(&CollKind::AllReduce, LL_MAX, 2), Some(SymKernel::AllReduceLl));
        assert_eq!(choose(&CollKind::AllReduce, LL_MAX + 8, 2), Some(SymKernel::AllReduceLd));
        assert_eq!(choose(&CollKind::AllReduce, LD_MAX + 8, 8), Some(SymKernel::AllReduceRsAg));
        // The LL scratch of a half holds nranks regions: many ranks take loads earlier.
        let ranks = 1024;
        assert!(SymKernel::ll_max_bytes(ranks) < LL_MAX);
        assert_eq!(choose(&CollKind::AllReduce, LL_MAX, ranks), Some(SymKernel::AllReduceLd));
        assert_eq!(choose(&CollKind::AllGather, 1 << 30, 8), Some(SymKernel::AllGather));
        assert_eq!(choose(&CollKind::ReduceScatter, 4, 8), Some(SymKernel::ReduceScatter));
        assert_eq!(choose(&CollKind::Broadcast { root: 0 }, 4, 8), None);
    }

    #[test]
    fn blocks_depend_only_on_the_kernel_and_size() {
        assert_eq!(blocks(SymKernel::AllReduceLl, 8), 1);
        assert_eq!(blocks(SymKernel::AllReduceLl, 64 << 10), 4);
        assert_eq!(blocks(SymKernel::AllReduceLd, 1), 1);
        assert_eq!(blocks(SymKernel::AllReduceRsAg, 1 << 30), rustccl_kernels::exec::SYM_MAX_BLOCKS);
        assert_eq!(blocks(SymKernel::AllGather, 64 << 10), 2);
    }
}
