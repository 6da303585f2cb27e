//! Connections between the ranks of one communicator after the rendezvous.
//!
//! Each rank listens on one socket. A rank sending to a peer connects to it once, proves the
//! secret, says who it is (`Hello`), and keeps the connection. A reader thread per incoming
//! connection files `Data` frames into a mailbox keyed by (sender, tag), where `recv` finds
//! them, in order. A connection that ends without a `Bye` means its rank died: the reader
//! marks it dead, wakes every waiter, and tells the other ranks (`PeerFailed`), so that every
//! survivor's next operation fails with a remote error instead of waiting. So does a peer
//! listener that refuses a connection (it was bound before the rendezvous, so its process is
//! gone), which is how a rank killed after the table but before it connected is noticed.
//!
//! A rank whose operation failed for another reason (a mismatch, a timeout) tells every peer
//! too (`CommFailed`, [`PeerNet::announce_failure`]): the communicator cannot go on anywhere.
//! The reader threads also answer status queries (`StatusQuery`, for hang reports) from a
//! provider the communicator installs, without the main thread, which may be stuck, and
//! requests (`Request`: a service of the communicator a peer asks for, such as mapping its
//! buffer) from a handler the communicator installs.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::id::Secret;
use super::root::PeerInfo;
use super::wire::{Cancel, Conn, Kind, POLL_INTERVAL};
use crate::error::{Error, Result, ResultCode};

/// Largest single peer message.
pub const MAX_PEER_MESSAGE: u64 = 1 << 34;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A reader waits for data without a deadline; this stands for "forever".
const NO_DEADLINE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

#[derive(Default)]
struct Mail {
    queues: HashMap<(u32, u64), VecDeque<Vec<u8>>>,
    /// Ranks known to have failed, with the reason.
    dead: HashMap<u32, String>,
    /// Ranks that closed their side on purpose.
    departed: HashSet<u32>,
    /// The first operation failure announced by any rank (this one included).
    comm_failed: Option<CommFailure>,
    /// The first failure of either kind: what every wait reports (with the rank it is the
    /// death of, for deaths).
    first: Option<(Option<u32>, Error)>,
}

/// An operation failure that ends the communicator on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommFailure {
    /// The rank where it happened.
    pub origin: u32,
    pub code: ResultCode,
    pub reason: String,
}

/// Answers a status query: the bytes to send back.
pub type StatusFn = Box<dyn Fn() -> Vec<u8> + Send + Sync>;
/// Receives a report a peer sent (its rank, the text).
pub type ReportFn = Box<dyn Fn(u32, &str) + Send + Sync>;
/// Answers a peer's request (its rank, the request): the bytes to send back.
pub type RequestFn = Box<dyn Fn(u32, &[u8]) -> Vec<u8> + Send + Sync>;

struct Shared {
    rank: u32,
    peers: Vec<PeerInfo>,
    secret: Secret,
    mail: Mutex<Mail>,
    /// Set (and never cleared) once `Mail::first` holds a failure: the check every call makes
    /// without taking the lock.
    failed: AtomicBool,
    arrived: Condvar,
    /// Outgoing connection to each peer, made on first use.
    out: Vec<Mutex<Option<Conn>>>,
    /// Incoming connections, kept so that closing can shut them down.
    inbound: Mutex<Vec<Conn>>,
    closing: AtomicBool,
    /// Background sends to every peer (news of a failure) not known to have finished:
    /// closing waits for them, so that a rank whose init fails because a peer is gone still
    /// tells the others before it leaves.
    telling: Mutex<Vec<JoinHandle<()>>>,
    status: Mutex<Option<StatusFn>>,
    on_request: Mutex<Option<RequestFn>>,
    on_report: Mutex<Option<ReportFn>>,
}

/// This rank's end of the peer connections of one communicator.
pub struct PeerNet {
    shared: Arc<Shared>,
    acceptor: Mutex<Option<JoinHandle<()>>>,
}

/// Binds the listener a rank announces at rendezvous (any free port on `ip`).
pub fn bind_listener(ip: std::net::IpAddr) -> Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| Error::io(format!("binding a listener on {ip}"), &e))?;
    let addr = l.local_addr().map_err(|e| Error::io("listener address", &e))?;
    Ok((l, addr))
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Mail> {
        self.mail.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn who(&self, rank: u32) -> String {
        match self.peers.get(rank as usize) {
            Some(p) => format!("rank {rank} (pid {} on {})", p.pid, p.hostname),
            None => format!("rank {rank}"),
        }
    }

    /// Records that `rank` failed, if this is news; with `spread`, also tells the other
    /// ranks. The news is on its way (and known to [`PeerNet::close`]) before any waiter
    /// wakes up: a rank whose init fails with it tells the others before it leaves.
    fn mark_dead(self: &Arc<Self>, rank: u32, reason: String, spread: bool) {
        let mut mail = self.lock();
        if mail.departed.contains(&rank) || mail.dead.contains_key(&rank) {
            return;
        }
        tracing::warn!(target: "BOOTSTRAP", "{reason}");
        mail.first.get_or_insert_with(|| (Some(rank), Error::remote(reason.clone())));
        self.failed.store(true, Ordering::Release);
        mail.dead.insert(rank, reason.clone());
        if spread {
            self.spread_failure(rank, reason);
        }
        self.arrived.notify_all();
    }

    /// Tells every other live peer that `rank` failed (best effort, in the background).
    fn spread_failure(self: &Arc<Self>, rank: u32, reason: String) {
        let mut payload = rank.to_le_bytes().to_vec();
        payload.extend_from_slice(reason.as_bytes());
        self.tell_all(Some(rank), Kind::PeerFailed, payload);
    }

    /// Sends one frame to every live peer but `skip` (best effort, at most about a second).
    fn tell_all_now(&self, skip: Option<u32>, kind: Kind, payload: &[u8]) {
        let cancel = Cancel::after(Duration::from_secs(1), "telling the other ranks");
        for peer in 0..self.peers.len() as u32 {
            if peer == self.rank || Some(peer) == skip || self.lock().dead.contains_key(&peer) {
                continue;
            }
            let _ = self.send_frame(peer, kind, &[payload], &cancel);
        }
    }

    /// As [`tell_all_now`](Self::tell_all_now), in the background.
    fn tell_all(self: &Arc<Self>, skip: Option<u32>, kind: Kind, payload: Vec<u8>) {
        let shared = Arc::clone(self);
        let spawned =
            std::thread::Builder::new().name("rustccl-notify".into()).spawn(move || shared.tell_all_now(skip, kind, &payload));
        if let Ok(handle) = spawned {
            let mut telling = self.telling.lock().unwrap_or_else(|p| p.into_inner());
            telling.retain(|h| !h.is_finished());
            telling.push(handle);
        }
    }

    /// Records an announced operation failure; true when it is the first.
    fn record_comm_failure(&self, f: CommFailure) -> bool {
        let mut mail = self.lock();
        if mail.comm_failed.is_some() {
            return false;
        }
        // A rank that announced a failure and then left (or was seen gone by another rank
        // first, whose news can overtake the announcement) failed for the announced reason.
        if mail.first.as_ref().is_none_or(|(dead, _)| *dead == Some(f.origin)) {
            mail.first = Some((None, Error::new(f.code, f.reason.clone())));
            self.failed.store(true, Ordering::Release);
        }
        mail.comm_failed = Some(f);
        self.arrived.notify_all();
        true
    }

    fn send_frame(&self, to: u32, kind: Kind, parts: &[&[u8]], cancel: &Cancel) -> Result<()> {
        let mut slot = self.out[to as usize].lock().unwrap_or_else(|p| p.into_inner());
        if self.closing.load(Ordering::Acquire) {
            return Err(Error::invalid_usage("the communicator's peer connections are closed"));
        }
        if slot.is_none() {
            let addr = self.peers[to as usize].listen;
            // The peer bound its listener before it joined the rendezvous: a refusal means
            // its process is gone.
            let mut conn = Conn::connect_listening(addr, MAX_PEER_MESSAGE, cancel)?;
            conn.prove(&self.secret, cancel)?;
            conn.send(Kind::Hello, &[&self.rank.to_le_bytes()], cancel)?;
            *slot = Some(conn);
        }
        let result = slot.as_mut().unwrap().send(kind, parts, cancel);
        if result.is_err() {
            // The stream may hold half a frame now; it cannot be used again.
            if let Some(c) = slot.take() {
                c.shutdown();
            }
        }
        result
    }

    fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        while !self.closing.load(Ordering::Acquire) {
            match listener.accept() {
                Ok((stream, from)) => {
                    let shared = Arc::clone(&self);
                    let _ = std::thread::Builder::new()
                        .name("rustccl-peer-rx".into())
                        .spawn(move || shared.serve(stream, from));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => {
                    tracing::warn!(target: "BOOTSTRAP", "peer listener: accept failed: {e}");
                    std::thread::sleep(POLL_INTERVAL);
                }
            }
        }
    }

    /// Authenticates one incoming connection and reads it until it ends.
    fn serve(self: Arc<Self>, stream: TcpStream, from: SocketAddr) {
        let _ = stream.set_nonblocking(false);
        let hello = (|| {
            let cancel = Cancel { abort: Some(&self.closing), ..Cancel::after(HANDSHAKE_TIMEOUT, "peer handshake") };
            let mut conn = Conn::new(stream, MAX_PEER_MESSAGE)?;
            conn.challenge(&self.secret, &cancel)?;
            let hello = conn.expect(Kind::Hello, &cancel)?;
            let rank = match <[u8; 4]>::try_from(hello.as_slice()) {
                Ok(b) => u32::from_le_bytes(b),
                Err(_) => return Err(Error::remote("malformed hello")),
            };
            if rank as usize >= self.peers.len() || rank == self.rank {
                return Err(Error::remote(format!("hello from impossible rank {rank}")));
            }
            Ok((conn, rank))
        })();
        let (mut conn, peer) = match hello {
            Ok(x) => x,
            Err(e) => {
                if !self.closing.load(Ordering::Acquire) {
                    tracing::warn!(target: "BOOTSTRAP", "rank {}: dropped connection from {from}: {}", self.rank, e.message);
                }
                return;
            }
        };
        if let Ok(c) = conn.try_clone() {
            self.inbound.lock().unwrap_or_else(|p| p.into_inner()).push(c);
        }
        let what = format!("connection from {}", self.who(peer));
        let cancel = Cancel { abort: Some(&self.closing), ..Cancel::after(NO_DEADLINE, &what) };
        loop {
            match conn.recv(&cancel) {
                Ok((Kind::Data, payload)) if payload.len() >= 8 => {
                    let tag = u64::from_le_bytes(payload[..8].try_into().unwrap());
                    let mut mail = self.lock();
                    mail.queues.entry((peer, tag)).or_default().push_back(payload[8..].to_vec());
                    self.arrived.notify_all();
                }
                Ok((Kind::Bye, _)) => {
                    self.lock().departed.insert(peer);
                    self.arrived.notify_all();
                }
                Ok((Kind::PeerFailed, payload)) if payload.len() >= 4 => {
                    let failed = u32::from_le_bytes(payload[..4].try_into().unwrap());
                    let reason = String::from_utf8_lossy(&payload[4..]).into_owned();
                    if failed != self.rank && (failed as usize) < self.peers.len() {
                        self.mark_dead(failed, format!("{} failed (reported by rank {peer}): {reason}", self.who(failed)), false);
                    }
                }
                Ok((Kind::CommFailed, payload)) if payload.len() >= 8 => {
                    let code = i32::from_le_bytes(payload[..4].try_into().unwrap());
                    let origin = u32::from_le_bytes(payload[4..8].try_into().unwrap());
                    let reason = String::from_utf8_lossy(&payload[8..]).into_owned();
                    let code = ResultCode::from_i32(code).filter(|c| *c != ResultCode::Success && *c != ResultCode::InProgress);
                    if let (Some(code), true) = (code, (origin as usize) < self.peers.len()) {
                        if self.record_comm_failure(CommFailure { origin, code, reason: reason.clone() }) {
                            tracing::warn!(target: "BOOTSTRAP", "rank {}: {} reports a failed operation: {reason}", self.rank, self.who(origin));
                        }
                    }
                }
                Ok((Kind::StatusQuery, payload)) if payload.len() == 8 => {
                    let tag = u64::from_le_bytes(payload[..8].try_into().unwrap());
                    let answer = self.status.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|f| f()).unwrap_or_default();
                    let cancel = Cancel { abort: Some(&self.closing), ..Cancel::after(Duration::from_secs(2), "answering a status query") };
                    let _ = self.send_frame(peer, Kind::Data, &[&tag.to_le_bytes(), &answer], &cancel);
                }
                Ok((Kind::Request, payload)) if payload.len() >= 8 => {
                    let tag = u64::from_le_bytes(payload[..8].try_into().unwrap());
                    // Without a handler (a communicator being set up or torn down) the answer
                    // is empty, which the requester reads as "not served".
                    let answer =
                        self.on_request.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|f| f(peer, &payload[8..])).unwrap_or_default();
                    let cancel = Cancel { abort: Some(&self.closing), ..Cancel::after(Duration::from_secs(2), "answering a request") };
                    let _ = self.send_frame(peer, Kind::Data, &[&tag.to_le_bytes(), &answer], &cancel);
                }
                Ok((Kind::Report, payload)) => {
                    let text = String::from_utf8_lossy(&payload);
                    match self.on_report.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                        Some(f) => f(peer, &text),
                        None => tracing::warn!(target: "BOOTSTRAP", "rank {}: report from rank {peer}:\n{text}", self.rank),
                    }
                }
                Ok((kind, _)) => {
                    self.fail_peer(peer, format!("{} broke the protocol (unexpected {kind:?} frame)", self.who(peer)));
                    conn.shutdown();
                    return;
                }
                Err(e) => {
                    if self.closing.load(Ordering::Acquire) {
                        return;
                    }
                    self.fail_peer(
                        peer,
                        format!("{} exited or its connection failed: {}", self.who(peer), e.message),
                    );
                    return;
                }
            }
        }
    }

    fn fail_peer(self: &Arc<Self>, peer: u32, reason: String) {
        // A rank that announced a failure told every rank itself; news of its end would only
        // race its announcement.
        let announced = self.lock().comm_failed.as_ref().is_some_and(|f| f.origin == peer);
        self.mark_dead(peer, reason, !announced);
    }
}

/// How long a failed send waits for the peer's own connection to tell why it went.
const SETTLE: Duration = Duration::from_millis(250);

impl PeerNet {
    /// Starts accepting peer connections on `listener` (bound before the rendezvous).
    pub fn start(listener: TcpListener, rank: u32, peers: Vec<PeerInfo>, secret: Secret) -> Result<PeerNet> {
        listener.set_nonblocking(true).map_err(|e| Error::io("peer listener", &e))?;
        let out = (0..peers.len()).map(|_| Mutex::new(None)).collect();
        let shared = Arc::new(Shared {
            rank,
            peers,
            secret,
            mail: Mutex::new(Mail::default()),
            failed: AtomicBool::new(false),
            arrived: Condvar::new(),
            out,
            inbound: Mutex::new(Vec::new()),
            closing: AtomicBool::new(false),
            telling: Mutex::new(Vec::new()),
            status: Mutex::new(None),
            on_request: Mutex::new(None),
            on_report: Mutex::new(None),
        });
        let s = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new()
            .name("rustccl-peer-accept".into())
            .spawn(move || s.accept_loop(listener))
            .map_err(|e| Error::io("starting the peer listener thread", &e))?;
        Ok(PeerNet { shared, acceptor: Mutex::new(Some(acceptor)) })
    }

    pub fn rank(&self) -> u32 {
        self.shared.rank
    }

    pub fn nranks(&self) -> u32 {
        self.shared.peers.len() as u32
    }

    pub fn peers(&self) -> &[PeerInfo] {
        &self.shared.peers
    }

    /// The first failure seen among the peers, if any: a dead rank (a remote error) or an
    /// operation failure some rank announced (with its code), whichever came first.
    pub fn failure(&self) -> Option<Error> {
        if !self.shared.failed.load(Ordering::Acquire) {
            return None;
        }
        let mail = self.shared.lock();
        Self::failure_of(&mail)
    }

    fn failure_of(mail: &Mail) -> Option<Error> {
        mail.first.as_ref().map(|(_, e)| e.clone().with_kind(crate::error::ErrorKind::PeerFailed))
    }

    /// The announced operation failure, if any.
    pub fn comm_failure(&self) -> Option<CommFailure> {
        self.shared.lock().comm_failed.clone()
    }

    /// Tells every peer that an operation failed here with `code` and `reason`, so that their
    /// pending and later operations end with it. Only the first failure of the communicator
    /// is announced (a failure heard from a peer is not echoed); true when this one was sent.
    pub fn announce_failure(&self, code: ResultCode, reason: &str) -> bool {
        {
            let mail = self.shared.lock();
            if !mail.dead.is_empty() {
                return false;
            }
        }
        if !self.shared.record_comm_failure(CommFailure { origin: self.rank(), code, reason: reason.to_string() }) {
            return false;
        }
        let mut payload = (code as i32).to_le_bytes().to_vec();
        payload.extend_from_slice(&self.rank().to_le_bytes());
        payload.extend_from_slice(reason.as_bytes());
        self.shared.tell_all_now(None, Kind::CommFailed, &payload);
        true
    }

    /// Installs what answers peers' status queries.
    pub fn set_status_provider(&self, f: StatusFn) {
        *self.shared.status.lock().unwrap_or_else(|p| p.into_inner()) = Some(f);
    }

    /// Installs what receives peers' reports.
    pub fn set_report_handler(&self, f: ReportFn) {
        *self.shared.on_report.lock().unwrap_or_else(|p| p.into_inner()) = Some(f);
    }

    /// Installs (or, with `None`, removes) what answers peers' requests.
    pub fn set_request_handler(&self, f: Option<RequestFn>) {
        *self.shared.on_request.lock().unwrap_or_else(|p| p.into_inner()) = f;
    }

    /// Asks `peer` for a service of its communicator (answered by its reader thread, whatever
    /// its main thread is doing) and waits for the answer under `reply_tag` (empty: the peer
    /// has no handler).
    pub fn request(&self, peer: u32, reply_tag: u64, request: &[u8], cancel: &Cancel) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        if let Some(why) = self.shared.lock().dead.get(&peer) {
            return Err(Error::remote(why.clone()));
        }
        self.shared.send_frame(peer, Kind::Request, &[&reply_tag.to_le_bytes(), request], cancel)?;
        self.recv(peer, reply_tag, false, cancel)
    }

    /// Asks every other rank for its status (answered by its reader thread, whatever its main
    /// thread is doing) and waits up to `wait` for the answers: one entry per rank, `None`
    /// for this rank and for ranks that are dead, departed or did not answer in time.
    pub fn query_status(&self, reply_tag: u64, wait: Duration) -> Vec<Option<Vec<u8>>> {
        let n = self.nranks();
        let cancel = Cancel::after(wait, "status query");
        let mut asked = vec![false; n as usize];
        for peer in 0..n {
            if peer == self.rank() || self.shared.lock().dead.contains_key(&peer) {
                continue;
            }
            asked[peer as usize] = self.shared.send_frame(peer, Kind::StatusQuery, &[&reply_tag.to_le_bytes()], &cancel).is_ok();
        }
        (0..n)
            .map(|peer| if asked[peer as usize] { self.recv(peer, reply_tag, false, &cancel).ok() } else { None })
            .collect()
    }

    /// Sends a report to every other live rank (best effort, in the background).
    pub fn send_report(&self, text: &str) {
        self.shared.tell_all(None, Kind::Report, text.as_bytes().to_vec());
    }

    fn check_peer(&self, peer: u32) -> Result<()> {
        if peer >= self.nranks() || peer == self.rank() {
            return Err(Error::invalid_argument(format!(
                "peer {peer} is not another rank of this {}-rank communicator",
                self.nranks()
            )));
        }
        Ok(())
    }

    /// Sends `data` to `peer` under `tag`.
    pub fn send(&self, peer: u32, tag: u64, data: &[u8], cancel: &Cancel) -> Result<()> {
        self.check_peer(peer)?;
        if let Some(why) = self.shared.lock().dead.get(&peer) {
            return Err(Error::remote(why.clone()));
        }
        self.shared.send_frame(peer, Kind::Data, &[&tag.to_le_bytes(), data], cancel).map_err(|e| {
            if cancel.check().is_ok() && e.code == crate::error::ResultCode::RemoteError {
                // The peer's last frames (news of another rank's failure, its goodbye) may
                // still be on their way on its own connection to this rank: a rank whose init
                // failed because a third one died tells the others, then leaves, and its
                // leaving can reach this send first. Its reader gets a moment to catch up;
                // then the first failure known is the cause to report.
                self.settle(peer, SETTLE);
                let departed = self.shared.lock().departed.contains(&peer);
                if departed {
                    return self
                        .failure()
                        .unwrap_or_else(|| Error::remote(format!("{} has destroyed its communicator", self.shared.who(peer))));
                }
                let reason = format!("{} cannot be reached: {}", self.shared.who(peer), e.message);
                self.shared.fail_peer(peer, reason.clone());
                return self.failure().unwrap_or_else(|| Error::remote(reason));
            }
            e
        })
    }

    /// Waits up to `limit` until the reader of `peer`'s connection has seen it leave or fail.
    fn settle(&self, peer: u32, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        let mut mail = self.shared.lock();
        while !(mail.departed.contains(&peer) || mail.dead.contains_key(&peer)) {
            let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else { break };
            mail = self.shared.arrived.wait_timeout(mail, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Receives the next message from `peer` under `tag`. With `strict`, the failure of any
    /// rank ends the wait (a collective cannot complete without it); otherwise only the
    /// failure of `peer` does.
    pub fn recv(&self, peer: u32, tag: u64, strict: bool, cancel: &Cancel) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        let mut mail = self.shared.lock();
        loop {
            if let Some(msg) = mail.queues.get_mut(&(peer, tag)).and_then(|q| q.pop_front()) {
                return Ok(msg);
            }
            if let Some(why) = mail.dead.get(&peer) {
                return Err(Error::remote(why.clone()));
            }
            // This rank's own abort or revoke first, then what other ranks reported.
            cancel.check()?;
            if strict {
                if let Some(e) = Self::failure_of(&mail) {
                    return Err(e);
                }
            }
            if mail.departed.contains(&peer) {
                return Err(Error::remote(format!(
                    "{} destroyed its communicator while this rank waited for its message",
                    self.shared.who(peer)
                )));
            }
            cancel.check()?;
            let (m, _) = self
                .shared
                .arrived
                .wait_timeout(mail, POLL_INTERVAL)
                .unwrap_or_else(|p| p.into_inner());
            mail = m;
        }
    }

    /// The next message from `peer` under `tag` if one has arrived; an error if `peer` failed.
    pub fn try_recv(&self, peer: u32, tag: u64) -> Result<Option<Vec<u8>>> {
        self.check_peer(peer)?;
        let mut mail = self.shared.lock();
        if let Some(msg) = mail.queues.get_mut(&(peer, tag)).and_then(|q| q.pop_front()) {
            return Ok(Some(msg));
        }
        if let Some(why) = mail.dead.get(&peer) {
            return Err(Error::remote(why.clone()));
        }
        Ok(None)
    }

    /// Closes every connection. Graceful: peers are told first (`Bye`), so that they do not
    /// take this rank's departure for a failure. Not graceful (abort): sockets are cut.
    pub fn close(&self, graceful: bool) {
        // News of a failure on its way out goes first (each is bounded by about a second).
        let telling = std::mem::take(&mut *self.shared.telling.lock().unwrap_or_else(|p| p.into_inner()));
        for handle in telling {
            let _ = handle.join();
        }
        if self.shared.closing.swap(true, Ordering::AcqRel) {
            return;
        }
        let cancel = Cancel::after(Duration::from_secs(1), "closing peer connections");
        for slot in &self.shared.out {
            let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(conn) = slot.as_mut() {
                if graceful {
                    let _ = conn.send(Kind::Bye, &[], &cancel);
                }
                conn.shutdown();
            }
            *slot = None;
        }
        for conn in self.shared.inbound.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            conn.shutdown();
        }
        self.shared.arrived.notify_all();
        if let Some(h) = self.acceptor.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = h.join();
        }
    }
}

impl Drop for PeerNet {
    fn drop(&mut self) {
        self.close(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn info(rank: u32, listen: SocketAddr) -> PeerInfo {
        PeerInfo {
            rank,
            listen,
            version: "test".into(),
            host_hash: 1,
            hostname: "h".into(),
            pid: std::process::id(),
            device: 0,
        }
    }

    fn pair(secret: Secret) -> (PeerNet, PeerNet) {
        let ip = "127.0.0.1".parse().unwrap();
        let (l0, a0) = bind_listener(ip).unwrap();
        let (l1, a1) = bind_listener(ip).unwrap();
        let peers = vec![info(0, a0), info(1, a1)];
        (
            PeerNet::start(l0, 0, peers.clone(), secret).unwrap(),
            PeerNet::start(l1, 1, peers, secret).unwrap(),
        )
    }

    fn nets(n: u32, secret: Secret) -> Vec<PeerNet> {
        let ip = "127.0.0.1".parse().unwrap();
        let listeners: Vec<_> = (0..n).map(|_| bind_listener(ip).unwrap()).collect();
        let peers: Vec<_> = listeners.iter().enumerate().map(|(r, (_, a))| info(r as u32, *a)).collect();
        listeners.into_iter().enumerate().map(|(r, (l, _))| PeerNet::start(l, r as u32, peers.clone(), secret).unwrap()).collect()
    }

    fn cancel() -> Cancel<'static> {
        Cancel::after(Duration::from_secs(10), "test")
    }

    #[test]
    fn messages_arrive_in_order_per_tag() {
        let (a, b) = pair([3; 16]);
        for i in 0..10u8 {
            a.send(1, 5, &[i], &cancel()).unwrap();
            a.send(1, 6, &[100 + i], &cancel()).unwrap();
        }
        for i in 0..10u8 {
            assert_eq!(b.recv(0, 6, true, &cancel()).unwrap(), vec![100 + i]);
        }
        for i in 0..10u8 {
            assert_eq!(b.recv(0, 5, true, &cancel()).unwrap(), vec![i]);
        }
        assert!(a.send(0, 1, b"self", &cancel()).is_err());
        assert!(a.send(7, 1, b"nobody", &cancel()).is_err());
    }

    #[test]
    fn intruders_on_the_peer_listener_are_dropped_without_harm() {
        let (a, b) = pair([4; 16]);
        let addr = b.peers()[1].listen;
        // Wrong secret.
        let mut wrong = Conn::connect(addr, 1 << 20, &cancel()).unwrap();
        wrong.prove(&[9; 16], &cancel()).unwrap();
        // Garbage.
        let mut raw = TcpStream::connect(addr).unwrap();
        raw.write_all(b"\x00\x01garbage garbage garbage").unwrap();
        // Right secret, then a hello from an impossible rank.
        let mut liar = Conn::connect(addr, 1 << 20, &cancel()).unwrap();
        liar.prove(&[4; 16], &cancel()).unwrap();
        liar.send(Kind::Hello, &[&1u32.to_le_bytes()], &cancel()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        a.send(1, 1, b"real", &cancel()).unwrap();
        assert_eq!(b.recv(0, 1, true, &cancel()).unwrap(), b"real");
        assert!(b.failure().is_none(), "intruders are not taken for failed ranks");
    }

    #[test]
    fn graceful_close_is_not_a_failure_but_a_cut_connection_is() {
        let (a, b) = pair([5; 16]);
        a.send(1, 1, b"x", &cancel()).unwrap();
        assert_eq!(b.recv(0, 1, true, &cancel()).unwrap(), b"x");
        a.close(true);
        std::thread::sleep(Duration::from_millis(200));
        assert!(b.failure().is_none());
        let e = b.recv(0, 2, false, &cancel()).unwrap_err();
        assert!(e.message.contains("destroyed its communicator"), "{e}");

        let (a, b) = pair([6; 16]);
        a.send(1, 1, b"x", &cancel()).unwrap();
        a.close(false);
        let t0 = std::time::Instant::now();
        let e = b.recv(0, 2, true, &cancel()).unwrap_err();
        assert_eq!(e.code, crate::error::ResultCode::RemoteError);
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert!(b.failure().is_some());
    }

    #[test]
    fn an_announced_failure_reaches_the_peer_with_its_code_and_is_announced_once() {
        let (a, b) = pair([7; 16]);
        a.send(1, 1, b"x", &cancel()).unwrap();
        assert_eq!(b.recv(0, 1, true, &cancel()).unwrap(), b"x");
        assert!(a.announce_failure(ResultCode::InvalidUsage, "mismatch on rank 0"));
        assert!(!a.announce_failure(ResultCode::InternalError, "a second one"), "only the first is announced");
        let t0 = std::time::Instant::now();
        let e = b.recv(0, 9, true, &cancel()).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        assert_eq!((e.code, e.message.as_str()), (ResultCode::InvalidUsage, "mismatch on rank 0"));
        let f = b.comm_failure().unwrap();
        assert_eq!((f.origin, f.code), (0, ResultCode::InvalidUsage));
        assert!(!b.announce_failure(ResultCode::InternalError, "echo"), "a failure heard is not echoed");
        assert_eq!(a.failure().unwrap().message, "mismatch on rank 0");
        // A non-strict wait on the sender's own messages still works (shrink needs it).
        a.send(1, 2, b"y", &cancel()).unwrap();
        assert_eq!(b.recv(0, 2, false, &cancel()).unwrap(), b"y");
    }

    #[test]
    fn status_queries_are_answered_by_the_reader_thread_and_reports_delivered() {
        let (a, b) = pair([8; 16]);
        b.set_status_provider(Box::new(|| b"busy in op 7".to_vec()));
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = Arc::clone(&got);
        b.set_report_handler(Box::new(move |from, text| g.lock().unwrap().push((from, text.to_string()))));
        // b's main thread does nothing: the answer comes from its reader thread.
        let answers = a.query_status(0xabc, Duration::from_secs(5));
        assert_eq!(answers, vec![None, Some(b"busy in op 7".to_vec())]);
        a.send_report("report text");
        let t0 = std::time::Instant::now();
        while got.lock().unwrap().is_empty() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(*got.lock().unwrap(), vec![(0, "report text".to_string())]);
        // A rank that is gone answers nothing, quickly.
        b.close(false);
        std::thread::sleep(Duration::from_millis(100));
        let t0 = std::time::Instant::now();
        assert_eq!(a.query_status(0xabd, Duration::from_secs(2)), vec![None, None]);
        assert!(t0.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn requests_are_answered_by_the_reader_thread_and_fail_when_the_peer_is_gone() {
        let (a, b) = pair([9; 16]);
        // No handler yet: an empty answer.
        assert_eq!(a.request(1, 0x100, b"map", &cancel()).unwrap(), b"");
        b.set_request_handler(Some(Box::new(|from, req| {
            let mut out = format!("from {from}: ").into_bytes();
            out.extend_from_slice(req);
            out
        })));
        // b's main thread does nothing; two requests in a row get their own answers.
        assert_eq!(a.request(1, 0x101, b"one", &cancel()).unwrap(), b"from 0: one");
        assert_eq!(a.request(1, 0x102, b"two", &cancel()).unwrap(), b"from 0: two");
        assert_eq!(a.request(0, 0x103, b"self", &cancel()).unwrap_err().code, ResultCode::InvalidArgument);
        b.set_request_handler(None);
        assert_eq!(a.request(1, 0x104, b"gone", &cancel()).unwrap(), b"");
        b.close(false);
        std::thread::sleep(Duration::from_millis(100));
        let t0 = std::time::Instant::now();
        assert_eq!(a.request(1, 0x105, b"late", &cancel()).unwrap_err().code, ResultCode::RemoteError);
        assert!(t0.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn a_rank_that_fails_because_a_peer_died_tells_the_others_before_it_closes() {
        for round in 0..100 {
            let nets = nets(3, [10; 16]);
            let (a, b, c) = (&nets[0], &nets[1], &nets[2]);
            // Rank 0 has no connection to rank 1 yet: its news has to open one.
            c.send(0, 1, b"open", &cancel()).unwrap();
            assert_eq!(a.recv(2, 1, true, &cancel()).unwrap(), b"open");
            c.close(false);
            // Rank 0 sees rank 2 die and leaves at once, as a failed init does.
            assert!(a.recv(2, 2, true, &cancel()).is_err());
            a.close(true);
            let t0 = std::time::Instant::now();
            let e = b.recv(0, 2, true, &cancel()).unwrap_err();
            assert!(e.message.starts_with("rank 2 "), "round {round}: rank 1 did not hear of rank 2: {e}");
            assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        }
    }

    #[test]
    fn a_peer_whose_listener_is_gone_is_failed_at_once_not_retried() {
        let nets = nets(3, [11; 16]);
        nets[2].close(false);
        std::thread::sleep(Duration::from_millis(100));
        let t0 = std::time::Instant::now();
        let e = nets[0].send(2, 1, b"x", &cancel()).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        assert_eq!(e.code, ResultCode::RemoteError, "{e}");
        assert!(e.message.starts_with("rank 2 ") && e.message.contains("refused"), "{e}");
        // Rank 1, waiting on rank 0, hears of it.
        let e = nets[1].recv(0, 1, true, &cancel()).unwrap_err();
        assert!(e.message.starts_with("rank 2 "), "{e}");
    }
}
