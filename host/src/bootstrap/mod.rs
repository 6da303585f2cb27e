//! Bootstrap: the out-of-band network a communicator is built with. A unique id names a
//! root; every rank registers with it, proving it knows the id's secret, and receives the
//! table of every rank's address. After that the ranks talk directly ([`peers`]):
//! all-gather, barrier, ring and point-to-point messages, each bounded by a timeout and
//! stopped by the communicator's abort and revoke flags.

pub mod encryption;
pub mod id;
pub mod peers;
pub mod root;
pub mod tags;
pub mod wire;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use id::UniqueId;
use peers::PeerNet;
pub use root::PeerInfo;
use root::RootMsg;
use wire::{Cancel, Conn};

use crate::error::{Error, Result, ResultCode};
use crate::params;
pub use rustccl_netif as netif;

/// Flags that stop every wait of one communicator.
#[derive(Debug, Default)]
pub struct StopFlags {
    pub abort: AtomicBool,
    pub revoked: AtomicBool,
}

impl StopFlags {
    pub fn cancel<'a>(&'a self, timeout: Duration, what: &'a str) -> Cancel<'a> {
        Cancel { abort: Some(&self.abort), revoked: Some(&self.revoked), ..Cancel::after(timeout, what) }
    }
}

/// Creates a unique id (`ncclGetUniqueId`). With `NCCL_COMM_ID=host:port` every rank gets the
/// same id by itself and rank 0 starts the root at init; otherwise a root starts here, on the
/// bootstrap interface, with a fresh random secret.
pub fn get_unique_id() -> Result<UniqueId> {
    crate::log::init();
    if let Some(env) = params::env_str("NCCL_COMM_ID") {
        let addr = netif::parse_socket_addr(env.trim()).map_err(|e| Error::from(e).context("NCCL_COMM_ID"))?;
        return Ok(UniqueId::from_comm_id_env(env.trim(), addr));
    }
    create_root_id()
}

/// Starts a root with a fresh secret on the bootstrap interface and returns its id (what
/// `get_unique_id` does without `NCCL_COMM_ID`; split and shrink use it for their children).
pub fn create_root_id() -> Result<UniqueId> {
    let iface = netif::bootstrap_interface_from(params::env_str)?;
    let (listener, addr) = peers::bind_listener(iface.addr)?;
    let secret = id::random_bytes()?;
    root::spawn(listener, secret, params::bootstrap_timeout(), true)?;
    Ok(UniqueId::from_parts(secret, addr))
}

/// Starts the root for an `NCCL_COMM_ID` id (rank 0 does this at init).
pub fn start_comm_id_root(id: &UniqueId) -> Result<()> {
    let addr = id.root_addr();
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| Error::io(format!("NCCL_COMM_ID: rank 0 cannot listen on {addr}"), &e))?;
    root::spawn(listener, id.secret(), params::bootstrap_timeout(), false)
}

/// The identity of this host: ranks with equal hashes share a node. `NCCL_HOSTID` overrides
/// it; otherwise it comes from the host name and the kernel's boot id.
pub fn host_hash() -> u64 {
    use sha2::{Digest, Sha256};
    let ident = match params::env_str("NCCL_HOSTID") {
        Some(h) => h,
        None => {
            let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
            format!("{}{}", hostname(), boot.trim())
        }
    };
    let d = Sha256::digest(ident.as_bytes());
    u64::from_le_bytes(d[..8].try_into().unwrap())
}

pub fn hostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "unknown".into())
}

/// Tags of internal operations have the top bit set (see [`tags`]).
const INTERNAL_TAG: u64 = tags::INTERNAL;
static STATUS_NONCE: AtomicU64 = AtomicU64::new(1);

/// One rank's bootstrap network for one communicator.
pub struct Bootstrap {
    net: PeerNet,
    timeout: Duration,
    /// Sequence number of internal collective operations (every rank calls them in one order).
    seq: AtomicU64,
    pub stop: Arc<StopFlags>,
}

/// What a rank needs to join a rendezvous.
pub struct JoinRequest<'a> {
    pub ids: &'a [UniqueId],
    pub nranks: u32,
    pub rank: u32,
    pub device: i32,
}

impl Bootstrap {
    /// Joins the rendezvous of `req.ids` and connects this rank to its peers.
    pub fn init(req: &JoinRequest, stop: Arc<StopFlags>) -> Result<Bootstrap> {
        let timeout = params::bootstrap_timeout();
        let iface = netif::bootstrap_interface_from(params::env_str)?;
        let (listener, listen) = peers::bind_listener(iface.addr)?;
        let info = PeerInfo {
            rank: req.rank,
            listen,
            version: crate::version::announced_version(),
            host_hash: host_hash(),
            hostname: hostname(),
            pid: std::process::id(),
            device: req.device,
        };
        // The root gives up a little earlier (`root::root_limit`), so that its message (which
        // says what went wrong) arrives before this rank gives up on its own.
        let peers = rendezvous(req, info, &stop.cancel(timeout, "bootstrap rendezvous"))?;
        let net = PeerNet::start(listener, req.rank, peers, req.ids[0].secret())?;
        let bs = Bootstrap { net, timeout, seq: AtomicU64::new(0), stop };
        // Every rank checks that all got the same table; this also opens the ring connections
        // through which a rank's death is noticed.
        let digest = table_digest(bs.net.peers());
        let all = bs.allgather(&digest.to_le_bytes())?;
        if let Some(r) = all.iter().position(|d| d.as_slice() != digest.to_le_bytes()) {
            return Err(Error::internal(format!("rank {r} received a different rank table")));
        }
        tracing::info!(
            target: "BOOTSTRAP",
            "Bootstrap: rank {} of {} connected (listening on {listen})", req.rank, req.nranks
        );
        Ok(bs)
    }

    pub fn rank(&self) -> u32 {
        self.net.rank()
    }
    pub fn nranks(&self) -> u32 {
        self.net.nranks()
    }
    pub fn peers(&self) -> &[PeerInfo] {
        self.net.peers()
    }

    /// The first failure seen: a dead peer (a remote error), else an operation failure a rank
    /// announced (with its code).
    pub fn failure(&self) -> Option<Error> {
        self.net.failure()
    }

    /// Tells every rank that an operation failed here (see [`PeerNet::announce_failure`]).
    pub fn announce_failure(&self, e: &Error) -> bool {
        self.net.announce_failure(e.code, &e.message)
    }

    /// The operation failure announced by some rank, if any.
    pub fn comm_failure(&self) -> Option<peers::CommFailure> {
        self.net.comm_failure()
    }

    /// Installs what answers peers' status queries (see [`PeerNet::query_status`]).
    pub fn set_status_provider(&self, f: peers::StatusFn) {
        self.net.set_status_provider(f);
    }

    /// Installs what receives peers' reports.
    pub fn set_report_handler(&self, f: peers::ReportFn) {
        self.net.set_report_handler(f);
    }

    /// Every rank's answer to a status query (`None` for this rank and silent ones).
    pub fn query_status(&self, wait: Duration) -> Vec<Option<Vec<u8>>> {
        let nonce = STATUS_NONCE.fetch_add(1, Ordering::Relaxed);
        self.net.query_status(tags::status_reply(nonce), wait)
    }

    /// Installs (or removes) what answers peers' requests (see [`Bootstrap::request`]).
    pub fn set_request_handler(&self, f: Option<peers::RequestFn>) {
        self.net.set_request_handler(f);
    }

    /// Asks `peer`'s communicator for a service (answered by its reader thread, whatever its
    /// main thread does) and waits up to `wait` for the answer; an empty answer means the
    /// peer has no handler.
    pub fn request(&self, peer: u32, request: &[u8], wait: Duration) -> Result<Vec<u8>> {
        let nonce = STATUS_NONCE.fetch_add(1, Ordering::Relaxed);
        let cancel = self.stop.cancel(wait, "a request to a peer");
        self.net.request(peer, tags::request_reply(nonce), request, &cancel)
    }

    /// Sends a report to every other rank.
    pub fn send_report(&self, text: &str) {
        self.net.send_report(text);
    }

    fn cancel<'a>(&'a self, what: &'a str) -> Cancel<'a> {
        self.stop.cancel(self.timeout, what)
    }

    fn next_tag(&self, op: u64) -> u64 {
        tags::internal(op, self.seq.fetch_add(1, Ordering::Relaxed))
    }

    /// Sends a message to `peer` (`tag` below 2^63).
    pub fn send(&self, peer: u32, tag: u64, data: &[u8]) -> Result<()> {
        if tag & INTERNAL_TAG != 0 {
            return Err(Error::invalid_argument("bootstrap tags at or above 2^63 are reserved"));
        }
        self.net.send(peer, tag, data, &self.cancel("bootstrap send"))
    }

    /// Receives the next message from `peer` under `tag`.
    pub fn recv(&self, peer: u32, tag: u64) -> Result<Vec<u8>> {
        if tag & INTERNAL_TAG != 0 {
            return Err(Error::invalid_argument("bootstrap tags at or above 2^63 are reserved"));
        }
        self.net.recv(peer, tag, false, &self.cancel("bootstrap recv"))
    }

    /// The next message from `peer` under `tag`, if it has arrived (never waits).
    pub fn try_recv(&self, peer: u32, tag: u64) -> Result<Option<Vec<u8>>> {
        if tag & INTERNAL_TAG != 0 {
            return Err(Error::invalid_argument("bootstrap tags at or above 2^63 are reserved"));
        }
        self.net.try_recv(peer, tag)
    }

    /// Internal point-to-point exchange that ignores the failure of ranks other than `peer`
    /// and the stop flags (shrink uses it while the parent is aborted), bounded by the timeout.
    pub fn send_survivor(&self, peer: u32, tag: u64, data: &[u8]) -> Result<()> {
        let cancel = Cancel::after(self.timeout, "bootstrap send to a survivor");
        self.net.send(peer, INTERNAL_TAG | tag, data, &cancel)
    }

    pub fn recv_survivor(&self, peer: u32, tag: u64) -> Result<Vec<u8>> {
        self.recv_survivor_by(peer, tag, Instant::now() + self.timeout)
    }

    /// As [`recv_survivor`](Self::recv_survivor), waiting until `deadline` (one wait for
    /// several messages); past it, only a message already here is taken.
    pub fn recv_survivor_by(&self, peer: u32, tag: u64, deadline: Instant) -> Result<Vec<u8>> {
        let cancel = Cancel { deadline, ..Cancel::after(Duration::ZERO, "bootstrap recv from a survivor") };
        self.net.recv(peer, INTERNAL_TAG | tag, false, &cancel)
    }

    /// How long one bootstrap operation may wait (`RUSTCCL_BOOTSTRAP_TIMEOUT`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Tests: a shorter wait than the process's setting, for this bootstrap only.
    #[cfg(test)]
    pub(crate) fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn check_live(&self) -> Result<()> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        Ok(())
    }

    /// Ring all-gather of one byte string per rank (sizes may differ).
    pub fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.check_live()?;
        let (rank, n) = (self.rank(), self.nranks());
        let tag = self.next_tag(tags::OP_ALLGATHER);
        let mut all = vec![Vec::new(); n as usize];
        all[rank as usize] = mine.to_vec();
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        let cancel = self.cancel("bootstrap all-gather");
        for step in 0..n.saturating_sub(1) {
            let send_idx = (rank + n - step) % n;
            let recv_idx = (rank + n - step - 1) % n;
            self.net.send(next, tag | step as u64, &all[send_idx as usize], &cancel)?;
            all[recv_idx as usize] = self.net.recv(prev, tag | step as u64, true, &cancel)?;
        }
        Ok(all)
    }

    /// Dissemination barrier: log2(n) rounds of one message each.
    pub fn barrier(&self) -> Result<()> {
        self.check_live()?;
        let (rank, n) = (self.rank(), self.nranks());
        let tag = self.next_tag(tags::OP_BARRIER);
        let cancel = self.cancel("bootstrap barrier");
        let mut dist = 1;
        let mut round = 0u64;
        while dist < n {
            self.net.send((rank + dist) % n, tag | round, &[], &cancel)?;
            self.net.recv((rank + n - dist) % n, tag | round, true, &cancel)?;
            dist *= 2;
            round += 1;
        }
        Ok(())
    }

    /// Sends to the next rank of the ring and receives from the previous one.
    pub fn ring_exchange(&self, data: &[u8]) -> Result<Vec<u8>> {
        self.check_live()?;
        let (rank, n) = (self.rank(), self.nranks());
        let tag = self.next_tag(tags::OP_RING);
        if n == 1 {
            return Ok(data.to_vec());
        }
        let cancel = self.cancel("bootstrap ring exchange");
        self.net.send((rank + 1) % n, tag, data, &cancel)?;
        self.net.recv((rank + n - 1) % n, tag, true, &cancel)
    }

    /// Closes the peer connections (see [`PeerNet::close`]).
    pub fn close(&self, graceful: bool) {
        self.net.close(graceful);
    }
}

fn table_digest(peers: &[PeerInfo]) -> u64 {
    use sha2::{Digest, Sha256};
    let text = serde_json::to_vec(peers).unwrap_or_default();
    let d = Sha256::digest(&text);
    u64::from_le_bytes(d[..8].try_into().unwrap())
}

fn fail_from(code: i32, message: String) -> Error {
    Error::new(ResultCode::from_i32(code).unwrap_or(ResultCode::RemoteError), message)
}

/// Registers with this rank's root and waits for the table.
fn rendezvous(req: &JoinRequest, info: PeerInfo, cancel: &Cancel) -> Result<Vec<PeerInfo>> {
    let n_ids = req.ids.len() as u32;
    let k = root::root_of(req.nranks, n_ids, req.rank);
    let id = &req.ids[k as usize];
    let mut conn = connect_root(id, cancel)?;
    conn.send_json(&RootMsg::Register { nranks: req.nranks, n_ids, root_index: k, info: info.clone() }, cancel)?;
    let reply: RootMsg = conn.recv_json(cancel).map_err(|e| e.context(format!("waiting for the bootstrap root {}", id.root_addr())))?;
    let peers = match reply {
        RootMsg::Table { peers } => peers,
        RootMsg::Fail { code, message } => return Err(fail_from(code, message)),
        RootMsg::Subset { peers } => {
            // This rank leads subset k: report it to root 0 and bring the table back.
            let mut conn0 = connect_root(&req.ids[0], cancel)?;
            conn0.send_json(&RootMsg::Report { nranks: req.nranks, n_ids, root_index: k, peers }, cancel)?;
            let reply: RootMsg = conn0.recv_json(cancel).map_err(|e| e.context("waiting for root 0"))?;
            let _ = conn.send_json(&reply, cancel);
            match reply {
                RootMsg::Table { peers } => peers,
                RootMsg::Fail { code, message } => return Err(fail_from(code, message)),
                other => return Err(Error::remote(format!("root 0 sent {other:?} instead of the table"))),
            }
        }
        other => return Err(Error::remote(format!("the bootstrap root sent {other:?} instead of the table"))),
    };
    let shape_ok = peers.len() == req.nranks as usize
        && peers.iter().enumerate().all(|(i, p)| p.rank == i as u32)
        && peers[req.rank as usize] == info;
    if !shape_ok {
        return Err(Error::remote("the bootstrap root sent a table that does not match this communicator"));
    }
    Ok(peers)
}

fn connect_root(id: &UniqueId, cancel: &Cancel) -> Result<Conn> {
    let addr: SocketAddr = id.root_addr();
    let mut conn = Conn::connect(addr, root::MAX_CONTROL_BYTES, cancel)
        .map_err(|e| e.context("bootstrap: cannot reach the root (was the unique id created and is its process alive?)"))?;
    conn.prove(&id.secret(), cancel)?;
    Ok(conn)
}
