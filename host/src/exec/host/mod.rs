//! The host executor: every CPU way of running a collective on the host backend, driven by one
//! wait loop on the calling thread.
//!
//! The ways, each in its module:
//! - [`fifo`]: the planner's work (programs of steps over FIFOs), polled item by item;
//! - [`board`]: small collectives one shot through a board in shared memory, made at the
//!   communicator's init; its head also carries each rank's route ring (which way each
//!   collective takes, published before it runs), which every wait for a peer reads;
//! - [`single_copy`]: large all_gathers copied straight from the peers' buffers
//!   (`process_vm_readv`), on the board;
//! - [`symmetric`]: the symmetric collectives' CPU twin on window memory.
//!
//! Each way but the FIFO run is a [`HostOp`]: a state machine that advances as far as it can
//! without waiting (sans-IO, as the FIFO run already was) and says when it waits for a peer.
//! [`drive`] runs a group: per communicator (a [`Queue`]; one thread may drive several ranks
//! of one communicator, `Communicator::init_all`) its FIFO run, if any, and its host
//! operations in call order (the first polled until it is done, then the next), every
//! communicator polled round-robin. Nothing blocks on one peer while another could move, so
//! ranks driven by the same thread never deadlock. While nothing moves the thread waits with
//! `exec::backoff` (what the waiting operations ask for: [`Wait`]) and now and then asks each
//! communicator whether to go on (`CommSide::check`: failures, aborts, `NCCL_OP_TIMEOUT_MS`,
//! hang reports), the FIFO runs for their connections and the peers' route entries, and the
//! waiting operations for theirs. A single call is a group of one ([`run_op`]).

pub mod board;
pub mod fifo;
pub mod signal_wait;
pub mod single_copy;
pub mod symmetric;

use smallvec::SmallVec;

pub use fifo::{HostRun, Prepared};

use super::backoff::{oversubscribed, spin_for, Backoff};
use super::CommSide;
use crate::error::Result;
use crate::spec::Collective;
use crate::types::DataType;
use crate::work::{LocalCopy, OpCtx};

pub(crate) use fifo::cores;

/// How often (in idle rounds) the failures are checked while a FIFO run waits (host
/// operations: `Backoff::check_now`, every 64th round once the spin is over).
const CHECK_EVERY: u32 = 256;

/// How far a host operation got in one poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// It has completed.
    Done,
    /// It advanced, and now waits for a peer.
    Moved,
    /// It waits for a peer, as before.
    Waiting,
}

/// How the thread waits while an operation waits for a peer: spin `spin` rounds, then yield
/// (or, with `naps`, nap: `exec::backoff`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait {
    pub spin: u32,
    pub naps: bool,
}

/// One collective of a host way as a state machine the driver polls.
pub trait HostOp {
    /// Advances as far as it can without waiting for a peer.
    fn poll(&mut self) -> Result<Progress>;
    /// While it waits (asked now and then, not on every poll): an error when the peer it waits
    /// for will not come (its route entry says it ran this collective another way, or went on
    /// past it).
    fn check_peers(&self) -> Result<()>;
    /// How to wait while it waits.
    fn wait(&self) -> Wait;
    /// What it is, for errors: e.g. `AllReduce (board)`.
    fn what(&self) -> String;
}

/// A collective as the host ways take it: plain data that coll resolved.
#[derive(Clone, Copy, Debug)]
pub struct HostCall {
    pub coll: Collective,
    /// The root of Broadcast and Reduce (0 for the others).
    pub root: usize,
    pub count: usize,
    pub dtype: DataType,
    /// Its number on the communicator (`Communicator::collective_number`): the key of the
    /// route ring.
    pub seq: u64,
    /// Its buffers (host addresses), reduction and signature.
    pub ctx: OpCtx,
}

impl HostCall {
    /// Bytes of one rank's part (`count` elements).
    pub fn part(&self) -> usize {
        self.count * self.dtype.size()
    }
}

/// One communicator's share of a group on the host: its FIFO run (the planner's work), if
/// any, and its host operations in call order.
pub struct Queue<'a> {
    pub comm: &'a dyn CommSide,
    pub fifo: Option<HostRun<'a>>,
    pub ops: SmallVec<[&'a mut dyn HostOp; 2]>,
    /// The operation polled now (those before it are done).
    head: usize,
    /// Whether the FIFO run has steps left.
    fifo_left: bool,
}

impl<'a> Queue<'a> {
    pub fn new(comm: &'a dyn CommSide) -> Queue<'a> {
        Queue { comm, fifo: None, ops: SmallVec::new(), head: 0, fifo_left: false }
    }

    /// Whether something is still to run.
    fn pending(&self) -> bool {
        self.fifo_left || self.head < self.ops.len()
    }
}

/// Runs the planner's work of every communicator of a group (no other host operations).
pub fn run(runs: &mut [HostRun<'_>]) -> Result<()> {
    let mut queues: SmallVec<[Queue<'_>; 2]> = SmallVec::new();
    for run in runs.iter_mut() {
        let mut q = Queue::new(run.comm);
        q.fifo = Some(HostRun { work: &mut *run.work, prep: &mut *run.prep, comm: run.comm });
        queues.push(q);
    }
    drive(&mut queues)
}

/// Runs one host operation of `comm` to completion (a single call: a group of one).
pub fn run_op(comm: &dyn CommSide, op: &mut dyn HostOp) -> Result<()> {
    // The first poll often completes it (its peers came first): then no wait loop is set up.
    match op.poll() {
        Ok(Progress::Done) => return Ok(()),
        Err(e) => return Err(comm.record(e.context(op.what()))),
        Ok(_) => {}
    }
    let mut q = Queue::new(comm);
    q.ops.push(op);
    drive(std::slice::from_mut(&mut q))
}

/// Copies within this rank's memory with nothing to compute, in order, on the calling thread:
/// a work's plain copies (before its items) and the one-rank route's (`exec::local_copies`).
/// Their ranges are host addresses the planner resolved through the backend
/// (`coll::plan::task_ctx`), as every address in a `Work` is.
pub fn local_copies<'a>(copies: impl IntoIterator<Item = &'a LocalCopy>) {
    for c in copies {
        // SAFETY: the planner resolved both ranges through the backend (live memory of
        // `bytes` each); they may overlap only as the caller's buffers do, hence memmove.
        unsafe { std::ptr::copy(c.src as *const u8, c.dst as *mut u8, c.bytes) };
    }
}

/// Runs every queue to completion on the calling thread (see the module docs). An error ends
/// the whole group (recorded as the failing communicator's last error; the caller marks the
/// communicators broken).
pub fn drive(queues: &mut [Queue<'_>]) -> Result<()> {
    let mut fifo_pending = false;
    for q in queues.iter_mut() {
        q.head = 0;
        q.fifo_left = match &mut q.fifo {
            Some(f) => {
                f.start();
                f.pending()
            }
            None => false,
        };
        fifo_pending |= q.fifo_left;
    }
    if fifo_pending {
        // How the FIFO runs wait, once per group (it asks each communicator of its ranks).
        let local = queues.iter().map(|q| q.comm.local_ranks()).max().unwrap_or(1) as usize;
        let fifo_wait = Wait { spin: spin_for(local, fifo::spin_rounds()), naps: oversubscribed(local) };
        fifo::with_scratch(|scratch| poll_all(queues, fifo_wait, scratch))
    } else {
        poll_all(queues, Wait { spin: 0, naps: false }, &mut [])
    }
}

/// The wait loop: every communicator's FIFO run and head operation, round-robin (the FIFO
/// runs wait as `fifo_wait` says).
fn poll_all(queues: &mut [Queue<'_>], fifo_wait: Wait, scratch: &mut [u8]) -> Result<()> {
    let mut idle = 0u32;
    let mut wait: Option<Backoff> = None;
    loop {
        let (mut progressed, mut pending) = (false, false);
        for q in queues.iter_mut() {
            if q.fifo_left {
                if let Some(f) = &mut q.fifo {
                    let (moved, more) = f.poll(scratch).map_err(|e| q.comm.record(e.context("collective")))?;
                    progressed |= moved;
                    q.fifo_left = more;
                }
            }
            while let Some(op) = q.ops.get_mut(q.head) {
                match op.poll().map_err(|e| q.comm.record(e.context(op.what())))? {
                    Progress::Done => {
                        q.head += 1;
                        progressed = true;
                    }
                    Progress::Moved => {
                        progressed = true;
                        break;
                    }
                    Progress::Waiting => break,
                }
            }
            pending |= q.pending();
        }
        if !pending {
            return Ok(());
        }
        if progressed {
            idle = 0;
            wait = None;
            continue;
        }
        idle += 1;
        let w = wait.get_or_insert_with(|| backoff(queues, fifo_wait));
        let fifo_check = idle.is_multiple_of(CHECK_EVERY) && queues.iter().any(|q| q.fifo_left);
        if fifo_check || (w.check_now() && queues.iter().any(|q| q.head < q.ops.len())) {
            check(queues)?;
        }
        w.pause();
    }
}

/// How to wait now: the longest spin any waiting part asks for; naps only where every one
/// asks for them.
fn backoff(queues: &[Queue<'_>], fifo_wait: Wait) -> Backoff {
    let mut want: Option<Wait> = None;
    let mut add = |w: Wait| {
        want = Some(match want {
            None => w,
            Some(have) => Wait { spin: have.spin.max(w.spin), naps: have.naps && w.naps },
        })
    };
    if queues.iter().any(|q| q.fifo_left) {
        add(fifo_wait);
    }
    for q in queues {
        if let Some(op) = q.ops.get(q.head) {
            add(op.wait());
        }
    }
    match want {
        Some(Wait { spin, naps: true }) => Backoff::napping(spin),
        Some(Wait { spin, .. }) => Backoff::new(spin),
        None => Backoff::new(0),
    }
}

/// While nothing moves: each communicator with work left may go on (no failure, abort,
/// timeout), its FIFO run's waiting connections have not failed and no peer ran its current
/// collective another way, and the peers its head operation waits for will come.
fn check(queues: &[Queue<'_>]) -> Result<()> {
    for q in queues.iter().filter(|q| q.pending()) {
        q.comm.check("collective").map_err(|e| q.comm.record(e))?;
        if let (true, Some(f)) = (q.fifo_left, &q.fifo) {
            f.check_connections().map_err(|e| q.comm.record(e))?;
            if let Some(board) = q.comm.board() {
                board.check_current_route().map_err(|e| q.comm.record(e.context("collective")))?;
            }
        }
        if let Some(op) = q.ops.get(q.head) {
            op.check_peers().map_err(|e| q.comm.record(e.context(op.what())))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::board::{tests::boards, Board, BoardOp};
    use super::single_copy::SingleCopyOp;
    use super::symmetric::SymOp;
    use super::*;
    use crate::error::{Error, ErrorKind};
    use crate::reduce::{DevOp, Reducer};
    use crate::work::{OpSig, SymmetricPlace, Way};

    /// A communicator as the driver sees it: going on for 20 s (then a timeout: a wait that
    /// never ends fails the test instead of hanging it), errors as they are.
    struct Side {
        rank: u32,
        board: Option<Arc<Board>>,
        deadline: std::time::Instant,
    }

    impl CommSide for Side {
        fn rank(&self) -> u32 {
            self.rank
        }
        fn check(&self, what: &str) -> Result<()> {
            if std::time::Instant::now() > self.deadline {
                return Err(Error::timeout(format!("{what}: still waiting after 20 s")));
            }
            Ok(())
        }
        fn record(&self, e: Error) -> Error {
            e
        }
        fn board(&self) -> Option<Arc<Board>> {
            self.board.clone()
        }
    }

    fn sides(boards: &[Arc<Board>]) -> Vec<Side> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        boards.iter().enumerate().map(|(r, b)| Side { rank: r as u32, board: Some(Arc::clone(b)), deadline }).collect()
    }

    /// A Float32 sum of `send` into `recv` (host memory of the test).
    fn ctx(send: &[f32], recv: &mut [f32], sig: OpSig) -> OpCtx {
        OpCtx {
            src: send.as_ptr() as usize,
            dst: recv.as_mut_ptr() as usize,
            src_len: std::mem::size_of_val(send),
            dst_len: std::mem::size_of_val(recv),
            reducer: Reducer::new(DataType::Float32, DevOp::Sum),
            proto: rustccl_plugin_api::Protocol::Simple,
            sig,
            scalar_at: 0,
            dst_remote: 0,
        }
    }

    /// [`ctx`] of a call in place on `buf`.
    fn in_place(buf: &mut [f32], sig: OpSig) -> OpCtx {
        let c = ctx(&[], buf, sig);
        OpCtx { src: c.dst, src_len: c.dst_len, ..c }
    }

    const SIG: OpSig = OpSig(1 << 60 | 8 << 56 | 1 << 52 | 0xf_ffff << 32 | 4);

    fn call(coll: Collective, count: usize, seq: u64, ctx: OpCtx) -> HostCall {
        HostCall { coll, root: 0, count, dtype: DataType::Float32, seq, ctx }
    }

    /// Runs each rank's ops in order, one queue per rank, all on this thread.
    fn drive_queues<O: HostOp>(sides: &[Side], ops: &mut [Vec<O>]) -> Result<()> {
        let mut queues: Vec<Queue<'_>> = Vec::new();
        for (side, rank_ops) in sides.iter().zip(ops.iter_mut()) {
            let mut q = Queue::new(side);
            q.ops.extend(rank_ops.iter_mut().map(|o| o as &mut dyn HostOp));
            queues.push(q);
        }
        drive(&mut queues)
    }

    /// Runs one op per rank, all on this thread.
    fn drive_all(sides: &[Side], ops: &mut [&mut dyn HostOp]) -> Result<()> {
        let mut queues: Vec<Queue<'_>> = Vec::new();
        for (side, op) in sides.iter().zip(ops.iter_mut()) {
            let mut q = Queue::new(side);
            q.ops.push(&mut **op);
            queues.push(q);
        }
        drive(&mut queues)
    }

    #[test]
    fn board_ops_of_three_ranks_on_one_thread_reduce_broadcast_and_gather() {
        let b = boards(3);
        let sides = sides(&b);
        let send: Vec<Vec<f32>> = (0..3).map(|r| vec![r as f32 + 1.0, 10.0 * (r as f32 + 1.0)]).collect();
        // All-reduce, then a broadcast from rank 0, then an all-gather: one queue per rank.
        let mut sum = vec![vec![0f32; 2]; 3];
        let mut bcast = vec![vec![0f32; 2]; 3];
        let mut gather = vec![vec![0f32; 6]; 3];
        let mut ops: Vec<Vec<BoardOp>> = Vec::new();
        for r in 0..3 {
            let ar = call(Collective::AllReduce, 2, 1, ctx(&send[r], &mut sum[r], SIG));
            let bc = call(Collective::Broadcast, 2, 2, ctx(&send[r], &mut bcast[r], OpSig(2)));
            let ag = call(Collective::AllGather, 2, 3, ctx(&send[r], &mut gather[r], OpSig(3)));
            ops.push([ar, bc, ag].into_iter().map(|c| BoardOp::new(&b[r], c)).collect());
        }
        drive_queues(&sides, &mut ops).unwrap();
        for r in 0..3 {
            assert_eq!(sum[r], [6.0, 60.0], "rank {r}");
            assert_eq!(bcast[r], send[0], "rank {r}");
            assert_eq!(gather[r], [1.0, 10.0, 2.0, 20.0, 3.0, 30.0], "rank {r}");
        }
    }

    #[test]
    fn a_board_op_fails_when_its_peer_published_another_way_naming_both() {
        let b = boards(2);
        let sides = sides(&b);
        let (send, mut recv) = ([1f32; 4], [0f32; 4]);
        b[1].publish_route(7, Way::Planned, SIG);
        b[0].publish_route(7, Way::Board, SIG);
        let mut op = BoardOp::new(&b[0], call(Collective::AllReduce, 4, 7, ctx(&send, &mut recv, SIG)));
        let e = run_op(&sides[0], &mut op).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Mismatch);
        for part in ["rank 1 ran collective 7", "on the planner way", "rank 0", "on the board way", "AllReduce (board)"] {
            assert!(e.message.contains(part), "{part:?} not in: {}", e.message);
        }
    }

    #[test]
    fn a_board_op_fails_when_its_peer_went_a_whole_route_ring_further() {
        let b = boards(2);
        let sides = sides(&b);
        let (send, mut recv) = ([1f32; 4], [0f32; 4]);
        b[0].publish_route(3, Way::Board, SIG);
        // Rank 1 ran collective 3 otherwise and went on for a whole ring of collectives.
        b[1].publish_route(3 + 1024, Way::Planned, OpSig(5));
        let mut op = BoardOp::new(&b[0], call(Collective::AllReduce, 4, 3, ctx(&send, &mut recv, SIG)));
        let e = run_op(&sides[0], &mut op).unwrap_err();
        assert!(e.message.contains("rank 1 went on to collective 1027 while rank 0 waits for it in collective 3"), "{}", e.message);
    }

    #[test]
    fn single_copies_of_two_ranks_on_one_thread_gather_every_part() {
        let b = boards(2);
        let sides = sides(&b);
        let send = [vec![1f32, 2.0, 3.0], vec![4f32, 5.0, 6.0]];
        let mut recv = vec![vec![0f32; 6]; 2];
        let (r0, r1) = recv.split_at_mut(1);
        let mut op0 = SingleCopyOp::new(&b[0], call(Collective::AllGather, 3, 1, ctx(&send[0], &mut r0[0], SIG)));
        let mut op1 = SingleCopyOp::new(&b[1], call(Collective::AllGather, 3, 1, ctx(&send[1], &mut r1[0], SIG)));
        drive_all(&sides, &mut [&mut op0, &mut op1]).unwrap();
        assert_eq!(recv, vec![vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; 2]);
        assert_eq!((b[0].single_copies(), b[1].single_copies()), (1, 1));
    }

    /// all_reduce (in and out of place, PreMulSum with each rank's own scalar), reduce_scatter
    /// and broadcast (in place from rank 1, out of place from rank 2) by single copies of three
    /// ranks, at sizes that take several chunks and uneven slices.
    #[test]
    fn single_copies_of_three_ranks_reduce_scatter_and_broadcast_straight_between_buffers() {
        let n = 3;
        let b = boards(n);
        let sides = sides(&b);
        let count = 3 * 40_000 + 7;
        let input = |r: usize| -> Vec<f32> { (0..count).map(|i| (i % 977) as f32 + 1000.0 * r as f32).collect() };
        let scaled = |r: usize, mut c: OpCtx| {
            c.reducer = Reducer::new(DataType::Float32, DevOp::PreMulSum { scalar: r as f64 + 1.0 });
            c
        };
        let send: Vec<Vec<f32>> = (0..n).map(input).collect();
        let expect: Vec<f32> = (0..count).map(|i| (0..n).map(|r| (r as f32 + 1.0) * send[r][i]).sum()).collect();
        // Out of place, then in place, then a reduce_scatter and a broadcast, in one queue per rank.
        let mut out = vec![vec![f32::NAN; count]; n];
        let mut inplace: Vec<Vec<f32>> = (0..n).map(input).collect();
        let rs_count = count / n;
        let mut rs_out = vec![vec![f32::NAN; rs_count]; n];
        let mut bcast: Vec<Vec<f32>> = (0..n).map(|r| if r == 1 { input(1) } else { vec![f32::NAN; count] }).collect();
        let mut bcast_out = vec![vec![f32::NAN; count]; n];
        let mut ops: Vec<Vec<SingleCopyOp>> = Vec::new();
        let (mut out_it, mut inplace_it, mut rs_it, mut bcast_it) = (out.iter_mut(), inplace.iter_mut(), rs_out.iter_mut(), bcast.iter_mut());
        let mut bcast_out_it = bcast_out.iter_mut();
        for r in 0..n {
            let o = out_it.next().unwrap();
            let ar = call(Collective::AllReduce, count, 1, scaled(r, ctx(&send[r], o, SIG)));
            let ip = inplace_it.next().unwrap();
            let ip_ctx = in_place(ip, OpSig(2));
            let ar_in_place = call(Collective::AllReduce, count, 2, scaled(r, ip_ctx));
            let rs = call(Collective::ReduceScatter, rs_count, 3, ctx(&send[r], rs_it.next().unwrap(), OpSig(3)));
            let bc_buf = bcast_it.next().unwrap();
            let bc = HostCall { root: 1, ..call(Collective::Broadcast, count, 4, in_place(bc_buf, OpSig(4))) };
            let bc_out = HostCall { root: 2, ..call(Collective::Broadcast, count, 5, ctx(&send[r], bcast_out_it.next().unwrap(), OpSig(5))) };
            ops.push([ar, ar_in_place, rs, bc, bc_out].into_iter().map(|c| SingleCopyOp::new(&b[r], c)).collect());
        }
        drive_queues(&sides, &mut ops).unwrap();
        drop(ops);
        for r in 0..n {
            assert!(out[r] == expect, "rank {r}: all_reduce out of place");
            assert!(inplace[r] == expect, "rank {r}: all_reduce in place");
            let sums: Vec<f32> = (0..rs_count).map(|i| (0..n).map(|p| send[p][r * rs_count + i]).sum()).collect();
            assert!(rs_out[r] == sums, "rank {r}: reduce_scatter");
            assert!(bcast[r] == send[1], "rank {r}: broadcast");
            assert!(bcast_out[r] == send[2], "rank {r}: broadcast out of place");
        }
        assert!(b.iter().all(|b| b.single_copies() == 5));
    }

    /// The flat range of `n` ranks' windows in one process: per rank a slot of `STRIDE` bytes
    /// holding its send buffer, receive buffer and resource memory.
    struct Windows {
        mem: Vec<u64>,
    }

    const STRIDE: usize = 1 << 16;
    const RECV_AT: u64 = 16 << 10;
    const RES_AT: u64 = 32 << 10;

    impl Windows {
        fn new(n: usize) -> Windows {
            Windows { mem: vec![0; n * STRIDE / 8] }
        }
        fn place(&self, rank: usize) -> SymmetricPlace {
            let base = self.mem.as_ptr() as u64 + (rank * STRIDE) as u64;
            SymmetricPlace { send: base, recv: base + RECV_AT, res: base + RES_AT, stride: STRIDE as u64, rank }
        }
        fn floats(&mut self, rank: usize, at: u64, count: usize) -> &mut [f32] {
            let i = (rank * STRIDE + at as usize) / 8;
            // SAFETY: `count` floats inside rank `rank`'s slot of the test's own memory.
            unsafe { std::slice::from_raw_parts_mut(self.mem[i..].as_mut_ptr().cast::<f32>(), count) }
        }
    }

    fn sym_call(place: SymmetricPlace, count: usize, seq: u64) -> HostCall {
        let bytes = count * 4;
        let c = OpCtx {
            src: place.send as usize,
            dst: place.recv as usize,
            src_len: bytes,
            dst_len: bytes,
            reducer: Reducer::new(DataType::Float32, DevOp::Sum),
            proto: rustccl_plugin_api::Protocol::Simple,
            sig: SIG,
            scalar_at: 0,
            dst_remote: 0,
        };
        call(Collective::AllReduce, count, seq, c)
    }

    #[test]
    fn symmetric_all_reduces_of_two_ranks_on_one_thread_complete() {
        let b = boards(2);
        let sides = sides(&b);
        let mut w = Windows::new(2);
        for r in 0..2 {
            w.floats(r, 0, 5).copy_from_slice(&[1.0 + r as f32; 5]);
        }
        let launches = symmetric::launches();
        for seq in 1..=3 {
            let mut op0 = SymOp::new(w.place(0), 2, sym_call(w.place(0), 5, seq), Some(&*b[0]));
            let mut op1 = SymOp::new(w.place(1), 2, sym_call(w.place(1), 5, seq), Some(&*b[1]));
            drive_all(&sides, &mut [&mut op0, &mut op1]).unwrap();
        }
        for r in 0..2 {
            assert_eq!(w.floats(r, RECV_AT, 5), [3.0; 5], "rank {r}");
        }
        assert!(symmetric::launches() >= launches + 6);
    }

    #[test]
    fn a_symmetric_barrier_fails_when_its_peer_runs_without_windows_naming_both() {
        let b = boards(2);
        let sides = sides(&b);
        let w = Windows::new(2);
        b[1].publish_route(4, Way::Planned, SIG);
        let mut op = SymOp::new(w.place(0), 2, sym_call(w.place(0), 5, 4), Some(&*b[0]));
        let e = run_op(&sides[0], &mut op).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Mismatch);
        for part in ["rank 1 ran collective 4", "on the planner way", "on the symmetric-cpu way", "without symmetric windows"] {
            assert!(e.message.contains(part), "{part:?} not in: {}", e.message);
        }
    }

    #[test]
    fn the_fifo_poller_fails_when_a_peer_runs_its_collective_another_way() {
        use crate::program::{Link, Purpose, Step};
        use crate::transport::fifo::{fifo_bytes, Fifo, LocalMemory};
        use crate::transport::{Connection, Dir, Kind};
        use crate::work::{Work, WorkItem};
        let b = boards(2);
        let sides = sides(&b);
        // Rank 0 waits for a slot from rank 1 that never comes: rank 1 took the board.
        let link = Link { peer: 1, purpose: Purpose::Direct(0) };
        let mem = LocalMemory::new(fifo_bytes(4));
        // SAFETY: `mem` is zeroed and kept by the connection as long as the FIFO.
        let fifo = unsafe { Fifo::new(mem.ptr(), 4) };
        let conn = Arc::new(Connection::for_test(link, Dir::Recv, Kind::Shm, fifo, mem));
        let links: crate::exec::Links = [((link, Dir::Recv), conn)].into_iter().collect();
        let (send, mut recv) = ([1f32; 4], [0f32; 4]);
        let step = Step { recv: vec![link], dst: Some(0), ..Step::new(16) };
        let mut work = Work {
            ctxs: vec![ctx(&send, &mut recv, SIG)],
            items: vec![WorkItem { steps: vec![(0, step)], pc: 0 }],
            copies: Vec::new(),
            stream: crate::backend::Stream::DEFAULT,
        };
        let mut prep = Prepared::new(&work, &links);
        b[0].publish_route(9, Way::Planned, SIG);
        b[1].publish_route(9, Way::Board, SIG);
        let e = run(&mut [HostRun { work: &mut work, prep: &mut prep, comm: &sides[0] }]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Mismatch);
        assert!(e.message.contains("rank 1 ran collective 9") && e.message.contains("on the board way"), "{}", e.message);
    }
}
