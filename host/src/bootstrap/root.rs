//! The root of a rendezvous: a thread started by `ncclGetUniqueId` (or by rank 0 when
//! `NCCL_COMM_ID` is set) that collects every rank's address and hands out the table.
//!
//! With several ids (`ncclCommInitRankScalable`) each root serves a contiguous subset of the
//! ranks; the lowest rank of each subset (its leader) reports the subset to root 0, receives
//! the whole table and passes it back through its own root, which forwards it.
//!
//! Whatever goes wrong (a rank that never arrives, ranks that disagree about the size,
//! two processes claiming one rank, mismatched versions, a registered rank whose connection
//! closes because its process died), every rank that did arrive receives a `Fail` message
//! saying what, so each fails with the same clear error; ranks that arrive later are told
//! the same until the rendezvous would have timed out.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::ops::Range;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::id::Secret;
use super::wire::{self, Cancel, Conn, SilenceBroken};
use crate::error::{Error, ErrorKind, Result, ResultCode};

/// Largest control message a root accepts.
pub const MAX_CONTROL_BYTES: u64 = 16 << 20;
/// How long an accepted connection has to prove the secret and say what it wants.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the root looks at the connections of the ranks waiting for the table: one that
/// closed means its rank is gone, and every other rank is told at once.
const WATCH_INTERVAL: Duration = Duration::from_millis(100);
/// How long the root waits for a message or a connection before it looks around again.
const TICK: Duration = Duration::from_millis(10);

/// What a rank tells the others about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInfo {
    pub rank: u32,
    /// Where its peer listener accepts connections.
    pub listen: SocketAddr,
    pub version: String,
    /// Identity of its host (ranks with equal hashes share a node).
    pub host_hash: u64,
    pub hostname: String,
    pub pid: u32,
    pub device: i32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum RootMsg {
    /// Rank → its root.
    Register { nranks: u32, n_ids: u32, root_index: u32, info: PeerInfo },
    /// Leader of subset `root_index` → root 0.
    Report { nranks: u32, n_ids: u32, root_index: u32, peers: Vec<PeerInfo> },
    /// Root k → the leader of its subset.
    Subset { peers: Vec<PeerInfo> },
    /// The whole table, to every rank.
    Table { peers: Vec<PeerInfo> },
    /// The rendezvous failed; `code` is an `ncclResult_t` value.
    Fail { code: i32, message: String },
}

/// The ranks that root `k` of `n_ids` serves.
pub fn subset(nranks: u32, n_ids: u32, k: u32) -> Range<u32> {
    let start = (k as u64 * nranks as u64 / n_ids as u64) as u32;
    let end = ((k as u64 + 1) * nranks as u64 / n_ids as u64) as u32;
    start..end
}

/// How long the root waits for the other ranks once the first has arrived: a little less
/// than the ranks' own limit, so that its message (which names the missing ranks) reaches
/// them before they give up on their own.
pub fn root_limit(timeout: Duration) -> Duration {
    timeout.saturating_sub((timeout / 10).min(Duration::from_secs(1)))
}

/// Which root serves `rank`.
pub fn root_of(nranks: u32, n_ids: u32, rank: u32) -> u32 {
    (0..n_ids).find(|&k| subset(nranks, n_ids, k).contains(&rank)).unwrap_or(0)
}

/// Starts a root thread on `listener`. It waits without limit for the first rank; from then
/// on the others have `timeout` to arrive. With `tell_latecomers`, a root whose rendezvous
/// failed stays until then to answer ranks that still arrive with the same failure (for a
/// root whose id is its own; not for an `NCCL_COMM_ID` root, whose fixed address a retry
/// in this process must be able to listen on again at once).
pub fn spawn(listener: TcpListener, secret: Secret, timeout: Duration, tell_latecomers: bool) -> Result<()> {
    listener.set_nonblocking(true).map_err(|e| Error::io("bootstrap root listener", &e))?;
    let addr = listener.local_addr().map_err(|e| Error::io("bootstrap root listener", &e))?;
    std::thread::Builder::new()
        .name("rustccl-root".into())
        .spawn(move || {
            Root::new(secret, timeout, addr, tell_latecomers).run(listener);
        })
        .map_err(|e| Error::io("starting the bootstrap root thread", &e))?;
    tracing::info!(target: "BOOTSTRAP", "Bootstrap root listening on {addr}");
    Ok(())
}

struct Expect {
    nranks: u32,
    n_ids: u32,
    root_index: u32,
}

struct Root {
    secret: Secret,
    timeout: Duration,
    addr: SocketAddr,
    tell_latecomers: bool,
    deadline: Option<Instant>,
    expect: Option<Expect>,
    members: BTreeMap<u32, (Conn, PeerInfo)>,
    reports: BTreeMap<u32, (Conn, Vec<PeerInfo>)>,
}

/// What a handshake thread hands the root: a rank's first message, or the refusal of a rank
/// that proved the secret but has another encryption key (or none, or one where the root has
/// none), which fails the rendezvous for everyone.
enum Arrival {
    Msg(Conn, RootMsg),
    Refused(Error),
}

type Sender = mpsc::Sender<Arrival>;
type Receiver = mpsc::Receiver<Arrival>;

/// "rank R (pid P on HOST)": how messages name a rank.
fn describe(info: &PeerInfo) -> String {
    format!("rank {} (pid {} on {})", info.rank, info.pid, info.hostname)
}

fn fail(conn: &mut Conn, code: ResultCode, message: &str) {
    let cancel = Cancel::after(Duration::from_secs(2), "bootstrap root: sending a failure");
    let _ = conn.send_json(&RootMsg::Fail { code: code as i32, message: message.to_string() }, &cancel);
}

impl Root {
    fn new(secret: Secret, timeout: Duration, addr: SocketAddr, tell_latecomers: bool) -> Root {
        Root {
            secret,
            timeout,
            addr,
            tell_latecomers,
            deadline: None,
            expect: None,
            members: BTreeMap::new(),
            reports: BTreeMap::new(),
        }
    }

    fn run(mut self, listener: TcpListener) {
        let (tx, rx) = mpsc::channel::<Arrival>();
        if let Err(e) = self.rendezvous(&listener, &tx, &rx) {
            self.fail_all(e.code, &e.message);
            if self.tell_latecomers {
                self.fail_latecomers(&listener, &tx, &rx, &e);
            }
        }
    }

    /// Collects the ranks (and, for root 0 of several, the other subsets) and hands out the
    /// table; an error is what every rank that arrived must be told.
    fn rendezvous(&mut self, listener: &TcpListener, tx: &Sender, rx: &Receiver) -> Result<()> {
        let mut next_watch = Instant::now();
        loop {
            self.accept(listener, tx);
            match rx.recv_timeout(TICK) {
                Ok(Arrival::Msg(conn, msg)) => self.on_message(conn, msg)?,
                Ok(Arrival::Refused(e)) => {
                    // Latecomers are told until the rendezvous would have timed out.
                    self.start_clock();
                    return Err(e);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => unreachable!("the root holds a sender"),
            }
            let complete = self.complete();
            // Once more just before the table goes out: a rank that left must not be in it.
            if complete || Instant::now() >= next_watch {
                self.check_waiting()?;
                next_watch = Instant::now() + WATCH_INTERVAL;
            }
            if complete {
                return self.finish();
            }
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::remote(self.timeout_message()));
            }
        }
    }

    /// Takes a waiting connection, if any, and starts its handshake.
    fn accept(&self, listener: &TcpListener, tx: &Sender) {
        match listener.accept() {
            Ok((stream, from)) => self.spawn_handshake(stream, from, tx.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => tracing::warn!(target: "BOOTSTRAP", "Bootstrap root {}: accept failed: {e}", self.addr),
        }
    }

    /// Fails the rendezvous if a rank waiting for the table (or, at root 0, the leader of a
    /// subset waiting with its report) is gone: its connection closed or broke. Nothing
    /// else can arrive on these connections before the root answers.
    fn check_waiting(&self) -> Result<()> {
        let conns: Vec<&Conn> = self.members.values().map(|(c, _)| c).chain(self.reports.values().map(|(c, _)| c)).collect();
        let Some((i, sign)) = wire::silence_broken(&conns, Duration::ZERO)?.into_iter().next() else {
            return Ok(());
        };
        let who = match self.members.values().nth(i) {
            Some((_, info)) => describe(info),
            None => {
                let (k, (_, peers)) = self.reports.iter().nth(i - self.members.len()).expect("an index of conns");
                let leader = peers.first().map(describe).unwrap_or_else(|| "a rank".into());
                format!("{leader}, which brought the ranks of root {k} to root 0,")
            }
        };
        Err(Error::remote(match sign {
            SilenceBroken::Closed => {
                format!("{who} closed its bootstrap connection during init (the process exited or was killed?)")
            }
            SilenceBroken::Failed(e) => {
                format!("{who} lost its bootstrap connection during init ({e}; the process exited or was killed?)")
            }
            SilenceBroken::SentData => format!("{who} sent data to the bootstrap root {} out of turn during init", self.addr),
        }))
    }

    /// After a failure: answers the ranks (and subset leaders) that still arrive with the
    /// same failure, so that they fail at once instead of waiting for a root that is gone,
    /// until all have been told or the rendezvous would have timed out anyway.
    fn fail_latecomers(&mut self, listener: &TcpListener, tx: &Sender, rx: &Receiver, e: &Error) {
        let until = self.deadline.unwrap_or_else(Instant::now);
        while Instant::now() < until && !self.complete() {
            self.accept(listener, tx);
            if let Ok(Arrival::Msg(mut conn, msg)) = rx.recv_timeout(TICK) {
                match msg {
                    RootMsg::Register { info, .. } => {
                        tracing::debug!(target: "BOOTSTRAP", "Bootstrap root {}: told {} that init failed", self.addr, describe(&info));
                        fail(&mut conn, e.code, &e.message);
                        // Counted only so that `complete` says when everyone has been told.
                        self.members.entry(info.rank).or_insert((conn, info));
                    }
                    RootMsg::Report { root_index, peers, .. } => {
                        fail(&mut conn, e.code, &e.message);
                        self.reports.entry(root_index).or_insert((conn, peers));
                    }
                    _ => fail(&mut conn, e.code, &e.message),
                }
            }
        }
    }

    /// Handshake and first message on a thread of their own, so that a slow or silent
    /// connection cannot hold up the rendezvous.
    fn spawn_handshake(&self, stream: std::net::TcpStream, from: SocketAddr, tx: Sender) {
        let secret = self.secret;
        let addr = self.addr;
        let _ = std::thread::Builder::new().name("rustccl-root-hs".into()).spawn(move || {
            let cancel = Cancel::after(HANDSHAKE_TIMEOUT, "bootstrap root handshake");
            let _ = stream.set_nonblocking(false);
            let mut conn = match Conn::new(stream, MAX_CONTROL_BYTES) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(target: "BOOTSTRAP", "Bootstrap root {addr}: dropped connection from {from}: {}", e.message);
                    return;
                }
            };
            let result = conn.challenge(&secret, &cancel).and_then(|()| conn.recv_json::<RootMsg>(&cancel));
            match result {
                Ok(msg) => {
                    let _ = tx.send(Arrival::Msg(conn, msg));
                }
                Err(e) if e.kind == ErrorKind::KeyMismatch => {
                    // The peer proved the secret: a rank of this rendezvous, misconfigured.
                    // It is told (in plaintext: no key is shared), and so is every other rank.
                    let e = Error::invalid_usage(format!(
                        "bootstrap root {addr}: refused the rank connecting from {from}: {}", e.message
                    ))
                    .with_kind(ErrorKind::KeyMismatch);
                    fail(&mut conn, e.code, &e.message);
                    let _ = tx.send(Arrival::Refused(e));
                }
                Err(e) => tracing::warn!(
                    target: "BOOTSTRAP",
                    "Bootstrap root {addr}: dropped connection from {from}: {}", e.message
                ),
            }
        });
    }

    fn start_clock(&mut self) {
        if self.deadline.is_none() {
            self.deadline = Some(Instant::now() + root_limit(self.timeout));
        }
    }

    /// Checks that a rank's view of the communicator agrees with what the root expects.
    fn check_shape(&mut self, nranks: u32, n_ids: u32, root_index: u32, who: &str) -> Result<()> {
        if nranks == 0 || n_ids == 0 || n_ids > nranks || root_index >= n_ids {
            return Err(Error::invalid_argument(format!(
                "{who} announced an impossible shape: nranks {nranks}, {n_ids} ids, root index {root_index}"
            )));
        }
        match &self.expect {
            None => {
                self.expect = Some(Expect { nranks, n_ids, root_index });
                Ok(())
            }
            Some(e) if e.nranks != nranks || e.n_ids != n_ids => Err(Error::invalid_usage(format!(
                "ranks disagree about the communicator: {who} says nranks={nranks} with {n_ids} id(s), others said nranks={} with {} id(s)",
                e.nranks, e.n_ids
            ))),
            Some(_) => Ok(()),
        }
    }

    fn on_message(&mut self, mut conn: Conn, msg: RootMsg) -> Result<()> {
        self.start_clock();
        match msg {
            RootMsg::Register { nranks, n_ids, root_index, info } => {
                let who = describe(&info);
                self.check_shape(nranks, n_ids, root_index, &who)?;
                let mine = self.expect.as_ref().map(|e| e.root_index).unwrap_or(0);
                if root_index != mine || !subset(nranks, n_ids, mine).contains(&info.rank) {
                    return Err(Error::invalid_usage(format!(
                        "{who} registered with root {root_index}, but root {mine} serves ranks {:?}; ranks were given the ids in different orders",
                        subset(nranks, n_ids, mine)
                    )));
                }
                if let Some((_, other)) = self.members.get(&info.rank) {
                    return Err(Error::invalid_usage(format!(
                        "two processes claim rank {}: pid {} on {} and pid {} on {}",
                        info.rank, other.pid, other.hostname, info.pid, info.hostname
                    )));
                }
                tracing::debug!(target: "BOOTSTRAP", "Bootstrap root {}: {who} joined", self.addr);
                self.members.insert(info.rank, (conn, info));
            }
            RootMsg::Report { nranks, n_ids, root_index, peers } => {
                let who = format!("the leader of root {root_index}");
                self.check_shape(nranks, n_ids, 0, &who)?;
                if self.expect.as_ref().map(|e| e.root_index) != Some(0) || root_index == 0 {
                    fail(&mut conn, ResultCode::InvalidUsage, "only root 0 collects subset reports");
                    return Ok(());
                }
                let want: Vec<u32> = subset(nranks, n_ids, root_index).collect();
                let got: Vec<u32> = peers.iter().map(|p| p.rank).collect();
                if want != got || self.reports.contains_key(&root_index) {
                    return Err(Error::invalid_usage(format!(
                        "{who} reported ranks {got:?}, expected {want:?} once"
                    )));
                }
                self.reports.insert(root_index, (conn, peers));
            }
            other => {
                tracing::warn!(target: "BOOTSTRAP", "Bootstrap root {}: dropped {} which sent {other:?} first", self.addr, conn.peer());
            }
        }
        Ok(())
    }

    fn complete(&self) -> bool {
        let Some(e) = &self.expect else { return false };
        let members_done = self.members.len() == subset(e.nranks, e.n_ids, e.root_index).len();
        let reports_done = e.root_index != 0 || self.reports.len() as u32 == e.n_ids - 1;
        members_done && reports_done
    }

    fn timeout_message(&self) -> String {
        let Some(e) = &self.expect else { return "bootstrap root timed out".into() };
        let range = subset(e.nranks, e.n_ids, e.root_index);
        let missing: Vec<u32> = range.clone().filter(|r| !self.members.contains_key(r)).collect();
        let shown: Vec<String> = missing.iter().take(16).map(|r| r.to_string()).collect();
        let mut msg = format!(
            "bootstrap: {} of {} ranks joined within {:.1}s (RUSTCCL_BOOTSTRAP_TIMEOUT); rank(s) {}{} never arrived at the root {}; check that every rank was started with the same unique id and can reach that address",
            self.members.len(),
            range.len(),
            self.timeout.as_secs_f64(),
            shown.join(", "),
            if missing.len() > 16 { ", ..." } else { "" },
            self.addr
        );
        if e.root_index == 0 && e.n_ids > 1 {
            let missing_roots: Vec<u32> = (1..e.n_ids).filter(|k| !self.reports.contains_key(k)).collect();
            if !missing_roots.is_empty() {
                msg.push_str(&format!("; subsets of roots {missing_roots:?} never reported"));
            }
        }
        msg
    }

    fn fail_all(&mut self, code: ResultCode, message: &str) {
        tracing::warn!(target: "BOOTSTRAP", "Bootstrap root {}: {message}", self.addr);
        // A rank in this process (NCCL_COMM_ID puts the root in rank 0's) is told last: its
        // process may exit as soon as it knows, and the root with it.
        let here = std::process::id();
        let (mine, others): (Vec<_>, Vec<_>) = self.members.values_mut().partition(|(_, info)| info.pid == here && info.host_hash == super::host_hash());
        for (conn, _) in others.into_iter().chain(mine) {
            fail(conn, code, message);
        }
        for (conn, _) in self.reports.values_mut() {
            fail(conn, code, message);
        }
    }

    fn finish(&mut self) -> Result<()> {
        let e = self.expect.as_ref().expect("complete() implies a shape");
        let mut all: Vec<PeerInfo> = self.members.values().map(|(_, i)| i.clone()).collect();
        for (_, peers) in self.reports.values() {
            all.extend(peers.iter().cloned());
        }
        all.sort_by_key(|p| p.rank);
        if let Some(first) = all.first() {
            if let Some(odd) = all.iter().find(|p| p.version != first.version) {
                return Err(Error::invalid_usage(format!(
                    "version mismatch: rank {} runs \"{}\" but rank {} runs \"{}\"; every rank must use the same rustccl",
                    first.rank, first.version, odd.rank, odd.version
                )));
            }
        }
        let cancel = Cancel::after(self.timeout, "bootstrap root: sending the table");
        if e.root_index == 0 {
            let table = RootMsg::Table { peers: all };
            for (conn, _) in self.members.values_mut() {
                conn.send_json(&table, &cancel)?;
            }
            for (conn, _) in self.reports.values_mut() {
                conn.send_json(&table, &cancel)?;
            }
            return Ok(());
        }
        // Root k: the leader takes the subset to root 0 and brings the table back.
        let leader = *self.members.keys().next().expect("a complete subset is not empty");
        let (conn, _) = self.members.get_mut(&leader).unwrap();
        conn.send_json(&RootMsg::Subset { peers: all }, &cancel)?;
        let reply: RootMsg = conn.recv_json(&cancel).map_err(|e| e.context("waiting for the subset leader"))?;
        match reply {
            RootMsg::Table { .. } => {
                for (rank, (conn, _)) in self.members.iter_mut() {
                    if *rank != leader {
                        conn.send_json(&reply, &cancel)?;
                    }
                }
                Ok(())
            }
            RootMsg::Fail { code, message } => {
                Err(Error::new(ResultCode::from_i32(code).unwrap_or(ResultCode::RemoteError), message))
            }
            other => Err(Error::remote(format!("subset leader sent {other:?} instead of the table"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: Secret = [7; 16];

    fn info(rank: u32) -> PeerInfo {
        PeerInfo {
            rank,
            listen: "127.0.0.1:9".parse().unwrap(),
            version: "test".into(),
            host_hash: 1,
            hostname: "h".into(),
            pid: 1000 + rank,
            device: 0,
        }
    }

    fn start_root() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        spawn(listener, SECRET, Duration::from_secs(60), true).unwrap();
        addr
    }

    fn send(addr: SocketAddr, msg: &RootMsg) -> Conn {
        let cancel = Cancel::after(Duration::from_secs(10), "test");
        let mut conn = Conn::connect(addr, MAX_CONTROL_BYTES, &cancel).unwrap();
        conn.prove(&SECRET, &cancel).unwrap();
        conn.send_json(msg, &cancel).unwrap();
        conn
    }

    fn register(addr: SocketAddr, nranks: u32, rank: u32) -> Conn {
        send(addr, &RootMsg::Register { nranks, n_ids: 1, root_index: 0, info: info(rank) })
    }

    /// The `Fail` message `conn` receives within a second.
    fn failure(conn: &mut Conn) -> (i32, String) {
        let t0 = Instant::now();
        match conn.recv_json(&Cancel::after(Duration::from_secs(10), "test")).unwrap() {
            RootMsg::Fail { code, message } => {
                assert!(t0.elapsed() < Duration::from_secs(1), "after {:?}: {message}", t0.elapsed());
                (code, message)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_registered_rank_that_goes_away_fails_the_waiting_ranks_and_the_latecomers_at_once() {
        let addr = start_root();
        let mut rank0 = register(addr, 3, 0);
        drop(register(addr, 3, 2));
        let (code, message) = failure(&mut rank0);
        assert_eq!(code, ResultCode::RemoteError as i32);
        assert_eq!(message, "rank 2 (pid 1002 on h) closed its bootstrap connection during init (the process exited or was killed?)");
        // Rank 1 comes after the failure: the root is still there to tell it.
        assert_eq!(failure(&mut register(addr, 3, 1)), (code, message));
    }

    #[test]
    fn a_subset_leader_that_goes_away_at_root_0_fails_root_0s_ranks_at_once() {
        let addr = start_root();
        // 4 ranks, 2 roots: root 0 serves ranks 0 and 1, root 1 ranks 2 and 3. Rank 1 never
        // comes, so the table cannot be complete when the leader of root 1 goes away (with it
        // complete, the root may send the table before it sees the leader leave: a race the
        // ranks settle later, not this rule).
        let mut rank0 = send(addr, &RootMsg::Register { nranks: 4, n_ids: 2, root_index: 0, info: info(0) });
        drop(send(addr, &RootMsg::Report { nranks: 4, n_ids: 2, root_index: 1, peers: vec![info(2), info(3)] }));
        let (_, message) = failure(&mut rank0);
        assert!(message.starts_with("rank 2 (pid 1002 on h), which brought the ranks of root 1 to root 0, closed"), "{message}");
    }

    #[test]
    fn subsets_cover_every_rank_once() {
        for nranks in 1..40u32 {
            for n_ids in 1..=nranks.min(9) {
                let mut seen = vec![0; nranks as usize];
                for k in 0..n_ids {
                    let s = subset(nranks, n_ids, k);
                    assert!(!s.is_empty(), "nranks {nranks} ids {n_ids} root {k}");
                    for r in s {
                        seen[r as usize] += 1;
                        assert_eq!(root_of(nranks, n_ids, r), k);
                    }
                }
                assert!(seen.iter().all(|&c| c == 1));
            }
        }
    }
}
