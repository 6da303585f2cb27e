//! Small single collectives on the host backend, one shot through a board in shared memory.
//!
//! Every rank of a communicator whose ranks share a host owns a region of shared memory that
//! every rank maps (the board, made at the first call that takes this way): a word `arrive`
//! (the number of the last call whose input this rank has put on the board) and a ring of
//! bytes. Each call takes the next entry of the ring, a header line (the call's signature and
//! number) and its data rounded up to a cache line; every rank takes the same entries (they
//! follow from the calls' sizes, which every rank agrees on), so a rank finds a peer's entry
//! where it put its own. Small calls take little of the ring, so a rank may run many of them
//! ahead of the others (a broadcast's root, a reduce's non-roots) before it must wait; large
//! ones reuse the same few cache-sized stretches. A call `k` of rank r:
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
//! Ranks that disagree (one passes other counts, so takes the usual way where the others take
//! the board) are found, not waited for: each rank publishes the number of the last collective
//! it ran the usual way (`usual`), and a rank waiting on the board for a peer that ran this
//! collective the usual way stops with `ncclInvalidUsage`.
//!
//! Taken for a single collective (outside a group, blocking communicator, no check mode, no
//! `NCCL_ALGO`/`NCCL_PROTO`, no `NCCL_SHM_DISABLE=1`, no tuner whose table speaks for the
//! call: `coll::way`) of at most `limit` bytes on the board
//! per rank, where every rank is on one host; everything the choice depends on is the same on
//! every rank, so every rank takes the same way. The board is made at the communicator's
//! first collective of any kind outside a group, with data (every rank makes it there,
//! whatever way that collective takes), so it exists on every rank before any rank could take
//! it. (Not inside a group: one thread may drive several ranks there, and making the board
//! waits for every rank.)

use std::sync::atomic::{AtomicU64, Ordering};
use super::observe::{self as profiler_events, OpPlan};

use super::{CollKind, Task};
use crate::backend::DevicePtr;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::reduce::Reducer;

/// The most data bytes of one call on the board.
const MAX_BYTES: usize = 32 << 10;
/// Bytes of a rank's ring, and where it starts in its region (the head words have the first
/// cache lines).
const RING: usize = 256 << 10;
const RING_AT: usize = 128;
/// Bytes of a region.
const REGION: usize = RING_AT + RING;
/// Offsets of the words at the head of a region: the last call put on the board, the last
/// collective run the usual way, the CPU this rank last ran a call on.
const ARRIVE: usize = 0;
const USUAL: usize = 8;
const CPU: usize = 16;
/// The last call whose single copies this rank has finished (`coll::single_copy`), and the
/// address of the region in its owner's process (to check that peers may read it there).
pub(super) const DONE: usize = 24;
const SELF: usize = 32;
/// An entry's header (signature, call number), before its data.
const HEADER: usize = 64;

/// `RUSTCCL_HOST_SMALL_BYTES`: the most bytes a rank puts on the board for one call (0: never
/// this way; at most the slot size); `None` unset.
fn setting() -> Option<usize> {
    static N: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *N.get_or_init(|| crate::params::env_int("RUSTCCL_HOST_SMALL_BYTES").ok().flatten().map(|v| v.clamp(0, MAX_BYTES as i64) as usize))
}

/// The most bytes a rank puts on the board for a call of `task`'s kind: the setting, else
/// where the board stops being faster than the FIFOs (2 ranks on the 2-core development
/// machine, 2026-12-02: all_reduce in place at 8 KiB 2.2 µs against 8.2 and at 32 KiB 9.4
/// against 22, at 64 KiB out of place 16.8 against 12.8; broadcast and all_gather the same
/// from 4 KiB on, run to run swings larger than the difference): a whole slot for reductions,
/// 4 KiB for copies.
fn limit(task: &Task) -> usize {
    setting().unwrap_or(if task.kind.reduces() { MAX_BYTES } else { 4 << 10 })
}

/// A communicator's board.
#[derive(Default)]
pub(crate) enum BoardState {
    /// Not made yet.
    #[default]
    NotYet,
    Ready(Board),
    /// This communicator never takes this way (ranks on several hosts, or the board could not
    /// be made on some rank).
    Off,
}

pub(crate) struct Board {
    /// This rank's region (its allocation) and every rank's, mapped here (this rank's own
    /// included), by rank.
    mine: DevicePtr,
    pub(super) regions: Vec<usize>,
    imports: Vec<DevicePtr>,
    /// Calls made so far.
    calls: u64,
    /// Where the next entry may start (bytes since the first, over every lap of the ring).
    next: u64,
    /// The ranks' process ids, and whether every rank may read every peer's memory with
    /// `process_vm_readv` (checked on every rank when the board was made).
    pub(super) pids: Vec<u32>,
    pub(super) single_copy: bool,
    /// Calls that took that way so far.
    pub(crate) single_copies: u64,
    /// The calls whose entries the next laps will reuse (number, start), oldest first.
    entries: std::collections::VecDeque<(u64, u64)>,
}

/// Where a call's entry goes, and which earlier call's readers it must wait for first.
pub(super) struct Entry {
    /// Start, in bytes since the first entry (its place in the ring: modulo `RING`).
    pub(super) start: u64,
    /// The latest call whose entry shares ring bytes with this one: every peer must have
    /// arrived at the call after it.
    pub(super) reuses: Option<u64>,
}

impl Board {
    fn new(mine: DevicePtr, n: usize) -> Board {
        Board {
            mine,
            regions: vec![0; n],
            imports: Vec::new(),
            calls: 0,
            next: 0,
            entries: std::collections::VecDeque::with_capacity(RING / HEADER),
            pids: Vec::new(),
            single_copy: false,
            single_copies: 0,
        }
    }

    pub(super) fn word(&self, rank: usize, offset: usize) -> &AtomicU64 {
        // SAFETY: `regions[rank]` is a mapped region of at least `REGION` bytes,
        // page-aligned, kept while the board exists; the head words and headers are only
        // used atomically.
        unsafe { &*((self.regions[rank] + offset) as *const AtomicU64) }
    }

    /// Takes the entry of call `call` with `bytes` of data: the same on every rank that
    /// makes the same calls.
    fn take_entry(&mut self, call: u64, bytes: usize) -> Entry {
        let len = (HEADER + bytes.next_multiple_of(HEADER)) as u64;
        let mut start = self.next;
        if start % RING as u64 + len > RING as u64 {
            // No entry wraps: the rest of this lap stays unused.
            start = start.next_multiple_of(RING as u64);
        }
        self.next = start + len;
        // Bytes before `start + len - RING` were last used by calls every later wait covers.
        let mut reuses = None;
        while let Some(&(c, s)) = self.entries.front() {
            if s + RING as u64 >= start + len {
                break;
            }
            reuses = Some(c);
            self.entries.pop_front();
        }
        self.entries.push_back((call, start));
        Entry { start, reuses }
    }

    /// The header word `i` (0: signature, 1: call number) of `rank`'s entry at `start`.
    pub(super) fn header(&self, rank: usize, start: u64, i: usize) -> &AtomicU64 {
        self.word(rank, RING_AT + (start % RING as u64) as usize + 8 * i)
    }

    /// `rank`'s data of the entry at `start`.
    fn data(&self, rank: usize, start: u64) -> *mut u8 {
        (self.regions[rank] + RING_AT + (start % RING as u64) as usize + HEADER) as *mut u8
    }

    /// Step 1 of call `call` (the next), with `bytes` of data: takes its entry and waits until
    /// no peer still reads the ring bytes the entry reuses.
    pub(super) fn enter(&mut self, comm: &Communicator, bytes: usize, seq: u64) -> Result<(u64, Entry)> {
        let call = self.calls + 1;
        let entry = self.take_entry(call, bytes);
        if let Some(reused) = entry.reuses {
            let me = comm.rank_unchecked() as usize;
            for p in (0..self.regions.len()).filter(|&p| p != me) {
                wait_arrival(comm, self, p, reused + 1, seq)?;
            }
        }
        Ok((call, entry))
    }

    /// The end of step 2 (whatever else the entry holds is in place): the header (signature
    /// `sig`, call number), the CPU this rank runs on, then its arrival at `call`.
    pub(super) fn arrive(&mut self, me: usize, entry: &Entry, call: u64, sig: crate::work::OpSig) {
        self.header(me, entry.start, 0).store(sig.0, Ordering::Relaxed);
        self.header(me, entry.start, 1).store(call, Ordering::Relaxed);
        self.word(me, CPU).store(current_cpu(), Ordering::Relaxed);
        self.word(me, ARRIVE).store(call, Ordering::Release);
        self.calls = call;
    }

    /// Gives the memory back (destroy).
    pub(crate) fn release(self, backend: &dyn crate::backend::DeviceBackend) {
        for p in self.imports {
            let _ = backend.close_import(p);
        }
        let _ = backend.free(self.mine);
    }
}

/// What a call needs on the board per rank (the most any rank sends: the root's send buffer),
/// and whether it takes this way at all.
pub(super) fn board_bytes(task: &Task, n: usize) -> Option<usize> {
    if task.kind.is_p2p() {
        return None;
    }
    let (send, _) = task.kind.spec().extents(task.count, n, 0, 0);
    send.checked_mul(task.dtype.size())
}

/// Makes the board at the communicator's first collective outside a group (a no-op after it, and where the
/// board is never used: devices, non-blocking communicators, one rank, the limit set to 0).
pub(crate) fn ensure_board(comm: &Communicator) {
    let mut state = comm.small_board();
    if !matches!(*state, BoardState::NotYet) {
        return;
    }
    // Shared memory between the ranks: not where the user turned it off (NCCL_SHM_DISABLE=1,
    // e.g. to run everything over the network).
    let used = comm.nranks_unchecked() > 1
        && comm.backend().capabilities().host_addressable
        && comm.config().blocking
        && (setting() != Some(0) || super::single_copy::wanted())
        && !super::plan::forced()
        && crate::params::env_int_or("NCCL_SHM_DISABLE", 0) != 1;
    *state = if !used {
        BoardState::Off
    } else {
        match make_board(comm) {
            Ok(Some(b)) => BoardState::Ready(b),
            Ok(None) => BoardState::Off,
            Err(e) => {
                tracing::warn!(target: "COLL", "rank {}: small collectives take the usual way: {}", comm.rank_unchecked(), e.message);
                BoardState::Off
            }
        }
    };
}

/// Runs `task`, a collective outside a group, through the board if it takes this way (None:
/// it does not). The board is made here at the first such collective with data, once its
/// buffers are checked (a bad argument on one rank is refused at once, not after waiting for
/// the others to make the board).
pub(crate) fn try_run(comm: &Communicator, task: &Task) -> Option<Result<()>> {
    if task.count == 0 || task.kind.is_p2p() {
        return None;
    }
    let mut state = comm.small_board();
    if matches!(*state, BoardState::NotYet) {
        drop(state);
        if let Err(e) = super::plan::task_ctx(comm, task) {
            return Some(Err(comm.record_error(e)));
        }
        ensure_board(comm);
        state = comm.small_board();
    }
    let BoardState::Ready(board) = &mut *state else { return None };
    let n = board.regions.len();
    if !super::cache::may_skip_planner(comm, task) {
        return None;
    }
    let bytes = board_bytes(task, n)?;
    let single_copy = super::single_copy::takes(board, task, bytes);
    if !single_copy && bytes > limit(task) {
        return None;
    }
    let way = if single_copy { super::way::Way::SingleCopy } else { super::way::Way::Board };
    super::way::trace(task, n, way);
    comm.op_log().started(std::slice::from_ref(&task.shape()));
    // For a profiler: one channel, no NCCL algorithm.
    let events = profiler_events::single_op(comm, task, || OpPlan { algo: "", proto: "", channels: 1 });
    let r = if single_copy {
        let r = super::single_copy::run(comm, board, task, bytes);
        board.single_copies += r.is_ok() as u64;
        r
    } else {
        run(comm, board, task, bytes)
    };
    profiler_events::end_single_op(events, &r);
    super::cache::finish(comm, &r, false);
    Some(r.map_err(|e| comm.record_error(e.context(task.kind.name()))))
}

/// Makes the board (collective: every rank gets here at the same call): `None` where it is not
/// used (ranks on several hosts).
fn make_board(comm: &Communicator) -> Result<Option<Board>> {
    let hosts = comm.host_hashes()?;
    if hosts.iter().any(|h| *h != hosts[0]) {
        return Ok(None);
    }
    let backend = comm.backend();
    let device = comm.device()?.max(0) as usize;
    let me = comm.rank_unchecked() as usize;
    let mine = backend.alloc_shareable(device, REGION);
    // Every rank says whether it has a region (and its handle), so all decide alike.
    let offer = match &mine {
        Ok((_, h)) => [&[1u8][..], &h.to_bytes()].concat(),
        Err(_) => vec![0u8],
    };
    let all = comm.allgather_bytes(&offer)?;
    let (mine, _) = match mine {
        Ok(m) if all.iter().all(|o| o.first() == Some(&1)) => m,
        Ok((p, _)) => {
            let _ = backend.free(p);
            return Err(Error::internal("a peer could not make its board"));
        }
        Err(e) => return Err(e),
    };
    let n = all.len();
    let mut board = Board::new(mine, n);
    board.regions[me] = backend.host_access_or_err("the board")?.host_address(board.mine, REGION)?;
    // Rank r's region is mapped last by rank r + 1, which then unlinks its file (the backend's
    // `import_last`): from then on it lives only in the mappings, and goes with the processes
    // however they end. So: every region but the one this rank maps last, then (every other
    // rank has mapped it) that one.
    let last_of_mine = (me + n - 1) % n;
    let map = |board: &mut Board, r: usize, last: bool| -> Result<()> {
        let h = crate::backend::ShareHandle::from_bytes(&all[r][1..])?;
        let p = if last { backend.import_last(device, &h)? } else { backend.import(device, &h)? };
        board.imports.push(p);
        board.regions[r] = backend.host_access_or_err("the board")?.host_address(p, REGION)?;
        Ok(())
    };
    let mut mapped: Result<()> = (0..n).filter(|&r| r != me && r != last_of_mine).try_for_each(|r| map(&mut board, r, false));
    // This region's address in this process, for the peers' check below (the rounds that
    // follow order it before their reads).
    board.word(me, SELF).store(board.regions[me] as u64, Ordering::Release);
    // Every rank says how it went, twice (before and after the last mappings), so all decide
    // alike: the board for every rank, or for none.
    for phase in 0..2 {
        if phase == 1 && mapped.is_ok() {
            mapped = map(&mut board, last_of_mine, true);
        }
        let ok = comm.allgather_bytes(&[mapped.is_ok() as u8]);
        match ok {
            Ok(all_ok) if mapped.is_ok() && all_ok.iter().all(|o| o.first() == Some(&1)) => {}
            ok => {
                board.release(&**backend);
                ok?;
                mapped?;
                return Err(Error::internal("a peer could not map the boards of the small collectives"));
            }
        }
    }
    // Whether every rank may read every peer's memory (process_vm_readv: the same user, no
    // rule against it): each reads the word where each peer wrote its region's address in its
    // own process, all say how it went, and all decide alike.
    board.pids = comm.peer_pids()?;
    let readable = (0..n).filter(|&p| p != me).all(|p| {
        let at = board.word(p, SELF).load(Ordering::Acquire);
        let mut v = 0u64;
        // SAFETY: `v` is 8 writable bytes of this process; the remote range is only read by
        // the kernel, which refuses (EFAULT) an address not mapped there.
        let got = unsafe { super::single_copy::read_remote(board.pids[p], at + SELF as u64, (&mut v as *mut u64).cast(), 8) };
        got.is_ok() && v == at
    });
    let all = comm.allgather_bytes(&[readable as u8])?;
    board.single_copy = all.iter().all(|o| o.first() == Some(&1));
    tracing::debug!(target: "COLL", "rank {me}: board made; single copies from peers' buffers: {}", board.single_copy);
    Ok(Some(board))
}

/// A collective of `comm` (number `Communicator::collective_number`) takes the usual way:
/// published on the board, if there is one, for peers waiting there.
pub(crate) fn note_usual(comm: &Communicator) {
    if let BoardState::Ready(b) = &*comm.small_board() {
        let me = comm.rank_unchecked() as usize;
        b.word(me, USUAL).store(comm.collective_number(), Ordering::Release);
    }
}

/// Waits until `rank` has arrived at call `call` (or later), in collective number `seq`.
pub(super) fn wait_arrival(comm: &Communicator, board: &Board, rank: usize, call: u64, seq: u64) -> Result<()> {
    wait_word(comm, board, rank, ARRIVE, call, seq)
}

/// Waits until `rank`'s head word at `offset` reaches `call`, in collective number `seq`.
pub(super) fn wait_word(comm: &Communicator, board: &Board, rank: usize, offset: usize, call: u64, seq: u64) -> Result<()> {
    let word = board.word(rank, offset);
    if word.load(Ordering::Acquire) >= call {
        return Ok(());
    }
    // Spinning only while the peer may run at the same time: not when it last ran on this
    // CPU (it runs only when this thread yields), briefly when ranks outnumber cores.
    let cpu = current_cpu();
    let shares_cpu = cpu != u64::MAX && board.word(rank, CPU).load(Ordering::Relaxed) == cpu;
    let spin = if shares_cpu { 0 } else { crate::exec::backoff::spin_for(board.regions.len(), 2048) };
    let mut wait = crate::exec::backoff::Backoff::new(spin);
    while word.load(Ordering::Acquire) < call {
        wait.pause();
        if wait.check_now() {
            // Failures, aborts, hang reports and NCCL_OP_TIMEOUT_MS, as every wait.
            comm.check_running("collective")?;
            comm.check_op_health()?;
            // The peer ran this collective (or a later one) the usual way, and has not arrived
            // (looked at again after: it publishes `usual` only after its arrivals).
            if offset == ARRIVE && board.word(rank, USUAL).load(Ordering::Acquire) >= seq && word.load(Ordering::Acquire) < call {
                return Err(Error::invalid_usage(format!(
                    "rank {rank} ran collective number {seq} with other arguments (count, type, operator or root): \
                     it took another way than this rank; every rank must call the same collectives with the same arguments"
                ))
                .with_kind(crate::error::ErrorKind::Mismatch));
            }
        }
    }
    Ok(())
}

/// After `p`'s arrival at `call`: its entry (at `entry.start` on every rank that made the
/// same calls) is this call's, with this rank's signature `sig`; else `ncclInvalidUsage`.
pub(super) fn check_header(board: &Board, p: usize, entry: &Entry, call: u64, sig: crate::work::OpSig, me: usize, seq: u64) -> Result<()> {
    let (theirs, their_call) = (board.header(p, entry.start, 0).load(Ordering::Relaxed), board.header(p, entry.start, 1).load(Ordering::Relaxed));
    if their_call != call {
        // Its entry is elsewhere: its calls so far had other sizes.
        return Err(Error::invalid_usage(format!(
            "rank {p} put collective number {seq} elsewhere on the board than rank {me}: it passed other counts or types; \
             every rank must call the same collectives with the same arguments"
        ))
        .with_kind(crate::error::ErrorKind::Mismatch));
    }
    if theirs != sig.0 {
        return Err(crate::work::mismatch(me as u32, sig, p as u32, crate::work::OpSig(theirs)));
    }
    Ok(())
}

/// The CPU the calling thread runs on (a cheap query: glibc reads it from the thread's rseq
/// area or the vDSO); `u64::MAX` if unknown.
pub(super) fn current_cpu() -> u64 {
    // SAFETY: sched_getcpu takes no arguments and only reads the thread's state.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 { u64::MAX } else { c as u64 }
}

fn run(comm: &Communicator, board: &mut Board, task: &Task, bytes: usize) -> Result<()> {
    let n = board.regions.len();
    let me = comm.rank_unchecked() as usize;
    let ctx = super::plan::task_ctx(comm, task)?;
    let reducer: Reducer = ctx.host_reducer();
    let seq = comm.collective_number();
    let part = task.count * task.dtype.size();
    // SAFETY (buffers): `ctx.src`/`ctx.dst` are the task's buffers resolved by the backend
    // (live host memory of `src_len`/`dst_len` bytes); the caller's stream semantics give this
    // call sole use of them.
    let src = |len: usize| unsafe { std::slice::from_raw_parts(ctx.src as *const u8, len) };
    let dst = |len: usize| unsafe { std::slice::from_raw_parts_mut(ctx.dst as *mut u8, len) };
    let (puts, root) = match task.kind {
        CollKind::Broadcast { root } => (me == root as usize, Some(root as usize)),
        CollKind::Reduce { root } => (true, Some(root as usize)),
        _ => (true, None),
    };
    // 1. Nobody still reads the ring bytes this call's entry reuses.
    let (call, entry) = board.enter(comm, bytes, seq)?;
    // 2. Input and header on the board, then the arrival.
    if puts {
        // SAFETY: this rank's own entry for this call, `bytes` long inside its ring: no peer
        // reads it now (step 1), only this rank writes it.
        let data = unsafe { std::slice::from_raw_parts_mut(board.data(me, entry.start), bytes) };
        if task.kind.reduces() {
            reducer.pre(src(bytes), data);
        } else {
            data.copy_from_slice(src(bytes));
        }
    }
    board.arrive(me, &entry, call, ctx.sig);
    // 3. The inputs this rank needs, straight from the peers' entries.
    let needs = match task.kind {
        CollKind::Broadcast { .. } => root.map_or(0..0, |r| r..r + 1),
        CollKind::Reduce { .. } if Some(me) != root => 0..0,
        _ => 0..n,
    };
    for p in needs.filter(|&p| p != me) {
        wait_arrival(comm, board, p, call, seq)?;
        check_header(board, p, &entry, call, ctx.sig, me, seq)?;
    }
    // SAFETY: every entry read below was filled before its rank's arrival at `call`, which
    // this rank acquired; no rank writes it again before this rank arrives at a later call.
    let slot_of = |p: usize, off: usize, len: usize| unsafe { std::slice::from_raw_parts(board.data(p, entry.start).add(off), len) };
    match task.kind {
        CollKind::AllReduce => reduce_into(&reducer, n, |p| slot_of(p, 0, part), dst(part)),
        CollKind::Reduce { .. } if Some(me) == root => reduce_into(&reducer, n, |p| slot_of(p, 0, part), dst(part)),
        CollKind::Reduce { .. } => {}
        CollKind::ReduceScatter => reduce_into(&reducer, n, |p| slot_of(p, me * part, part), dst(part)),
        CollKind::AllGather => {
            for p in 0..n {
                // This rank's own part from its send buffer, which in place is that part of the
                // receive buffer (then nothing to do).
                let from = if p == me { ctx.src as *const u8 } else { slot_of(p, 0, part).as_ptr() };
                // SAFETY: part p of the receive buffer (`dst_len` = n × part bytes); a copy
                // with overlap only in place, where it is the same bytes.
                unsafe { std::ptr::copy(from, (ctx.dst + p * part) as *mut u8, part) };
            }
        }
        CollKind::Broadcast { .. } => {
            let from = if puts { ctx.src as *const u8 } else { slot_of(root.unwrap_or(0), 0, part).as_ptr() };
            // SAFETY: the receive buffer (`part` bytes); in place the root copies onto itself.
            unsafe { std::ptr::copy(from, ctx.dst as *mut u8, part) };
        }
        CollKind::Send { .. } | CollKind::Recv { .. } => unreachable!("point-to-point never takes the board"),
    }
    Ok(())
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
mod tests {
    use super::*;

    fn board() -> Board {
        Board::new(DevicePtr(0), 2)
    }

    #[test]
    fn small_entries_fill_the_ring_before_any_wait() {
        let mut b = board();
        let per_lap = RING / (2 * HEADER); // 8 B of data: a header and one line
        for call in 1..=per_lap as u64 {
            let e = b.take_entry(call, 8);
            assert_eq!(e.start, (call - 1) * 2 * HEADER as u64);
            assert_eq!(e.reuses, None, "call {call}");
        }
        // The next lap's first entry reuses the first call's bytes only.
        let e = b.take_entry(per_lap as u64 + 1, 8);
        assert_eq!(e.start, RING as u64);
        assert_eq!(e.reuses, Some(1));
    }

    #[test]
    fn an_entry_never_wraps_and_waits_for_what_it_reuses() {
        let mut b = board();
        let len = (HEADER + MAX_BYTES) as u64;
        let fit = RING as u64 / len;
        for call in 1..=fit {
            assert_eq!(b.take_entry(call, MAX_BYTES).reuses, None);
        }
        let e = b.take_entry(fit + 1, MAX_BYTES);
        assert_eq!(e.start, RING as u64, "the rest of the lap is skipped");
        assert_eq!(e.reuses, Some(1));
    }

    /// Every entry, at any mix of sizes, lies in one lap and overlaps no entry of a call after
    /// the last one it (or an earlier entry) waited for.
    #[test]
    fn entries_of_mixed_sizes_overlap_only_calls_waited_for() {
        let mut b = board();
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
            let e = b.take_entry(call, bytes);
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
}
