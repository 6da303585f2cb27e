//! Small collectives on the host backend, one shot through a board in shared memory; and the
//! route ring every collective of the communicator publishes its way on.
//!
//! Every rank of a communicator whose ranks share a host owns a region of shared memory that
//! every rank maps (the board, made at the communicator's init: [`make`]): a word `arrive`
//! (the number of the last call whose input this rank has put on the board), its route ring
//! (below) and a ring of bytes. Each call takes the next entry of the ring, a header line (the
//! call's signature and number) and its data rounded up to a cache line; every rank takes the
//! same entries (they follow from the calls' sizes, which every rank agrees on), so a rank
//! finds a peer's entry where it put its own. Small calls take little of the ring, so a rank
//! may run many of them ahead of the others (a broadcast's root, a reduce's non-roots) before
//! it must wait; large ones reuse the same few cache-sized stretches. A call `k` of rank r
//! ([`BoardOp`]):
//! 1. if its entry reuses ring bytes that an earlier call `j` used, waits until every peer has
//!    arrived at call `j + 1` (so no peer still reads them; usually true on entry);
//! 2. puts its input (scaled by its own PreMulSum scalar) and the header in its entry, then
//!    stores `arrive = k` (release);
//! 3. waits until the ranks whose input it needs have arrived at `k`, checks their headers
//!    (another operation, other counts, or an entry elsewhere are `ncclInvalidUsage`, not
//!    wrong data), and reduces or copies straight from their entries into its receive buffer,
//!    in rank order (every rank gets the same bits as the other paths).
//!
//! One store and one wait per call, by the calling thread: no other thread is woken, no system
//! call on the way (the wait spins, then yields, then naps; failures, aborts and
//! `NCCL_OP_TIMEOUT_MS` end it with an error). In place and out of place cost the same (the
//! input is copied to the board either way). Broadcast: only the root puts data, and it runs
//! ahead of slow non-roots instead of in lockstep (4 ranks on 2 cores, 8 B: 0.7–1 µs a call
//! with the ring, 2–3 with 8 entries, 5–7 with 2); reduce: only the root waits in step 3. A
//! waiting rank spins only while the peer it waits for was last seen on another CPU (a peer
//! that shares its CPU runs only when it yields).
//!
//! **The route ring.** Ranks that disagree (one passes other counts, so takes the usual way
//! where the others take the board; one passes buffers in symmetric windows where the others
//! do not) are found, not waited for: every collective of the communicator, whatever way it
//! takes, publishes (its collective number, its way, its signature) in the publishing rank's
//! entry of the ring for that number ([`Board::publish_route`]) before it runs, and every host
//! wait for a peer (the board's, single copies', the symmetric barriers', the FIFO poller's
//! periodic look) reads the peer's entry for its own collective: the same number with another
//! way or another signature is `ncclInvalidUsage` naming both ranks and both ways; a later
//! number in that entry (the peer is a whole ring of collectives further) while this rank still
//! waits for it too. A ring rather than one word, so that a group may publish the ways of all
//! its collectives before any of them runs.
//!
//! The board is made at the communicator's init where every rank is on one host, on any
//! backend (one bootstrap all-gather of the regions' handles; each rank then maps the peers'
//! regions and says in its own region how that went: every rank decides alike, the board or
//! none). Where the board way is off (`RUSTCCL_HOST_SMALL_BYTES=0` without single copies,
//! `NCCL_SHM_DISABLE=1`) it carries only the route rings; on device backends too
//! ([`Making::entries`] off: the regions are then host shared memory of a host backend of the
//! communicator's own, which every local process maps without a GPU context, and the
//! watchdog reads the peers' entries while device work waits, `comm::health`). Ranks on
//! several hosts have no board and no route rings (no agreement over the network). coll
//! decides which calls take it (`coll::small`).

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{HostCall, HostOp, Progress, Wait};
use crate::backend::{DeviceBackend, DevicePtr, ShareHandle};
use crate::error::{Error, ErrorKind, Result};
use crate::reduce::Reducer;
use crate::spec::Collective;
use crate::work::{OpSig, Way};

/// The most data bytes of one call on the board.
pub const MAX_BYTES: usize = 32 << 10;
/// Bytes of a rank's ring where the board way is on (else 0).
const RING: usize = 256 << 10;
/// Offsets of the words at the head of a region (its first cache line): the last call put on
/// the board, the CPU this rank last ran a call on, the last call whose single copies this
/// rank has finished (`single_copy`), the address of the region in its owner's process (to
/// check that peers may read it there), and how the making went on this rank ([`make`]).
pub(super) const ARRIVE: usize = 0;
const CPU: usize = 8;
pub(super) const DONE: usize = 16;
const SELF: usize = 24;
const STATUS: usize = 32;
/// The route ring: entries of two words (`number << 8 | way code`, signature) from the second
/// cache line on (a published route never shares a line with the words peers spin on).
const ROUTES: u64 = 1024;
const ROUTES_AT: usize = 64;
/// Where the ring of entries starts.
const RING_AT: usize = ROUTES_AT + 16 * ROUTES as usize;
/// An entry's header (signature, call number, a single copy's source), before its data.
const HEADER: usize = 64;
/// Waiting for peers while the board is made: spinning rounds before yielding.
const MAKING_SPIN: u32 = 64;

/// `STATUS` values: every peer's region is mapped here (and every peer's memory readable with
/// `process_vm_readv`, or not), or something failed.
const MAPPED: u64 = 1;
const MAPPED_READABLE: u64 = 2;
const FAILED: u64 = 3;

/// `RUSTCCL_HOST_SMALL_BYTES`: the most bytes a rank puts on the board for one call (0: never
/// this way; at most [`MAX_BYTES`]); `None` unset.
pub fn bytes_setting() -> Option<usize> {
    static N: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *N.get_or_init(|| crate::params::env_int("RUSTCCL_HOST_SMALL_BYTES").ok().flatten().map(|v| v.clamp(0, MAX_BYTES as i64) as usize))
}

/// Whether the board gets its ring of entries (any call may take the board or a single copy):
/// not where the user turned shared memory off (`NCCL_SHM_DISABLE=1`, e.g. to run everything
/// over the network) or both ways off.
fn ring_wanted() -> bool {
    crate::params::env_int_or("NCCL_SHM_DISABLE", 0) != 1 && (bytes_setting() != Some(0) || super::single_copy::threshold() > 0)
}

/// A communicator's board: made at init on every rank, or on none.
#[derive(Default)]
pub enum BoardState {
    Ready(Arc<Board>),
    /// This communicator has none (one rank, ranks on several hosts, or it could not be made
    /// on some rank).
    #[default]
    Off,
}

/// One rank's view of the board: every rank's region, mapped here.
pub struct Board {
    backend: Arc<dyn DeviceBackend>,
    rank: usize,
    /// Every rank's region (this rank's own included), by rank.
    regions: Vec<usize>,
    /// The mappings behind them, closed when the board goes.
    maps: Vec<DevicePtr>,
    /// Whether the regions have their rings of entries ([`RING`] bytes; agreed by every rank:
    /// else the board carries only the route rings).
    ring: bool,
    /// The ranks' process ids, and whether every rank may read every peer's memory with
    /// `process_vm_readv` (checked on every rank when the board was made).
    pids: Vec<u32>,
    single_copy: bool,
    /// Calls that took that way so far.
    single_copies: AtomicU64,
    /// Where the next entry goes.
    cursor: Mutex<Cursor>,
    /// The number of the last collective this rank published.
    published: AtomicU64,
}

/// Where a call's entry goes, and which earlier call's readers it must wait for first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    /// Start, in bytes since the first entry (its place in the ring: modulo the ring's size).
    pub(super) start: u64,
    /// The latest call whose entry shares ring bytes with this one: every peer must have
    /// arrived at the call after it.
    pub(super) reuses: Option<u64>,
}

/// The entries taken so far (the same on every rank that made the same calls).
#[derive(Default)]
struct Cursor {
    /// Calls so far.
    calls: u64,
    /// Where the next entry may start (bytes since the first, over every lap of the ring).
    next: u64,
    /// The calls whose entries the next laps will reuse (number, start), oldest first.
    entries: VecDeque<(u64, u64)>,
}

impl Cursor {
    /// The next call's number and entry, with `bytes` of data.
    fn take(&mut self, bytes: usize) -> (u64, Entry) {
        let call = self.calls + 1;
        self.calls = call;
        let ring = RING as u64;
        let len = (HEADER + bytes.next_multiple_of(HEADER)) as u64;
        let mut start = self.next;
        if start % ring + len > ring {
            // No entry wraps: the rest of this lap stays unused.
            start = start.next_multiple_of(ring);
        }
        self.next = start + len;
        // Bytes before `start + len - ring` were last used by calls every later wait covers.
        let mut reuses = None;
        while let Some(&(c, s)) = self.entries.front() {
            if s + ring >= start + len {
                break;
            }
            reuses = Some(c);
            self.entries.pop_front();
        }
        self.entries.push_back((call, start));
        (call, Entry { start, reuses })
    }
}

/// A collective's entry in a route ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Its collective number.
    pub seq: u64,
    pub way: Way,
    pub sig: OpSig,
}

impl Board {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.regions.len()
    }

    /// Whether calls may take the board way at all (it has a ring of entries).
    pub fn has_ring(&self) -> bool {
        self.ring
    }

    /// Whether every rank may read every peer's memory (single copies may run).
    pub fn single_copy(&self) -> bool {
        self.single_copy && self.has_ring()
    }

    /// Calls that copied straight between the ranks' buffers (`single_copy`) so far.
    pub fn single_copies(&self) -> u64 {
        self.single_copies.load(Ordering::Relaxed)
    }

    pub(super) fn pid(&self, rank: usize) -> u32 {
        self.pids[rank]
    }

    pub(super) fn count_single_copy(&self) {
        self.single_copies.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn word(&self, rank: usize, offset: usize) -> &AtomicU64 {
        // SAFETY: `regions[rank]` is a mapped region of `RING_AT` bytes (`RING_AT + RING` with
        // a ring, where the headers lie), page-aligned, kept while the board exists; the head
        // words, route entries and headers are only used atomically.
        unsafe { &*((self.regions[rank] + offset) as *const AtomicU64) }
    }

    /// Takes the next call's number and entry, with `bytes` of data (the same on every rank
    /// that makes the same calls).
    pub(super) fn take_entry(&self, bytes: usize) -> (u64, Entry) {
        self.cursor.lock().unwrap_or_else(|p| p.into_inner()).take(bytes)
    }

    /// The header word `i` (0: signature, 1: call number, 2: a single copy's source) of
    /// `rank`'s entry at `start`.
    pub(super) fn header(&self, rank: usize, start: u64, i: usize) -> &AtomicU64 {
        self.word(rank, RING_AT + (start % RING as u64) as usize + 8 * i)
    }

    /// `rank`'s data of the entry at `start`.
    fn data(&self, rank: usize, start: u64) -> *mut u8 {
        (self.regions[rank] + RING_AT + (start % RING as u64) as usize + HEADER) as *mut u8
    }

    /// Whether `rank` has arrived at call `call` (or later).
    pub(super) fn arrived(&self, rank: usize, call: u64) -> bool {
        self.word(rank, ARRIVE).load(Ordering::Acquire) >= call
    }

    /// The end of step 2 (whatever else the entry holds is in place): the header (signature
    /// `sig`, call number), the CPU this rank runs on, then its arrival at `call`.
    pub(super) fn arrive(&self, entry: &Entry, call: u64, sig: OpSig) {
        let me = self.rank;
        self.header(me, entry.start, 0).store(sig.0, Ordering::Relaxed);
        self.header(me, entry.start, 1).store(call, Ordering::Relaxed);
        self.word(me, CPU).store(current_cpu(), Ordering::Relaxed);
        self.word(me, ARRIVE).store(call, Ordering::Release);
    }

    /// After `p`'s arrival at `call`: its entry (at `entry.start` on every rank that made the
    /// same calls) is this call's, with this rank's signature `sig`; else `ncclInvalidUsage`.
    pub(super) fn check_header(&self, p: usize, entry: &Entry, call: u64, sig: OpSig, seq: u64) -> Result<()> {
        let me = self.rank;
        let (theirs, their_call) = (self.header(p, entry.start, 0).load(Ordering::Relaxed), self.header(p, entry.start, 1).load(Ordering::Relaxed));
        if their_call != call {
            // Its entry is elsewhere: its calls so far had other sizes.
            return Err(Error::invalid_usage(format!(
                "rank {p} put collective number {seq} elsewhere on the board than rank {me}: it passed other counts or types; \
                 every rank must call the same collectives with the same arguments"
            ))
            .with_kind(ErrorKind::Mismatch));
        }
        if theirs != sig.0 {
            return Err(crate::work::mismatch(me as u32, sig, p as u32, OpSig(theirs)));
        }
        Ok(())
    }

    /// How to wait for `rank`: spinning only while it may run at the same time (not when it
    /// last ran on this CPU: it runs only when this thread yields), briefly when ranks
    /// outnumber cores.
    pub(super) fn wait_for(&self, rank: usize) -> Wait {
        let cpu = current_cpu();
        let shares_cpu = cpu != u64::MAX && self.word(rank, CPU).load(Ordering::Relaxed) == cpu;
        let spin = if shares_cpu { 0 } else { crate::exec::backoff::spin_for(self.nranks(), 2048) };
        Wait { spin, naps: crate::exec::backoff::oversubscribed(self.nranks()) }
    }

    // ---- the route ring ----

    /// `rank`'s entry of the route ring for collective `seq` (two words: number and way,
    /// signature).
    fn route_slot(&self, rank: usize, seq: u64) -> (&AtomicU64, &AtomicU64) {
        let at = ROUTES_AT + 16 * (seq % ROUTES) as usize;
        (self.word(rank, at), self.word(rank, at + 8))
    }

    /// Publishes that this rank runs collective `seq` (its number on the communicator) the
    /// way `way`, with signature `sig` (0 where it has none), before it runs. Every
    /// collective of a board communicator publishes, whatever way it takes.
    pub fn publish_route(&self, seq: u64, way: Way, sig: OpSig) {
        let (head, sig_word) = self.route_slot(self.rank, seq);
        // A seqlock whose version is the head word itself (numbers only grow): 0 while the
        // entry is rewritten, so a reader never takes one collective's number with another's
        // signature.
        head.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        sig_word.store(sig.0, Ordering::Relaxed);
        head.store(seq << 8 | way.code() as u64, Ordering::Release);
        self.published.store(seq, Ordering::Relaxed);
    }

    /// The route `rank` published in its entry for collective `seq`: that collective's, an
    /// older one's (it has not published `seq` yet), or a later one's (it is a whole ring of
    /// collectives further). `None` while the entry is empty or being written.
    pub fn route_of(&self, rank: usize, seq: u64) -> Option<Route> {
        let (head, sig_word) = self.route_slot(rank, seq);
        let first = head.load(Ordering::Acquire);
        let sig = sig_word.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let again = head.load(Ordering::Relaxed);
        if first == 0 || first != again {
            return None;
        }
        Some(Route { seq: first >> 8, way: Way::from_code(first as u8)?, sig: OpSig(sig) })
    }

    /// While this rank waits for `p` in collective `mine` (`waiting`: whether the peer has
    /// still not done what this rank waits for, looked at after its route): an error when `p`
    /// ran that collective another way, with another signature, or went a whole ring of
    /// collectives further.
    pub(super) fn check_route(&self, p: usize, mine: Route, waiting: impl Fn() -> bool) -> Result<()> {
        let Some(theirs) = self.route_of(p, mine.seq) else { return Ok(()) };
        if theirs.seq == mine.seq {
            if differs(mine, theirs) {
                return Err(route_mismatch(self.rank, mine, p, theirs));
            }
        } else if theirs.seq > mine.seq && waiting() {
            return Err(Error::invalid_usage(format!(
                "rank {p} went on to collective {} while rank {} waits for it in collective {}{} on the {} way: it ran \
                 collective {} another way (other arguments, or buffers in symmetric windows on one rank only); every rank must \
                 call the same collectives in the same order with the same arguments",
                theirs.seq,
                self.rank,
                mine.seq,
                described(mine.sig),
                mine.way.name(),
                mine.seq,
            ))
            .with_kind(ErrorKind::Mismatch));
        }
        Ok(())
    }

    /// The FIFO poller's look while it waits: no peer ran this rank's current collective (the
    /// last it published) another way or with another signature.
    pub fn check_current_route(&self) -> Result<()> {
        let seq = self.published.load(Ordering::Relaxed);
        let Some(mine) = self.route_of(self.rank, seq).filter(|r| seq > 0 && r.seq == seq) else { return Ok(()) };
        for p in (0..self.nranks()).filter(|&p| p != self.rank) {
            if let Some(theirs) = self.route_of(p, seq).filter(|t| t.seq == seq && differs(mine, *t)) {
                return Err(route_mismatch(self.rank, mine, p, theirs));
            }
        }
        Ok(())
    }
}

/// Whether two routes of one collective disagree (signatures only where both are known).
fn differs(a: Route, b: Route) -> bool {
    a.way != b.way || (a.sig.is_known() && b.sig.is_known() && a.sig != b.sig)
}

/// ` (signature)` where it is known.
fn described(sig: OpSig) -> String {
    if sig.is_known() {
        format!(" ({sig})")
    } else {
        String::new()
    }
}

/// The error for peer `p`'s route `theirs` of the collective this rank runs as `mine`.
fn route_mismatch(me: usize, mine: Route, p: usize, theirs: Route) -> Error {
    let hint = if mine.sig.is_known() && theirs.sig.is_known() && mine.sig != theirs.sig {
        "every rank must call the same collectives in the same order with the same count, datatype, operator and root"
    } else if mine.way.symmetric() != theirs.way.symmetric() {
        "one of them runs it without symmetric windows: every rank must pass buffers in NCCL_WIN_COLL_SYMMETRIC windows \
         at the same offsets, or none"
    } else {
        "the ranks chose differently for the same call: what chooses the way (RUSTCCL_HOST_SMALL_BYTES, \
         RUSTCCL_HOST_SINGLE_COPY_BYTES, NCCL_ALGO, NCCL_PROTO, NCCL_SHM_DISABLE, RUSTCCL_SYM_KERNEL, a tuner) must be the \
         same on every rank"
    };
    let ways = if mine.way == theirs.way {
        format!("rank {p} ran collective {}{} and rank {me}{}, both on the {} way", mine.seq, described(theirs.sig), described(mine.sig), mine.way.name())
    } else {
        format!(
            "rank {p} ran collective {}{} on the {} way, rank {me}{} on the {} way",
            mine.seq,
            described(theirs.sig),
            theirs.way.name(),
            described(mine.sig),
            mine.way.name()
        )
    };
    Error::invalid_usage(format!("{ways}: {hint}"))
    .with_kind(ErrorKind::Mismatch)
}

impl Drop for Board {
    fn drop(&mut self) {
        for p in self.maps.drain(..) {
            let _ = self.backend.close_import(p);
        }
    }
}

/// The bootstrap's all-gather: every rank's bytes, in rank order.
pub type AllGather<'a> = dyn Fn(&[u8]) -> Result<Vec<Vec<u8>>> + 'a;

/// What making the board needs from its communicator (at init).
pub struct Making<'a> {
    pub rank: usize,
    pub nranks: usize,
    pub device: usize,
    /// Whose shareable memory the regions are (host memory: the host backend's).
    pub backend: &'a Arc<dyn DeviceBackend>,
    /// Whether the regions get their ring of entries, so that calls may take the board (the
    /// communicator's backend is the host's); else they carry only the route rings (device
    /// backends: their collectives run on the GPU, but the ranks still publish their routes).
    pub entries: bool,
    /// The ranks' process ids, in rank order.
    pub pids: &'a [u32],
    pub allgather: &'a AllGather<'a>,
    /// Whether to go on waiting for the peers (no failure, no abort).
    pub check: &'a dyn Fn() -> Result<()>,
    /// The longest wait for the peers.
    pub timeout: Duration,
}

/// Makes the board (collective: every rank of a communicator whose ranks share a host calls
/// it at init, `m.backend`'s memory being host-addressable): one all-gather of the regions'
/// handles (and ring sizes: the smallest is every rank's); each rank maps every peer's region,
/// checks that it may read the peers' memory (`process_vm_readv`, for single copies), and
/// stores in its own region's `STATUS` how that went; it then waits for every peer's status
/// (through the mappings): the board on every rank where every rank mapped everything, else
/// [`BoardState::Off`] on every rank. A rank that failed does not wait (its peers see its
/// status, or fail to map its region and say so). Each rank then unlinks its region's file
/// (every peer that will map it has): the memory goes with the last mapping however the
/// processes end. `Err` only where a peer failed or did not answer in time (init fails).
pub fn make(m: &Making) -> Result<BoardState> {
    let began = Instant::now();
    let ring = if m.entries && ring_wanted() { RING } else { 0 };
    let region = RING_AT + ring;
    let backend = m.backend;
    // This rank's region: an exported allocation (its file, until the peers have mapped it)
    // and this rank's own mapping of it.
    let mine = backend.alloc_shareable(m.device, region).and_then(|(export, handle)| {
        let own = backend.import(m.device, &handle).and_then(|own| match backend.host_access_or_err("the board").and_then(|h| h.host_address(own, region)) {
            Ok(at) => Ok((own, at)),
            Err(e) => {
                let _ = backend.close_import(own);
                Err(e)
            }
        });
        match own {
            Ok((own, at)) => Ok((export, handle, own, at)),
            Err(e) => {
                let _ = backend.free(export);
                Err(e)
            }
        }
    });
    let mut board = Board {
        backend: Arc::clone(backend),
        rank: m.rank,
        regions: vec![0; m.nranks],
        maps: Vec::with_capacity(m.nranks),
        ring: ring > 0,
        pids: m.pids.to_vec(),
        single_copy: false,
        single_copies: AtomicU64::new(0),
        cursor: Mutex::new(Cursor::default()),
        published: AtomicU64::new(0),
    };
    let offer = match &mine {
        Ok((_, handle, own, at)) => {
            board.maps.push(*own);
            board.regions[m.rank] = *at;
            // This region's address in this process, for the peers' check below (the
            // all-gather orders it before their reads).
            board.word(m.rank, SELF).store(*at as u64, Ordering::Release);
            [&[1u8][..], &(ring as u32).to_le_bytes(), &handle.to_bytes()].concat()
        }
        Err(e) => {
            tracing::warn!(target: "INIT", "rank {}: no board for small collectives: {}", m.rank, e.message);
            vec![0u8]
        }
    };
    let export = mine.as_ref().ok().map(|(export, ..)| *export);
    let unlink = |export: Option<DevicePtr>| {
        if let Some(p) = export {
            let _ = backend.free(p);
        }
    };
    let all = match (m.allgather)(&offer) {
        Ok(all) => all,
        Err(e) => {
            unlink(export);
            return Err(e.context("making the board of small collectives"));
        }
    };
    if export.is_none() || all.iter().any(|o| o.first() != Some(&1) || o.len() < 5) {
        unlink(export);
        return Ok(BoardState::Off);
    }
    let ring = all.iter().map(|o| u32::from_le_bytes([o[1], o[2], o[3], o[4]]) as usize).min().unwrap_or(0);
    board.ring = ring == RING;
    let size = RING_AT + if board.ring { RING } else { 0 };
    let mapped = (0..m.nranks).filter(|&r| r != m.rank).try_for_each(|r| -> Result<()> {
        let h = ShareHandle::from_bytes(&all[r][5..])?;
        let p = backend.import(m.device, &h)?;
        board.maps.push(p);
        board.regions[r] = backend.host_access_or_err("the board")?.host_address(p, size)?;
        Ok(())
    });
    let status = match &mapped {
        Err(e) => {
            tracing::warn!(target: "INIT", "rank {}: no board for small collectives: {}", m.rank, e.message);
            FAILED
        }
        // Whether this rank may read every peer's memory (process_vm_readv: the same user, no
        // rule against it): it reads the word where each peer wrote its region's address in
        // its own process.
        Ok(()) if (0..m.nranks).filter(|&p| p != m.rank).all(|p| readable(&board, p)) => MAPPED_READABLE,
        Ok(()) => MAPPED,
    };
    board.word(m.rank, STATUS).store(status, Ordering::Release);
    if status == FAILED {
        unlink(export);
        return Ok(BoardState::Off);
    }
    let statuses = wait_statuses(&board, m);
    unlink(export);
    let statuses = statuses?;
    if statuses.contains(&FAILED) {
        return Ok(BoardState::Off);
    }
    board.single_copy = statuses.iter().all(|&s| s == MAPPED_READABLE);
    tracing::debug!(
        target: "INIT",
        "rank {}: board made in {} us (ring of entries: {}); single copies from peers' buffers: {}",
        m.rank,
        began.elapsed().as_micros(),
        board.ring,
        board.single_copy
    );
    Ok(BoardState::Ready(Arc::new(board)))
}

/// Whether this rank may read peer `p`'s memory: its region's address in its process, read
/// there with `process_vm_readv`, is what it wrote.
fn readable(board: &Board, p: usize) -> bool {
    let at = board.word(p, SELF).load(Ordering::Acquire);
    let mut v = 0u64;
    // SAFETY: `v` is 8 writable bytes of this process; the remote range is only read by the
    // kernel, which refuses (EFAULT) an address not mapped there.
    let got = unsafe { super::single_copy::read_remote(board.pid(p), at + SELF as u64, (&mut v as *mut u64).cast(), 8) };
    got.is_ok() && v == at
}

/// Every rank's making status, once each has stored one.
fn wait_statuses(board: &Board, m: &Making) -> Result<Vec<u64>> {
    let start = Instant::now();
    let mut wait = crate::exec::backoff::Backoff::new(MAKING_SPIN);
    let mut out = Vec::with_capacity(m.nranks);
    for p in 0..m.nranks {
        loop {
            let s = board.word(p, STATUS).load(Ordering::Acquire);
            if s != 0 {
                out.push(s);
                break;
            }
            wait.pause();
            if wait.check_now() {
                (m.check)().map_err(|e| e.context("making the board of small collectives"))?;
                if start.elapsed() > m.timeout {
                    return Err(Error::remote(format!(
                        "making the board of small collectives: rank {p} did not map it within {:.0} s \
                         (RUSTCCL_BOOTSTRAP_TIMEOUT)",
                        m.timeout.as_secs_f64()
                    )));
                }
            }
        }
        wait.reset();
    }
    Ok(out)
}

/// What a collective needs on the board per rank (the most any rank sends: the root's send
/// buffer), in bytes; `None` for sends and receives.
pub fn board_bytes(coll: Collective, count: usize, elem_size: usize, nranks: usize) -> Option<usize> {
    let spec = coll.spec();
    if spec.p2p {
        return None;
    }
    let (send, _) = spec.extents(count, nranks, 0, 0);
    send.checked_mul(elem_size)
}

/// The CPU the calling thread runs on (a cheap query: glibc reads it from the thread's rseq
/// area or the vDSO); `u64::MAX` if unknown.
pub(super) fn current_cpu() -> u64 {
    // SAFETY: sched_getcpu takes no arguments and only reads the thread's state.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 { u64::MAX } else { c as u64 }
}

/// Where a [`BoardOp`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Take the entry.
    Enter,
    /// 1: wait until no peer still reads the ring bytes the entry reuses.
    Reuse,
    /// 2: input and header on the board, then the arrival.
    Put,
    /// 3: wait for the inputs this rank needs, then compute.
    Gather,
    Done,
}

/// One collective on the board (see the module docs), polled by the driver.
pub struct BoardOp<'a> {
    board: &'a Board,
    call: HostCall,
    /// Bytes on the board per rank.
    bytes: usize,
    step: Step,
    /// The board call's number and entry (from `Enter` on).
    number: u64,
    entry: Entry,
    /// The next peer to look at in `Reuse` and `Gather`.
    peer: usize,
    /// This rank's reducer (its PreMulSum scalar read when the call runs).
    reducer: Reducer,
}

impl<'a> BoardOp<'a> {
    /// `call` on `board` (whose ranks share a host and which has a ring: `Board::has_ring`),
    /// a collective of at most [`MAX_BYTES`] on the board per rank.
    pub fn new(board: &'a Board, call: HostCall) -> BoardOp<'a> {
        let bytes = board_bytes(call.coll, call.count, call.dtype.size(), board.nranks()).unwrap_or(0);
        let reducer = call.ctx.reducer;
        BoardOp { board, call, bytes, step: Step::Enter, number: 0, entry: Entry { start: 0, reuses: None }, peer: 0, reducer }
    }

    /// Whether this rank puts data on the board (a broadcast's root only), and the root.
    fn puts(&self) -> bool {
        self.call.coll != Collective::Broadcast || self.board.rank == self.call.root
    }

    /// The peers whose input this rank needs.
    fn needs(&self) -> std::ops::Range<usize> {
        let (me, root) = (self.board.rank, self.call.root);
        match self.call.coll {
            Collective::Broadcast => root..root + 1,
            Collective::Reduce if me != root => 0..0,
            _ => 0..self.board.nranks(),
        }
    }

    /// The peer this op waits for now, and the call it waits for that peer to arrive at.
    fn awaited(&self) -> Option<(usize, u64)> {
        let call = match self.step {
            Step::Reuse => self.entry.reuses? + 1,
            Step::Gather if self.peer < self.needs().end => self.number,
            _ => return None,
        };
        (self.peer != self.board.rank && self.peer < self.board.nranks()).then_some((self.peer, call))
    }

    fn route(&self) -> Route {
        Route { seq: self.call.seq, way: Way::Board, sig: self.call.ctx.sig }
    }

    /// Step 2.
    fn put(&mut self) {
        let me = self.board.rank;
        self.reducer = self.call.ctx.host_reducer();
        if self.puts() {
            // SAFETY: this rank's own entry for this call, `bytes` long inside its ring: no
            // peer reads it now (step 1), only this rank writes it. The source is the call's
            // send buffer, resolved by the backend (live host memory of `src_len` ≥ `bytes`).
            let (data, src) = unsafe {
                (
                    std::slice::from_raw_parts_mut(self.board.data(me, self.entry.start), self.bytes),
                    std::slice::from_raw_parts(self.call.ctx.src as *const u8, self.bytes),
                )
            };
            if self.call.coll.spec().reduces {
                self.reducer.pre(src, data);
            } else {
                data.copy_from_slice(src);
            }
        }
        self.board.arrive(&self.entry, self.number, self.call.ctx.sig);
    }

    /// The result from the peers' entries (every one this rank needs has arrived).
    fn compute(&self) {
        let (board, ctx) = (self.board, &self.call.ctx);
        let (n, me, root) = (board.nranks(), board.rank, self.call.root);
        let part = self.call.part();
        let start = self.entry.start;
        // SAFETY: every entry read here was filled before its rank's arrival at this call,
        // which this rank acquired; no rank writes it again before this rank arrives at a
        // later call.
        let slot_of = |p: usize, off: usize, len: usize| unsafe { std::slice::from_raw_parts(board.data(p, start).add(off), len) };
        // SAFETY (buffers): `ctx.dst` is the call's receive buffer resolved by the backend
        // (live host memory of `dst_len` bytes); the caller's stream semantics give this call
        // sole use of it.
        let dst = |len: usize| unsafe { std::slice::from_raw_parts_mut(ctx.dst as *mut u8, len) };
        let r = &self.reducer;
        match self.call.coll {
            Collective::AllReduce => reduce_into(r, n, |p| slot_of(p, 0, part), dst(part)),
            Collective::Reduce if me == root => reduce_into(r, n, |p| slot_of(p, 0, part), dst(part)),
            Collective::Reduce => {}
            Collective::ReduceScatter => reduce_into(r, n, |p| slot_of(p, me * part, part), dst(part)),
            Collective::AllGather => {
                for p in 0..n {
                    // This rank's own part from its send buffer, which in place is that part
                    // of the receive buffer (then nothing to do).
                    let from = if p == me { ctx.src as *const u8 } else { slot_of(p, 0, part).as_ptr() };
                    // SAFETY: part p of the receive buffer (`dst_len` = n × part bytes); a copy
                    // with overlap only in place, where it is the same bytes.
                    unsafe { std::ptr::copy(from, (ctx.dst + p * part) as *mut u8, part) };
                }
            }
            Collective::Broadcast => {
                let from = if me == root { ctx.src as *const u8 } else { slot_of(root, 0, part).as_ptr() };
                // SAFETY: the receive buffer (`part` bytes); in place the root copies onto
                // itself.
                unsafe { std::ptr::copy(from, ctx.dst as *mut u8, part) };
            }
            _ => unreachable!("only all_reduce, reduce, reduce_scatter, all_gather and broadcast take the board"),
        }
    }
}

impl HostOp for BoardOp<'_> {
    fn poll(&mut self) -> Result<Progress> {
        // While it waits, a poll is one load (the driver polls on every round of its wait).
        match self.awaited() {
            Some((p, call)) if !self.board.arrived(p, call) => Ok(Progress::Waiting),
            _ => self.advance(),
        }
    }

    fn check_peers(&self) -> Result<()> {
        let Some((p, call)) = self.awaited() else { return Ok(()) };
        self.board.check_route(p, self.route(), || !self.board.arrived(p, call))
    }

    fn wait(&self) -> Wait {
        match self.awaited() {
            Some((p, _)) => self.board.wait_for(p),
            None => Wait { spin: 0, naps: false },
        }
    }

    fn what(&self) -> String {
        format!("{} (board)", self.call.coll.spec().name)
    }
}

impl BoardOp<'_> {
    /// Runs the steps as far as the peers allow.
    #[inline(never)]
    fn advance(&mut self) -> Result<Progress> {
        let me = self.board.rank;
        let n = self.board.nranks();
        let mut moved = false;
        loop {
            match self.step {
                Step::Enter => {
                    if !self.board.has_ring() || self.bytes > MAX_BYTES {
                        return Err(Error::internal(format!("{} bytes do not fit on the board", self.bytes)));
                    }
                    (self.number, self.entry) = self.board.take_entry(self.bytes);
                    self.peer = 0;
                    self.step = if self.entry.reuses.is_some() { Step::Reuse } else { Step::Put };
                }
                Step::Reuse => {
                    let reused = self.entry.reuses.unwrap_or(0);
                    while self.peer < n {
                        if self.peer != me && !self.board.arrived(self.peer, reused + 1) {
                            return Ok(if moved { Progress::Moved } else { Progress::Waiting });
                        }
                        self.peer += 1;
                    }
                    self.step = Step::Put;
                }
                Step::Put => {
                    self.put();
                    self.peer = self.needs().start;
                    self.step = Step::Gather;
                }
                Step::Gather => {
                    let needs = self.needs();
                    while self.peer < needs.end {
                        let p = self.peer;
                        if p != me {
                            if !self.board.arrived(p, self.number) {
                                return Ok(if moved { Progress::Moved } else { Progress::Waiting });
                            }
                            self.board.check_header(p, &self.entry, self.number, self.call.ctx.sig, self.call.seq)?;
                        }
                        self.peer += 1;
                    }
                    self.compute();
                    self.step = Step::Done;
                }
                Step::Done => return Ok(Progress::Done),
            }
            moved = true;
        }
    }
}

/// `out = in(0) ⊕ in(1) ⊕ ...` in rank order (the inputs already scaled by their ranks'
/// PreMulSum scalars), then the post-op.
fn reduce_into<'a>(reducer: &Reducer, n: usize, input: impl Fn(usize) -> &'a [u8], out: &mut [u8]) {
    reducer.combine(input(0), input(1), out);
    for p in 2..n {
        reducer.combine_into(out, input(p));
    }
    reducer.post(out);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::backend::HostBackend;

    #[test]
    fn small_entries_fill_the_ring_before_any_wait() {
        let mut c = Cursor::default();
        let per_lap = RING / (2 * HEADER); // 8 B of data: a header and one line
        for call in 1..=per_lap as u64 {
            let (number, e) = c.take(8);
            assert_eq!(number, call);
            assert_eq!(e.start, (call - 1) * 2 * HEADER as u64);
            assert_eq!(e.reuses, None, "call {call}");
        }
        // The next lap's first entry reuses the first call's bytes only.
        let (_, e) = c.take(8);
        assert_eq!(e.start, RING as u64);
        assert_eq!(e.reuses, Some(1));
    }

    #[test]
    fn an_entry_never_wraps_and_waits_for_what_it_reuses() {
        let mut c = Cursor::default();
        let len = (HEADER + MAX_BYTES) as u64;
        let fit = RING as u64 / len;
        for _ in 1..=fit {
            assert_eq!(c.take(MAX_BYTES).1.reuses, None);
        }
        let (_, e) = c.take(MAX_BYTES);
        assert_eq!(e.start, RING as u64, "the rest of the lap is skipped");
        assert_eq!(e.reuses, Some(1));
    }

    /// Every entry, at any mix of sizes, lies in one lap and overlaps no entry of a call after
    /// the last one it (or an earlier entry) waited for.
    #[test]
    fn entries_of_mixed_sizes_overlap_only_calls_waited_for() {
        let mut c = Cursor::default();
        let mut taken: Vec<(u64, u64, u64)> = Vec::new(); // (call, start, len)
        let mut waited = 0u64;
        let mut x = 12345u64;
        for call in 1..20_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let bytes = match x >> 61 {
                0..=3 => (x >> 20) as usize % 512,
                4..=5 => (x >> 20) as usize % 8192,
                _ => (x >> 20) as usize % (MAX_BYTES + 1),
            };
            let (number, e) = c.take(bytes);
            assert_eq!(number, call);
            let len = (HEADER + bytes.next_multiple_of(HEADER)) as u64;
            assert!(e.start % RING as u64 + len <= RING as u64);
            if let Some(r) = e.reuses {
                assert!(r > waited && r < call);
                waited = r;
            }
            let ring = |s: u64| s % RING as u64;
            for &(c, s, l) in taken.iter().filter(|(c, _, _)| *c > waited) {
                let (a0, a1, b0, b1) = (ring(s), ring(s) + l, ring(e.start), ring(e.start) + len);
                assert!(a1 <= b0 || b1 <= a0, "call {call} overlaps call {c}, which no wait covered");
            }
            taken.push((call, e.start, len));
            taken.retain(|(c, _, _)| *c > waited);
        }
    }

    /// The boards of `n` ranks of one process, made as at init: each rank's `make` on its own
    /// thread, the all-gather through shared memory of the test.
    pub(crate) fn boards(n: usize) -> Vec<Arc<Board>> {
        boards_made(n, true)
    }

    /// As [`boards`], with the rings of entries (`entries`) or only the route rings (as a
    /// device backend's communicator has them).
    pub(crate) fn boards_made(n: usize, entries: bool) -> Vec<Arc<Board>> {
        let backend: Arc<dyn DeviceBackend> = Arc::new(HostBackend::with_devices(n));
        let gathered = Mutex::new(vec![Vec::new(); n]);
        let barrier = std::sync::Barrier::new(n);
        let pids = vec![std::process::id(); n];
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|rank| {
                    let (backend, gathered, barrier, pids) = (&backend, &gathered, &barrier, &pids);
                    s.spawn(move || {
                        let allgather = |mine: &[u8]| -> Result<Vec<Vec<u8>>> {
                            gathered.lock().unwrap()[rank] = mine.to_vec();
                            barrier.wait();
                            let all = gathered.lock().unwrap().clone();
                            barrier.wait();
                            Ok(all)
                        };
                        let m = Making {
                            rank,
                            nranks: n,
                            device: rank,
                            backend,
                            entries,
                            pids,
                            allgather: &allgather,
                            check: &|| Ok(()),
                            timeout: Duration::from_secs(10),
                        };
                        match make(&m).unwrap() {
                            BoardState::Ready(b) => b,
                            BoardState::Off => panic!("rank {rank}: no board"),
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn every_rank_makes_the_board_with_one_all_gather_and_sees_every_region() {
        let b = boards(3);
        for (r, board) in b.iter().enumerate() {
            assert_eq!((board.rank(), board.nranks()), (r, 3));
            assert!(board.has_ring(), "the ring is on by default");
            assert!(board.single_copy(), "one process may read its own memory");
        }
        // A word one rank stores in its region is what every rank reads there.
        b[1].word(1, ARRIVE).store(7, Ordering::Release);
        assert!(b[0].arrived(1, 7) && b[2].arrived(1, 7) && !b[0].arrived(1, 8));
    }

    #[test]
    fn a_published_route_is_read_back_whole_and_a_later_lap_replaces_it() {
        let b = boards(2);
        let sig = OpSig(0x1234_5678_9abc_def0);
        assert_eq!(b[0].route_of(1, 5), None, "nothing published yet");
        b[1].publish_route(5, Way::Board, sig);
        assert_eq!(b[0].route_of(1, 5), Some(Route { seq: 5, way: Way::Board, sig }));
        b[1].publish_route(5 + ROUTES, Way::Planned, OpSig(9));
        assert_eq!(b[0].route_of(1, 5), Some(Route { seq: 5 + ROUTES, way: Way::Planned, sig: OpSig(9) }));
    }

    #[test]
    fn the_fifo_look_names_both_ranks_and_both_ways() {
        let b = boards(2);
        let (mine, theirs) = (OpSig(1 << 60 | 1 << 56 | 1 << 52 | 0xf_ffff << 32 | 2), OpSig(1 << 60 | 1 << 56 | 1 << 52 | 0xf_ffff << 32 | 1024));
        b[0].publish_route(12, Way::Planned, mine);
        assert!(b[0].check_current_route().is_ok(), "the peer has not published collective 12 yet");
        b[1].publish_route(12, Way::Board, theirs);
        let e = b[0].check_current_route().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Mismatch);
        for part in ["rank 1 ran collective 12", "count 1024", "on the board way", "rank 0", "count 2", "on the planner way"] {
            assert!(e.message.contains(part), "{part:?} not in: {}", e.message);
        }
    }
}
