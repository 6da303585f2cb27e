//! Which single collectives take the board of small collectives or its single copies (host
//! backend, every rank on one host): the choice; the executor runs them
//! (`exec::host::board`, `exec::host::single_copy`).
//!
//! Taken for a single collective (outside a group, blocking communicator, no check mode, no
//! `NCCL_ALGO`/`NCCL_PROTO`, a board with its ring: not where `NCCL_SHM_DISABLE=1` or both
//! ways are turned off, no tuner whose table speaks for the call: `coll::way`) of at most
//! [`limit`] bytes on the board per rank, or an all_gather of at least
//! `RUSTCCL_HOST_SINGLE_COPY_BYTES` per rank where every rank may read every peer's memory
//! (single copies); everything the choice depends on is the same on every rank, so every rank
//! takes the same way (and where a rank's arguments differ, the route ring finds it). The
//! board is made at the communicator's init, so it exists on every rank before any collective.

use super::{CollKind, Task};
use crate::comm::Communicator;
use crate::error::Result;
use crate::exec::host::board::{self, Board, BoardOp};
use crate::exec::host::single_copy::{self, SingleCopyOp};
use crate::exec::host::HostCall;
use super::observe::{self as profiler_events, OpPlan};
use crate::work::{OpCtx, Way};

/// The most bytes a rank puts on the board for a call of `task`'s kind: the setting
/// (`RUSTCCL_HOST_SMALL_BYTES`), else where the board stops being faster than the FIFOs (2 ranks
/// on the 2-core development machine, 2026-12-02: all_reduce in place at 8 KiB 2.2 µs against
/// 8.2 and at 32 KiB 9.4 against 22, at 64 KiB out of place 16.8 against 12.8; broadcast and
/// all_gather the same from 4 KiB on, run to run swings larger than the difference): a whole
/// slot for reductions, 4 KiB for copies.
fn limit(task: &Task) -> usize {
    board::bytes_setting().unwrap_or(if task.kind.reduces() { board::MAX_BYTES } else { 4 << 10 })
}

/// Whether `task` (of `bytes` per rank on the board) takes a single copy on `board`.
fn takes_single_copy(board: &Board, task: &Task, bytes: usize) -> bool {
    let t = single_copy::threshold();
    board.single_copy() && t > 0 && bytes >= t && matches!(task.kind, CollKind::AllGather)
}

/// The way `task`, a single collective, takes on the board of `comm`: `None` when it does not.
fn choose<'c>(comm: &'c Communicator, task: &Task) -> Option<(&'c Board, Way)> {
    if task.count == 0 || task.kind.is_p2p() || !super::cache::may_skip_planner(comm, task) || super::plan::forced() {
        return None;
    }
    let board = comm.board().filter(|b| b.has_ring())?.as_ref();
    let bytes = board::board_bytes(task.kind.collective(), task.count, task.dtype.size(), board.nranks())?;
    if takes_single_copy(board, task, bytes) {
        return Some((board, Way::SingleCopy));
    }
    (bytes <= limit(task)).then_some((board, Way::Board))
}

/// The plain description of `task` the host ways take.
pub(super) fn host_call(task: &Task, seq: u64, ctx: OpCtx) -> HostCall {
    HostCall { coll: task.kind.collective(), root: task.kind.root(), count: task.count, dtype: task.dtype, seq, ctx }
}

/// Runs `task`, a collective outside a group, through the board or by single copies if it
/// takes one of them (None: it does not).
pub(crate) fn try_run(comm: &Communicator, task: &Task) -> Option<Result<()>> {
    let (board, way) = choose(comm, task)?;
    // Its buffers are checked before anything is published: a bad argument is refused at
    // once, as on the planner's way.
    let ctx = match super::plan::task_ctx(comm, task) {
        Ok(ctx) => ctx,
        Err(e) => return Some(Err(comm.record_error(e))),
    };
    let seq = comm.collective_number();
    board.publish_route(seq, way, ctx.sig);
    super::way::trace(task, board.nranks(), way);
    comm.op_log().started(std::slice::from_ref(&task.shape()));
    // For a profiler: one channel, no NCCL algorithm.
    let events = profiler_events::single_op(comm, task, || OpPlan { algo: "", proto: "", channels: 1 });
    let call = host_call(task, seq, ctx);
    let r = if way == Way::SingleCopy {
        crate::exec::host::run_op(comm, &mut SingleCopyOp::new(board, call))
    } else {
        crate::exec::host::run_op(comm, &mut BoardOp::new(board, call))
    };
    profiler_events::end_single_op(events, &r);
    super::cache::finish(comm, &r, false);
    Some(r)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::DeviceBackend;
    use crate::exec::host::{drive, HostOp, Queue};
    use crate::reduce::{DevOp, Reducer};
    use crate::spec::Collective;
    use crate::types::DataType;
    use crate::work::OpSig;

    /// Float32 sums of `count` elements, on host memory of `backend`: (send, receive, ctx).
    fn sum_ctx(backend: &dyn DeviceBackend, device: usize, values: &[f32]) -> OpCtx {
        let bytes = std::mem::size_of_val(values);
        let (src, dst) = (backend.alloc(device, bytes).unwrap(), backend.alloc(device, bytes).unwrap());
        let (src, dst) = (backend.host_access().unwrap().host_address(src, bytes).unwrap(), backend.host_access().unwrap().host_address(dst, bytes).unwrap());
        // SAFETY: `src` is a live host allocation of `bytes` bytes just made.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr().cast::<u8>(), src as *mut u8, bytes) };
        OpCtx {
            src,
            dst,
            src_len: bytes,
            dst_len: bytes,
            reducer: Reducer::new(DataType::Float32, DevOp::Sum),
            proto: rustccl_plugin_api::Protocol::Simple,
            sig: OpSig(1 << 60 | 8 << 56 | 1 << 52 | 0xf_ffff << 32 | values.len() as u64),
            scalar_at: 0,
            dst_remote: 0,
        }
    }

    fn result(ctx: &OpCtx, count: usize) -> Vec<f32> {
        // SAFETY: `dst` is the live receive buffer of `count` floats made by `sum_ctx`.
        unsafe { std::slice::from_raw_parts(ctx.dst as *const f32, count) }.to_vec()
    }

    /// The deadlock this driver removes: two ranks of one communicator driven by one thread
    /// (as `init_all` and a group allow), each with several board-sized all_reduces. A
    /// blocking wait for rank 1 on the thread that must also run rank 1 never returned; one
    /// driver polling both ranks' board operations completes them all.
    #[test]
    fn one_thread_drives_two_ranks_board_all_reduces_to_completion() {
        let comms = Communicator::init_all(&[0, 1]).unwrap();
        let boards: Vec<&Board> = comms.iter().map(|c| &**c.board().expect("a board on the host backend")).collect();
        let counts = [2usize, 1024, 8192]; // 8 B to the board's largest call (32 KiB)
        let mut ctxs: Vec<Vec<OpCtx>> = Vec::new();
        let mut ops: Vec<Vec<BoardOp>> = Vec::new();
        for (r, comm) in comms.iter().enumerate() {
            let backend = Arc::clone(comm.backend());
            let mut mine = Vec::new();
            let mut rank_ops = Vec::new();
            for (i, &count) in counts.iter().enumerate() {
                let values: Vec<f32> = (0..count).map(|e| (r * 1000 + i * 10 + e % 7) as f32).collect();
                let ctx = sum_ctx(&*backend, r, &values);
                let call = HostCall { coll: Collective::AllReduce, root: 0, count, dtype: DataType::Float32, seq: i as u64 + 1, ctx };
                boards[r].publish_route(call.seq, Way::Board, ctx.sig);
                rank_ops.push(BoardOp::new(boards[r], call));
                mine.push(ctx);
            }
            ctxs.push(mine);
            ops.push(rank_ops);
        }
        // A regression that waits forever fails the test: the communicators are aborted
        // after 30 s, which ends every wait with an error.
        let handles: Vec<Communicator> = comms.iter().map(|c| c.handle()).collect();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watchdog = {
            let done = Arc::clone(&done);
            std::thread::spawn(move || {
                let t = std::time::Instant::now();
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    if t.elapsed() > std::time::Duration::from_secs(30) {
                        handles.iter().for_each(|c| drop(c.abort()));
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            })
        };
        let (ops0, ops1) = ops.split_at_mut(1);
        let mut queues = [Queue::new(&comms[0]), Queue::new(&comms[1])];
        queues[0].ops.extend(ops0[0].iter_mut().map(|o| o as &mut dyn HostOp));
        queues[1].ops.extend(ops1[0].iter_mut().map(|o| o as &mut dyn HostOp));
        let r = drive(&mut queues);
        done.store(true, std::sync::atomic::Ordering::Release);
        watchdog.join().unwrap();
        r.unwrap();
        drop(queues);
        for (i, &count) in counts.iter().enumerate() {
            let want: Vec<f32> = (0..count).map(|e| ((i * 10 + e % 7) * 2 + 1000) as f32).collect();
            for (r, mine) in ctxs.iter().enumerate() {
                assert_eq!(result(&mine[i], count), want, "rank {r}, call {i} ({count} elements)");
            }
        }
        for c in &comms {
            c.destroy().unwrap();
        }
    }
}
