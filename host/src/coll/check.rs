//! Catching ranks that call different operations.
//!
//! Two checks:
//! - Always, where it costs nothing: every slot a rank fills in a shared-memory FIFO carries
//!   the [`OpSig`] of its operation (kind, datatype, operator, root, count), and the consumer
//!   compares it with its own before using the data. Float32 on one rank and Int32 on the
//!   other (same bytes) is caught at the first slot, with both sides named. Device kernels
//!   do the same through the FIFO header and their line flags (`kernels/src/device/exec.cu`).
//!   Slots that cross the network carry no signature.
//! - With `RUSTCCL_CHECK_COLLECTIVES=1`, on every backend and transport: before a group runs,
//!   the ranks exchange the list of their operations over the bootstrap network and compare
//!   them (a round trip per group: for debugging).
//!
//! A PreMulSum's scalar takes no part: ranks may multiply by different scalars.

use super::{CollKind, Task};
use crate::comm::Communicator;
use crate::error::{Error, Result};

pub use crate::work::{mismatch, OpSig};
use crate::work::NO_ROOT;

fn kind_code(kind: &CollKind) -> (u64, u64) {
    match *kind {
        CollKind::AllReduce => (1, NO_ROOT),
        CollKind::Broadcast { root } => (2, root as u64 & NO_ROOT),
        CollKind::Reduce { root } => (3, root as u64 & NO_ROOT),
        CollKind::AllGather => (4, NO_ROOT),
        CollKind::ReduceScatter => (5, NO_ROOT),
        // The two ends of a message carry the same signature.
        CollKind::Send { .. } | CollKind::Recv { .. } => (6, NO_ROOT),
    }
}

impl OpSig {
    /// Bits 60..64 kind, 56..60 datatype + 1, 52..56 operator + 1 (0 when the operation does
    /// not reduce), 32..52 root, 0..32 the count's low 32 bits.
    pub fn of(task: &Task) -> OpSig {
        let (kind, root) = kind_code(&task.kind);
        let op = if task.kind.reduces() { task.op.red_op() as u64 + 1 } else { 0 };
        OpSig(kind << 60 | (task.dtype as u64 + 1) << 56 | op << 52 | root << 32 | (task.count as u64 & 0xffff_ffff))
    }
}

/// Whether `RUSTCCL_CHECK_COLLECTIVES=1`.
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::params::env_int_or("RUSTCCL_CHECK_COLLECTIVES", 0) == 1)
}

/// One operation as the explicit check exchanges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    sig: u64,
    /// The full count (the signature keeps 32 bits).
    count: u64,
    /// The peer of a send (`1 << 32 | peer`) or receive (`2 << 32 | peer`); 0 for collectives.
    p2p: u64,
}

fn entry(task: &Task) -> Entry {
    let p2p = match task.kind {
        CollKind::Send { peer } => 1 << 32 | peer as u64,
        CollKind::Recv { peer } => 2 << 32 | peer as u64,
        _ => 0,
    };
    Entry { sig: OpSig::of(task).0, count: task.count as u64, p2p }
}

fn encode(entries: &[Entry]) -> Vec<u8> {
    entries.iter().flat_map(|e| [e.sig, e.count, e.p2p]).flat_map(u64::to_le_bytes).collect()
}

fn decode(bytes: &[u8]) -> Option<Vec<Entry>> {
    if !bytes.len().is_multiple_of(24) {
        return None;
    }
    let words: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
    Some(words.chunks_exact(3).map(|w| Entry { sig: w[0], count: w[1], p2p: w[2] }).collect())
}

fn describe(e: &Entry) -> String {
    let sig = OpSig(e.sig);
    match e.p2p >> 32 {
        1 => format!("Send(count {}, to rank {})", e.count, e.p2p & 0xffff_ffff),
        2 => format!("Recv(count {}, from rank {})", e.count, e.p2p & 0xffff_ffff),
        _ => format!("{sig}"),
    }
}

/// Compares every rank's operations (collectives in order; each rank's sends to a peer with
/// that peer's receives from it, in order); the first difference, naming both sides.
fn compare(all: &[Vec<Entry>]) -> Option<String> {
    let colls: Vec<Vec<&Entry>> = all.iter().map(|l| l.iter().filter(|e| e.p2p == 0).collect()).collect();
    for (r, list) in colls.iter().enumerate().skip(1) {
        let n = list.len().max(colls[0].len());
        for i in 0..n {
            let (a, b) = (colls[0].get(i), list.get(i));
            if a.map(|e| (e.sig, e.count)) != b.map(|e| (e.sig, e.count)) {
                let show = |e: Option<&&Entry>| e.map_or("no collective".to_string(), |e| describe(e));
                return Some(format!("collective {} of the group: rank 0 calls {} but rank {r} calls {}", i + 1, show(a), show(b)));
            }
        }
    }
    let n = all.len() as u64;
    for (from, list) in all.iter().enumerate() {
        for to in 0..n {
            let sends: Vec<&Entry> = list.iter().filter(|e| e.p2p == 1 << 32 | to).collect();
            let recvs: Vec<&Entry> = all[to as usize].iter().filter(|e| e.p2p == 2 << 32 | from as u64).collect();
            for i in 0..sends.len().max(recvs.len()) {
                let (s, r) = (sends.get(i), recvs.get(i));
                if s.map(|e| (e.sig, e.count)) != r.map(|e| (e.sig, e.count)) {
                    let show = |e: Option<&&Entry>| e.map_or("nothing".to_string(), |e| format!("{}", OpSig(e.sig)));
                    return Some(format!(
                        "message {} from rank {from} to rank {to}: rank {from} sends {} but rank {to} receives {}",
                        i + 1,
                        show(s),
                        show(r)
                    ));
                }
            }
        }
    }
    None
}

/// The explicit check (`RUSTCCL_CHECK_COLLECTIVES=1`): the ranks of `comm` exchange the
/// operations of this group and stop it before it runs if they differ.
pub fn check_group(comm: &Communicator, tasks: &[Task]) -> Result<()> {
    let mine: Vec<Entry> = tasks.iter().map(entry).collect();
    let all = comm.allgather_bytes(&encode(&mine))?;
    let all: Vec<Vec<Entry>> = all
        .iter()
        .map(|b| decode(b).ok_or_else(|| Error::internal("RUSTCCL_CHECK_COLLECTIVES: a rank sent a malformed list")))
        .collect::<Result<_>>()?;
    match compare(&all) {
        None => Ok(()),
        Some(what) => Err(Error::invalid_usage(format!("RUSTCCL_CHECK_COLLECTIVES: the ranks called different operations: {what}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{DevicePtr, Stream};
    use crate::coll::ReduceOp;
    use crate::types::DataType;

    fn task(kind: CollKind, count: usize, dtype: DataType, op: ReduceOp) -> Task {
        Task { kind, send: DevicePtr(8), recv: DevicePtr(8), count, dtype, op, stream: Stream(0), profile: Default::default(), options: Default::default() }
    }

    #[test]
    fn signatures_tell_types_ops_roots_and_counts_apart() {
        let a = OpSig::of(&task(CollKind::AllReduce, 1024, DataType::Float32, ReduceOp::Sum));
        let b = OpSig::of(&task(CollKind::AllReduce, 1024, DataType::Int32, ReduceOp::Sum));
        let c = OpSig::of(&task(CollKind::AllReduce, 1024, DataType::Float32, ReduceOp::Max));
        let d = OpSig::of(&task(CollKind::Broadcast { root: 1 }, 1024, DataType::Float32, ReduceOp::Sum));
        let e = OpSig::of(&task(CollKind::Broadcast { root: 0 }, 1024, DataType::Float32, ReduceOp::Max));
        assert!([a, b, c, d, e].iter().all(|s| s.is_known()));
        for (i, x) in [a, b, c, d, e].iter().enumerate() {
            for (j, y) in [a, b, c, d, e].iter().enumerate() {
                assert_eq!(i == j, x == y, "{x} vs {y}");
            }
        }
        assert_eq!(a.to_string(), "AllReduce(count 1024, Float32, Sum)");
        assert_eq!(d.to_string(), "Broadcast(count 1024, Float32, root 1)");
        // A broadcast ignores the operator; both ends of a message agree.
        assert_eq!(d, OpSig::of(&task(CollKind::Broadcast { root: 1 }, 1024, DataType::Float32, ReduceOp::Max)));
        let s = OpSig::of(&task(CollKind::Send { peer: 1 }, 7, DataType::Int8, ReduceOp::Sum));
        assert_eq!(s, OpSig::of(&task(CollKind::Recv { peer: 0 }, 7, DataType::Int8, ReduceOp::Sum)));
        let m = mismatch(0, a, 1, b);
        assert!(m.message.contains("rank 1 is in AllReduce(count 1024, Int32, Sum) while rank 0 is in AllReduce(count 1024, Float32, Sum)"), "{}", m.message);
    }

    #[test]
    fn group_lists_are_compared_collective_by_collective_and_message_by_message() {
        let ar = |t| entry(&task(CollKind::AllReduce, 4, t, ReduceOp::Sum));
        let send = |p, n| entry(&task(CollKind::Send { peer: p }, n, DataType::Float32, ReduceOp::Sum));
        let recv = |p, n| entry(&task(CollKind::Recv { peer: p }, n, DataType::Float32, ReduceOp::Sum));
        let ok = vec![vec![ar(DataType::Float32), send(1, 8)], vec![recv(0, 8), ar(DataType::Float32)]];
        assert_eq!(compare(&ok), None);
        let bad = vec![vec![ar(DataType::Float32)], vec![ar(DataType::Int32)]];
        assert!(compare(&bad).unwrap().contains("rank 0 calls AllReduce(count 4, Float32, Sum) but rank 1 calls AllReduce(count 4, Int32, Sum)"));
        let missing = vec![vec![ar(DataType::Float32)], vec![]];
        assert!(compare(&missing).unwrap().contains("rank 1 calls no collective"));
        let short = vec![vec![send(1, 8)], vec![recv(0, 4)]];
        assert!(compare(&short).unwrap().contains("rank 0 sends Send/Recv(count 8, Float32) but rank 1 receives Send/Recv(count 4, Float32)"));
        let round = decode(&encode(&ok[0])).unwrap();
        assert_eq!(round, ok[0]);
        assert_eq!(decode(&[1, 2, 3]), None);
    }
}
