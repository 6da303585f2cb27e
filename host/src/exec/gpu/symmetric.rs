//! The symmetric kernels' launch (`kernels/src/device/symmetric.h`, entry points in
//! `kernels/src/symmetric.rs`): a single all_reduce, all_gather or reduce_scatter whose
//! buffers lie in symmetric windows runs one kernel that reads and writes the peers' windows
//! directly. Which kernel, and whether one runs at all, is the caller's choice
//! (`coll::symmetric`); this module turns that choice into the kernel's parameter
//! ([`SymArgs`]) and its grid ([`blocks`]), and launches it through the one launch sequence
//! (`ExecState::launch`): a symmetric kernel may be captured into a graph, and it polls the
//! control block while it waits for its peers.
//!
//! Its buffers come as a [`SymPlace`]: plain addresses in the communicator's flat window
//! range, where rank r's copy of this rank's address is found by [`SymPlace::peer`] (the
//! windows themselves are the business of `window`, above this layer).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustccl_kernels::exec::SymArgs;
use rustccl_kernels::symmetric::SymKernel;
use rustccl_kernels::DeviceOp;

use super::sequence::Engine;
use super::ExecState;
use crate::backend::{DeviceBackend, Stream};
use crate::error::Result;
use crate::reduce::Reducer;
use crate::types::DataType;

/// Bytes per block of the barrier kernels (blocks up to `SYM_MAX_BLOCKS`).
const BLOCK_BYTES: u64 = 32 << 10;

/// Symmetric collectives run by this process: kernels launched, copy-engine collectives
/// enqueued, and their CPU twins on the host backend (for tests and tools: proof that a run
/// took them).
pub(crate) static LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// How many symmetric collectives this process has run (`LAUNCHES`).
pub fn launches() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// Where a symmetric collective's buffers lie, as addresses of this rank in the
/// communicator's flat window range (the symmetric kernels' view of a collective on windows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SymPlace {
    /// The send buffer.
    pub send: u64,
    /// The receive buffer.
    pub recv: u64,
    /// The symmetric kernels' resource memory (epoch, barrier inboxes, LL scratch, copy-engine
    /// flags).
    pub res: u64,
    /// The distance between two consecutive ranks' copies of an address.
    pub stride: u64,
    /// This rank.
    pub rank: usize,
}

impl SymPlace {
    /// Rank `r`'s copy of this rank's flat address `addr`.
    pub fn peer(&self, addr: u64, r: usize) -> u64 {
        addr.wrapping_add((r as i64 - self.rank as i64) as u64 * self.stride)
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

/// One symmetric kernel launch, as the caller chose it.
#[derive(Clone, Copy, Debug)]
pub struct SymLaunch {
    pub kernel: SymKernel,
    pub place: SymPlace,
    /// all_reduce: the bytes of the buffer; all_gather and reduce_scatter: of one rank's part.
    pub bytes: u64,
    pub nranks: usize,
    /// The collective's reduction (unused by a kernel that does not reduce).
    pub reducer: Reducer,
    /// The device address of a PreMulSum scalar in device memory (0: none).
    pub scalar_at: usize,
    pub stream: Stream,
}

impl SymLaunch {
    /// The kernel's operator and element type: the collective's for a kernel that reduces;
    /// bytes for one that only moves them (all_gather), so that it is compiled once.
    fn op_and_type(&self) -> (DeviceOp, DataType, u64, u64) {
        let (op, scalar, divisor) = super::ops::coll_device_op(self.reducer.op, self.reducer.dtype);
        if self.kernel.reduces() {
            (op, self.reducer.dtype, scalar, divisor)
        } else {
            (DeviceOp::Sum, DataType::Uint8, scalar, divisor)
        }
    }

    /// The kernel's parameter, with the control block at `control`.
    pub(crate) fn args(&self, control: u64) -> SymArgs {
        let (_, _, scalar, divisor) = self.op_and_type();
        SymArgs {
            send: self.place.send,
            recv: self.place.recv,
            res: self.place.res,
            stride: self.place.stride,
            bytes: self.bytes,
            scalar,
            scalar_ptr: self.scalar_at as u64,
            divisor,
            control,
            rank: self.place.rank as u32,
            nranks: self.nranks as u32,
        }
    }
}

/// Launches the symmetric kernel `l` on `device` (`state`: the communicator's); returns once
/// it is enqueued.
pub(crate) fn run_symmetric(backend: &Arc<dyn DeviceBackend>, device: usize, state: &mut ExecState, l: &SymLaunch) -> Result<()> {
    let (op, dtype, _, _) = l.op_and_type();
    state.launch(backend, device, Engine::Kernel(l.stream), |_, at| {
        backend.symmetric_kernels_or_err("symmetric collective")?.launch_symmetric(device, op, dtype, l.kernel, &l.args(at.control.0), blocks(l.kernel, l.bytes), at.stream)?;
        LAUNCHES.fetch_add(1, Ordering::Relaxed);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_depend_only_on_the_kernel_and_size() {
        assert_eq!(blocks(SymKernel::AllReduceLl, 8), 1);
        assert_eq!(blocks(SymKernel::AllReduceLl, 64 << 10), 4);
        assert_eq!(blocks(SymKernel::AllReduceLd, 1), 1);
        assert_eq!(blocks(SymKernel::AllReduceRsAg, 1 << 30), rustccl_kernels::exec::SYM_MAX_BLOCKS);
        assert_eq!(blocks(SymKernel::AllGather, 64 << 10), 2);
    }

    #[test]
    fn peers_are_a_stride_apart() {
        let p = SymPlace { send: 0x1_0000, recv: 0x2_0000, res: 0x3_0000, stride: 0x100_0000, rank: 2 };
        assert_eq!(p.peer(p.recv, 2), p.recv);
        assert_eq!(p.peer(p.recv, 3), p.recv + 0x100_0000);
        assert_eq!(p.peer(p.recv + 8, 0), p.recv + 8 - 2 * 0x100_0000);
    }
}
