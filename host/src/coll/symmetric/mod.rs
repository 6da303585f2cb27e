//! The planner's choice of the symmetric kernels (`kernels/src/device/symmetric.h`; on the
//! host backend their CPU twins, `exec::host::symmetric`): a single
//! all_reduce, all_gather or reduce_scatter (outside a group, on a blocking communicator)
//! whose send and receive buffers both lie in `NCCL_WIN_COLL_SYMMETRIC` windows runs one
//! kernel that reads and writes the peers' windows directly, instead of the ring through the
//! FIFOs. As with NCCL, every rank must pass window buffers at the same offsets for the same
//! call (the windows are collective, so ranks that do see the same windows): on GPUs a rank
//! that passes a window buffer where another passes other memory takes another kernel, and
//! the two wait for each other until the operation timeout reports the hang; the host
//! backend detects it (the route ring, `exec::host::board`).
//!
//! Which kernel, by size (`choose`; `RUSTCCL_SYM_KERNEL` forces one: `ll`, `ld`, `rsag` for
//! all_reduce; `off` turns the symmetric kernels off), from the measurements on one H200
//! with 2 ranks (docs/PERFORMANCE.md, 2026-12-02):
//! - all_reduce up to [`LL_MAX`] bytes (and what fits the LL scratch): one shot through
//!   flag-tagged LL lines, no barrier;
//! - above: two shots, each rank reducing its slice from every peer's send window and
//!   storing it into every peer's receive window;
//! - the one-shot load kernel (every rank reduces the whole buffer itself) only when forced,
//!   and never in place: a rank would overwrite its input while a peer still reads it.
//!
//! all_gather and reduce_scatter each have one kernel.
//!
//! Copy-engine collectives (no kernel, no SM): broadcast from [`CE_MIN`] bytes, all_to_all
//! on symmetric windows (out of place) at every size, and all_gather when forced (its kernel
//! was faster at every size measured) copy into the peers' windows with `cuMemcpyAsync`,
//! between two barriers of stream memory operations (`exec::gpu::copy_engine`). Their epoch is
//! counted by the host, so they do not run inside a graph capture (those calls take the
//! kernels or the ring). `RUSTCCL_SYM_KERNEL=ce` makes all_gather and broadcast take them at
//! every size.
//!
//! This module makes the choice; the GPU executor runs it (`exec::gpu::symmetric`: the
//! kernel's launch; `exec::gpu::copy_engine`: the copy engines), given the buffers as an
//! `exec::gpu::symmetric::SymPlace`.

use rustccl_kernels::symmetric::SymKernel;
use super::observe::{self as profiler_events, OpPlan};

use super::route::SymWay;
use super::{CollKind, Task};
use crate::backend::{DevicePtr, Stream};
use crate::comm::health::OpShape;
use crate::comm::Communicator;
use crate::error::Result;
use crate::exec::gpu::copy_engine::{CeCollective, CopyEngineRun, Ready};
use crate::exec::gpu::symmetric::{SymLaunch, SymPlace};
use crate::exec::host::symmetric::SymOp;
use crate::exec::host::HostCall;
use crate::types::DataType;
use crate::work::{OpCtx, OpSig, SymmetricPlace, Way};

pub use super::route::{CE_MIN, LL_MAX};

/// How many symmetric collectives this process has run (kernels and copy engines, or on the
/// host backend their CPU twins).
pub fn launches() -> u64 {
    crate::exec::gpu::symmetric::launches() + crate::exec::host::symmetric::launches()
}

/// What the profiler's Coll event says of a symmetric path: no NCCL algorithm, one channel.
const ONE_CHANNEL: OpPlan = OpPlan { algo: "", proto: "", channels: 1 };

/// Whether a collective of `count` elements on `comm` may take a symmetric path at all:
/// the backend has them, they are not turned off, and it is a single blocking call of
/// several ranks outside check mode.
fn eligible(comm: &Communicator, count: usize) -> bool {
    comm.backend().capabilities().symmetric_kernels
        && count > 0
        && comm.config().blocking
        && !super::check::enabled()
        && comm.nranks_unchecked() > 1
        && super::route::Settings::get().sym != super::route::SymSetting::Off
}

/// Where `task`'s buffers lie in symmetric windows (`None` if either does not), with its
/// kind's send and receive sizes; a broadcast's non-root, whose send buffer is unused, looks
/// its receive buffer up twice.
fn place_of(comm: &Communicator, task: &Task, n: usize) -> Option<SymmetricPlace> {
    if !matches!(task.kind, CollKind::AllReduce | CollKind::AllGather | CollKind::ReduceScatter | CollKind::Broadcast { .. }) {
        return None;
    }
    let me = comm.rank_unchecked() as usize;
    let (send_bytes, recv_bytes) = task.extent_bytes(n, me);
    let (send, send_bytes) = if task.kind.spec().uses_send(me, task.kind.root()) { (task.send, send_bytes) } else { (task.recv, recv_bytes) };
    comm.symmetric_place(send, send_bytes, task.recv, recv_bytes)
}

/// The executor's view of `place`.
fn sym_place(place: SymmetricPlace) -> SymPlace {
    let SymmetricPlace { send, recv, res, stride, rank } = place;
    SymPlace { send, recv, res, stride, rank }
}

/// Whether the copy engines may run on `stream` now (not while it captures a graph: their
/// host-counted epochs cannot be replayed): `Err` with the failure already recorded.
fn copy_engine_ready(comm: &Communicator, stream: Stream) -> std::result::Result<Option<Ready>, Result<()>> {
    crate::exec::gpu::copy_engine_ready(comm.backend(), stream).map_err(|e| Err(comm.record_error(e)))
}

/// Where a task's buffers lie, as the router asks it (`route::Placement`): looked up once
/// each, and kept for the run (the copy engines' readiness is the capture check itself).
pub(crate) struct Placed<'c> {
    comm: &'c Communicator,
    task: &'c Task,
    place: Option<Option<SymmetricPlace>>,
    ready: Option<Ready>,
}

impl<'c> Placed<'c> {
    pub(crate) fn new(comm: &'c Communicator, task: &'c Task) -> Placed<'c> {
        Placed { comm, task, place: None, ready: None }
    }

    fn place(&mut self) -> Option<SymmetricPlace> {
        let (comm, task) = (self.comm, self.task);
        *self.place.get_or_insert_with(|| {
            // No symmetric window yet: nothing to look up (this runs on every small call).
            if !comm.has_symmetric_resources() && comm.backend().capabilities().host_addressable {
                return None;
            }
            place_of(comm, task, comm.nranks_unchecked() as usize)
        })
    }
}

impl super::route::Placement for Placed<'_> {
    fn symmetric(&mut self) -> bool {
        self.place().is_some()
    }

    fn capturing(&mut self) -> Result<bool> {
        let ready = crate::exec::gpu::copy_engine_ready(self.comm.backend(), self.task.stream)?;
        let capturing = ready.is_none();
        self.ready = ready;
        Ok(capturing)
    }
}

/// Runs `task` the symmetric way `way` the router chose for it, on the buffers `placed`
/// found in symmetric windows.
pub(crate) fn run(comm: &Communicator, task: &Task, way: SymWay, mut placed: Placed<'_>) -> Result<()> {
    let n = comm.nranks_unchecked() as usize;
    let Some(place) = placed.place() else {
        return Err(comm.record_error(crate::error::Error::internal("a symmetric route without window buffers")));
    };
    let part = (task.count * task.dtype.size()) as u64;
    match way {
        SymWay::Cpu => {
            super::way::trace(task, n, Way::SymmetricCpu);
            let events = profiler_events::single_op(comm, task, || ONE_CHANNEL);
            let r = run_on_host(comm, task.shape(), place, || super::plan::task_ctx(comm, task), |seq, ctx| super::small::host_call(task, seq, ctx));
            profiler_events::end_single_op(events, &r);
            r
        }
        SymWay::CopyEngine => {
            let collective = match task.kind {
                CollKind::AllGather => CeCollective::AllGather,
                CollKind::Broadcast { root } => CeCollective::Broadcast { root: root as usize },
                _ => return Err(comm.record_error(crate::error::Error::internal("the copy engines run all_gather and broadcast only"))),
            };
            let Some(ready) = placed.ready.take() else {
                return Err(comm.record_error(crate::error::Error::internal("the copy engines chosen without their capture check")));
            };
            super::way::trace(task, n, Way::CopyEngine);
            comm.publish_route(Way::CopyEngine, OpSig::of(task));
            let events = profiler_events::single_op(comm, task, || ONE_CHANNEL);
            let r = copy_engine_run(comm, task.shape(), ready, collective, place, part);
            profiler_events::launched_single_op(events, comm, &r);
            r
        }
        SymWay::Kernel(kernel) => {
            super::way::trace(task, n, Way::SymmetricKernel);
            comm.publish_route(Way::SymmetricKernel, OpSig::of(task));
            let start = crate::profile::start();
            let mut guard = super::call::Call::start(comm, true, std::iter::once(task));
            guard.around_planner(task);
            let r = guard.end(launch(comm, task, kernel, place, part, n));
            crate::profile::stage(crate::profile::Stage::Total, start);
            r
        }
    }
}

/// `ncclAlltoAll` on symmetric windows (out of place) by the copy engines, or the host
/// backend's loads and stores: `bytes` to and from every rank (block p of this rank's send
/// buffer into block `rank` of rank p's receive buffer). `None` when it must take the usual
/// way.
pub(crate) fn try_all_to_all(comm: &Communicator, send: DevicePtr, recv: DevicePtr, count: usize, dtype: DataType, stream: Stream) -> Option<Result<()>> {
    if !eligible(comm, count) {
        return None;
    }
    let n = comm.nranks_unchecked() as usize;
    let part = (count * dtype.size()) as u64;
    let total = part as usize * n;
    let place = comm.symmetric_place(send, total, recv, total)?;
    if place.send == place.recv {
        return None;
    }
    let shape = crate::comm::health::OpShape { kind: "AlltoAll", rank: None, count: count as u64, dtype: dtype.name(), op: None, p2p: false };
    if comm.backend().capabilities().host_addressable {
        let ctx = || {
            let bytes = part as usize * n;
            let reducer = crate::reduce::Reducer::new(DataType::Uint8, crate::reduce::DevOp::Sum);
            let proto = rustccl_plugin_api::Protocol::Simple;
            let (src, dst) = (place.send as usize, place.recv as usize);
            Ok(OpCtx { src, dst, src_len: bytes, dst_len: bytes, reducer, proto, sig: OpSig(0), scalar_at: 0, dst_remote: 0 })
        };
        let call = |seq, ctx| HostCall { coll: crate::spec::Collective::AlltoAll, root: 0, count, dtype, seq, ctx };
        return Some(run_on_host(comm, shape, place, ctx, call));
    }
    match copy_engine_ready(comm, stream) {
        Ok(Some(ready)) => {
            comm.publish_route(Way::CopyEngine, OpSig(0));
            Some(copy_engine_run(comm, shape, ready, CeCollective::AllToAll, place, part))
        }
        Ok(None) => None,
        Err(r) => Some(r),
    }
}

/// A symmetric collective on the host backend (its CPU twin, `exec::host::symmetric`): its
/// buffers resolved (`ctx`), its way published, then run by the executor; the op log and
/// failures as every way around the planner.
fn run_on_host(
    comm: &Communicator,
    shape: OpShape,
    place: SymmetricPlace,
    ctx: impl FnOnce() -> Result<OpCtx>,
    call: impl FnOnce(u64, OpCtx) -> HostCall,
) -> Result<()> {
    let n = comm.nranks_unchecked() as usize;
    comm.op_log().started(std::slice::from_ref(&shape));
    let r = match ctx() {
        Ok(ctx) => {
            let seq = comm.publish_route(Way::SymmetricCpu, ctx.sig);
            crate::exec::host::run_op(comm, &mut SymOp::new(place, n, call(seq, ctx), comm.board().map(|b| &**b)))
        }
        Err(e) => Err(comm.record_error(e.context(format!("{} (symmetric, host)", shape.kind)))),
    };
    super::cache::finish(comm, &r, false);
    r
}

/// Runs a copy-engine collective on `ready`'s stream: the op log, the run (its epoch drawn
/// now), the failure's bookkeeping.
fn copy_engine_run(comm: &Communicator, shape: OpShape, ready: Ready, collective: CeCollective, place: SymmetricPlace, bytes: u64) -> Result<()> {
    comm.op_log().started(std::slice::from_ref(&shape));
    let nranks = comm.nranks_unchecked() as usize;
    let run = CopyEngineRun { collective, place: sym_place(place), nranks, bytes, epoch: comm.next_ce_epoch() };
    let r = comm.with_device_exec(|backend, device, state| crate::exec::gpu::run_copy_engine(backend, device, state, ready, &run));
    super::cache::finish(comm, &r, true);
    r.map_err(|e| comm.record_error(e.context(format!("{} (copy engines)", shape.kind))))
}

/// Launches `kernel` for `task` on `bytes` (see [`choose`]) on the buffers at `place`.
fn launch(comm: &Communicator, task: &Task, kernel: SymKernel, place: SymmetricPlace, bytes: u64, n: usize) -> Result<()> {
    let ctx = super::plan::task_ctx(comm, task).map_err(|e| comm.record_error(e))?;
    let l = SymLaunch { kernel, place: sym_place(place), bytes, nranks: n, reducer: ctx.reducer, scalar_at: ctx.scalar_at, stream: task.stream };
    let r = comm.with_device_exec(|backend, device, state| crate::exec::gpu::run_symmetric(backend, device, state, &l));
    tracing::debug!(target: "COLL", "{} of {bytes} bytes: symmetric kernel {}", task.kind.name(), kernel.name());
    r.map_err(|e| comm.record_error(e.context(format!("{} (symmetric kernel {})", task.kind.name(), kernel.name()))))
}
