//! Marshalling (pure): the NCCL calls one benchmark [`Call`] makes, with their arguments as
//! the C ABI takes them. Unit-tested without a library (`bench/tests/pure.rs`).

use crate::driver::Call;
use crate::ops::Coll;

/// One NCCL call, with its arguments as the C ABI takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prim {
    GroupStart,
    GroupEnd,
    AllReduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
        op: i32,
    },
    AllGather {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
    },
    ReduceScatter {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
        op: i32,
    },
    Broadcast {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
        root: i32,
    },
    Reduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
        op: i32,
        root: i32,
    },
    Send {
        buf: u64,
        count: usize,
        dtype: i32,
        peer: i32,
    },
    Recv {
        buf: u64,
        count: usize,
        dtype: i32,
        peer: i32,
    },
}

/// The NCCL calls that run `call` `agg` times with operator value `op` (a built-in value or
/// one `ncclRedOpCreatePreMulSum` made). AlltoAll, AlltoAllv, Gather, Scatter and SendRecv
/// are groups of sends and receives, as nccl-tests makes them.
pub fn marshal(call: &Call, op: i32, agg: usize) -> Vec<Prim> {
    let mut out = Vec::new();
    if agg > 1 {
        out.push(Prim::GroupStart);
    }
    for _ in 0..agg.max(1) {
        marshal_one(call, op, &mut out);
    }
    if agg > 1 {
        out.push(Prim::GroupEnd);
    }
    out
}

fn marshal_one(call: &Call, op: i32, out: &mut Vec<Prim>) {
    let dtype = call.dtype as i32;
    let (send, recv, count, root) = (call.send, call.recv, call.count, call.root);
    let prim = match call.coll {
        Coll::AllReduce => Prim::AllReduce { send, recv, count, dtype, op },
        Coll::AllGather => Prim::AllGather { send, recv, count, dtype },
        Coll::ReduceScatter => Prim::ReduceScatter { send, recv, count, dtype, op },
        Coll::Broadcast => Prim::Broadcast { send, recv, count, dtype, root },
        Coll::Reduce => Prim::Reduce { send, recv, count, dtype, op, root },
        Coll::AlltoAll | Coll::AlltoAllv | Coll::Gather | Coll::Scatter | Coll::SendRecv => {
            out.push(Prim::GroupStart);
            out.extend(point_to_point(call));
            out.push(Prim::GroupEnd);
            return;
        }
    };
    out.push(prim);
}

/// The sends and receives of the operations that are groups of them (none for the others).
fn point_to_point(call: &Call) -> Vec<Prim> {
    let dtype = call.dtype as i32;
    let e = call.dtype.size() as u64;
    let (send, recv, count, root) = (call.send, call.recv, call.count, call.root);
    let (n, rank) = (call.nranks, call.rank);
    let peers = 0..n as i32;
    let to = |buf: u64, count: usize, peer: i32| Prim::Send { buf, count, dtype, peer };
    let from = |buf: u64, count: usize, peer: i32| Prim::Recv { buf, count, dtype, peer };
    // Where peer `p`'s block of `count` elements starts in a buffer of one block per rank.
    let block = |base: u64, p: i32| base + p as u64 * count as u64 * e;
    match call.coll {
        Coll::AlltoAll => peers
            .flat_map(|p| [to(block(send, p), count, p), from(block(recv, p), count, p)])
            .collect(),
        Coll::AlltoAllv => match &call.vcounts {
            Some(v) => peers
                .flat_map(|p| {
                    let i = p as usize;
                    [
                        to(send + v.send_displs[i] as u64 * e, v.send_counts[i], p),
                        from(recv + v.recv_displs[i] as u64 * e, v.recv_counts[i], p),
                    ]
                })
                .collect(),
            None => Vec::new(),
        },
        Coll::Gather => {
            let mut prims = vec![to(send, count, root)];
            if rank as i32 == root {
                prims.extend(peers.map(|p| from(block(recv, p), count, p)));
            }
            prims
        }
        Coll::Scatter => {
            let mut prims = Vec::new();
            if rank as i32 == root {
                prims.extend(peers.map(|p| to(block(send, p), count, p)));
            }
            prims.push(from(recv, count, root));
            prims
        }
        Coll::SendRecv => vec![
            to(send, count, ((rank + 1) % n) as i32),
            from(recv, count, ((rank + n - 1) % n) as i32),
        ],
        Coll::AllReduce
        | Coll::AllGather
        | Coll::ReduceScatter
        | Coll::Broadcast
        | Coll::Reduce => Vec::new(),
    }
}
