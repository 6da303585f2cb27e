//! The symmetric kernels (`kernels/src/device/symmetric.h`; on the host backend their CPU
//! twins, `exec::host::symmetric`) as the router (`coll::route`) sends tasks to them: an
//! all_reduce, all_gather, reduce_scatter or broadcast (a single call or a task of a group,
//! blocking or not) whose send and receive buffers both lie in `NCCL_WIN_COLL_SYMMETRIC`
//! windows runs one kernel that reads and writes the peers' windows directly, instead of the
//! ring through the FIFOs. As with NCCL, every rank must pass window buffers at the same
//! offsets for the same call (the windows are collective, so ranks that do see the same
//! windows): a rank that passes a window buffer where another passes other memory takes
//! another way, and the route ring (`exec::host::board`) reports it to both (host waits read
//! it; on GPUs the watchdog, while device work waits) instead of a hang.
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


use super::route::{SymExec, SymWay};
use super::{CollKind, Task};
use crate::backend::{DevicePtr, Stream};
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

/// Whether a collective of `count` elements on `comm` may take a symmetric path at all:
/// its executor runs them, they are not turned off, and it is a single blocking call of
/// several ranks outside check mode.
fn eligible(comm: &Communicator, count: usize) -> bool {
    comm.engine().executor().symmetric() != SymExec::None
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
            if !comm.has_symmetric_resources() {
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

/// A task on symmetric windows, ready to run the way the router chose: its buffers resolved
/// and checked (an error before this is the caller's: nothing ran), nothing run yet. A
/// single call runs it at once ([`run`]); a group runs it with the group's other tasks
/// (`coll::group`).
pub(crate) enum SymRun {
    /// The CPU twin: a host operation (`exec::host::symmetric`), made when it runs.
    Cpu { place: SymmetricPlace, call: HostCall },
    /// The copy engines on the stream their capture check found ready (its epoch is drawn when
    /// it runs: every rank draws them in the same order).
    CopyEngine { collective: CeCollective, ready: Ready, place: SymmetricPlace, bytes: u64, what: &'static str },
    /// A symmetric kernel.
    Kernel { launch: SymLaunch, what: &'static str },
}

impl SymRun {
    /// The way it takes (published in the route ring).
    pub(crate) fn way(&self) -> Way {
        match self {
            SymRun::Cpu { .. } => Way::SymmetricCpu,
            SymRun::CopyEngine { .. } => Way::CopyEngine,
            SymRun::Kernel { .. } => Way::SymmetricKernel,
        }
    }

    /// Whether it runs on a device (it outlives the call).
    pub(crate) fn on_device(&self) -> bool {
        !matches!(self, SymRun::Cpu { .. })
    }

    /// Its host operation (the CPU twin), on `comm`'s board (route rings) where it has one.
    pub(crate) fn host_op<'c>(&self, comm: &'c Communicator) -> Option<SymOp<'c>> {
        match self {
            SymRun::Cpu { place, call } => Some(SymOp::new(*place, comm.nranks_unchecked() as usize, *call, comm.board().map(|b| &**b))),
            _ => None,
        }
    }

    /// Enqueues a device way (kernel or copy engines) on its stream; a failure in context.
    pub(crate) fn launch(self, comm: &Communicator) -> Result<()> {
        match self {
            SymRun::Cpu { .. } => Err(crate::error::Error::internal("the CPU twin launched as device work")),
            SymRun::CopyEngine { collective, ready, place, bytes, what } => {
                let nranks = comm.nranks_unchecked() as usize;
                let run = CopyEngineRun { collective, place: sym_place(place), nranks, bytes, epoch: comm.next_ce_epoch() };
                let r = comm.engine().with_device(|backend, device, state| crate::exec::gpu::run_copy_engine(backend, device, state, ready, &run));
                r.map_err(|e| e.context(format!("{what} (copy engines)")))
            }
            SymRun::Kernel { launch, what } => {
                let r = comm.engine().with_device(|backend, device, state| crate::exec::gpu::run_symmetric(backend, device, state, &launch));
                tracing::debug!(target: "COLL", "{what} of {} bytes: symmetric kernel {}", launch.bytes, launch.kernel.name());
                r.map_err(|e| e.context(format!("{what} (symmetric kernel {})", launch.kernel.name())))
            }
        }
    }
}

/// Makes `task` ready to run the symmetric way `way` the router chose for it, on the buffers
/// `placed` found in symmetric windows; `seq`: its collective number.
pub(crate) fn prepare(comm: &Communicator, task: &Task, way: SymWay, placed: &mut Placed<'_>, seq: u64) -> Result<SymRun> {
    let n = comm.nranks_unchecked() as usize;
    let Some(place) = placed.place() else {
        return Err(crate::error::Error::internal("a symmetric route without window buffers"));
    };
    let bytes = (task.count * task.dtype.size()) as u64;
    let what = task.kind.name();
    let ctx = super::plan::task_ctx(comm, task)?;
    Ok(match way {
        SymWay::Cpu => SymRun::Cpu { place, call: super::small::host_call(task, seq, ctx) },
        SymWay::CopyEngine => {
            let collective = match task.kind {
                CollKind::AllGather => CeCollective::AllGather,
                CollKind::Broadcast { root } => CeCollective::Broadcast { root: root as usize },
                _ => return Err(crate::error::Error::internal("the copy engines run all_gather and broadcast only")),
            };
            let Some(ready) = placed.ready.take() else {
                return Err(crate::error::Error::internal("the copy engines chosen without their capture check"));
            };
            SymRun::CopyEngine { collective, ready, place, bytes, what }
        }
        SymWay::Kernel(kernel) => {
            let launch = SymLaunch { kernel, place: sym_place(place), bytes, nranks: n, reducer: ctx.reducer, scalar_at: ctx.scalar_at, stream: task.stream };
            SymRun::Kernel { launch, what }
        }
    })
}

/// Runs `task`, a single call, the symmetric way `way` the router chose for it, on the
/// buffers `placed` found in symmetric windows: made ready, its way published, then run under
/// the call guard.
pub(crate) fn run(comm: &Communicator, task: &Task, way: SymWay, mut placed: Placed<'_>) -> Result<()> {
    let start = crate::profile::start();
    let seq = comm.collective_number();
    let prepared = prepare(comm, task, way, &mut placed, seq).map_err(|e| comm.record_error(e))?;
    comm.publish_route_at(seq, prepared.way(), OpSig::of(task));
    super::way::trace(task, comm.nranks_unchecked() as usize, prepared.way());
    let mut guard = super::call::Call::start(comm, prepared.on_device(), std::iter::once(task));
    guard.around_planner(task);
    let r = run_prepared(comm, prepared);
    let r = guard.end(r);
    crate::profile::stage(crate::profile::Stage::Total, start);
    r
}

/// Runs a prepared symmetric collective to completion (the CPU twin) or enqueues it (device).
fn run_prepared(comm: &Communicator, prepared: SymRun) -> Result<()> {
    match prepared.host_op(comm) {
        Some(mut op) => crate::exec::host::run_op(comm, &mut op),
        None => prepared.launch(comm),
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
    let seq = comm.collective_number();
    let prepared = if comm.engine().executor().symmetric() == SymExec::Cpu {
        let reducer = crate::reduce::Reducer::new(DataType::Uint8, crate::reduce::DevOp::Sum);
        let proto = rustccl_plugin_api::Protocol::Simple;
        let (src, dst) = (place.send as usize, place.recv as usize);
        let ctx = OpCtx { src, dst, src_len: total, dst_len: total, reducer, proto, sig: OpSig(0), scalar_at: 0, dst_remote: 0 };
        SymRun::Cpu { place, call: HostCall { coll: crate::spec::Collective::AlltoAll, root: 0, count, dtype, seq, ctx } }
    } else {
        match copy_engine_ready(comm, stream) {
            Ok(Some(ready)) => SymRun::CopyEngine { collective: CeCollective::AllToAll, ready, place, bytes: part, what: "AlltoAll" },
            Ok(None) => return None,
            Err(r) => return Some(r),
        }
    };
    comm.publish_route_at(seq, prepared.way(), OpSig(0));
    let shape = crate::comm::health::OpShape { kind: "AlltoAll", rank: None, count: count as u64, dtype: dtype.name(), op: None, p2p: false };
    let guard = super::call::Call::start_shapes(comm, prepared.on_device(), std::slice::from_ref(&shape));
    Some(guard.end(run_prepared(comm, prepared)))
}
