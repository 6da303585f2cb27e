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
    let e = call.dtype.size() as u64;
    let (send, recv, count, root) = (call.send, call.recv, call.count, call.root);
    let n = call.nranks;
    let rank = call.rank;
    match call.coll {
        Coll::AllReduce => out.push(Prim::AllReduce {
            send,
            recv,
            count,
            dtype,
            op,
        }),
        Coll::AllGather => out.push(Prim::AllGather {
            send,
            recv,
            count,
            dtype,
        }),
        Coll::ReduceScatter => out.push(Prim::ReduceScatter {
            send,
            recv,
            count,
            dtype,
            op,
        }),
        Coll::Broadcast => out.push(Prim::Broadcast {
            send,
            recv,
            count,
            dtype,
            root,
        }),
        Coll::Reduce => out.push(Prim::Reduce {
            send,
            recv,
            count,
            dtype,
            op,
            root,
        }),
        Coll::AlltoAll => {
            out.push(Prim::GroupStart);
            for p in 0..n {
                let off = p as u64 * count as u64 * e;
                out.push(Prim::Send {
                    buf: send + off,
                    count,
                    dtype,
                    peer: p as i32,
                });
                out.push(Prim::Recv {
                    buf: recv + off,
                    count,
                    dtype,
                    peer: p as i32,
                });
            }
            out.push(Prim::GroupEnd);
        }
        Coll::AlltoAllv => {
            out.push(Prim::GroupStart);
            if let Some(v) = &call.vcounts {
                for p in 0..n {
                    out.push(Prim::Send {
                        buf: send + v.send_displs[p] as u64 * e,
                        count: v.send_counts[p],
                        dtype,
                        peer: p as i32,
                    });
                    out.push(Prim::Recv {
                        buf: recv + v.recv_displs[p] as u64 * e,
                        count: v.recv_counts[p],
                        dtype,
                        peer: p as i32,
                    });
                }
            }
            out.push(Prim::GroupEnd);
        }
        Coll::Gather => {
            out.push(Prim::GroupStart);
            out.push(Prim::Send {
                buf: send,
                count,
                dtype,
                peer: root,
            });
            if rank as i32 == root {
                for p in 0..n {
                    out.push(Prim::Recv {
                        buf: recv + p as u64 * count as u64 * e,
                        count,
                        dtype,
                        peer: p as i32,
                    });
                }
            }
            out.push(Prim::GroupEnd);
        }
        Coll::Scatter => {
            out.push(Prim::GroupStart);
            if rank as i32 == root {
                for p in 0..n {
                    out.push(Prim::Send {
                        buf: send + p as u64 * count as u64 * e,
                        count,
                        dtype,
                        peer: p as i32,
                    });
                }
            }
            out.push(Prim::Recv {
                buf: recv,
                count,
                dtype,
                peer: root,
            });
            out.push(Prim::GroupEnd);
        }
        Coll::SendRecv => {
            out.push(Prim::GroupStart);
            out.push(Prim::Send {
                buf: send,
                count,
                dtype,
                peer: ((rank + 1) % n) as i32,
            });
            out.push(Prim::Recv {
                buf: recv,
                count,
                dtype,
                peer: ((rank + n - 1) % n) as i32,
            });
            out.push(Prim::GroupEnd);
        }
    }
}
