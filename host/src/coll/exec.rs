//! Running a planned group: its connections are made (all at once, so that ranks waiting on
//! each other's setup never deadlock), then each communicator's work goes to the executor its
//! backend's capabilities call for (`crate::exec`): device work is launched and returns,
//! host work of every communicator of the group is run together. When the group fails after
//! data started moving, every communicator of it is marked broken (and the failure announced).

use std::sync::Arc;
use std::time::Instant;

use super::plan::CommRun;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::exec::host::{HostOp, Queue};
use crate::exec::{self, CommSide, Links};
use crate::program::Link;
use crate::transport::{establish_all, Dir, Wanted};

/// The host operations of one communicator's share of a group: the tasks the router sent
/// around the planner (board, single copies, the symmetric CPU twin), in call order. The
/// host executor's driver runs them with the communicator's FIFO work, if any.
pub(crate) struct HostOps<'a> {
    pub comm: &'a Communicator,
    pub ops: Vec<Box<dyn HostOp + 'a>>,
}

/// Runs every communicator's work (connections are made first).
pub fn run(runs: &mut [CommRun]) -> Result<()> {
    run_with(runs, &mut [])
}

/// [`run`], with host operations of the same group (`host_ops`) driven with the host work.
pub(crate) fn run_with(runs: &mut [CommRun], host_ops: &mut [HostOps<'_>]) -> Result<()> {
    match runs.iter().find(|r| r.device).map(|r| Arc::clone(r.comm.backend())) {
        Some(backend) => backend.with_relaxed_capture(&mut || run_all(runs, host_ops)),
        None => run_all(runs, host_ops),
    }
}

fn run_all(runs: &mut [CommRun], host_ops: &mut [HostOps<'_>]) -> Result<()> {
    let start = crate::profile::start();
    let result = connect(runs).and_then(|conns| {
        crate::profile::stage(crate::profile::Stage::Connect, start);
        execute(runs, &conns, host_ops)
    });
    if let Err(e) = &result {
        for run in runs.iter() {
            run.comm.mark_broken(e);
        }
    }
    result
}

impl CommSide for Communicator {
    fn rank(&self) -> u32 {
        self.rank_unchecked()
    }

    fn check(&self, what: &str) -> Result<()> {
        self.check_running(what)?;
        self.check_op_health()
    }

    fn record(&self, e: Error) -> Error {
        self.record_error(e)
    }

    fn local_ranks(&self) -> u32 {
        self.local_rank_count()
    }

    fn board(&self) -> Option<Arc<crate::exec::host::board::Board>> {
        Communicator::board(self).cloned()
    }
}

fn execute(runs: &mut [CommRun], conns: &[Links], host_ops: &mut [HostOps<'_>]) -> Result<()> {
    // The observer's transfers: which slots of each network connection carry which task.
    for (run, links) in runs.iter().zip(conns) {
        if let Some(events) = &run.profile {
            exec::observe::queue_proxy_ops(events, &run.work, links);
        }
    }
    let r = execute_queued(runs, conns, host_ops);
    if r.is_err() {
        // Transfers that will never run: their events go (their tasks' may end).
        for (run, links) in runs.iter().zip(conns) {
            if run.profile.is_some() {
                links.values().for_each(|c| c.proxy_ops.clear());
            }
        }
    }
    r
}

fn execute_queued(runs: &mut [CommRun], conns: &[Links], host_ops: &mut [HostOps<'_>]) -> Result<()> {
    // Device work is enqueued on its streams (the interpreter runs it); host work runs here.
    for (run, links) in runs.iter_mut().zip(conns) {
        if run.device {
            let _launch = run.profile.as_ref().and_then(|p| p.kernel_launch(run.work.stream.0));
            let channels = run.profile.as_ref().map(|p| p.launch_channels());
            run.comm.resolve_direct_receives(&mut run.work, links);
            let work = &run.work;
            let engine = run.comm.engine();
            let r = engine.with_device(|backend, device, state| exec::gpu::launch(backend, device, state, work, links));
            r.map_err(|e| run.comm.record_error(e.context("collective")))?;
            if let Some(c) = channels {
                engine.profiled_launch(c);
            }
        }
    }
    // The observer's channels of the host work: they start now and complete when the
    // executor has run them.
    let channels: Vec<_> = runs.iter().filter(|r| !r.device).filter_map(|r| r.profile.as_ref().map(|p| p.start_channels())).collect();
    let mut preps: Vec<exec::host::Prepared> =
        runs.iter().zip(conns).filter(|(r, _)| !r.device).map(|(r, links)| exec::host::Prepared::new(&r.work, links)).collect();
    // One queue per communicator: its FIFO work and its host operations.
    let mut queues: Vec<(&Communicator, Queue<'_>)> = Vec::new();
    for (r, prep) in runs.iter_mut().filter(|r| !r.device).zip(preps.iter_mut()) {
        let mut q = Queue::new(&r.comm);
        q.fifo = Some(exec::host::HostRun { work: &mut r.work, prep, comm: &r.comm });
        queues.push((&r.comm, q));
    }
    for share in host_ops.iter_mut().filter(|s| !s.ops.is_empty()) {
        let at = match queues.iter().position(|(c, _)| c.same_as(share.comm)) {
            Some(at) => at,
            None => {
                queues.push((share.comm, Queue::new(share.comm)));
                queues.len() - 1
            }
        };
        queues[at].1.ops.extend(share.ops.iter_mut().map(|op| &mut **op as &mut dyn HostOp));
    }
    let mut queues: Vec<Queue<'_>> = queues.into_iter().map(|(_, q)| q).collect();
    let r = exec::host::drive(&mut queues);
    if r.is_ok() {
        channels.into_iter().for_each(|c| c.complete());
    }
    r
}

/// Makes (or finds) every connection the items use, all at once.
pub(crate) fn connect(runs: &[CommRun]) -> Result<Vec<Links>> {
    let mut out = Vec::with_capacity(runs.len());
    let mut pending = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let mut wanted: Vec<(Link, Dir)> = Vec::new();
        for item in &run.work.items {
            for (_, s) in &item.steps {
                wanted.extend(s.recv.iter().map(|l| (*l, Dir::Recv)));
                wanted.extend(s.send.iter().map(|l| (*l, Dir::Send)));
            }
        }
        wanted.sort();
        wanted.dedup();
        let (have, missing) = run.comm.engine().cached_connections(&wanted);
        out.push(have);
        pending.extend(missing.into_iter().map(|(l, d)| Wanted::new((i, l, d), l, d)));
    }
    if pending.is_empty() {
        return Ok(out);
    }
    let deadline = Instant::now() + crate::params::bootstrap_timeout();
    establish_all(
        pending,
        |&(i, link, _), est| {
            let comm = &runs[i].comm;
            comm.with_transport(|cx| est.poll(cx))
                .map_err(|e| comm.record_error(e.context(format!("connecting to rank {}", link.peer))))
        },
        |(i, link, dir), conn| {
            runs[i].comm.engine().keep_connection(link, dir, Arc::clone(&conn));
            out[i].insert((link, dir), conn);
        },
        |&(i, link, _)| {
            if Instant::now() > deadline {
                return Err(runs[i].comm.record_error(Error::remote(format!(
                    "connecting to rank {}: timed out (RUSTCCL_BOOTSTRAP_TIMEOUT)",
                    link.peer
                ))));
            }
            for run in runs {
                CommSide::check(&run.comm, "connect").map_err(|e| run.comm.record_error(e))?;
                // A peer that ran this collective another way never connects for it (it may
                // wait for this rank in an earlier collective of the group meanwhile).
                if let Some(board) = run.comm.board() {
                    board.check_current_route().map_err(|e| run.comm.record_error(e.context("connecting")))?;
                }
            }
            Ok(())
        },
    )?;
    Ok(out)
}

