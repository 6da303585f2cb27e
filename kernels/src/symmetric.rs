//! The symmetric kernels (`device/symmetric.h`, built into every `exec.cu` module): collectives
//! that read and write the peers' windows directly, with no FIFO. Their parameter is
//! [`crate::exec::SymArgs`]; their constants (`SYM_*`) are in [`crate::exec`].

/// A symmetric kernel's entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SymKernel {
    /// all_reduce, one shot: each rank pushes its buffer into every peer's LL scratch as
    /// flag-tagged lines, then reduces what arrived; no barrier (small sizes).
    AllReduceLl,
    /// all_reduce, one shot by loads: barrier, each rank reduces the whole buffer from every
    /// peer's send window, barrier.
    AllReduceLd,
    /// all_reduce, two shots: barrier, each rank reduces its slice from every peer's send
    /// window and stores it into every peer's receive window, barrier (large sizes).
    AllReduceRsAg,
    /// all_gather: barrier, each rank stores its part into every peer's receive window, barrier.
    AllGather,
    /// reduce_scatter: barrier, each rank reduces its part from every peer's send window, barrier.
    ReduceScatter,
}

impl SymKernel {
    /// Every entry point, in the order the host loads them.
    pub const ALL: [SymKernel; 5] =
        [SymKernel::AllReduceLl, SymKernel::AllReduceLd, SymKernel::AllReduceRsAg, SymKernel::AllGather, SymKernel::ReduceScatter];

    /// The entry point's name in `symmetric.h`.
    pub fn name(self) -> &'static str {
        match self {
            SymKernel::AllReduceLl => "rustccl_sym_ar_ll",
            SymKernel::AllReduceLd => "rustccl_sym_ar_ld",
            SymKernel::AllReduceRsAg => "rustccl_sym_ar_rs_ag",
            SymKernel::AllGather => "rustccl_sym_ag",
            SymKernel::ReduceScatter => "rustccl_sym_rs",
        }
    }

    /// Position in [`SymKernel::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The name used by `RUSTCCL_SYM_KERNEL` and the logs.
    pub fn short(self) -> &'static str {
        match self {
            SymKernel::AllReduceLl => "ll",
            SymKernel::AllReduceLd => "ld",
            SymKernel::AllReduceRsAg => "rsag",
            SymKernel::AllGather => "ag",
            SymKernel::ReduceScatter => "rs",
        }
    }

    /// Whether the kernel reduces (and so depends on the operator and element type).
    pub fn reduces(self) -> bool {
        !matches!(self, SymKernel::AllGather)
    }

    /// The most bytes the one-shot LL kernel takes with `nranks` ranks: each source's lines
    /// (16 bytes per 8) fit its region of a scratch half.
    pub fn ll_max_bytes(nranks: usize) -> u64 {
        (crate::exec::SYM_LL_HALF / nranks.max(1) as u64) / 16 * 8
    }
}
