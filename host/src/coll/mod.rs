//! Collective and point-to-point operations: the API (`Communicator::all_reduce` and the
//! others), argument checks as NCCL makes them, and groups. A call becomes a [`Task`]; at the
//! end of the outermost group (at once, outside a group) the tasks of every communicator in the
//! group are planned ([`plan`]) into programs ([`program`](crate::program)), their connections are made, and
//! the executor ([`exec`]) runs them.
//!
//! On the host backend an operation has completed when its call (or the outermost
//! `group_end`) returns; the stream argument orders nothing more.
//!
//! On a non-blocking communicator (`CommConfig::blocking = 0`) an operation outside a group,
//! and the end of a group, return `Err` with code `InProgress` (NCCL's `ncclInProgress`)
//! instead: the work runs in the background (`comm::jobs`), after any still queued on the
//! same communicator. The caller polls [`Communicator::async_error`] until it is no longer
//! `InProgress` (or blocks in [`Communicator::wait_idle`]) before it reads the results; it
//! may abort stuck work from the same thread. Argument errors are still returned at once.

mod call;
pub mod check;
pub mod exec;
pub mod group;
pub mod observe;
pub(crate) mod one_rank;
mod one_sided;
pub mod options;
pub mod plan;
mod planned;
pub(crate) mod route;
pub(crate) mod small;
pub mod symmetric;
mod way;


use crate::backend::{DevicePtr, Stream};
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::spec::{CollSpec, Collective};
use crate::types::{DataType, RedOp};

pub use group::{depth as group_depth, group_end, group_start, group_simulate_end};

/// The bytes of `count` elements of `dtype`, `times` over (the ranks of an AllGather output or
/// a ReduceScatter input); an invalid argument when that is more than any buffer can hold
/// (it overflows, or exceeds `isize::MAX`, the most one allocation can have).
pub fn checked_bytes(what: &str, count: usize, dtype: DataType, times: usize) -> Result<usize> {
    count
        .checked_mul(dtype.size())
        .and_then(|b| b.checked_mul(times))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            let ranks = if times == 1 { String::new() } else { format!(" x {times} ranks") };
            Error::invalid_argument(format!(
                "{what}: count {count} of {dtype} ({} bytes each){ranks} is more bytes than a buffer can hold; check the count argument",
                dtype.size()
            ))
        })
}

/// Cancels the current group (if the calling thread is inside one) because one of its
/// operations was refused before reaching [`Communicator`] (for example by the C API, which
/// checks data types and operators itself): the group's end returns the error and runs nothing.
pub fn cancel_group(e: &Error) {
    group::fail(e);
}

/// A reduction operator, as a caller gives it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    /// Each rank's input is multiplied by its own scalar before the sum.
    PreMulSum(Scalar),
}

/// The scalar of a PreMulSum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// Given by value (`ncclScalarHostImmediate`).
    Host(f64),
    /// Read from device memory when the operation runs (`ncclScalarDevice`): one element of
    /// the operation's type.
    Device(DevicePtr),
}

impl ReduceOp {
    pub fn red_op(&self) -> RedOp {
        match self {
            ReduceOp::Sum => RedOp::Sum,
            ReduceOp::Prod => RedOp::Prod,
            ReduceOp::Max => RedOp::Max,
            ReduceOp::Min => RedOp::Min,
            ReduceOp::Avg => RedOp::Avg,
            ReduceOp::PreMulSum(_) => RedOp::PreMulSum,
        }
    }
}

/// What an operation does.
#[derive(Clone, Debug, PartialEq)]
pub enum CollKind {
    AllReduce,
    Broadcast { root: u32 },
    Reduce { root: u32 },
    AllGather,
    ReduceScatter,
    Send { peer: u32 },
    Recv { peer: u32 },
}

impl CollKind {
    /// Its descriptor: name, buffer extents, plugin type, bandwidth ([`crate::spec`]).
    pub fn spec(&self) -> &'static CollSpec {
        self.collective().spec()
    }

    /// The collective it is (without its root or peer).
    pub fn collective(&self) -> Collective {
        match self {
            CollKind::AllReduce => Collective::AllReduce,
            CollKind::Broadcast { .. } => Collective::Broadcast,
            CollKind::Reduce { .. } => Collective::Reduce,
            CollKind::AllGather => Collective::AllGather,
            CollKind::ReduceScatter => Collective::ReduceScatter,
            CollKind::Send { .. } => Collective::Send,
            CollKind::Recv { .. } => Collective::Recv,
        }
    }

    pub fn name(&self) -> &'static str {
        self.spec().name
    }

    /// Whether the operation reduces (applies the operator).
    pub fn reduces(&self) -> bool {
        self.spec().reduces
    }

    /// A send or a receive.
    pub fn is_p2p(&self) -> bool {
        self.spec().p2p
    }

    /// The root of Broadcast and Reduce (0 for the others: [`CollSpec`] ignores it there).
    pub fn root(&self) -> usize {
        match self {
            CollKind::Broadcast { root } | CollKind::Reduce { root } => *root as usize,
            _ => 0,
        }
    }
}

impl Task {
    /// Bytes of `rank`'s (send, receive) buffer on `nranks` ranks ([`CollSpec::extents`]).
    pub fn extent_bytes(&self, nranks: usize, rank: usize) -> (usize, usize) {
        self.kind.spec().extent_bytes(self.count, self.dtype.size(), nranks, rank, self.kind.root())
    }
}

/// One operation of one rank, as enqueued. Counts are in elements: for AllGather the count
/// each rank sends, for ReduceScatter the count each rank receives.
#[derive(Clone, Debug)]
pub struct Task {
    pub kind: CollKind,
    pub send: DevicePtr,
    pub recv: DevicePtr,
    pub count: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    /// The caller's stream (device backends run the operation on it).
    pub stream: Stream,
    /// The observer's API events the operation was called under (none without an observer).
    pub profile: crate::observe::ApiParents,
    /// Its per-call options (`nccl*Config`; [`options::scoped`] at the call, else none).
    pub options: options::CollOptions,
}

impl Task {
    /// The task as the communicator's op log (hang reports) describes it.
    pub(crate) fn shape(&self) -> crate::comm::health::OpShape {
        let rank = match self.kind {
            CollKind::AllReduce | CollKind::ReduceScatter | CollKind::AllGather => None,
            CollKind::Reduce { root } | CollKind::Broadcast { root } => Some(root),
            CollKind::Send { peer } | CollKind::Recv { peer } => Some(peer),
        };
        crate::comm::health::OpShape {
            kind: self.kind.name(),
            rank,
            count: self.count as u64,
            dtype: self.dtype.name(),
            op: self.kind.reduces().then(|| self.op.red_op().name()),
            p2p: self.kind.is_p2p(),
        }
    }
}

impl Communicator {
    /// Refuses an operation: records the error and, inside a group, cancels the group.
    fn refuse(&self, e: Error) -> Error {
        group::fail(&e);
        self.record_error(e)
    }

    fn check_rank_arg(&self, r: i32, what: &str, name: &str) -> Result<u32> {
        let n = self.nranks_unchecked();
        if r < 0 || r as u32 >= n {
            return Err(self.refuse(Error::invalid_argument(format!("{what}: {name} {r} is out of range for {n} ranks"))));
        }
        Ok(r as u32)
    }

    fn check_root(&self, root: i32, what: &str) -> Result<u32> {
        self.check_rank_arg(root, what, "root")
    }

    fn check_peer(&self, peer: i32, what: &str) -> Result<u32> {
        self.check_rank_arg(peer, what, "peer")
    }

    /// Checks an operation's arguments and hands it to the group (runs it now outside one).
    fn submit(&self, mut task: Task) -> Result<()> {
        task.options = options::current();
        // The observer's events of the call (and of its group outside a group), ended when
        // the call returns.
        let _api = observe::api_call(self, &mut task, group::depth);
        let what = task.kind.name();
        let checked = self.check_collective_ready(what).and_then(|_| {
            let spec = task.kind.spec();
            let n = self.nranks_unchecked() as usize;
            checked_bytes(what, task.count, task.dtype, spec.count_multiple(n))?;
            let (me, root) = (self.rank_unchecked() as usize, task.kind.root());
            // Buffers a rank does not use may be NULL: the receive buffer of Send, the send
            // buffer of Recv, a non-root's send buffer in Broadcast and receive buffer in Reduce.
            if task.count > 0 && spec.uses_send(me, root) && task.send.is_null() {
                return Err(Error::invalid_argument(format!("{what}: send buffer is NULL")));
            }
            if task.count > 0 && spec.uses_recv(me, root) && task.recv.is_null() {
                return Err(Error::invalid_argument(format!("{what}: receive buffer is NULL")));
            }
            if let ReduceOp::PreMulSum(Scalar::Device(p)) = task.op {
                if p.is_null() {
                    return Err(Error::invalid_argument(format!("{what}: PreMulSum scalar pointer is NULL")));
                }
            }
            Ok(())
        });
        if let Err(e) = checked {
            return Err(self.refuse(e));
        }
        if !task.kind.is_p2p() {
            self.note_collective();
        }
        group::enqueue(self, task).map_err(|e| if e.code == crate::error::ResultCode::InProgress { e } else { self.record_error(e) })
    }

    /// `ncclAllReduce`.
    pub fn all_reduce(&self, send: DevicePtr, recv: DevicePtr, count: usize, dtype: DataType, op: ReduceOp, stream: Stream) -> Result<()> {
        self.submit(Task { kind: CollKind::AllReduce, send, recv, count, dtype, op, stream, profile: Default::default(), options: Default::default() })
    }

    /// `ncclBroadcast`.
    pub fn broadcast(&self, send: DevicePtr, recv: DevicePtr, count: usize, dtype: DataType, root: i32, stream: Stream) -> Result<()> {
        let root = self.check_root(root, "Broadcast")?;
        self.submit(Task { kind: CollKind::Broadcast { root }, send, recv, count, dtype, op: ReduceOp::Sum, stream, profile: Default::default(), options: Default::default() })
    }

    /// `ncclReduce`.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce(&self, send: DevicePtr, recv: DevicePtr, count: usize, dtype: DataType, op: ReduceOp, root: i32, stream: Stream) -> Result<()> {
        let root = self.check_root(root, "Reduce")?;
        self.submit(Task { kind: CollKind::Reduce { root }, send, recv, count, dtype, op, stream, profile: Default::default(), options: Default::default() })
    }

    /// `ncclAllGather`: `send_count` elements from each rank.
    pub fn all_gather(&self, send: DevicePtr, recv: DevicePtr, send_count: usize, dtype: DataType, stream: Stream) -> Result<()> {
        self.submit(Task { kind: CollKind::AllGather, send, recv, count: send_count, dtype, op: ReduceOp::Sum, stream, profile: Default::default(), options: Default::default() })
    }

    /// `ncclReduceScatter`: `recv_count` elements to each rank.
    pub fn reduce_scatter(&self, send: DevicePtr, recv: DevicePtr, recv_count: usize, dtype: DataType, op: ReduceOp, stream: Stream) -> Result<()> {
        self.submit(Task { kind: CollKind::ReduceScatter, send, recv, count: recv_count, dtype, op, stream, profile: Default::default(), options: Default::default() })
    }

    /// `ncclSend`.
    pub fn send(&self, send: DevicePtr, count: usize, dtype: DataType, peer: i32, stream: Stream) -> Result<()> {
        let peer = self.check_peer(peer, "Send")?;
        self.submit(Task { kind: CollKind::Send { peer }, send, recv: DevicePtr::NULL, count, dtype, op: ReduceOp::Sum, stream, profile: Default::default(), options: Default::default() })
    }

    /// `ncclRecv`.
    pub fn recv(&self, recv: DevicePtr, count: usize, dtype: DataType, peer: i32, stream: Stream) -> Result<()> {
        let peer = self.check_peer(peer, "Recv")?;
        self.submit(Task { kind: CollKind::Recv { peer }, send: DevicePtr::NULL, recv, count, dtype, op: ReduceOp::Sum, stream, profile: Default::default(), options: Default::default() })
    }

    /// `ncclAlltoAll`: `count` elements to and from every rank (a group of sends and receives).
    pub fn all_to_all(&self, send: DevicePtr, recv: DevicePtr, count: usize, dtype: DataType, stream: Stream) -> Result<()> {
        let n = self.nranks_unchecked() as usize;
        checked_bytes("AlltoAll", count, dtype, Collective::AlltoAll.spec().count_multiple(n)).map_err(|e| self.refuse(e))?;
        // Outside a group, on symmetric windows: the copy engines (the host backend's loads
        // and stores).
        self.note_collective();
        if group::depth() == 0 && self.check_collective_ready("AlltoAll").is_ok() {
            if let Some(r) = symmetric::try_all_to_all(self, send, recv, count, dtype, stream) {
                return r;
            }
        }
        // The usual way: a group of sends and receives (no signature of its own).
        self.publish_route(crate::work::Way::Planned, crate::work::OpSig(0));
        let counts = vec![count; n];
        let displs: Vec<usize> = (0..n).map(|i| i * count).collect();
        self.all_to_allv(send, &counts, &displs, recv, &counts, &displs, dtype, stream)
    }

    /// AlltoAllv (rustccl's own; NCCL has none): to rank `i`, `send_counts[i]` elements from
    /// `send + send_displs[i]`; from rank `i`, `recv_counts[i]` elements into
    /// `recv + recv_displs[i]` (counts and displacements in elements).
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_allv(
        &self,
        send: DevicePtr,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: DevicePtr,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DataType,
        stream: Stream,
    ) -> Result<()> {
        let n = self.nranks_unchecked() as usize;
        if [send_counts.len(), send_displs.len(), recv_counts.len(), recv_displs.len()].iter().any(|&l| l != n) {
            return Err(self.refuse(Error::invalid_argument(format!(
                "AlltoAllv: counts and displacements need one entry per rank ({n})"
            ))));
        }
        // Each block must end at a byte offset a buffer can have.
        let offsets = |side: &str, counts: &[usize], displs: &[usize]| -> Result<Vec<usize>> {
            (0..n)
                .map(|p| {
                    let end = displs[p].checked_add(counts[p]).and_then(|e| e.checked_mul(dtype.size()));
                    if end.is_none_or(|e| e > isize::MAX as usize) {
                        return Err(Error::invalid_argument(format!(
                            "AlltoAllv: {side} block {p} (displacement {} + count {} elements of {dtype}) ends beyond any buffer; check the counts and displacements",
                            displs[p], counts[p]
                        )));
                    }
                    Ok(displs[p] * dtype.size())
                })
                .collect()
        };
        let both = offsets("send", send_counts, send_displs).and_then(|s| Ok((s, offsets("receive", recv_counts, recv_displs)?)));
        let (send_off, recv_off) = both.map_err(|e| self.refuse(e))?;
        group_start();
        let result = (0..n).try_for_each(|peer| {
            self.send(send.offset(send_off[peer]), send_counts[peer], dtype, peer as i32, stream)?;
            self.recv(recv.offset(recv_off[peer]), recv_counts[peer], dtype, peer as i32, stream)
        });
        let end = group_end();
        result.and(end)
    }

    /// `ncclGather`: every rank's `count` elements to `root`, in rank order.
    pub fn gather(&self, send: DevicePtr, recv: DevicePtr, count: usize, dtype: DataType, root: i32, stream: Stream) -> Result<()> {
        let root_u = self.check_root(root, "Gather")?;
        let me = self.rank_unchecked();
        checked_bytes("Gather", count, dtype, Collective::Gather.spec().count_multiple(self.nranks_unchecked() as usize)).map_err(|e| self.refuse(e))?;
        let e = count * dtype.size();
        group_start();
        let mut result = self.send(send, count, dtype, root, stream);
        if me == root_u && result.is_ok() {
            result = (0..self.nranks_unchecked()).try_for_each(|p| self.recv(recv.offset(p as usize * e), count, dtype, p as i32, stream));
        }
        let end = group_end();
        result.and(end)
    }

    /// `ncclScatter`: block `i` of `root`'s buffer to rank `i`.
    pub fn scatter(&self, send: DevicePtr, recv: DevicePtr, count: usize, dtype: DataType, root: i32, stream: Stream) -> Result<()> {
        let root_u = self.check_root(root, "Scatter")?;
        let me = self.rank_unchecked();
        checked_bytes("Scatter", count, dtype, Collective::Scatter.spec().count_multiple(self.nranks_unchecked() as usize)).map_err(|e| self.refuse(e))?;
        let e = count * dtype.size();
        group_start();
        let mut result = Ok(());
        if me == root_u {
            result = (0..self.nranks_unchecked()).try_for_each(|p| self.send(send.offset(p as usize * e), count, dtype, p as i32, stream));
        }
        if result.is_ok() {
            result = self.recv(recv, count, dtype, root, stream);
        }
        let end = group_end();
        result.and(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_that_overflow_or_exceed_isize_are_refused() {
        assert_eq!(checked_bytes("t", 10, DataType::Float32, 3).unwrap(), 120);
        let e = checked_bytes("AllGather", usize::MAX / 4 + 2, DataType::Float32, 1).unwrap_err();
        assert_eq!(e.code, crate::error::ResultCode::InvalidArgument);
        assert!(e.message.contains("count") && e.message.contains("float32") && e.message.contains("4 bytes"), "{}", e.message);
        assert!(checked_bytes("t", usize::MAX / 16, DataType::Float64, 2).is_err(), "x ranks overflows");
        assert!(checked_bytes("t", (isize::MAX as usize) / 8 + 1, DataType::Float64, 1).is_err(), "beyond isize::MAX");
    }
}
