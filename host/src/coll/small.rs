//! A single collective the router (`coll::route`) sends to the board of small collectives or
//! to its single copies (host backend, every rank on one host): its buffers resolved, its way
//! published in the route ring, then run by the executor (`exec::host::board`,
//! `exec::host::single_copy`) under the call guard (`coll::call`). The board is made at the
//! communicator's init, so it exists on every rank before any collective.

use super::Task;
use crate::comm::Communicator;
use crate::error::Result;
use crate::exec::host::board::{Board, BoardOp};
use crate::exec::host::single_copy::SingleCopyOp;
use crate::exec::host::{HostCall, HostOp};
use crate::work::{OpCtx, Way};

/// The plain description of `task` the host ways take.
pub(super) fn host_call(task: &Task, seq: u64, ctx: OpCtx) -> HostCall {
    HostCall { coll: task.kind.collective(), root: task.kind.root(), count: task.count, dtype: task.dtype, seq, ctx }
}

/// `task` ready for the board way `way` (`Way::Board` or `Way::SingleCopy`) the router chose
/// for it: the board and the call with its buffers resolved and checked (an error here is
/// the caller's: nothing ran); `seq`: its collective number.
pub(crate) fn prepare<'c>(comm: &'c Communicator, task: &Task, seq: u64) -> Result<(&'c Board, HostCall)> {
    let Some(board) = comm.board().filter(|b| b.has_ring()) else {
        return Err(crate::error::Error::internal("a board route without a board"));
    };
    let ctx = super::plan::task_ctx(comm, task)?;
    Ok((board, host_call(task, seq, ctx)))
}

/// The host operation that runs `call` on `board` the way `way`.
pub(crate) fn op<'c>(board: &'c Board, call: HostCall, way: Way) -> Box<dyn HostOp + 'c> {
    if way == Way::SingleCopy {
        Box::new(SingleCopyOp::new(board, call))
    } else {
        Box::new(BoardOp::new(board, call))
    }
}

/// Runs `task`, a single collective, the board way `way` (`Way::Board` or `Way::SingleCopy`)
/// the router chose for it.
pub(crate) fn run(comm: &Communicator, task: &Task, way: Way) -> Result<()> {
    // Its buffers are checked before anything is published: a bad argument is refused at
    // once, as on the planner's way.
    let seq = comm.collective_number();
    let (board, call) = prepare(comm, task, seq).map_err(|e| comm.record_error(e))?;
    board.publish_route(seq, way, call.ctx.sig);
    super::way::trace(task, board.nranks(), way);
    let mut guard = super::call::Call::start(comm, false, std::iter::once(task));
    guard.around_planner(task);
    let r = if way == Way::SingleCopy {
        crate::exec::host::run_op(comm, &mut SingleCopyOp::new(board, call))
    } else {
        crate::exec::host::run_op(comm, &mut BoardOp::new(board, call))
    };
    guard.end(r)
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
        let boards: Vec<&crate::exec::host::board::Board> = comms.iter().map(|c| &**c.board().expect("a board on the host backend")).collect();
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
