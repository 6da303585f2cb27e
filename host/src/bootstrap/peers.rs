//! Connections between the ranks of one communicator after the rendezvous.
//!
//! Each rank listens on one socket. A rank sending to a peer connects to it once, proves the
//! secret, says who it is (`Hello`), and keeps the connection. A reader thread per incoming
//! connection files `Data` frames into a mailbox keyed by (sender, tag), where `recv` finds
//! them, in order. A connection that ends without a `Bye` means its rank died: the reader
//! marks it dead, wakes every waiter, and tells the other ranks (`PeerFailed`), so that every
//! survivor's next operation fails with a remote error instead of waiting.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::id::Secret;
use super::root::PeerInfo;
use super::wire::{Cancel, Conn, Kind, POLL_INTERVAL};
use crate::error::{Error, Result};

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
}

struct Shared {
    rank: u32,
    peers: Vec<PeerInfo>,
    secret: Secret,
    mail: Mutex<Mail>,
    arrived: Condvar,
    /// Outgoing connection to each peer, made on first use.
    out: Vec<Mutex<Option<Conn>>>,
    /// Incoming connections, kept so that closing can shut them down.
    inbound: Mutex<Vec<Conn>>,
    closing: AtomicBool,
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

    /// Records that `rank` failed; returns true when this is news.
    fn mark_dead(&self, rank: u32, reason: String) -> bool {
        let mut mail = self.lock();
        if mail.departed.contains(&rank) || mail.dead.contains_key(&rank) {
            return false;
        }
        tracing::warn!(target: "BOOTSTRAP", "{reason}");
        mail.dead.insert(rank, reason);
        self.arrived.notify_all();
        true
    }

    /// Tells every other live peer that `rank` failed (best effort, in the background).
    fn spread_failure(self: &Arc<Self>, rank: u32, reason: String) {
        let shared = Arc::clone(self);
        let _ = std::thread::Builder::new().name("rustccl-notify".into()).spawn(move || {
            for peer in 0..shared.peers.len() as u32 {
                if peer == shared.rank || peer == rank || shared.lock().dead.contains_key(&peer) {
                    continue;
                }
                let cancel = Cancel::after(Duration::from_secs(2), "telling a peer about a failure");
                let _ = shared.send_frame(peer, Kind::PeerFailed, &[&rank.to_le_bytes(), reason.as_bytes()], &cancel);
            }
        });
    }

    fn send_frame(&self, to: u32, kind: Kind, parts: &[&[u8]], cancel: &Cancel) -> Result<()> {
        let mut slot = self.out[to as usize].lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            let addr = self.peers[to as usize].listen;
            let mut conn = Conn::connect(addr, MAX_PEER_MESSAGE, cancel)?;
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
                        self.mark_dead(failed, format!("{} failed (reported by rank {peer}): {reason}", self.who(failed)));
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
        if self.mark_dead(peer, reason.clone()) {
            self.spread_failure(peer, reason);
        }
    }
}

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
            arrived: Condvar::new(),
            out,
            inbound: Mutex::new(Vec::new()),
            closing: AtomicBool::new(false),
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

    /// The first failure seen among the peers, if any.
    pub fn failure(&self) -> Option<String> {
        let mail = self.shared.lock();
        mail.dead.iter().min_by_key(|(r, _)| **r).map(|(_, why)| why.clone())
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
                let departed = self.shared.lock().departed.contains(&peer);
                if departed {
                    return Error::remote(format!("{} has destroyed its communicator", self.shared.who(peer)));
                }
                let reason = format!("{} cannot be reached: {}", self.shared.who(peer), e.message);
                self.shared.fail_peer(peer, reason.clone());
                return Error::remote(reason);
            }
            e
        })
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
            if strict {
                if let Some((_, why)) = mail.dead.iter().min_by_key(|(r, _)| **r) {
                    return Err(Error::remote(why.clone()));
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
        assert_eq!(b.failure(), None, "intruders are not taken for failed ranks");
    }

    #[test]
    fn graceful_close_is_not_a_failure_but_a_cut_connection_is() {
        let (a, b) = pair([5; 16]);
        a.send(1, 1, b"x", &cancel()).unwrap();
        assert_eq!(b.recv(0, 1, true, &cancel()).unwrap(), b"x");
        a.close(true);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(b.failure(), None);
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
}
