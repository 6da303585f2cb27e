//! Operation health: what each rank is doing, hang reports, and operation timeouts.
//!
//! Every communicator keeps an [`OpLog`]: the operations it started and finished, numbered.
//! The bootstrap's reader threads answer peers' status queries from it, whatever the main
//! thread is doing (it may be the one that is stuck). When an operation has waited longer
//! than `RUSTCCL_HANG_REPORT_S` (60 s by default), the waiting rank gathers every rank's
//! status, logs a report (per rank: last operation started and finished, which ranks never
//! arrived, which are in another operation) and sends it to the others, which log it too:
//! one report per rank and hang. The same report comes from [`Communicator::hang_report`]
//! and from the signal `RUSTCCL_HANG_REPORT_SIGNAL` (SIGUSR1 by default, when the process has
//! no handler of its own for it). With an operation timeout (`op_timeout_ms`,
//! `NCCL_OP_TIMEOUT_MS`), an operation waiting longer ends with `Timeout` on every rank.
//! Device work that waits also has its route checked (`route_disagreement`): a peer that
//! ran the collective another way ends it at once with `Mismatch`.

use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{Communicator, Inner};
use crate::error::{Error, Result};

/// How long a report waits for the other ranks' answers.
const GATHER_WAIT: Duration = Duration::from_secs(2);

/// How long device work waits before the watchdog reads the peers' route entries for it
/// ([`route_disagreement`]): most device work completes sooner, so the look costs nothing
/// then; ranks that called the collective together have published their routes well within
/// it (each publishes before it launches); and a disagreement is still reported in a fraction
/// of a second, far below any sensible `NCCL_OP_TIMEOUT_MS`.
pub(crate) const ROUTE_LOOK_AFTER: Duration = Duration::from_millis(100);

/// One operation as the report shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpDesc {
    /// Operations of any kind this rank started on the communicator, counting from 1.
    pub seq: u64,
    /// Collectives (not point-to-point) started, counting from 1: on ranks that agree, the
    /// same number names the same collective.
    pub coll_seq: u64,
    pub kind: String,
    /// The root, or the peer of a send or receive.
    pub rank: Option<u32>,
    pub count: u64,
    pub dtype: String,
    pub op: Option<String>,
}

/// What the op log needs of an operation (the collective layer describes its tasks so).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpShape {
    pub kind: &'static str,
    /// The root, or the peer of a send or receive.
    pub rank: Option<u32>,
    pub count: u64,
    pub dtype: &'static str,
    /// The reduction operator, for operations that reduce.
    pub op: Option<&'static str>,
    /// A send or a receive (not numbered among the collectives).
    pub p2p: bool,
}

impl OpDesc {
    fn of(shape: &OpShape, seq: u64, coll_seq: u64) -> OpDesc {
        OpDesc {
            seq,
            coll_seq,
            kind: shape.kind.to_string(),
            rank: shape.rank,
            count: shape.count,
            dtype: shape.dtype.to_string(),
            op: shape.op.map(str::to_string),
        }
    }

    fn is_p2p(&self) -> bool {
        self.kind == "Send" || self.kind == "Recv"
    }

    /// Whether two ranks' descriptions are the same collective (sequence number and shape).
    fn same_collective(&self, other: &OpDesc) -> bool {
        (self.coll_seq, &self.kind, self.rank, self.count, &self.dtype, &self.op)
            == (other.coll_seq, &other.kind, other.rank, other.count, &other.dtype, &other.op)
    }
}

impl fmt::Display for OpDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} {}(count {}, {}", self.seq, self.kind, self.count, self.dtype)?;
        if let Some(op) = &self.op {
            write!(f, ", {op}")?;
        }
        match (self.kind.as_str(), self.rank) {
            ("Send", Some(p)) => write!(f, ", to rank {p}")?,
            ("Recv", Some(p)) => write!(f, ", from rank {p}")?,
            (_, Some(r)) => write!(f, ", root {r}")?,
            _ => {}
        }
        if !self.is_p2p() {
            write!(f, "; collective #{}", self.coll_seq)?;
        }
        write!(f, ")")
    }
}

/// What one rank says of itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankStatus {
    pub rank: u32,
    pub pid: u32,
    pub host: String,
    pub started: Option<OpDesc>,
    pub finished: Option<OpDesc>,
    /// Whether an operation is under way (started, not finished).
    pub busy: bool,
    /// How long the oldest unfinished operation has waited, in milliseconds.
    pub waiting_ms: u64,
}

/// An operation as logged: its shape and numbers (described, with strings, only when a
/// status is asked for: recording runs on every call).
#[derive(Clone, Copy)]
struct Logged {
    shape: OpShape,
    seq: u64,
    coll_seq: u64,
}

impl Logged {
    fn desc(&self) -> OpDesc {
        OpDesc::of(&self.shape, self.seq, self.coll_seq)
    }
}

/// The monotonic clock at its coarse resolution (a few milliseconds, ample for hang reports
/// and timeouts), since an arbitrary start: a fraction of the cost of `Instant::now`, which
/// every call here would otherwise pay.
fn coarse_now() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec it is given; the clock exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[derive(Default)]
struct LogState {
    seq: u64,
    coll_seq: u64,
    started: Option<Logged>,
    finished: Option<Logged>,
    /// When the oldest unfinished operation started ([`coarse_now`]).
    busy_since: Option<Duration>,
    /// When this rank last logged a report (its own or a peer's) for the current wait.
    reported: Option<Instant>,
}

/// The operations of one rank of one communicator.
pub struct OpLog {
    rank: u32,
    host: String,
    state: Mutex<LogState>,
}

impl OpLog {
    pub(crate) fn new(rank: u32) -> OpLog {
        OpLog { rank, host: crate::bootstrap::hostname(), state: Mutex::new(LogState::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that operations of these shapes start now.
    pub(crate) fn started(&self, tasks: &[OpShape]) {
        let mut s = self.lock();
        s.seq += tasks.len() as u64;
        s.coll_seq += tasks.iter().filter(|t| !t.p2p).count() as u64;
        // Only the latest is shown: the others are not described (this runs on every call).
        if let Some(last) = tasks.last() {
            s.started = Some(Logged { shape: *last, seq: s.seq, coll_seq: s.coll_seq });
        }
        if !tasks.is_empty() {
            // Host work starts when the last finished; device work is launched while earlier
            // launches may still run: the wait counts from the latest launch (the caller's
            // thread stops launching soon after its work stops completing).
            if s.busy_since.is_none() {
                s.reported = None;
            }
            s.busy_since = Some(coarse_now());
        }
    }

    /// Records that every operation started so far has finished (or failed).
    pub(crate) fn all_finished(&self) {
        let mut s = self.lock();
        if s.busy_since.take().is_some() {
            s.finished = s.started;
        }
    }

    pub fn status(&self) -> RankStatus {
        let s = self.lock();
        RankStatus {
            rank: self.rank,
            pid: std::process::id(),
            host: self.host.clone(),
            started: s.started.as_ref().map(Logged::desc),
            finished: s.finished.as_ref().map(Logged::desc),
            busy: s.busy_since.is_some(),
            waiting_ms: s.busy_since.map_or(0, |t| coarse_now().saturating_sub(t).as_millis() as u64),
        }
    }

    /// Whether an operation is under way (started, not finished).
    pub(crate) fn busy(&self) -> bool {
        self.lock().busy_since.is_some()
    }

    /// How long the oldest unfinished operation has waited.
    fn waiting(&self) -> Option<Duration> {
        self.lock().busy_since.map(|t| coarse_now().saturating_sub(t))
    }

    /// Whether a report was logged during the current wait (or, when idle, lately).
    fn reported_lately(&self, within: Duration) -> bool {
        self.lock().reported.is_some_and(|t| t.elapsed() < within)
    }

    fn mark_reported(&self) {
        self.lock().reported = Some(Instant::now());
    }
}

/// `RUSTCCL_HANG_REPORT_S`: how long an operation waits before a hang report. Read once:
/// waiting operations ask on every check.
pub fn hang_report_after() -> Duration {
    static AFTER: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *AFTER.get_or_init(|| crate::params::env_seconds_or("RUSTCCL_HANG_REPORT_S", Duration::from_secs(60)))
}

/// How each rank stands relative to the operation a report is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Waiting in the same operation.
    Same,
    /// Has not started it and is not in any operation.
    NeverArrived,
    /// In (or past) another operation.
    Different,
    /// Gave no answer: dead, gone, or unreachable.
    NoAnswer,
    /// Idle and past it (it finished that operation, or a report was asked for while
    /// nothing waits).
    Idle,
}

/// Classifies every rank against `reference` (the operation this rank waits in).
pub fn classify(reference: Option<&OpDesc>, statuses: &[Option<RankStatus>]) -> Vec<Standing> {
    statuses
        .iter()
        .map(|st| {
            let Some(st) = st else { return Standing::NoAnswer };
            let Some(r) = reference else {
                return if st.busy { Standing::Different } else { Standing::Idle };
            };
            let started = st.started.as_ref();
            if r.is_p2p() {
                return match (st.busy, started) {
                    (false, _) => Standing::NeverArrived,
                    (true, Some(s)) if s.is_p2p() => Standing::Same,
                    _ => Standing::Different,
                };
            }
            match started {
                Some(s) if st.busy && s.same_collective(r) => Standing::Same,
                Some(s) if !st.busy && s.coll_seq < r.coll_seq => Standing::NeverArrived,
                Some(s) if !st.busy && s.coll_seq == r.coll_seq && s.same_collective(r) => Standing::Idle,
                None => Standing::NeverArrived,
                _ => Standing::Different,
            }
        })
        .collect()
}

/// The text of a hang report; `me` is the rank making it.
pub fn format_report(hash: u64, me: u32, why: &str, statuses: &[Option<RankStatus>]) -> String {
    let mine = statuses.get(me as usize).and_then(|s| s.as_ref());
    let reference = mine.filter(|s| s.busy).and_then(|s| s.started.as_ref());
    let standing = classify(reference, statuses);
    let mut out = format!("rustccl hang report for communicator {hash:016x} ({} ranks), from rank {me}: {why}", statuses.len());
    if let Some(r) = reference {
        out += &format!("; rank {me} waits in {r}");
    }
    for (rank, (st, standing)) in statuses.iter().zip(&standing).enumerate() {
        out += &format!("\n  rank {rank}: ");
        let Some(st) = st else {
            out += "no answer (dead, gone, or not reachable)";
            continue;
        };
        out += &format!("pid {} on {}; ", st.pid, st.host);
        let show = |d: &Option<OpDesc>| d.as_ref().map_or("none".to_string(), |d| d.to_string());
        if st.busy {
            out += &format!("waiting {:.1} s in {}", st.waiting_ms as f64 / 1000.0, show(&st.started));
        } else {
            out += &format!("in no operation; last started {}", show(&st.started));
        }
        out += &format!("; last finished {}", show(&st.finished));
        out += match (standing, reference) {
            (Standing::NeverArrived, _) => "  <- never arrived",
            (Standing::Different, _) => "  <- in a different operation",
            (Standing::Idle, Some(_)) => "  <- finished it",
            _ => "",
        };
    }
    if reference.is_some() {
        let list = |want: Standing| {
            let v: Vec<String> = standing.iter().enumerate().filter(|(_, s)| **s == want).map(|(r, _)| r.to_string()).collect();
            if v.is_empty() { "none".to_string() } else { v.join(", ") }
        };
        out += &format!(
            "\n  never arrived: {}; in a different operation: {}; no answer: {}",
            list(Standing::NeverArrived),
            list(Standing::Different),
            list(Standing::NoAnswer)
        );
    }
    out
}

/// The watchdog's look at the route rings while device work waits (`waited`: how long the
/// oldest unfinished operation has waited, `None` when none): from [`ROUTE_LOOK_AFTER`] on, a
/// peer that ran this rank's current collective (the last it published) another way or with
/// another signature is a `Mismatch` naming both ranks and both ways — the look the host
/// backend's FIFO poller makes (`Board::check_current_route`). A peer that has not published
/// that collective yet is no error (it may still come). On GPUs this is what turns ranks
/// that disagree (one on symmetric windows, one on plain memory) into an error instead of
/// kernels waiting for each other until the operation timeout.
pub(crate) fn route_disagreement(board: Option<&crate::exec::host::board::Board>, waited: Option<Duration>) -> Result<()> {
    match (board, waited) {
        (Some(board), Some(waited)) if waited >= ROUTE_LOOK_AFTER => board.check_current_route(),
        _ => Ok(()),
    }
}

/// Communicators alive in this process, for the report signal.
static LIVE: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

/// Makes a new communicator known to the report signal.
pub(super) fn register(inner: &Arc<Inner>) {
    let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(inner));
    drop(live);
    install_signal_once();
}

fn install_signal_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let name = crate::params::env_str("RUSTCCL_HANG_REPORT_SIGNAL").unwrap_or_else(|| "USR1".into());
        let sig = match name.trim().trim_start_matches("SIG").to_ascii_uppercase().as_str() {
            "USR1" => libc::SIGUSR1,
            "USR2" => libc::SIGUSR2,
            "NONE" | "0" | "" => return,
            other => {
                tracing::warn!(target: "INIT", "RUSTCCL_HANG_REPORT_SIGNAL={other:?}: use USR1, USR2 or none; no report signal installed");
                return;
            }
        };
        // A signal the program already handles is left alone.
        // SAFETY: reads the current disposition only (a null new action).
        let current = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut old);
            old.sa_sigaction
        };
        if current != libc::SIG_DFL {
            tracing::info!(target: "INIT", "signal {name} already has a handler; hang reports by signal are off");
            return;
        }
        let mut signals = match signal_hook::iterator::Signals::new([sig]) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(target: "INIT", "cannot install the hang-report signal {name}: {e}");
                return;
            }
        };
        let _ = std::thread::Builder::new().name("rustccl-report-signal".into()).spawn(move || {
            for _ in signals.forever() {
                let comms: Vec<Arc<Inner>> =
                    LIVE.lock().unwrap_or_else(|p| p.into_inner()).iter().filter_map(|w| w.upgrade()).collect();
                for inner in comms {
                    let comm = Communicator { inner };
                    if let Err(e) = comm.hang_report() {
                        tracing::warn!(target: "INIT", "hang report on signal: {}", e.message);
                    }
                }
            }
        });
    });
}

impl Communicator {
    /// Wires the op log to the bootstrap (status answers, peers' reports); after init.
    pub(super) fn attach_health(inner: &Arc<Inner>) {
        let Some(bs) = inner.bootstrap.get() else { return };
        let weak = Arc::downgrade(inner);
        bs.set_status_provider(Box::new(move || {
            let status = weak.upgrade().map(|inner| Communicator { inner }.fresh_status());
            status.map(|s| serde_json::to_vec(&s).unwrap_or_default()).unwrap_or_default()
        }));
        let log = Arc::clone(&inner.ops);
        let (hash, rank) = (inner.comm_hash, inner.rank);
        bs.set_report_handler(Box::new(move |from, text| {
            let after = hang_report_after();
            if !log.reported_lately(after) {
                log.mark_reported();
                tracing::warn!(target: "INIT", "rank {rank}: hang report received from rank {from} (communicator {hash:016x}):\n{text}");
            }
        }));
    }

    /// Every rank's status, this one's first-hand (`None` for ranks that gave no answer).
    pub fn rank_statuses(&self) -> Result<Vec<Option<RankStatus>>> {
        let bs = self.ready("hang_report")?;
        let mut all: Vec<Option<RankStatus>> =
            bs.query_status(GATHER_WAIT).into_iter().map(|a| a.and_then(|b| serde_json::from_slice(&b).ok())).collect();
        all[self.inner.rank as usize] = Some(self.fresh_status());
        Ok(all)
    }

    /// This rank's status, after looking whether device work still marked as running has
    /// completed meanwhile (the watchdog looks only every few milliseconds).
    fn fresh_status(&self) -> RankStatus {
        if self.inner.ops.busy() {
            let _ = self.device_completed();
        }
        self.inner.ops.status()
    }

    /// Builds a hang report of this communicator now (gathered from every rank), logs it,
    /// sends it to the other ranks (which log it too) and returns its text.
    pub fn hang_report(&self) -> Result<String> {
        self.report("report requested")
    }

    fn report(&self, why: &str) -> Result<String> {
        let statuses = self.rank_statuses()?;
        let text = format_report(self.inner.comm_hash, self.inner.rank, why, &statuses);
        tracing::warn!(target: "INIT", "{text}");
        self.inner.ops.mark_reported();
        if let Some(bs) = self.inner.bootstrap.get() {
            bs.send_report(&text);
        }
        Ok(text)
    }

    /// Called while an operation waits: logs a hang report once it has waited past the
    /// threshold, and fails it with `Timeout` past the communicator's operation timeout.
    pub(crate) fn check_op_health(&self) -> Result<()> {
        let Some(waited) = self.inner.ops.waiting() else { return Ok(()) };
        let after = hang_report_after();
        if let Some(limit) = self.inner.config.op_timeout {
            if waited >= limit {
                let what = self.inner.ops.status().started.map_or("an operation".to_string(), |d| d.to_string());
                let why = format!("{what} did not complete within the operation timeout ({:.1} s)", limit.as_secs_f64());
                let report = self.report(&why).unwrap_or_else(|e| format!("(no report: {})", e.message));
                let summary = report.lines().last().unwrap_or_default().trim().to_string();
                return Err(Error::timeout(format!("{why}; {summary}. The communicator can now be aborted or shrunk")));
            }
        }
        if waited >= after && !self.inner.ops.reported_lately(after.max(waited)) {
            // From now on reports from peers are not logged here: this rank logs its own.
            self.inner.ops.mark_reported();
            let why = format!("an operation has waited {:.1} s (RUSTCCL_HANG_REPORT_S = {:.0})", waited.as_secs_f64(), after.as_secs_f64());
            if let Err(e) = self.report(&why) {
                tracing::warn!(target: "INIT", "rank {}: hang report failed: {}", self.inner.rank, e.message);
            }
        }
        Ok(())
    }

    /// The watchdog, while device work waits: [`route_disagreement`] of this communicator
    /// (its error ends the work as the operation timeout does: recorded, announced, kernels
    /// stopped).
    pub(crate) fn check_device_routes(&self) -> Result<()> {
        route_disagreement(self.board().map(|b| &**b), self.inner.ops.waiting())
    }

    /// This rank's operation log.
    pub(crate) fn op_log(&self) -> &OpLog {
        &self.inner.ops
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(seq: u64, coll_seq: u64, kind: &str, count: u64) -> OpDesc {
        OpDesc { seq, coll_seq, kind: kind.into(), rank: None, count, dtype: "Float32".into(), op: Some("sum".into()) }
    }

    fn st(rank: u32, started: Option<OpDesc>, busy: bool) -> Option<RankStatus> {
        Some(RankStatus { rank, pid: 100 + rank, host: "h".into(), finished: None, started, busy, waiting_ms: 61_000 })
    }

    #[test]
    fn ranks_are_classified_against_the_waiting_operation() {
        let r = desc(5, 5, "AllReduce", 1024);
        let statuses = vec![
            st(0, Some(r.clone()), true),
            st(1, Some(desc(4, 4, "AllReduce", 1024)), false),
            st(2, Some(desc(5, 5, "Broadcast", 1024)), true),
            None,
            st(4, Some(desc(5, 5, "AllReduce", 1024)), true),
            st(5, None, false),
            st(6, Some(desc(5, 5, "AllReduce", 1024)), false),
        ];
        let c = classify(Some(&r), &statuses);
        use Standing::*;
        assert_eq!(c, vec![Same, NeverArrived, Different, NoAnswer, Same, NeverArrived, Idle]);
        let text = format_report(0xabc, 0, "waited 61.0 s", &statuses);
        assert!(text.contains("never arrived: 1, 5; in a different operation: 2; no answer: 3"), "{text}");
        assert!(text.contains("rank 0 waits in #5 AllReduce(count 1024, Float32, sum; collective #5)"), "{text}");
        assert!(text.contains("rank 2: pid 102 on h; waiting 61.0 s in #5 Broadcast"), "{text}");
        assert!(text.contains("rank 6: pid 106 on h; in no operation; last started #5 AllReduce(count 1024, Float32, sum; collective #5); last finished none  <- finished it"), "{text}");
        assert_eq!(text.lines().count(), 1 + statuses.len() + 1);
    }

    #[test]
    fn p2p_waits_name_the_peer_that_is_idle() {
        let r = OpDesc { seq: 3, coll_seq: 1, kind: "Send".into(), rank: Some(1), count: 8, dtype: "Int32".into(), op: None };
        let c = classify(Some(&r), &[st(0, Some(r.clone()), true), st(1, None, false)]);
        assert_eq!(c, vec![Standing::Same, Standing::NeverArrived]);
        assert_eq!(r.to_string(), "#3 Send(count 8, Int32, to rank 1)");
    }

    /// The watchdog's look on a device communicator's route rings (made as at its init: only
    /// the rings, no entries): nothing before the grace or while the peer has not published;
    /// the peer's other way is a `Mismatch` naming both ranks and both ways; agreeing routes
    /// are fine.
    #[test]
    fn the_watchdog_finds_a_peer_that_took_another_route() {
        use crate::error::{ErrorKind, ResultCode};
        use crate::work::{OpSig, Way};
        let rings = crate::exec::host::board::tests::boards_made(2, false);
        assert!(!rings[0].has_ring(), "a device communicator's board carries only the route rings");
        let (r0, r1) = (Some(&*rings[0]), Some(&*rings[1]));
        let late = Some(ROUTE_LOOK_AFTER);
        // AllReduce of 1024 Float32, sum.
        let sig = OpSig(1 << 60 | 8 << 56 | 1 << 52 | 0xf_ffff << 32 | 1024);
        // Collective 1 agrees.
        rings[0].publish_route(1, Way::Planned, sig);
        rings[1].publish_route(1, Way::Planned, sig);
        assert!(route_disagreement(r0, late).is_ok() && route_disagreement(r1, late).is_ok());
        // Collective 2: rank 0 on symmetric windows, rank 1 not yet there.
        rings[0].publish_route(2, Way::SymmetricKernel, sig);
        assert!(route_disagreement(r0, late).is_ok(), "the peer has not published collective 2 yet");
        // Rank 1 takes the planner: both see it, after the grace only.
        rings[1].publish_route(2, Way::Planned, sig);
        assert!(route_disagreement(r0, Some(ROUTE_LOOK_AFTER / 2)).is_ok(), "within the grace");
        assert!(route_disagreement(r0, None).is_ok(), "no device work waits");
        for (me, peer, ring, mine, theirs) in [(0, 1, r0, "symmetric-kernel", "planner"), (1, 0, r1, "planner", "symmetric-kernel")] {
            let e = route_disagreement(ring, late).unwrap_err();
            assert_eq!((e.kind, e.code), (ErrorKind::Mismatch, ResultCode::InvalidUsage));
            for part in [format!("rank {peer} ran collective 2"), format!("on the {theirs} way"), format!("rank {me}"), format!("on the {mine} way"), "without symmetric windows".into()] {
                assert!(e.message.contains(&part), "rank {me}: {part:?} not in: {}", e.message);
            }
        }
        // Collective 3 agrees again on a fresh pair of entries.
        rings[0].publish_route(3, Way::SymmetricKernel, sig);
        rings[1].publish_route(3, Way::SymmetricKernel, sig);
        assert!(route_disagreement(r0, late).is_ok() && route_disagreement(r1, late).is_ok());
    }

    #[test]
    fn the_log_numbers_operations_and_tracks_waiting() {
        let log = OpLog::new(0);
        assert!(log.waiting().is_none());
        let shape = |kind, p2p: bool| OpShape { kind, rank: p2p.then_some(1), count: 4, dtype: "Float32", op: None, p2p };
        log.started(&[shape("AllReduce", false), shape("Send", true)]);
        let s = log.status();
        assert!(s.busy);
        assert_eq!((s.started.as_ref().unwrap().seq, s.started.as_ref().unwrap().coll_seq), (2, 1));
        assert!(log.waiting().is_some());
        log.all_finished();
        let s = log.status();
        assert!(!s.busy);
        assert_eq!(s.finished, s.started);
    }
}
