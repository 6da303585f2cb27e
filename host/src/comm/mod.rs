//! The communicator and its lifecycle, as NCCL's `ncclComm_t`: init (blocking or not, one or
//! several ids, several ranks in one process), split, shrink, revoke, finalize, destroy,
//! abort, and the queries.
//!
//! States: `InProgress` while a non-blocking init runs, then `Ready` or `Failed`. Every call
//! goes through `Communicator::ready` first, which refuses a destroyed, aborted, still
//! initialising or failed communicator with the matching code and a message (kept as the
//! communicator's and the process's last error).

pub mod from_env;
mod agree;
mod grow;
pub mod health;
mod init;
pub mod jobs;
mod split;
mod suspend;
mod registered;
mod windows;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use crate::backend::DeviceBackend;
use crate::bootstrap::{Bootstrap, StopFlags};
use crate::config::{CommConfig, ResolvedConfig};
use crate::error::{set_last_error, Error, ErrorKind, Result, ResultCode};
use crate::exec::engine::Engine;
use crate::program::Link;
use crate::plugin::CommPlugins;
use crate::transport::{proxy::Proxy, Connection, Context, Dir};

/// How long a failed communicator waits, before it frees device memory its peers map, for the
/// peers' kernels to stop.
const PEER_STOP_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

pub use from_env::{LaunchEnv, Launcher};
pub use init::get_unique_id;
pub use split::ShrinkFlags;
pub use suspend::{MemStat, MemStats, SUSPEND_MEM};

/// `NCCL_SPLIT_NOCOLOR`: a rank that passes it to split gets no communicator.
pub const SPLIT_NOCOLOR: i32 = -1;

/// Resources that split or shrunk children may share with their parent (`splitShare`,
/// `shrinkShare`): the device backend and, in later issues, the proxy and its connections.
#[derive(Debug)]
pub struct SharedResources {
    pub backend: Arc<dyn DeviceBackend>,
}

enum State {
    InProgress,
    Ready,
    Failed(Error),
}

struct Inner {
    rank: u32,
    nranks: u32,
    device: i32,
    config: ResolvedConfig,
    /// The caller's config, which children inherit when split or shrink gets none.
    user_config: CommConfig,
    comm_hash: u64,
    stop: Arc<StopFlags>,
    state: Mutex<State>,
    /// Set (for good) when `state` becomes `Ready`: the check every call makes without the lock.
    is_ready: AtomicBool,
    bootstrap: OnceLock<Bootstrap>,
    init_job: Mutex<Option<JoinHandle<()>>>,
    finalized: AtomicBool,
    destroyed: AtomicBool,
    last_error: Mutex<String>,
    shared: Arc<SharedResources>,
    /// Past the number of every split or shrink child this rank made of this communicator.
    /// Ranks' counts can differ after failures; children's numbers are agreed (`split.rs`).
    children: AtomicU64,
    /// Set when a shrink with `ShrinkFlags::Abort` stopped this communicator (`stop.abort`):
    /// it may still be shrunk again.
    shrink_stopped: AtomicBool,
    /// The plugins chosen at init (released at destroy).
    plugins: Mutex<Option<Arc<CommPlugins>>>,
    /// Set at init when the plugins include a tuner (the check every collective makes).
    has_tuner: AtomicBool,
    /// What runs its work (`exec::engine`): the connections and the proxy, the device
    /// executor's state, the planned route's memo.
    engine: Engine,
    /// Set when an operation failed half-way: the FIFOs may hold stale data, so later
    /// operations are refused with this error instead of running on them.
    broken: Mutex<Option<Error>>,
    /// Set (for good) when `broken` holds an error.
    is_broken: AtomicBool,
    /// The operations started and finished (hang reports, timeouts).
    ops: Arc<health::OpLog>,
    /// Operations queued or running in the background (non-blocking communicators).
    jobs: jobs::CommJobs,
    /// While suspended (`ncclCommSuspend`): the connections to make again at resume.
    suspended: Mutex<Option<Vec<(Link, Dir)>>>,
    /// The id `ncclCommGetUniqueId` made for the next grow, until a grow consumes it.
    grow_id: Mutex<Option<crate::bootstrap::UniqueId>>,
    /// Symmetric memory windows (`crate::window`).
    windows: Mutex<crate::window::Windows>,
    /// Buffers registered for zero-copy point-to-point, and peers' buffers mapped here.
    registered: Mutex<registered::Registry>,
    /// Ranks on one host: the board of small collectives and the ranks' route rings
    /// (`exec::host::board`; on device backends only the route rings), made at init (set then
    /// or never; read without a lock on every collective). Its memory goes with the last
    /// handle of the communicator (its files were unlinked when it was made).
    board: OnceLock<Arc<crate::exec::host::board::Board>>,
    /// Whether the symmetric collectives' memory exists (a symmetric window was registered),
    /// and how many collectives this rank has started.
    sym_resources: AtomicBool,
    coll_seq: AtomicU64,
    /// The first failure of one of its network connections (set by the proxy): it ends every
    /// pending and later operation, whichever connection that waits on.
    net_failure: crate::transport::proxy::FailureSlot,
}

/// One rank's communicator.
pub struct Communicator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Communicator(rank {} of {}, device {}, hash {:016x})",
            self.inner.rank, self.inner.nranks, self.inner.device, self.inner.comm_hash
        )
    }
}

impl Inner {
    fn record(&self, e: Error) -> Error {
        let e = e.log_once(format!("rank {}: ", self.rank));
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = e.message.clone();
        set_last_error(&e.message);
        e
    }
}

impl Communicator {
    fn lock_state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an error as this communicator's (and the process's) last error.
    fn fail<T>(&self, e: Error) -> Result<T> {
        Err(self.inner.record(e))
    }

    /// The gate of every call (NCCL's `ncclCommEnsureReady`).
    fn ready(&self, what: &str) -> Result<&Bootstrap> {
        if self.inner.destroyed.load(Ordering::Acquire) {
            return self.fail(Error::invalid_argument(format!("{what}: the communicator has been destroyed")));
        }
        if self.inner.stop.abort.load(Ordering::Acquire) {
            return self.fail(Error::invalid_usage(format!("{what}: the communicator was aborted")));
        }
        if self.inner.is_ready.load(Ordering::Acquire) {
            return Ok(self.inner.bootstrap.get().expect("a ready communicator has a bootstrap"));
        }
        let state_error = match &*self.lock_state() {
            State::InProgress => Some(Error::invalid_argument(format!(
                "{what}: the communicator is still being initialised (non-blocking); poll async_error until it is no longer InProgress"
            ))),
            State::Failed(e) => Some(e.clone().context(format!("{what}: the communicator's initialisation failed"))),
            State::Ready => None,
        };
        if let Some(e) = state_error {
            return self.fail(e);
        }
        Ok(self.inner.bootstrap.get().expect("a ready communicator has a bootstrap"))
    }

    /// The gate of operations that move data: also refuses finalized, revoked and failed ones.
    fn operational(&self, what: &str) -> Result<&Bootstrap> {
        let bs = self.ready(what)?;
        if self.inner.finalized.load(Ordering::Acquire) {
            return self.fail(Error::invalid_usage(format!("{what}: the communicator was finalized")));
        }
        if let Err(e) = self.check_running(what).and_then(|_| self.check_not_suspended(what)) {
            return self.fail(e);
        }
        if self.inner.is_broken.load(Ordering::Acquire) {
            let broken = self.inner.broken.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if let Some(e) = broken {
                return self.fail(e.context(format!("{what}: an earlier operation failed half-way")));
            }
        }
        Ok(bs)
    }

    /// Runs a bootstrap operation, recording its error.
    fn run<T>(&self, what: &str, op: impl FnOnce(&Bootstrap) -> Result<T>) -> Result<T> {
        let _g = crate::log::rank_scope(self.inner.rank as i32);
        let bs = self.operational(what)?;
        op(bs).or_else(|e| self.fail(e.context(what)))
    }

    // --- Queries ---------------------------------------------------------------------------

    /// `ncclCommCount`.
    pub fn count(&self) -> Result<i32> {
        self.ready("count")?;
        Ok(self.inner.nranks as i32)
    }

    /// `ncclCommUserRank`.
    pub fn user_rank(&self) -> Result<i32> {
        self.ready("user_rank")?;
        Ok(self.inner.rank as i32)
    }

    /// `ncclCommCuDevice`: the device this rank uses.
    pub fn device(&self) -> Result<i32> {
        self.ready("device")?;
        Ok(self.inner.device)
    }

    /// `ncclCommGetAsyncError`: `InProgress` while a non-blocking init runs, then `Success`
    /// or the error that ended it; a peer's failure shows here as `RemoteError`.
    pub fn async_error(&self) -> ResultCode {
        if matches!(&*self.lock_state(), State::InProgress) || self.inner.jobs.busy() {
            return ResultCode::InProgress;
        }
        self.async_error_detail().map_or(ResultCode::Success, |e| e.code)
    }

    /// The error behind [`async_error`](Self::async_error), if any.
    pub fn async_error_detail(&self) -> Option<Error> {
        match &*self.lock_state() {
            State::InProgress | State::Ready => {}
            State::Failed(e) => return Some(e.clone()),
        }
        if let Some(e) = self.inner.broken.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Some(e);
        }
        if let Some(e) = self.inner.jobs.error() {
            return Some(e);
        }
        self.inner.bootstrap.get().and_then(|b| b.failure())
    }

    /// Waits until a non-blocking init has finished, and returns its result.
    pub fn wait_ready(&self) -> Result<()> {
        let job = self.inner.init_job.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(job) = job {
            let _ = job.join();
        }
        match &*self.lock_state() {
            State::Ready => Ok(()),
            State::Failed(e) => Err(e.clone()),
            State::InProgress => Err(Error::internal("init finished without a result")),
        }
    }

    /// This communicator's last error message (empty when none).
    pub fn last_error(&self) -> String {
        self.inner.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The hash that names this communicator in logs.
    pub fn hash(&self) -> u64 {
        self.inner.comm_hash
    }

    /// The configuration in force.
    pub fn config(&self) -> &ResolvedConfig {
        &self.inner.config
    }

    /// The device backend this communicator runs on.
    pub fn backend(&self) -> &Arc<dyn DeviceBackend> {
        &self.inner.shared.backend
    }

    /// Whether this communicator shares its resources with `other` (split with splitShare).
    pub fn shares_resources_with(&self, other: &Communicator) -> bool {
        Arc::ptr_eq(&self.inner.shared, &other.inner.shared)
    }

    /// The plugins this communicator uses: its network, and its tuner and profiler if any.
    pub fn plugins(&self) -> Result<Arc<CommPlugins>> {
        self.ready("plugins")?;
        let p = self.inner.plugins.lock().unwrap_or_else(|p| p.into_inner()).clone();
        p.ok_or_else(|| self.inner.record(Error::invalid_usage("plugins: the communicator's plugins were released")))
    }

    /// Whether a tuner plugin is in use (without the plugins' lock: asked on every call).
    pub(crate) fn has_tuner(&self) -> bool {
        self.inner.has_tuner.load(Ordering::Acquire)
    }

    /// How many ranks (this one included) share this rank's host; 1 when not known.
    pub(crate) fn local_rank_count(&self) -> u32 {
        // No gate (and no error recorded): only called while the communicator's work runs.
        let Some(bs) = self.inner.bootstrap.get() else { return 1 };
        let mine = bs.peers()[bs.rank() as usize].host_hash;
        bs.peers().iter().filter(|p| p.host_hash == mine).count() as u32
    }

    /// Host identities of every rank, in rank order (ranks with equal values share a node).
    pub fn host_hashes(&self) -> Result<Vec<u64>> {
        Ok(self.ready("host_hashes")?.peers().iter().map(|p| p.host_hash).collect())
    }

    // --- Bootstrap operations ----------------------------------------------------------------

    /// Blocks until every rank has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.run("barrier", |bs| bs.barrier())
    }

    /// Every rank's bytes, in rank order.
    pub fn allgather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.run("allgather", |bs| bs.allgather(mine))
    }

    /// Sends bytes to `peer` under `tag` (below 2^48; out-of-band, through the bootstrap
    /// network).
    pub fn send_bytes(&self, peer: i32, tag: u64, data: &[u8]) -> Result<()> {
        let peer = self.peer_index(peer)?;
        crate::bootstrap::tags::check_user(tag).or_else(|e| self.fail(e))?;
        self.run("send", |bs| bs.send(peer, tag, data))
    }

    /// Receives the next bytes `peer` sent under `tag`.
    pub fn recv_bytes(&self, peer: i32, tag: u64) -> Result<Vec<u8>> {
        let peer = self.peer_index(peer)?;
        crate::bootstrap::tags::check_user(tag).or_else(|e| self.fail(e))?;
        self.run("recv", |bs| bs.recv(peer, tag))
    }

    fn peer_index(&self, peer: i32) -> Result<u32> {
        if peer < 0 || peer as u32 >= self.inner.nranks || peer as u32 == self.inner.rank {
            return self.fail(Error::invalid_argument(format!(
                "peer {peer} is not another rank of this {}-rank communicator",
                self.inner.nranks
            )));
        }
        Ok(peer as u32)
    }

    // --- End of life ---------------------------------------------------------------------------

    /// `ncclCommRevoke`: stops operations in flight and refuses new ones; the communicator
    /// can still be shrunk, finalized and destroyed.
    pub fn revoke(&self, flags: i32) -> Result<()> {
        if flags != 0 {
            return self.fail(Error::invalid_argument(format!(
                "revoke flags {flags:#x}: only NCCL_REVOKE_DEFAULT (0) is defined"
            )));
        }
        self.ready("revoke")?;
        if !self.inner.stop.revoked.swap(true, Ordering::AcqRel) {
            self.announce(&Error::remote("it revoked the communicator (ncclCommRevoke)"));
        }
        self.device_cache().exec.abort();
        self.release_copy_engine_waits();
        tracing::info!(target: "INIT", "rank {}: communicator {:016x} revoked", self.inner.rank, self.inner.comm_hash);
        Ok(())
    }

    /// `ncclCommFinalize`: completes outstanding work; afterwards only destroy is allowed.
    /// On a non-blocking communicator with operations still queued it returns `InProgress`
    /// at once, and [`async_error`](Self::async_error) says when it has completed.
    pub fn finalize(&self) -> Result<()> {
        self.ready("finalize")?;
        if self.inner.finalized.swap(true, Ordering::AcqRel) {
            return self.fail(Error::invalid_argument("finalize: the communicator was already finalized"));
        }
        if !self.inner.config.blocking && self.inner.jobs.busy() {
            // Non-blocking with operations queued: finalize completes behind them.
            let comm = self.handle();
            jobs::launch(vec![self.handle()], move || comm.finish_finalize());
            return Err(Error::in_progress("finalize: queued operations are completing; poll async_error"));
        }
        self.finish_finalize()
    }

    fn finish_finalize(&self) -> Result<()> {
        // Outstanding device work completes (a failure stops it through the watchdog).
        if let Err(e) = self.wait_device_idle() {
            return self.fail(e.context("finalize"));
        }
        if let Err(e) = self.deliver_sends() {
            return self.fail(e.context("finalize"));
        }
        if let Some(e) = self.inner.broken.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return self.fail(e.context("finalize"));
        }
        Ok(())
    }

    /// `ncclCommDestroy`: releases the communicator; peers are told, so they do not take
    /// this for a failure. A second destroy is an invalid argument.
    pub fn destroy(&self) -> Result<()> {
        // Queued operations (non-blocking) complete first.
        self.inner.jobs.wait_idle(None);
        if self.inner.destroyed.swap(true, Ordering::AcqRel) {
            return self.fail(Error::invalid_argument("destroy: the communicator has already been destroyed"));
        }
        let _ = self.wait_ready();
        // What this rank still owes its peers goes out before anything closes, unless the
        // communicator already failed (a failure here is logged: destroy releases the
        // communicator all the same).
        if self.check_running("destroy").is_ok() {
            if let Err(e) = self.wait_device_idle().and_then(|_| self.deliver_sends()) {
                self.inner.record(e.context("destroy"));
            }
        }
        if let Some(bs) = self.inner.bootstrap.get() {
            bs.close(true);
        }
        self.release_plugins();
        self.release_registrations();
        self.inner.sym_resources.store(false, Ordering::Release);
        self.windows().release();
        tracing::info!(target: "INIT", "rank {}: communicator {:016x} destroyed", self.inner.rank, self.inner.comm_hash);
        Ok(())
    }

    /// `ncclCommAbort`: stops everything now, even with dead peers or a non-blocking init in
    /// progress; always succeeds. Peers see this rank as failed.
    pub fn abort(&self) -> Result<()> {
        // After a failure every rank already knows (announced): leave saying goodbye, so that
        // peers keep reporting that failure rather than this rank's departure.
        let known_failure = self.inner.bootstrap.get().is_some_and(|b| b.comm_failure().is_some());
        // The flag first: this rank's own waits then report the abort, not its announcement.
        let first = !self.inner.stop.abort.swap(true, Ordering::AcqRel);
        if first && !known_failure && !self.inner.destroyed.load(Ordering::Acquire) {
            self.announce(&Error::remote("it aborted the communicator (ncclCommAbort)"));
        }
        self.device_cache().exec.abort();
        self.release_copy_engine_waits();
        self.inner.destroyed.store(true, Ordering::Release);
        if let Some(bs) = self.inner.bootstrap.get() {
            bs.close(known_failure);
        }
        self.stop_background_jobs();
        let _ = self.wait_ready();
        if let Some(bs) = self.inner.bootstrap.get() {
            bs.close(known_failure);
        }
        self.release_plugins();
        tracing::info!(target: "INIT", "rank {}: communicator {:016x} aborted", self.inner.rank, self.inner.comm_hash);
        Ok(())
    }
}

/// What the collective machinery needs from a communicator.
impl Communicator {
    pub(crate) fn background_jobs(&self) -> &jobs::CommJobs {
        &self.inner.jobs
    }

    pub(crate) fn handle(&self) -> Communicator {
        Communicator { inner: Arc::clone(&self.inner) }
    }

    pub(crate) fn same_as(&self, other: &Communicator) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether destroy or abort has ended this communicator (asked without recording an error).
    pub(crate) fn is_ended(&self) -> bool {
        self.inner.destroyed.load(Ordering::Acquire)
    }

    pub(crate) fn nranks_unchecked(&self) -> u32 {
        self.inner.nranks
    }

    pub(crate) fn rank_unchecked(&self) -> u32 {
        self.inner.rank
    }

    /// Records an error as this communicator's (and the process's) last error.
    pub fn record_error(&self, e: Error) -> Error {
        self.inner.record(e)
    }

    /// Marks the communicator unusable after an operation failed half-way, and tells every
    /// other rank (unless the failure came from one of them, or from this rank's own abort or
    /// revoke, which announce themselves), so that their operations end too.
    pub(crate) fn mark_broken(&self, e: &Error) {
        let first = {
            let mut broken = self.inner.broken.lock().unwrap_or_else(|p| p.into_inner());
            let first = broken.is_none();
            broken.get_or_insert_with(|| e.clone());
            self.inner.is_broken.store(true, Ordering::Release);
            first
        };
        let stopped = self.inner.stop.abort.load(Ordering::Acquire) || self.inner.stop.revoked.load(Ordering::Acquire);
        if first && !stopped {
            self.announce(e);
        }
    }

    /// Tells every other rank that this communicator failed here (once; see
    /// [`Bootstrap::announce_failure`]). The peers' code: a usage error or timeout stays
    /// what it is; anything else is a remote error for them.
    fn announce(&self, e: &Error) {
        let Some(bs) = self.inner.bootstrap.get() else { return };
        let code = match e.code {
            ResultCode::InvalidArgument | ResultCode::InvalidUsage | ResultCode::Timeout => e.code,
            _ => ResultCode::RemoteError,
        };
        let me = &bs.peers()[self.inner.rank as usize];
        let message = format!("rank {} (pid {} on {}) failed: {}", self.inner.rank, me.pid, me.hostname, e.message);
        if bs.announce_failure(&Error::new(code, message)) {
            tracing::info!(target: "INIT", "rank {}: failure announced to every rank", self.inner.rank);
        }
    }

    /// The gate of a collective call.
    pub(crate) fn check_collective_ready(&self, what: &str) -> Result<()> {
        self.operational(what).map(|_| ())
    }

    /// Whether operations may go on (checked while they wait): not aborted, not revoked, no
    /// failed peer. Does not record.
    pub(crate) fn check_running(&self, what: &str) -> Result<()> {
        if self.inner.stop.abort.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(format!("{what}: the communicator was aborted")).with_kind(ErrorKind::Aborted));
        }
        if self.inner.stop.revoked.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(format!("{what}: the communicator was revoked")).with_kind(ErrorKind::Revoked));
        }
        if let Some(e) = self.inner.bootstrap.get().and_then(|b| b.failure()) {
            return Err(e.context(what));
        }
        match self.inner.net_failure.get() {
            Some(e) => Err(e.clone().context(what)),
            None => Ok(()),
        }
    }

    /// The engine that runs this communicator's work (connections, device executor, the
    /// planned route's memo): coll runs work through it.
    pub(crate) fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    fn lock_transports(&self) -> std::sync::MutexGuard<'_, crate::exec::engine::Connections> {
        self.inner.engine.connections()
    }

    /// Runs `f` with what making a connection needs.
    pub(crate) fn with_transport<T>(&self, f: impl FnOnce(&Context) -> Result<T>) -> Result<T> {
        let bs = self.ready("connect")?;
        let plugins = self.plugins()?;
        let mut t = self.lock_transports();
        let proxy = t.proxy.get_or_insert_with(|| Proxy::new(Arc::clone(&plugins.net.plugin.api), Arc::clone(&self.inner.net_failure)));
        let cx = Context {
            bootstrap: bs,
            backend: &self.inner.shared.backend,
            device: self.inner.device as usize,
            net: &plugins.net,
            proxy,
            shm_disabled: crate::params::env_int_or("NCCL_SHM_DISABLE", 0) == 1,
            p2p_disabled: crate::params::env_int_or("NCCL_P2P_DISABLE", 0) == 1,
        };
        f(&cx)
    }
}

impl Communicator {
    /// Starts the thread that watches this communicator's device work: when a peer dies, a
    /// network connection fails, the communicator is aborted or revoked, or a kernel reports
    /// an error, it records the error (the asynchronous error from then on) and tells the
    /// kernels to stop. It ends with the communicator. Started by the engine when the first
    /// device work is handed to the executor (`Engine::with_device`): the engine is made with
    /// this as its `on_first_device_work`, `weak` naming the communicator it is made for.
    fn watchdog_starter(weak: std::sync::Weak<Inner>, backend: Arc<dyn DeviceBackend>, rank: u32) -> Box<dyn Fn() + Send + Sync> {
        Box::new(move || Self::start_watchdog(weak.clone(), Arc::clone(&backend), rank))
    }

    fn start_watchdog(weak: std::sync::Weak<Inner>, backend: Arc<dyn DeviceBackend>, rank: u32) {
        let spawned = std::thread::Builder::new().name("rustccl-watchdog".into()).spawn(move || {
            // The watchdog queries events while the application may be capturing a graph on
            // another thread; in CUDA's global capture mode such a query from any thread that
            // is not relaxed invalidates the capture (PyTorch's watchdog met the same), so this
            // thread's calls are relaxed for its whole life.
            // (A backend that cannot relax still gets its watchdog.)
            let watch = || loop {
                std::thread::sleep(std::time::Duration::from_millis(2));
                let Some(inner) = weak.upgrade() else { return };
                Communicator { inner }.watch_once();
            };
            let mut ran = false;
            let _ = backend.with_relaxed_capture(&mut || {
                ran = true;
                watch();
                Ok(())
            });
            if !ran {
                watch();
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(target: "INIT", "rank {}: no watchdog thread ({e}); failures will not stop kernels", rank);
        }
    }

    /// One look of the watchdog: stops the kernels of a broken communicator; breaks one whose
    /// device work failed or hangs.
    fn watch_once(&self) {
        if self.inner.broken.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            self.device_cache().exec.abort();
            drop(std::mem::take(&mut self.device_cache().profiled));
            self.release_copy_engine_waits();
            self.inner.ops.all_finished();
            return;
        }
        if let Some(e) = self.device_failure().or_else(|| self.device_health().err()) {
            self.device_cache().exec.abort();
            self.release_copy_engine_waits();
            let e = self.record_error(e);
            self.mark_broken(&e);
            self.inner.ops.all_finished();
        }
    }

    /// Why device work of this communicator must stop, if it must: a kernel's report, an
    /// abort or revoke, a failed peer, a failed network connection.
    fn device_failure(&self) -> Option<Error> {
        let kernel_error = {
            // Read under the lock: release frees the control block under it.
            let cache = self.device_cache();
            // No control block yet (only copy-engine work so far): no kernel error, but the
            // peers' and transports' failures below still count.
            cache.exec.control_host().and_then(|control| crate::exec::gpu::control_error(control, self.inner.rank))
        };
        kernel_error
            .or_else(|| self.check_running("collective").err())
            .or_else(|| self.lock_transports().conns.values().find_map(|c| c.failure()))
    }

    /// Whether the device work launched so far has completed (then the op log says so), and
    /// the hang report and timeout of work that has not.
    fn device_health(&self) -> Result<()> {
        let busy = self.inner.ops.busy();
        // Profiled launches are completed here too when the op log already says all finished
        // (a wait on the stream may have said so first): their KernelCh events need the stop.
        let profiled = !self.device_cache().profiled.is_empty();
        if busy || profiled {
            let completed = self.device_completed();
            if busy && !completed {
                self.check_device_routes()?;
                self.check_op_health()?;
            }
        }
        Ok(())
    }

    /// Whether the device work launched so far has completed; if so the op log says so.
    fn device_completed(&self) -> bool {
        let done = {
            let cache = self.device_cache();
            if !cache.exec.watching {
                return false;
            }
            match cache.exec.last_event() {
                Some(ev) => self.inner.shared.backend.query_event(ev).unwrap_or(false),
                None => true,
            }
        };
        if done {
            self.inner.ops.all_finished();
            self.complete_profiled_launches();
        }
        done
    }

    /// The device work launched so far has completed: the observer's channels of it complete.
    fn complete_profiled_launches(&self) {
        let launched = std::mem::take(&mut self.device_cache().profiled);
        launched.into_iter().for_each(crate::observe::Channels::complete);
    }

    /// Waits until this communicator's device work has completed; a failure found meanwhile
    /// stops the kernels (so this never waits on a dead peer).
    pub(crate) fn wait_device_idle(&self) -> Result<()> {
        let backend = &self.inner.shared.backend;
        let Some(event) = self.device_cache().exec.last_event() else { return Ok(()) };
        let mut spins = 0u32;
        while !backend.query_event(event)? {
            if spins.is_multiple_of(64) && self.device_failure().is_some() {
                self.device_cache().exec.abort();
            }
            spins += 1;
            std::thread::sleep(std::time::Duration::from_micros(if spins < 100 { 10 } else { 500 }));
        }
        if self.inner.broken.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
            self.complete_profiled_launches();
        }
        Ok(())
    }

    /// The board of small collectives and the route rings (ranks on one host; on device
    /// backends only the route rings), where this communicator has one.
    pub(crate) fn board(&self) -> Option<&Arc<crate::exec::host::board::Board>> {
        self.inner.board.get()
    }

    /// Host backend: calls that copied straight between the ranks' buffers
    /// (`exec::host::single_copy`) so far. For tests and logs.
    pub fn single_copy_calls(&self) -> u64 {
        self.board().map_or(0, |b| b.single_copies())
    }

    /// The device executor's state (the engine's).
    fn device_cache(&self) -> std::sync::MutexGuard<'_, crate::exec::engine::DeviceExec> {
        self.inner.engine.device()
    }

    /// Waits until every network connection has handed the peer what this rank's operations
    /// put in it: an operation returns once its data is in the connection's FIFO, and the
    /// proxy sends it later. Bounded by `NCCL_OP_TIMEOUT_MS` (else the bootstrap timeout);
    /// a connection that fails stops owing, and an abort, a revoke or a failed peer end the
    /// wait at once. Never called after an abort.
    fn deliver_sends(&self) -> Result<()> {
        let mut owing: Vec<Arc<Connection>> = self.lock_transports().conns.values().filter(|c| c.owes_peer()).cloned().collect();
        if owing.is_empty() {
            return Ok(());
        }
        let limit = self.inner.config.op_timeout.unwrap_or_else(crate::params::bootstrap_timeout);
        let start = std::time::Instant::now();
        let mut wait = crate::exec::backoff::Backoff::new(64);
        loop {
            owing.retain(|c| c.owes_peer());
            let Some(c) = owing.first() else { return Ok(()) };
            self.check_running("delivering the last sends")?;
            if start.elapsed() > limit {
                let (unsent, _) = c.fifo.pending();
                return Err(Error::timeout(format!(
                    "{unsent} slot(s) for rank {} were not delivered within {:.1} s; the peer may be gone or stuck \
                     (NCCL_OP_TIMEOUT_MS, else RUSTCCL_BOOTSTRAP_TIMEOUT, bounds this wait)",
                    c.link.peer,
                    limit.as_secs_f64()
                )));
            }
            wait.pause();
        }
    }

    /// Drops this communicator's hold on its plugins (finalizing their per-communicator state
    /// once no operation uses them any more), after its device work and connections.
    fn release_plugins(&self) {
        if let Err(e) = self.wait_device_idle() {
            tracing::warn!(target: "INIT", "rank {}: waiting for the device before release: {}", self.inner.rank, e.message);
        }
        let mut cache = std::mem::take(&mut *self.device_cache());
        let backend = &self.inner.shared.backend;
        // After a failure or an abort, peers' kernels may still write into the FIFO memory
        // this rank exported to them until they learn of it (it was announced): their
        // watchdogs stop them within milliseconds; give them that time before it is freed.
        let failed = self.inner.stop.abort.load(Ordering::Acquire) || self.async_error_detail().is_some();
        if cache.exec.watching && failed {
            std::thread::sleep(PEER_STOP_GRACE);
        }
        // Kernels still running use the connections and the images: they finish (or, after
        // an abort, stop) first.
        cache.exec.release(backend);
        // Connections and the proxy first: they use the network plugin's context.
        let transports = std::mem::take(&mut *self.lock_transports());
        if let Some(p) = &transports.proxy {
            p.stop();
        }
        drop(transports);
        self.inner.plugins.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(bs) = self.bootstrap.get() {
            bs.close(!self.stop.abort.load(Ordering::Acquire));
        }
        // Peers' buffers still mapped (an abort; destroy unmaps them itself).
        let registered = self.registered.get_mut().unwrap_or_else(|p| p.into_inner());
        registered.close_imports(&*self.shared.backend);
    }
}
