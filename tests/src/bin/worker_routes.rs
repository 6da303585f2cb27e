//! The router's ways inside groups and on non-blocking communicators (issue 32): every task of
//! a group is routed as a single call is, so the board, the symmetric CPU twin and the
//! planner serve one group together; on a non-blocking communicator the same ways run in the
//! background job. Each rank checks every result element by element (int32, exact) and the
//! way it published for each collective (`Communicator::route_taken`).
//!
//! - `routes-group`: a blocking communicator; three times, one group of: a small all_reduce
//!   (the board), a small broadcast (the board), an all_reduce on symmetric windows (the CPU
//!   twin), a 4 MiB all_reduce (a single copy between the ranks' buffers) and a send/receive
//!   ring (the planner). `RESULT routes-group ok`. On GPUs (tests/gpu/issue32.sh) the small
//!   calls and the 4 MiB all_reduce take the planner and the call on windows a symmetric
//!   kernel.
//! - `routes-nonblocking`: a non-blocking communicator: a small all_reduce alone (the board),
//!   one on windows alone (the CPU twin), then the group above; each returns `InProgress`
//!   and is polled to the end. `RESULT routes-nonblocking ok`.
//! - `routes-disagree`: in a group with a small all_reduce, rank 0 passes window buffers for
//!   a second all_reduce, the others plain ones: every rank gets an error (rank 0's names the
//!   peer that took another way), none hangs; `RUSTCCL_TEST_NONBLOCKING=1` runs it on a
//!   non-blocking communicator (the error comes through async_error).
//!   `RESULT routes-disagree ok <code>`.

use rustccl::backend::{DeviceBackend, DevicePtr, Stream};
use rustccl::types::DataType;
use rustccl::window::{Window, WIN_COLL_SYMMETRIC};
use rustccl::work::Way;
use rustccl::{group_end, group_start, CommConfig, Communicator, Error, ReduceOp, ResultCode, UniqueId};

use crate::worker_coll::test_device;
use crate::worker_nonblocking::{check, download, expect_eq, hang_guard, poll_done, upload};

const S: Stream = Stream::DEFAULT;
/// Elements of the small calls (1 KiB: the board).
const SMALL: usize = 256;
/// Elements of the calls on windows (256 KiB).
const WIN: usize = 64 << 10;
/// Elements of the planner's all_reduce (4 MiB).
const BIG: usize = 1 << 20;
/// Elements each rank sends to the next.
const RING: usize = 1000;

/// Rank `r`'s input of `n` elements for call `k`.
fn input(r: usize, k: usize, n: usize) -> Vec<i32> {
    (0..n).map(|i| (r as i32 + 1) * 7 + k as i32 * 3 + (i % 13) as i32 - 6).collect()
}

fn summed(nranks: usize, k: usize, n: usize) -> Vec<i32> {
    let inputs: Vec<Vec<i32>> = (0..nranks).map(|r| input(r, k, n)).collect();
    (0..n).map(|i| inputs.iter().map(|v| v[i]).sum()).collect()
}

/// Waits for a call's work: at once on a blocking communicator; by polling on a
/// non-blocking one (whose calls return `InProgress`).
fn done(comm: &Communicator, r: Result<(), Error>, what: &str) -> Result<(), Error> {
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.code == ResultCode::InProgress => poll_done(comm, what).map(|_| ()),
        Err(e) => Err(e.context(what.to_string())),
    }
}

/// A communicator with two symmetric windows of `WIN` int32 each.
struct Setup {
    comm: Communicator,
    be: std::sync::Arc<dyn DeviceBackend>,
    dev: usize,
    win: [DevicePtr; 2],
    windows: Vec<Window>,
}

fn setup(nranks: i32, rank: i32, ids: &[UniqueId], blocking: bool) -> Result<Setup, Error> {
    let config = if blocking { CommConfig::default() } else { CommConfig::non_blocking() };
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, test_device(rank), &config)?;
    if !blocking {
        poll_done(&comm, "init")?;
    }
    let be = std::sync::Arc::clone(comm.backend());
    let dev = comm.device()? as usize;
    let bytes = WIN * 4;
    let mem = be.window_memory_or_err("routes test")?;
    let win = [mem.alloc_symmetric(dev, bytes)?, mem.alloc_symmetric(dev, bytes)?];
    let mut windows = Vec::new();
    for w in win {
        let r = comm.window_register(w, bytes, WIN_COLL_SYMMETRIC);
        match r {
            Ok(w) => windows.push(w),
            Err(e) if e.code == ResultCode::InProgress => return Err(Error::internal("window_register returned InProgress")),
            Err(e) => return Err(e),
        }
    }
    Ok(Setup { comm, be, dev, win, windows })
}

/// The ways a small call, a call on windows and the 4 MiB all_reduce take: the board, the CPU
/// twin and a single copy between the ranks' buffers on the host backend; the planner, a
/// symmetric kernel and the planner on GPUs (no board there; its route rings only).
fn expected_ways(be: &dyn DeviceBackend) -> (Way, Way, Way) {
    if be.capabilities().host_addressable {
        (Way::Board, Way::SymmetricCpu, Way::SingleCopy)
    } else {
        (Way::Planned, Way::SymmetricKernel, Way::Planned)
    }
}

/// The way `comm` published for collective `seq` must be `want`.
fn took(comm: &Communicator, seq: u64, want: Way, what: &str) -> Result<(), Error> {
    let got = comm.route_taken(seq);
    check(got == Some(want), || format!("{what} (collective {seq}) took {got:?}, expected {want:?}"))
}

/// The mixed group: queues its calls (inside group_start/group_end), then checks every result
/// and way. `iter` varies the inputs.
fn mixed_group(s: &Setup, nranks: usize, me: usize, iter: usize) -> Result<(), Error> {
    let (comm, be, dev) = (&s.comm, &*s.be, s.dev);
    let ai = DataType::Int32;
    let root = 1 % nranks;
    let (a, b) = (upload(be, dev, &input(me, iter, SMALL))?, be.alloc(dev, SMALL * 4)?);
    let c = upload(be, dev, &input(me, iter + 1, SMALL))?;
    let d = be.alloc(dev, SMALL * 4)?;
    let w = input(me, iter + 2, WIN);
    let w_bytes: Vec<u8> = w.iter().flat_map(|x| x.to_ne_bytes()).collect();
    be.copy_to_device(s.win[0], &w_bytes, S)?;
    be.synchronize(S)?;
    let (e, f) = (upload(be, dev, &input(me, iter + 3, BIG))?, be.alloc(dev, BIG * 4)?);
    let (g, h) = (upload(be, dev, &input(me, iter + 4, RING))?, be.alloc(dev, RING * 4)?);
    let (next, prev) = ((me + 1) % nranks, (me + nranks - 1) % nranks);
    group_start();
    let mut seqs = Vec::new();
    let r = (|| {
        comm.all_reduce(a, b, SMALL, ai, ReduceOp::Sum, S)?;
        seqs.push(comm.collectives_called());
        comm.broadcast(c, d, SMALL, ai, root as i32, S)?;
        seqs.push(comm.collectives_called());
        comm.all_reduce(s.win[0], s.win[1], WIN, ai, ReduceOp::Sum, S)?;
        seqs.push(comm.collectives_called());
        comm.all_reduce(e, f, BIG, ai, ReduceOp::Sum, S)?;
        seqs.push(comm.collectives_called());
        comm.send(g, RING, ai, next as i32, S)?;
        comm.recv(h, RING, ai, prev as i32, S)
    })();
    let end = group_end();
    r?;
    done(comm, end, "the mixed group")?;
    be.synchronize(S)?;
    expect_eq(&download(be, b, SMALL)?, &summed(nranks, iter, SMALL), "all_reduce (board)")?;
    expect_eq(&download(be, d, SMALL)?, &input(root, iter + 1, SMALL), "broadcast (board)")?;
    expect_eq(&download(be, s.win[1], WIN)?, &summed(nranks, iter + 2, WIN), "all_reduce (windows)")?;
    expect_eq(&download(be, f, BIG)?, &summed(nranks, iter + 3, BIG), "all_reduce (4 MiB)")?;
    expect_eq(&download(be, h, RING)?, &input(prev, iter + 4, RING), "recv")?;
    let (small, win, big) = expected_ways(be);
    took(comm, seqs[0], small, "the small all_reduce")?;
    took(comm, seqs[1], small, "the small broadcast")?;
    took(comm, seqs[2], win, "the all_reduce on windows")?;
    took(comm, seqs[3], big, "the 4 MiB all_reduce")?;
    for p in [a, b, c, d, e, f, g, h] {
        be.free(p)?;
    }
    Ok(())
}

fn finish(s: Setup) -> Result<(), Error> {
    for w in &s.windows {
        s.comm.window_deregister(w)?;
    }
    s.comm.destroy()
}

pub fn group(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    hang_guard(rank, "routes-group", 90);
    let s = setup(nranks, rank, ids, true)?;
    for iter in 0..3 {
        mixed_group(&s, nranks as usize, rank as usize, iter)?;
    }
    finish(s)?;
    println!("RESULT routes-group ok");
    Ok(())
}

pub fn nonblocking(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    hang_guard(rank, "routes-nonblocking", 90);
    let s = setup(nranks, rank, ids, false)?;
    let (comm, be, dev, n, me) = (&s.comm, &*s.be, s.dev, nranks as usize, rank as usize);
    let ai = DataType::Int32;
    // Alone: the board, then the CPU twin.
    let (a, b) = (upload(be, dev, &input(me, 9, SMALL))?, be.alloc(dev, SMALL * 4)?);
    let (small, win, _) = expected_ways(be);
    let r = comm.all_reduce(a, b, SMALL, ai, ReduceOp::Sum, S);
    check(matches!(&r, Err(e) if e.code == ResultCode::InProgress), || format!("a small all_reduce returned {r:?}, expected InProgress"))?;
    done(comm, r, "the small all_reduce")?;
    be.synchronize(S)?;
    expect_eq(&download(be, b, SMALL)?, &summed(n, 9, SMALL), "all_reduce alone (board)")?;
    took(comm, comm.collectives_called(), small, "the small all_reduce alone")?;
    let w: Vec<u8> = input(me, 10, WIN).iter().flat_map(|x| x.to_ne_bytes()).collect();
    be.copy_to_device(s.win[0], &w, S)?;
    be.synchronize(S)?;
    done(comm, comm.all_reduce(s.win[0], s.win[1], WIN, ai, ReduceOp::Sum, S), "the all_reduce on windows")?;
    be.synchronize(S)?;
    expect_eq(&download(be, s.win[1], WIN)?, &summed(n, 10, WIN), "all_reduce on windows alone")?;
    took(comm, comm.collectives_called(), win, "the all_reduce on windows alone")?;
    for iter in 0..2 {
        mixed_group(&s, n, me, iter)?;
    }
    finish(s)?;
    println!("RESULT routes-nonblocking ok");
    Ok(())
}

pub fn disagree(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    hang_guard(rank, "routes-disagree", 40);
    let blocking = std::env::var("RUSTCCL_TEST_NONBLOCKING").map_or(true, |v| v != "1");
    let s = setup(nranks, rank, ids, blocking)?;
    let (comm, be, dev, me) = (&s.comm, &*s.be, s.dev, rank as usize);
    let ai = DataType::Int32;
    let (a, b) = (upload(be, dev, &input(me, 0, SMALL))?, be.alloc(dev, SMALL * 4)?);
    let (p, q) = (upload(be, dev, &input(me, 1, WIN))?, be.alloc(dev, WIN * 4)?);
    let (src, dst) = if rank == 0 { (s.win[0], s.win[1]) } else { (p, q) };
    group_start();
    let queued = comm.all_reduce(a, b, SMALL, ai, ReduceOp::Sum, S).and_then(|_| comm.all_reduce(src, dst, WIN, ai, ReduceOp::Sum, S));
    let end = group_end();
    queued?;
    let e = match done(comm, end, "the group") {
        Ok(()) => return Err(Error::internal("a group where one rank passed windows and the others plain buffers succeeded")),
        Err(e) => e,
    };
    if rank == 0 {
        check(e.code == ResultCode::InvalidUsage && e.message.contains("without symmetric windows"), || format!("rank 0: {e}"))?;
    }
    for w in &s.windows {
        let _ = s.comm.window_deregister(w);
    }
    let _ = s.comm.abort();
    println!("RESULT routes-disagree ok {:?}", e.code);
    Ok(())
}
