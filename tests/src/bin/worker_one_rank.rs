//! `one-rank` (1 rank; `ONE_RANK_NONBLOCKING=1`: a non-blocking communicator): every operation
//! on a one-rank communicator, in place and out of place, alone and all in one group, results
//! checked element by element (int32, exact); issue 32 item 8.
//!
//! 1. In place, every collective whose operator leaves the data as it is (AllReduce Sum, Avg,
//!    PreMulSum by 1; Broadcast, Reduce Max, AllGather, ReduceScatter Min, AlltoAll,
//!    AlltoAllv, Gather, Scatter, a Send/Recv pair to self with one buffer), alone, then all
//!    in one group: nothing may run — the op log (`rank_statuses`) must have seen no operation
//!    start (the planner's way logs every task it runs).
//! 2. The same out of place, alone and in one group: the output is the input; the op log has
//!    seen them.
//! 3. Operators that compute on one rank (PreMulSum by 2, by a device scalar of 3): in place
//!    and out of place, alone and in a group with the others: the input times the scalar.
//! 4. Errors as the planner gives them: a send to self alone, a pair whose sizes differ, an
//!    unknown buffer in place.
//!
//! Every call of 1, 2 and 4 must complete within it: `Ok` (on a non-blocking communicator too,
//! not `InProgress`) and `async_error` then `Success`; those of 3 go the planner's way, queued
//! on a non-blocking communicator. `RESULT one-rank <blocking|non-blocking> ok`.

use rustccl::backend::{DevicePtr, Stream};
use rustccl::types::DataType;
use rustccl::{group_end, group_start, CommConfig, Communicator, Error, ReduceOp, ResultCode, Scalar, UniqueId};

use crate::worker_coll::test_device;
use crate::worker_nonblocking::{download, expect_eq, poll_done, upload};

const COUNT: usize = 1001;
const S: Stream = Stream::DEFAULT;
const I32: DataType = DataType::Int32;

/// The operations, each with the factor its output is of its input.
#[derive(Clone, Copy, Debug)]
enum Op {
    AllReduce(ReduceOp),
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AlltoAll,
    AlltoAllv,
    Gather,
    Scatter,
    SendRecv,
}

const LEAVE_AS_IS: [Op; 12] = [
    Op::AllReduce(ReduceOp::Sum),
    Op::AllReduce(ReduceOp::Avg),
    Op::AllReduce(ReduceOp::PreMulSum(Scalar::Host(1.0))),
    Op::Broadcast,
    Op::Reduce,
    Op::AllGather,
    Op::ReduceScatter,
    Op::AlltoAll,
    Op::AlltoAllv,
    Op::Gather,
    Op::Scatter,
    Op::SendRecv,
];

fn call(comm: &Communicator, op: Op, send: DevicePtr, recv: DevicePtr) -> Result<(), Error> {
    match op {
        Op::AllReduce(r) => comm.all_reduce(send, recv, COUNT, I32, r, S),
        Op::Broadcast => comm.broadcast(send, recv, COUNT, I32, 0, S),
        Op::Reduce => comm.reduce(send, recv, COUNT, I32, ReduceOp::Max, 0, S),
        Op::AllGather => comm.all_gather(send, recv, COUNT, I32, S),
        Op::ReduceScatter => comm.reduce_scatter(send, recv, COUNT, I32, ReduceOp::Min, S),
        Op::AlltoAll => comm.all_to_all(send, recv, COUNT, I32, S),
        Op::AlltoAllv => comm.all_to_allv(send, &[COUNT], &[0], recv, &[COUNT], &[0], I32, S),
        Op::Gather => comm.gather(send, recv, COUNT, I32, 0, S),
        Op::Scatter => comm.scatter(send, recv, COUNT, I32, 0, S),
        Op::SendRecv => {
            group_start();
            let r = comm.send(send, COUNT, I32, 0, S).and_then(|_| comm.recv(recv, COUNT, I32, 0, S));
            r.and(group_end())
        }
    }
}

fn input(k: usize) -> Vec<i32> {
    (0..COUNT).map(|i| (i as i32 % 97) - 40 + k as i32).collect()
}

/// The call completed within it: `Ok`, and nothing left in the background. Where `queued_ok`
/// (an operator that computes: the planner's way, queued on a non-blocking communicator), it
/// may have returned `InProgress` instead: then it is waited for.
fn done_or_queued(comm: &Communicator, r: Result<(), Error>, what: &str, queued_ok: bool) -> Result<(), Error> {
    match r {
        Err(e) if queued_ok && e.code == ResultCode::InProgress => poll_done(comm, what).map(|_| ()),
        r => done(comm, r, what),
    }
}

/// The call completed within it: `Ok`, and nothing left in the background.
fn done(comm: &Communicator, r: Result<(), Error>, what: &str) -> Result<(), Error> {
    r.map_err(|e| e.context(format!("{what}: expected to complete within the call")))?;
    let a = comm.async_error();
    if a != ResultCode::Success {
        return Err(Error::internal(format!("{what}: async_error is {a:?} after the call returned Ok")));
    }
    Ok(())
}

/// How many operations the op log has seen start.
fn started(comm: &Communicator) -> Result<u64, Error> {
    let st = comm.rank_statuses()?.remove(0).ok_or_else(|| Error::internal("no status of rank 0"))?;
    Ok(st.started.map_or(0, |d| d.seq))
}

/// Runs `ops`, each on its own buffers, alone or all in one group; checks every output.
fn run(comm: &Communicator, ops: &[(Op, i32)], in_place: bool, grouped: bool, scalar: DevicePtr) -> Result<(), Error> {
    let be = comm.backend();
    let dev = comm.device()? as usize;
    let mut bufs = Vec::new();
    for (k, _) in ops.iter().enumerate() {
        let send = upload(&**be, dev, &input(k))?;
        let recv = if in_place { send } else { upload(&**be, dev, &vec![-7; COUNT])? };
        bufs.push((send, recv));
    }
    let what = |op: Op| format!("{op:?} {} {}", if in_place { "in place" } else { "out of place" }, if grouped { "in a group" } else { "alone" });
    let with_scalar = |op: Op| match op {
        Op::AllReduce(ReduceOp::PreMulSum(Scalar::Device(_))) => Op::AllReduce(ReduceOp::PreMulSum(Scalar::Device(scalar))),
        op => op,
    };
    if grouped {
        group_start();
        let r = ops.iter().zip(&bufs).try_for_each(|(&(op, _), &(s, d))| call(comm, with_scalar(op), s, d));
        let what = format!("a group of {} operations {}", ops.len(), if in_place { "in place" } else { "out of place" });
        done_or_queued(comm, r.and(group_end()), &what, ops.iter().any(|&(_, f)| f != 1))?;
    } else {
        for (&(op, f), &(s, d)) in ops.iter().zip(&bufs) {
            done_or_queued(comm, call(comm, with_scalar(op), s, d), &what(op), f != 1)?;
        }
    }
    be.synchronize(S)?;
    for (k, (&(op, factor), &(s, d))) in ops.iter().zip(&bufs).enumerate() {
        let want: Vec<i32> = input(k).iter().map(|v| v * factor).collect();
        expect_eq(&download(&**be, d, COUNT)?, &want, &what(op))?;
        if !in_place {
            expect_eq(&download(&**be, s, COUNT)?, &input(k), &format!("{}: the send buffer", what(op)))?;
            be.free(d)?;
        }
        be.free(s)?;
    }
    Ok(())
}

/// `err` is the error with `code` whose message contains `text`.
fn refused(r: Result<(), Error>, code: ResultCode, text: &str, what: &str) -> Result<(), Error> {
    match r {
        Err(e) if e.code == code && e.message.contains(text) => Ok(()),
        other => Err(Error::internal(format!("{what}: returned {other:?}, expected {code:?} saying \"{text}\""))),
    }
}

pub fn one_rank(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let nonblocking = std::env::var("ONE_RANK_NONBLOCKING").is_ok_and(|v| v == "1");
    let config = if nonblocking { CommConfig::non_blocking() } else { CommConfig::default() };
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, test_device(rank), &config)?;
    if nonblocking {
        poll_done(&comm, "init")?;
    }
    let be = std::sync::Arc::clone(comm.backend());
    let scalar = upload(&*be, comm.device()? as usize, &[3])?;
    let as_is: Vec<(Op, i32)> = LEAVE_AS_IS.iter().map(|&op| (op, 1)).collect();
    // 1. In place: nothing runs.
    let before = started(&comm)?;
    run(&comm, &as_is, true, false, scalar)?;
    run(&comm, &as_is, true, true, scalar)?;
    let seen = started(&comm)? - before;
    if seen != 0 {
        return Err(Error::internal(format!("in place on one rank: the op log saw {seen} operations start, expected none (no work)")));
    }
    // 2. Out of place: one copy each.
    run(&comm, &as_is, false, false, scalar)?;
    run(&comm, &as_is, false, true, scalar)?;
    let seen = started(&comm)? - before;
    if seen == 0 {
        return Err(Error::internal("out of place on one rank: the op log saw nothing start"));
    }
    // 3. Operators that compute on one rank, alone and among the others.
    let computing = [(Op::AllReduce(ReduceOp::PreMulSum(Scalar::Host(2.0))), 2), (Op::AllReduce(ReduceOp::PreMulSum(Scalar::Device(DevicePtr::NULL))), 3)];
    let mixed: Vec<(Op, i32)> = computing.iter().copied().chain(as_is.iter().copied()).collect();
    for in_place in [true, false] {
        run(&comm, &computing, in_place, false, scalar)?;
        run(&comm, &mixed, in_place, true, scalar)?;
    }
    // 4. Errors, as the planner gives them.
    let x = upload(&*be, comm.device()? as usize, &input(0))?;
    refused(comm.send(x, COUNT, I32, 0, S), ResultCode::InvalidUsage, "1 send(s) to self but 0 receive(s) from self", "a send to self alone")?;
    group_start();
    let r = comm.send(x, COUNT, I32, 0, S).and_then(|_| comm.recv(x, COUNT / 2, I32, 0, S));
    let want = format!("a send to self of {} bytes meets a receive from self of {} bytes", COUNT * 4, COUNT / 2 * 4);
    refused(r.and(group_end()), ResultCode::InvalidUsage, &want, "a pair to self of different sizes")?;
    let unknown = DevicePtr(0x10);
    refused(comm.all_reduce(unknown, unknown, COUNT, I32, ReduceOp::Sum, S), ResultCode::InvalidArgument, "", "AllReduce in place on an unknown buffer")?;
    refused(call(&comm, Op::SendRecv, unknown, unknown), ResultCode::InvalidArgument, "", "Send/Recv in place on an unknown buffer")?;
    // Still usable.
    done(&comm, comm.all_reduce(x, x, COUNT, I32, ReduceOp::Sum, S), "AllReduce after the errors")?;
    expect_eq(&download(&*be, x, COUNT)?, &input(0), "AllReduce after the errors")?;
    be.free(x)?;
    be.free(scalar)?;
    comm.destroy()?;
    println!("RESULT one-rank {} ok", if nonblocking { "non-blocking" } else { "blocking" });
    Ok(())
}
