//! Creating communicators: one rank (`ncclCommInitRank[Config]`), one rank with several ids
//! (`ncclCommInitRankScalable`), and every rank of one process (`ncclCommInitAll`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::{Communicator, Inner, SharedResources, State};
use crate::backend;
use crate::bootstrap::{self, Bootstrap, JoinRequest, StopFlags, UniqueId};
use crate::config::CommConfig;
use crate::exec::engine::Engine;
use crate::error::{Error, Result};
use crate::plugin::profiler::CommInfo;
use crate::plugin::CommPlugins;

/// Where a new communicator comes from.
pub(super) struct Origin {
    /// Resources to share with a parent, or `None` for fresh ones.
    pub shared: Option<Arc<SharedResources>>,
    /// The hash that names the communicator (the id's, or derived from the parent's).
    pub comm_hash: u64,
}

/// `ncclGetUniqueId`.
pub fn get_unique_id() -> Result<UniqueId> {
    bootstrap::get_unique_id().map_err(|e| e.context("get_unique_id").record())
}

impl Communicator {
    /// `ncclCommInitRank` on device 0 with the default config.
    pub fn init_rank(nranks: i32, id: &UniqueId, rank: i32) -> Result<Communicator> {
        Communicator::init_rank_config(nranks, id, rank, 0, &CommConfig::default())
    }

    /// `ncclCommInitRankConfig`: `device` is the device this rank uses.
    pub fn init_rank_config(
        nranks: i32,
        id: &UniqueId,
        rank: i32,
        device: i32,
        config: &CommConfig,
    ) -> Result<Communicator> {
        Communicator::init_rank_scalable(nranks, rank, std::slice::from_ref(id), device, config)
    }

    /// `ncclCommInitRankScalable`: the ranks are spread over `ids.len()` roots.
    pub fn init_rank_scalable(
        nranks: i32,
        rank: i32,
        ids: &[UniqueId],
        device: i32,
        config: &CommConfig,
    ) -> Result<Communicator> {
        crate::log::init();
        let hash = ids.first().map(|id| id.hash()).unwrap_or(0);
        Communicator::create(nranks, rank, ids, device, config, Origin { shared: None, comm_hash: hash })
            .map_err(|e| e.context("init").record())
    }

    /// `ncclCommInitAll`: one communicator per device of `devices`, all in this process.
    pub fn init_all(devices: &[i32]) -> Result<Vec<Communicator>> {
        crate::log::init();
        let result = (|| {
            if devices.is_empty() {
                return Err(Error::invalid_argument("init_all needs at least one device"));
            }
            let backend = backend::select_backend()?;
            let count = backend.device_count()?;
            let mut seen = HashSet::new();
            for &d in devices {
                if d < 0 || d as usize >= count {
                    return Err(Error::invalid_argument(format!(
                        "device {d} does not exist ({count} {} devices)",
                        backend.kind()
                    )));
                }
                if !seen.insert(d) {
                    return Err(Error::invalid_usage(format!("device {d} appears twice in the device list")));
                }
            }
            let id = bootstrap::create_root_id()?;
            let n = devices.len() as i32;
            let results: Vec<Result<Communicator>> = std::thread::scope(|s| {
                let handles: Vec<_> = devices
                    .iter()
                    .enumerate()
                    .map(|(rank, &dev)| {
                        s.spawn(move || {
                            let origin = Origin { shared: None, comm_hash: id.hash() };
                            Communicator::create(n, rank as i32, &[id], dev, &CommConfig::default(), origin)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::internal("init thread panicked")))).collect()
            });
            let mut comms = Vec::with_capacity(results.len());
            let mut first_err = None;
            for r in results {
                match r {
                    Ok(c) => comms.push(c),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_err {
                for c in &comms {
                    let _ = c.abort();
                }
                return Err(e);
            }
            Ok(comms)
        })();
        result.map_err(|e| e.context("init_all").record())
    }

    /// Validates the arguments, makes the communicator, and runs the bootstrap: inline when
    /// blocking, on a thread of its own otherwise (the state says `InProgress` meanwhile).
    pub(super) fn create(
        nranks: i32,
        rank: i32,
        ids: &[UniqueId],
        device: i32,
        config: &CommConfig,
        origin: Origin,
    ) -> Result<Communicator> {
        if nranks < 1 {
            return Err(Error::invalid_argument(format!("nranks is {nranks}; it must be at least 1")));
        }
        if rank < 0 || rank >= nranks {
            return Err(Error::invalid_argument(format!("rank {rank} is out of range for {nranks} ranks")));
        }
        if ids.is_empty() || ids.len() > nranks as usize {
            return Err(Error::invalid_argument(format!(
                "{} unique ids for {nranks} ranks: there must be between 1 and nranks",
                ids.len()
            )));
        }
        crate::log::version_banner(|| {
            let from = crate::version::loaded_from().unwrap_or_else(|| "an unknown file".into());
            format!("NCCL version {} (rustccl {}, from {from})", crate::version::nccl_version_string(), crate::version::RUSTCCL_VERSION)
        });
        let resolved = config.resolve()?;
        let shared = match origin.shared {
            Some(s) => s,
            None => Arc::new(SharedResources { backend: backend::backend_for(config.backend)? }),
        };
        let count = shared.backend.device_count()?;
        if device < 0 || device as usize >= count {
            return Err(Error::invalid_argument(format!(
                "device {device} does not exist ({count} {} devices)",
                shared.backend.kind()
            )));
        }
        if rank == 0 && ids.len() == 1 && crate::params::env_str("NCCL_COMM_ID").is_some() && origin.comm_hash == ids[0].hash() {
            bootstrap::start_comm_id_root(&ids[0])?;
        }
        let blocking = resolved.blocking;
        let engine_backend = Arc::clone(&shared.backend);
        let inner = Arc::new_cyclic(|weak| Inner {
            rank: rank as u32,
            nranks: nranks as u32,
            device,
            config: resolved,
            user_config: config.clone(),
            comm_hash: origin.comm_hash,
            stop: Arc::new(StopFlags::default()),
            state: Mutex::new(State::InProgress),
            is_ready: AtomicBool::new(false),
            bootstrap: OnceLock::new(),
            init_job: Mutex::new(None),
            finalized: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
            last_error: Mutex::new(String::new()),
            shared,
            children: AtomicU64::new(0),
            shrink_stopped: AtomicBool::new(false),
            plugins: Mutex::new(None),
            has_tuner: AtomicBool::new(false),
            engine: Engine::new(
                Arc::clone(&engine_backend),
                device as usize,
                Communicator::watchdog_starter(weak.clone(), engine_backend, rank as u32),
            ),
            broken: Mutex::new(None),
            is_broken: AtomicBool::new(false),
            ops: Arc::new(super::health::OpLog::new(rank as u32)),
            jobs: Default::default(),
            suspended: Mutex::new(None),
            grow_id: Mutex::new(None),
            windows: Mutex::new(Default::default()),
            registered: Mutex::new(Default::default()),
            board: OnceLock::new(),
            sym_resources: AtomicBool::new(false),
            coll_seq: AtomicU64::new(0),
            net_failure: Default::default(),
        });
        super::health::register(&inner);
        let ids = ids.to_vec();
        let job = {
            let inner = Arc::clone(&inner);
            move || run_init(&inner, &ids)
        };
        let comm = Communicator { inner };
        if blocking {
            job();
            comm.wait_ready()?;
        } else {
            let handle = std::thread::Builder::new()
                .name("rustccl-init".into())
                .spawn(job)
                .map_err(|e| Error::io("starting the init thread", &e))?;
            *comm.inner.init_job.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        }
        Ok(comm)
    }
}

/// The body of init: bootstrap, then publish the result in the state.
fn run_init(inner: &Arc<Inner>, ids: &[UniqueId]) {
    let _g = crate::log::rank_scope(inner.rank as i32);
    let req = JoinRequest { ids, nranks: inner.nranks, rank: inner.rank, device: inner.device };
    let result = Bootstrap::init(&req, Arc::clone(&inner.stop)).and_then(|bs| {
        let hosts: HashSet<u64> = bs.peers().iter().map(|p| p.host_hash).collect();
        let name = inner.config.comm_name.clone().unwrap_or_else(|| format!("{:016x}", inner.comm_hash));
        let info = CommInfo {
            comm_id: inner.comm_hash,
            name: &name,
            nnodes: hosts.len(),
            nranks: inner.nranks as usize,
            rank: inner.rank as usize,
        };
        let plugins = CommPlugins::select(&info, &inner.config)?;
        let board = make_board(inner, &bs)?;
        Ok((bs, plugins, board))
    });
    let mut state = inner.state.lock().unwrap_or_else(|p| p.into_inner());
    match result {
        Ok((bs, plugins, board)) => {
            let _ = inner.bootstrap.set(bs);
            if let crate::exec::host::board::BoardState::Ready(b) = board {
                let _ = inner.board.set(b);
            }
            Communicator::attach_health(inner);
            Communicator::attach_registrations(inner);
            inner.has_tuner.store(plugins.tuner.is_some(), Ordering::Release);
            *inner.plugins.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(plugins));
            *state = State::Ready;
            inner.is_ready.store(true, Ordering::Release);
            tracing::info!(
                target: "INIT",
                "comm {:016x} rank {} nranks {} device {} ({}) - Init COMPLETE",
                inner.comm_hash, inner.rank, inner.nranks, inner.device, inner.shared.backend.kind()
            );
        }
        Err(e) => {
            let e = inner.record(e);
            *state = State::Failed(e);
        }
    }
}

/// The board of small collectives and the route rings (`exec::host::board`), where the
/// communicator has several ranks, all on one host: made here, in one go, so that every rank
/// has the same board (or none) before its first collective. Every rank decides alike whether
/// to make it (from what every rank knows: the backend and the peers' hosts). Where the host
/// executor runs the work (the host backend) the regions are the backend's memory and calls
/// may take the board; where the device executor does (CUDA, HIP) the regions carry only the
/// route rings, in host shared memory of a host backend of this communicator's own
/// (`/dev/shm` files, which every local process maps without a GPU context): the collectives
/// publish their routes there, and the watchdog reads the peers' while device work waits
/// (`health.rs`).
fn make_board(inner: &Arc<Inner>, bs: &Bootstrap) -> Result<crate::exec::host::board::BoardState> {
    use crate::exec::host::board::{self, BoardState};
    let peers = bs.peers();
    let one_host = peers.iter().all(|p| p.host_hash == peers[0].host_hash);
    if inner.nranks < 2 || !one_host {
        return Ok(BoardState::Off);
    }
    let on_host = inner.engine.executor().runs_on_host();
    let (backend, device): (Arc<dyn backend::DeviceBackend>, usize) = if on_host {
        (Arc::clone(&inner.shared.backend), inner.device.max(0) as usize)
    } else {
        (Arc::new(backend::HostBackend::with_devices(1)), 0)
    };
    let pids: Vec<u32> = peers.iter().map(|p| p.pid).collect();
    let allgather = |mine: &[u8]| bs.allgather(mine);
    let check = || {
        if inner.stop.abort.load(Ordering::Acquire) {
            return Err(Error::invalid_usage("the communicator was aborted during its init"));
        }
        bs.failure().map_or(Ok(()), Err)
    };
    let making = board::Making {
        rank: inner.rank as usize,
        nranks: inner.nranks as usize,
        device,
        backend: &backend,
        entries: on_host,
        pids: &pids,
        allgather: &allgather,
        check: &check,
        timeout: crate::params::bootstrap_timeout(),
    };
    board::make(&making)
}
