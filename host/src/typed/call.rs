//! One operation of the typed API after its checks: raw addresses and counts, ready for the
//! raw API ([`Communicator`]'s methods). Length rules live here, one function per operation.

use super::error::{Error, ErrorKind, Result};
use crate::backend::{DevicePtr, Stream as RawStream};
use crate::coll::ReduceOp;
use crate::comm::Communicator;
use crate::spec::Collective;
use crate::types::DataType;

/// An operation to hand to the raw API.
#[derive(Clone, Debug)]
pub(crate) enum Call {
    AllReduce { send: DevicePtr, recv: DevicePtr, count: usize, op: ReduceOp },
    Broadcast { send: DevicePtr, recv: DevicePtr, count: usize, root: i32 },
    Reduce { send: DevicePtr, recv: DevicePtr, count: usize, op: ReduceOp, root: i32 },
    AllGather { send: DevicePtr, recv: DevicePtr, send_count: usize },
    ReduceScatter { send: DevicePtr, recv: DevicePtr, recv_count: usize, op: ReduceOp },
    AllToAll { send: DevicePtr, recv: DevicePtr, count: usize },
    Gather { send: DevicePtr, recv: DevicePtr, count: usize, root: i32 },
    Scatter { send: DevicePtr, recv: DevicePtr, count: usize, root: i32 },
    Send { send: DevicePtr, count: usize, peer: i32 },
    Recv { recv: DevicePtr, count: usize, peer: i32 },
}

impl Call {
    pub fn run(&self, c: &Communicator, dtype: DataType, s: RawStream) -> crate::error::Result<()> {
        match *self {
            Call::AllReduce { send, recv, count, op } => c.all_reduce(send, recv, count, dtype, op, s),
            Call::Broadcast { send, recv, count, root } => c.broadcast(send, recv, count, dtype, root, s),
            Call::Reduce { send, recv, count, op, root } => c.reduce(send, recv, count, dtype, op, root, s),
            Call::AllGather { send, recv, send_count } => c.all_gather(send, recv, send_count, dtype, s),
            Call::ReduceScatter { send, recv, recv_count, op } => c.reduce_scatter(send, recv, recv_count, dtype, op, s),
            Call::AllToAll { send, recv, count } => c.all_to_all(send, recv, count, dtype, s),
            Call::Gather { send, recv, count, root } => c.gather(send, recv, count, dtype, root, s),
            Call::Scatter { send, recv, count, root } => c.scatter(send, recv, count, dtype, root, s),
            Call::Send { send, count, peer } => c.send(send, count, dtype, peer, s),
            Call::Recv { recv, count, peer } => c.recv(recv, count, dtype, peer, s),
        }
    }
}

fn refuse(what: &str, detail: String) -> Error {
    Error::new(ErrorKind::Length, format!("{what}: {detail}; nothing was enqueued"))
}

/// Send and receive buffers of equal length (AllReduce, Broadcast, Reduce).
pub(crate) fn equal(what: &str, send: usize, recv: usize) -> Result<usize> {
    if send != recv {
        return Err(refuse(what, format!("the send buffer has {send} elements but the receive buffer {recv}; they must be equal")));
    }
    Ok(send)
}

/// One side `nranks` times the other: AllGather's receive buffer, ReduceScatter's send
/// buffer, Gather's receive and Scatter's send buffer at the root. The per-rank count.
pub(crate) fn times_ranks(what: &str, small_name: &str, small: usize, big_name: &str, big: usize, nranks: u32) -> Result<usize> {
    if small.checked_mul(nranks as usize) != Some(big) {
        return Err(refuse(
            what,
            format!("the {big_name} buffer has {big} elements but must have {nranks} ranks x {small} (the {small_name} buffer's length) = {}", small as u128 * nranks as u128),
        ));
    }
    Ok(small)
}

/// A whole number of per-rank blocks (AlltoAll, in-place AllGather / ReduceScatter). The
/// block length.
pub(crate) fn blocks(what: &str, name: &str, len: usize, nranks: u32) -> Result<usize> {
    if nranks == 0 || !len.is_multiple_of(nranks as usize) {
        return Err(refuse(what, format!("the {name} buffer has {len} elements, which is not a multiple of the {nranks} ranks")));
    }
    Ok(len / nranks as usize)
}

/// The (send, receive) pointers of `coll` in place on `ptr`: NCCL's rule
/// ([`CollSpec::in_place_offsets`](crate::spec::CollSpec::in_place_offsets)), e.g. AllGather
/// sends `rank`'s block of the buffer it receives into.
pub(crate) fn in_place(coll: Collective, ptr: DevicePtr, rank: u32, count: usize, dtype: DataType) -> (DevicePtr, DevicePtr) {
    let (send, recv) = coll.spec().in_place_offsets(count, rank as usize);
    (ptr.offset(send * dtype.size()), ptr.offset(recv * dtype.size()))
}

/// The (send, receive) elements of `coll` on its root: what a buffer a non-root does not
/// use would hold there.
pub(crate) fn at_root(coll: Collective, count: usize, nranks: u32) -> (usize, usize) {
    coll.spec().extents(count, nranks as usize, 0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_rules() {
        assert_eq!(equal("AllReduce", 4, 4).unwrap(), 4);
        let e = equal("AllReduce", 4, 3).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Length);
        assert!(e.message().contains("4 elements but the receive buffer 3") && e.message().contains("nothing was enqueued"), "{}", e.message());
        assert_eq!(times_ranks("AllGather", "send", 3, "receive", 6, 2).unwrap(), 3);
        let e = times_ranks("AllGather", "send", 3, "receive", 5, 2).unwrap_err();
        assert!(e.message().contains("must have 2 ranks x 3"), "{}", e.message());
        assert!(times_ranks("x", "a", usize::MAX, "b", 0, 3).is_err(), "overflow is a mismatch");
        assert_eq!(blocks("AlltoAll", "send", 6, 3).unwrap(), 2);
        assert!(blocks("AlltoAll", "send", 7, 3).is_err());
        assert_eq!(in_place(Collective::AllGather, DevicePtr(1000), 2, 3, DataType::Float64), (DevicePtr(1048), DevicePtr(1000)));
        assert_eq!(in_place(Collective::ReduceScatter, DevicePtr(1000), 2, 3, DataType::Float64), (DevicePtr(1000), DevicePtr(1048)));
        assert_eq!(at_root(Collective::Gather, 3, 4), (3, 12));
    }
}
