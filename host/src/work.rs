//! What the planner hands an executor: for one communicator of a group, the contexts of its
//! operations (buffers, reduction, protocol, signature) and its work items (programs of steps
//! over links, from [`crate::program`]), with the stream device work goes on. Pure data: the
//! planner (`coll::plan`) makes it without touching memory, the executors (`exec`) run it.
//! Also the descriptors the other ways hand an executor: which [`Way`] a collective takes
//! (published for the peers before it runs, see `exec::host::board`'s route ring) and where a
//! symmetric collective finds its buffers ([`SymmetricPlace`]).

use rustccl_plugin_api::Protocol;

use crate::backend::Stream;
use crate::program::Step;
use crate::reduce::Reducer;
use crate::types::DataType;

/// The buffers and the reduction of one task, as the executor needs them.
#[derive(Clone, Copy, Debug)]
pub struct OpCtx {
    /// Host address of the source buffer (0 when the rank reads none).
    pub src: usize,
    /// Host address of the destination buffer (0 when the rank writes none).
    pub dst: usize,
    /// Bytes of the source and destination buffers this rank touches.
    pub src_len: usize,
    pub dst_len: usize,
    pub reducer: Reducer,
    /// The protocol of the steps (the format of the FIFO slots on device backends).
    pub proto: Protocol,
    /// The operation's signature, carried by the FIFO slots it fills (see `coll::check`).
    pub sig: OpSig,
    /// Where a PreMulSum scalar given by address (`ncclScalarDevice`) is read when the
    /// operation runs (0: the reducer holds the scalar): a host address on the host backend,
    /// a device address on devices.
    pub scalar_at: usize,
    /// A receive from a peer that maps this rank's registered buffer (`ncclCommRegister`,
    /// device backends over P2P): where `dst` lies in the sending peer's process, so its
    /// kernel can write the message straight there (0: through the FIFO). Set at launch
    /// (`Communicator::resolve_direct_receives`), not by the planner.
    pub dst_remote: usize,
}

impl OpCtx {
    /// The reducer as the operation runs on the host backend: a PreMulSum scalar given by
    /// address is read now.
    pub fn host_reducer(&self) -> Reducer {
        if self.scalar_at == 0 {
            return self.reducer;
        }
        let dtype = self.reducer.dtype;
        // SAFETY: the planner resolved the address through the backend, which checked that
        // one element of the operation's type lies in live host memory there.
        let bytes = unsafe { std::slice::from_raw_parts(self.scalar_at as *const u8, dtype.size()) };
        Reducer::new(dtype, crate::reduce::DevOp::PreMulSum { scalar: crate::reduce::decode_scalar(dtype, bytes) })
    }
}

/// Steps that run in order, each with the index of its task's [`OpCtx`].
pub struct WorkItem {
    pub steps: Vec<(usize, Step)>,
    pub pc: usize,
}

/// A copy within this rank's memory with nothing to compute (a one-rank collective out of
/// place): the executor makes it a plain copy (a copy engine on devices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalCopy {
    pub src: usize,
    pub dst: usize,
    pub bytes: usize,
}

/// One communicator's work in a group.
pub struct Work {
    pub ctxs: Vec<OpCtx>,
    pub items: Vec<WorkItem>,
    /// Plain copies, done before the items.
    pub copies: Vec<LocalCopy>,
    /// The stream device work runs on (the first task's).
    pub stream: Stream,
}

/// An operation's identity as a rank's FIFO slots carry it. 0 means "not known".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpSig(pub u64);

pub(crate) const NO_ROOT: u64 = 0xf_ffff;

impl OpSig {
    pub fn is_known(self) -> bool {
        self.0 != 0
    }
}

impl std::fmt::Display for OpSig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.0;
        let kind = match v >> 60 {
            1 => "AllReduce",
            2 => "Broadcast",
            3 => "Reduce",
            4 => "AllGather",
            5 => "ReduceScatter",
            6 => "Send/Recv",
            _ => "an unknown operation",
        };
        let dtype = DataType::from_i32(((v >> 56) & 0xf) as i32 - 1).map_or("?".to_string(), |t| format!("{t:?}"));
        write!(f, "{kind}(count {}, {dtype}", v & 0xffff_ffff)?;
        const OPS: [&str; 6] = ["Sum", "Prod", "Max", "Min", "Avg", "PreMulSum"];
        if let Some(op) = (((v >> 52) & 0xf) as usize).checked_sub(1).and_then(|i| OPS.get(i)) {
            write!(f, ", {op}")?;
        }
        let root = (v >> 32) & NO_ROOT;
        if root != NO_ROOT {
            write!(f, ", root {root}")?;
        }
        write!(f, ")")
    }
}


/// The error for a slot from `peer` whose signature differs from this rank's.
pub fn mismatch(me: u32, mine: OpSig, peer: u32, theirs: OpSig) -> crate::error::Error {
    crate::error::Error::invalid_usage(format!(
        "the ranks called different operations: rank {peer} is in {theirs} while rank {me} is in {mine}; every rank must call the same collectives in the same order with the same count, datatype, operator and root"
    )).with_kind(crate::error::ErrorKind::Mismatch)
}


/// The ways a collective runs (the planner's and the ways around it). coll chooses one per
/// collective; every rank of a communicator whose ranks share a host publishes it before the
/// collective runs (`exec::host::board`'s route ring), so that a rank waiting for a peer that
/// took another way finds out instead of waiting forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Way {
    /// One rank: nothing, or one copy per task.
    OneRank,
    /// A symmetric kernel on symmetric windows (GPUs).
    SymmetricKernel,
    /// The symmetric collectives' CPU twin on symmetric windows (`exec::host::symmetric`).
    SymmetricCpu,
    /// The copy engines on symmetric windows (GPUs).
    CopyEngine,
    /// The board of small collectives in shared memory (`exec::host::board`).
    Board,
    /// One copy straight from the peers' buffers (`exec::host::single_copy`).
    SingleCopy,
    /// The planner's programs over the FIFOs or the device interpreter (plan cache hits too:
    /// the cache is a memo of the planner).
    Planned,
}

impl Way {
    pub const ALL: [Way; 7] =
        [Way::OneRank, Way::SymmetricKernel, Way::SymmetricCpu, Way::CopyEngine, Way::Board, Way::SingleCopy, Way::Planned];

    /// Its code in the route ring (never 0: 0 is "nothing published").
    pub fn code(self) -> u8 {
        match self {
            Way::OneRank => 1,
            Way::SymmetricKernel => 2,
            Way::SymmetricCpu => 3,
            Way::CopyEngine => 4,
            Way::Board => 5,
            Way::SingleCopy => 6,
            Way::Planned => 7,
        }
    }

    /// The way of a code ([`Way::code`]).
    pub fn from_code(code: u8) -> Option<Way> {
        Way::ALL.into_iter().find(|w| w.code() == code)
    }

    /// Its name in TRACE lines and error messages.
    pub fn name(self) -> &'static str {
        match self {
            Way::OneRank => "one-rank",
            Way::SymmetricKernel => "symmetric-kernel",
            Way::SymmetricCpu => "symmetric-cpu",
            Way::CopyEngine => "copy-engine",
            Way::Board => "board",
            Way::SingleCopy => "single-copy",
            Way::Planned => "planner",
        }
    }

    /// Whether it runs on symmetric windows (every rank must pass window buffers, or none).
    pub fn symmetric(self) -> bool {
        matches!(self, Way::SymmetricKernel | Way::SymmetricCpu | Way::CopyEngine)
    }
}

/// Where a symmetric collective finds its buffers and memory (this rank's addresses in the
/// communicator's flat range of windows, `crate::window`; rank r's are
/// `+ (r - rank) * stride`, [`SymmetricPlace::peer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SymmetricPlace {
    pub send: u64,
    pub recv: u64,
    /// The symmetric collectives' resource memory (epoch, barrier inboxes, scalars).
    pub res: u64,
    pub stride: u64,
    pub rank: usize,
}

impl SymmetricPlace {
    /// Rank `r`'s copy of this rank's flat address `addr`.
    pub fn peer(&self, addr: u64, r: usize) -> u64 {
        addr.wrapping_add((r as i64 - self.rank as i64) as u64 * self.stride)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn way_codes_are_distinct_nonzero_and_round_trip() {
        let mut codes: Vec<u8> = Way::ALL.iter().map(|w| w.code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), Way::ALL.len());
        assert!(!codes.contains(&0));
        for w in Way::ALL {
            assert_eq!(Way::from_code(w.code()), Some(w));
        }
        assert_eq!(Way::from_code(0), None);
        let place = SymmetricPlace { send: 0x1_0000, recv: 0x2_0000, res: 0, stride: 1 << 32, rank: 1 };
        assert_eq!(place.peer(place.send, 0), 0x1_0000u64.wrapping_sub(1 << 32));
        assert_eq!(place.peer(place.send, 3), 0x1_0000 + (2u64 << 32));
    }
}
