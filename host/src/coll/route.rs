//! The router: which way each task of a group runs (a single call is a group of one), decided
//! in one place, as NCCL's task preparation sorts every task into its symmetric, copy-engine
//! or legacy queue before anything runs.
//!
//! [`route`] is pure: it reads what the communicator is ([`Caps`], fixed for its life), what
//! the process was told ([`Settings`], read once), what the tuner said for the task, and where
//! the task's buffers lie ([`Placement`], looked up only when a rule asks). Every input but
//! the placement is the same on every rank of a communicator for the same call, and the
//! placement is too when the ranks call as NCCL requires (window buffers at the same offsets
//! on every rank, the same capture state); where a rank passes other buffers the ways'
//! agreement word finds it (see `exec::host`'s route ring) instead of a hang.
//!
//! The ways, tried in this order:
//! 1. [`Route::OneRank`]: a one-rank communicator, any task that leaves its input as it is
//!    (nothing in place, one copy out of place);
//! 2. [`Route::Planned`] with the tuner's choice where a tuner's table speaks for the task
//!    (NCCL asks the tuner first: its choice is not second-guessed by a faster way);
//! 3. [`Route::Symmetric`]: both buffers in symmetric windows — the copy engines (broadcast
//!    from [`CE_MIN`], all_gather when forced; never inside a graph capture), a symmetric
//!    kernel, or, on a backend whose collectives run on CPUs, their CPU twins;
//! 4. [`Route::SingleCopy`] and [`Route::Board`]: a communicator whose ranks share one host
//!    runs its small collectives on its board in shared memory, and its large all_gathers,
//!    all_reduces, reduce_scatters and broadcasts by copies straight between the ranks'
//!    buffers (the board carries their handshakes);
//! 5. [`Route::Planned`]: the planner (algorithm, protocol, channels), through the plan cache.
//!
//! `NCCL_ALGO` / `NCCL_PROTO` keep a task off the board (the user asked for an algorithm);
//! `NCCL_SHM_DISABLE=1` too (shared memory off); check mode (`RUSTCCL_CHECK_COLLECTIVES`)
//! sends everything to the planner, whose plans it checks; `RUSTCCL_SYM_KERNEL` forces or
//! turns off the symmetric kernels.

use rustccl_kernels::symmetric::SymKernel;

use super::plan::{Choice, ChosenBy};
use super::{CollKind, Task};
use crate::error::Result;

/// all_reduce takes the LL one-shot kernel up to this many bytes (one H200, 2 ranks,
/// 2026-12-02: 6.6 µs at 128 KiB against 7.3 for two shots; 10.0 at 512 KiB against 7.7).
pub const LL_MAX: u64 = 256 << 10;
/// broadcast takes the copy engines from this many bytes (one H200, 2 ranks: the ring 14 µs
/// at 4 MiB against 18; 62 at 32 MiB against 52).
pub const CE_MIN: u64 = 16 << 20;
/// A broadcast copies straight from the root's buffer from this many times the single-copy
/// threshold on (256 KiB by default): below it the FIFO chain is faster where the ranks
/// outnumber the cores (4 ranks on 2 cores, 2026-12-07: 32 KiB in 31 µs against 89, 128 KiB
/// 49 against 106), since it lets the root go on before the others have copied.
pub const BROADCAST_SINGLE_COPY_FACTOR: usize = 8;
/// The most data bytes of one call on the board (a slot of its ring).
pub const BOARD_MAX_BYTES: usize = crate::exec::host::board::MAX_BYTES;

/// The way a task runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Route {
    /// One rank: nothing in place, one copy out of place.
    OneRank,
    /// On symmetric windows.
    Symmetric(SymWay),
    /// The board of small collectives in shared memory.
    Board,
    /// Copies straight between the ranks' buffers (on the board): large all_gathers,
    /// all_reduces, reduce_scatters and broadcasts.
    SingleCopy,
    /// The planner, with the choice already made for the task, if one was (the tuner's).
    Planned(Option<Choice>),
}

/// How a task on symmetric windows runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SymWay {
    Kernel(SymKernel),
    CopyEngine,
    /// The CPU twins of the kernels (backends whose collectives run on CPUs).
    Cpu,
}

/// How symmetric collectives run on a communicator: its executor's answer
/// (`exec::executor::Executor::symmetric`).
pub(crate) use crate::exec::executor::SymmetricExec as SymExec;

/// What the router knows of a communicator, fixed for its life and the same on every rank.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caps {
    pub nranks: u32,
    pub symmetric: SymExec,
    /// The board, where every rank made it at init (`None`: ranks on several hosts, a device
    /// backend, or it could not be made on some rank).
    pub board: Option<BoardCaps>,
}

/// What the board offers (agreed by every rank when it was made).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BoardCaps {
    /// Every rank may read every peer's memory (`process_vm_readv`): single copies work.
    pub single_copy: bool,
}

/// `RUSTCCL_SYM_KERNEL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SymSetting {
    /// The measured choice.
    Auto,
    /// No symmetric way at all.
    Off,
    /// This kernel where it applies (the measured choice elsewhere).
    Kernel(SymKernel),
    /// The copy engines for all_gather and broadcast at every size.
    CopyEngines,
}

impl SymSetting {
    /// Reads a value of `RUSTCCL_SYM_KERNEL`: `Err` names what is accepted.
    pub(crate) fn parse(v: &str) -> std::result::Result<SymSetting, String> {
        let v = v.trim().to_ascii_lowercase();
        match v.as_str() {
            "" | "auto" => Ok(SymSetting::Auto),
            "off" | "0" | "none" => Ok(SymSetting::Off),
            "ce" => Ok(SymSetting::CopyEngines),
            k => SymKernel::ALL
                .iter()
                .find(|s| s.short() == k)
                .map(|&s| SymSetting::Kernel(s))
                .ok_or_else(|| format!("RUSTCCL_SYM_KERNEL={v}: not one of auto, off, ll, ld, rsag, ag, rs, ce; ignored")),
        }
    }
}

/// What the process was told (the environment, read once), the same on every rank.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// `RUSTCCL_CHECK_COLLECTIVES`: every task to the planner, whose plans it checks.
    pub check: bool,
    /// `NCCL_ALGO` or `NCCL_PROTO` is set.
    pub algo_forced: bool,
    /// `NCCL_SHM_DISABLE=1`.
    pub shm_disabled: bool,
    pub sym: SymSetting,
    /// `RUSTCCL_HOST_SMALL_BYTES`: the most bytes per rank a call puts on the board (0: never).
    pub board_bytes: Option<usize>,
    /// `RUSTCCL_HOST_SINGLE_COPY_BYTES`: the least bytes per rank of a single copy (0: never).
    pub single_copy_min: usize,
}

impl Settings {
    /// The process's settings.
    pub(crate) fn get() -> &'static Settings {
        static S: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();
        S.get_or_init(|| {
            use crate::params::{env_int_or, env_str};
            let sym = match env_str("RUSTCCL_SYM_KERNEL").map(|v| SymSetting::parse(&v)) {
                None => SymSetting::Auto,
                Some(Ok(s)) => s,
                Some(Err(msg)) => {
                    tracing::warn!(target: "INIT", "{msg}");
                    SymSetting::Auto
                }
            };
            Settings {
                check: super::check::enabled(),
                algo_forced: super::plan::forced(),
                shm_disabled: env_int_or("NCCL_SHM_DISABLE", 0) == 1,
                sym,
                board_bytes: crate::exec::host::board::bytes_setting(),
                single_copy_min: crate::exec::host::single_copy::threshold(),
            }
        })
    }

    /// The most bytes per rank a call of `task`'s kind puts on the board: the setting, else
    /// where the board stops being faster than the FIFOs (2 ranks on the 2-core development
    /// machine, 2026-12-02: all_reduce in place at 8 KiB 2.2 µs against 8.2 and at 32 KiB 9.4
    /// against 22, at 64 KiB out of place 16.8 against 12.8; broadcast and all_gather the same
    /// from 4 KiB on): a whole slot for reductions, 4 KiB for copies.
    pub(crate) fn board_limit(&self, reduces: bool) -> usize {
        self.board_bytes.unwrap_or(if reduces { BOARD_MAX_BYTES } else { 4 << 10 })
    }
}

/// Where a task's buffers lie, asked only when a rule needs it (the look-ups cost).
pub(crate) trait Placement {
    /// Whether both buffers the rank uses lie in symmetric windows.
    fn symmetric(&mut self) -> bool;
    /// Whether the task's stream is capturing a graph.
    fn capturing(&mut self) -> Result<bool>;
}

/// The way `task` runs (see the module's documentation). `tuner`: the tuner's choice for it,
/// where a tuner is loaded and was asked.
pub(crate) fn route(task: &Task, caps: &Caps, place: &mut dyn Placement, tuner: Option<Choice>, settings: &Settings) -> Result<Route> {
    if caps.nranks == 1 {
        let leaves_input = task.kind.is_p2p() || super::plan::one_rank_identity(task);
        return Ok(if leaves_input && !settings.check { Route::OneRank } else { Route::Planned(None) });
    }
    let planned = Route::Planned(tuner);
    if !may_go_around_planner(task, settings) || tuner.is_some_and(|c| c.by == ChosenBy::Tuner) {
        return Ok(planned);
    }
    if let Some(way) = symmetric(task, caps, place, settings)? {
        return Ok(Route::Symmetric(way));
    }
    if let Some(board) = caps.board.filter(|_| !settings.algo_forced && !settings.shm_disabled) {
        let (send, _) = task.kind.spec().extents(task.count, caps.nranks as usize, 0, 0);
        let Some(bytes) = send.checked_mul(task.dtype.size()) else { return Ok(planned) };
        let single_min = match task.kind {
            CollKind::Broadcast { .. } => settings.single_copy_min.saturating_mul(BROADCAST_SINGLE_COPY_FACTOR),
            _ => settings.single_copy_min,
        };
        let single = board.single_copy && single_min > 0 && bytes >= single_min;
        if single && matches!(task.kind, CollKind::AllGather) {
            return Ok(Route::SingleCopy);
        }
        if bytes <= settings.board_limit(task.kind.reduces()) {
            return Ok(Route::Board);
        }
        if single && matches!(task.kind, CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Broadcast { .. }) {
            return Ok(Route::SingleCopy);
        }
    }
    Ok(planned)
}

/// Whether `task` may go any way around the planner: some data, not point-to-point, not in
/// check mode (which checks every call's plan), no per-call options that steer the planner
/// (an algorithm selection or channel bounds of `nccl*Config`: the choice asked for is the
/// planner's to make).
fn may_go_around_planner(task: &Task, settings: &Settings) -> bool {
    task.count > 0 && !task.kind.is_p2p() && !settings.check && !task.options.steer_planner()
}

/// Whether a task the router sent to the planner ([`Route::Planned`]) may be served by the
/// planned route's memo (`coll::planned`), as far as the router's rules go: a communicator of
/// several ranks and a task that could go around the planner. The memo's own conditions (the
/// backend's, the process's, no tuner, no profiler) are the memo's.
pub(crate) fn memo_may_serve(task: &Task, nranks: u32, settings: &Settings) -> bool {
    nranks > 1 && may_go_around_planner(task, settings)
}

/// The symmetric way of `task`, if it takes one.
fn symmetric(task: &Task, caps: &Caps, place: &mut dyn Placement, settings: &Settings) -> Result<Option<SymWay>> {
    if caps.symmetric == SymExec::None || settings.sym == SymSetting::Off {
        return Ok(None);
    }
    if !matches!(task.kind, CollKind::AllReduce | CollKind::AllGather | CollKind::ReduceScatter | CollKind::Broadcast { .. }) {
        return Ok(None);
    }
    if caps.symmetric == SymExec::Cpu {
        return Ok(place.symmetric().then_some(SymWay::Cpu));
    }
    let part = (task.count * task.dtype.size()) as u64;
    let n = caps.nranks as usize;
    if copy_engine(&task.kind, part, settings.sym) && place.symmetric() && !place.capturing()? {
        return Ok(Some(SymWay::CopyEngine));
    }
    Ok(match choose_kernel(&task.kind, part, n, task.send == task.recv, settings.sym) {
        Some(k) if place.symmetric() => Some(SymWay::Kernel(k)),
        _ => None,
    })
}

/// The kernel for a collective of `kind` on `bytes` (all_reduce: the buffer; all_gather and
/// reduce_scatter: one rank's part) with `nranks` ranks, if a symmetric one takes it:
/// all_reduce one shot through LL lines up to [`LL_MAX`] (and what fits the LL scratch), two
/// shots above; the one-shot load kernel only when forced, and never in place (a rank would
/// overwrite its input while a peer still reads it).
pub(crate) fn choose_kernel(kind: &CollKind, bytes: u64, nranks: usize, in_place: bool, sym: SymSetting) -> Option<SymKernel> {
    let forced = match sym {
        SymSetting::Off => return None,
        SymSetting::Kernel(k) => Some(k),
        _ => None,
    };
    match kind {
        CollKind::AllReduce => {
            let ll_fits = bytes <= SymKernel::ll_max_bytes(nranks);
            Some(match forced {
                Some(SymKernel::AllReduceLl) if ll_fits => SymKernel::AllReduceLl,
                Some(SymKernel::AllReduceLd) if !in_place => SymKernel::AllReduceLd,
                Some(SymKernel::AllReduceRsAg) => SymKernel::AllReduceRsAg,
                _ if bytes <= LL_MAX && ll_fits => SymKernel::AllReduceLl,
                _ => SymKernel::AllReduceRsAg,
            })
        }
        CollKind::AllGather => Some(SymKernel::AllGather),
        CollKind::ReduceScatter => Some(SymKernel::ReduceScatter),
        _ => None,
    }
}

/// Whether a collective of `kind` on `bytes` (per rank for all_gather) takes the copy engines
/// (outside graph captures): broadcast from [`CE_MIN`], all_gather only when forced (its kernel
/// was faster at every size measured).
pub(crate) fn copy_engine(kind: &CollKind, bytes: u64, sym: SymSetting) -> bool {
    match (kind, sym) {
        (_, SymSetting::Off) => false,
        (CollKind::AllGather | CollKind::Broadcast { .. }, SymSetting::CopyEngines) => true,
        (CollKind::Broadcast { .. }, SymSetting::Auto) => bytes >= CE_MIN,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{DevicePtr, Stream};
    use crate::coll::{ReduceOp, Scalar};
    use crate::error::Error;
    use crate::types::DataType;

    /// A placement with fixed answers, counting the look-ups.
    #[derive(Default)]
    struct Place {
        symmetric: bool,
        capturing: bool,
        lookups: u32,
        capture_fails: bool,
    }

    impl Placement for Place {
        fn symmetric(&mut self) -> bool {
            self.lookups += 1;
            self.symmetric
        }
        fn capturing(&mut self) -> Result<bool> {
            self.lookups += 1;
            if self.capture_fails {
                return Err(Error::internal("capture query failed"));
            }
            Ok(self.capturing)
        }
    }

    fn task(kind: CollKind, count: usize) -> Task {
        Task { kind, send: DevicePtr(0x1000), recv: DevicePtr(0x8000_0000), count, dtype: DataType::Float32, op: ReduceOp::Sum, stream: Stream(0), profile: Default::default(), options: Default::default() }
    }

    fn settings() -> Settings {
        Settings { check: false, algo_forced: false, shm_disabled: false, sym: SymSetting::Auto, board_bytes: None, single_copy_min: 256 << 10 }
    }

    const HOST: Caps = Caps { nranks: 4, symmetric: SymExec::Cpu, board: Some(BoardCaps { single_copy: true }) };
    const GPU: Caps = Caps { nranks: 2, symmetric: SymExec::Kernels, board: None };

    fn choice(by: ChosenBy) -> Choice {
        Choice { algo: rustccl_plugin_api::Algorithm::Ring, proto: rustccl_plugin_api::Protocol::Simple, channels: 2, chunk_bytes: 1 << 20, time_us: 1.0, by }
    }

    fn go(t: &Task, caps: &Caps, place: &mut Place, tuner: Option<Choice>, s: &Settings) -> Route {
        route(t, caps, place, tuner, s).unwrap()
    }

    #[test]
    fn one_rank_takes_every_task_that_leaves_its_input_and_the_planner_the_rest() {
        let caps = Caps { nranks: 1, ..HOST };
        let s = settings();
        for kind in [CollKind::AllReduce, CollKind::AllGather, CollKind::Broadcast { root: 0 }, CollKind::Send { peer: 0 }, CollKind::Recv { peer: 0 }] {
            assert_eq!(go(&task(kind.clone(), 10), &caps, &mut Place::default(), None, &s), Route::OneRank, "{kind:?}");
        }
        let mut premul = task(CollKind::AllReduce, 10);
        premul.op = ReduceOp::PreMulSum(Scalar::Host(2.0));
        assert_eq!(go(&premul, &caps, &mut Place::default(), None, &s), Route::Planned(None), "a scalar that computes");
        premul.op = ReduceOp::PreMulSum(Scalar::Host(1.0));
        assert_eq!(go(&premul, &caps, &mut Place::default(), None, &s), Route::OneRank);
        let check = Settings { check: true, ..s };
        assert_eq!(go(&task(CollKind::AllReduce, 10), &caps, &mut Place::default(), None, &check), Route::Planned(None), "check mode checks plans");
    }

    #[test]
    fn the_tuner_that_speaks_wins_and_its_choice_goes_to_the_planner() {
        let s = settings();
        let t = task(CollKind::AllReduce, 8);
        let mut on_windows = Place { symmetric: true, ..Default::default() };
        let tuned = choice(ChosenBy::Tuner);
        assert_eq!(go(&t, &HOST, &mut on_windows, Some(tuned), &s), Route::Planned(Some(tuned)));
        assert_eq!(on_windows.lookups, 0, "no look-up when the tuner decided");
        // A silent tuner: rustccl's ways stand, and the choice goes along where it plans.
        let silent = choice(ChosenBy::Rustccl);
        assert_eq!(go(&t, &HOST, &mut on_windows, Some(silent), &s), Route::Symmetric(SymWay::Cpu));
        let big = task(CollKind::Reduce { root: 0 }, 1 << 20);
        assert_eq!(go(&big, &HOST, &mut Place::default(), Some(silent), &s), Route::Planned(Some(silent)));
        assert_eq!(go(&task(CollKind::AllReduce, 1 << 20), &HOST, &mut Place::default(), Some(silent), &s), Route::SingleCopy);
    }

    #[test]
    fn windows_take_the_symmetric_ways_by_kind_and_size() {
        let s = settings();
        let win = || Place { symmetric: true, ..Default::default() };
        assert_eq!(go(&task(CollKind::AllReduce, 2), &GPU, &mut win(), None, &s), Route::Symmetric(SymWay::Kernel(SymKernel::AllReduceLl)));
        assert_eq!(go(&task(CollKind::AllReduce, 1 << 20), &GPU, &mut win(), None, &s), Route::Symmetric(SymWay::Kernel(SymKernel::AllReduceRsAg)));
        assert_eq!(go(&task(CollKind::AllGather, 4), &GPU, &mut win(), None, &s), Route::Symmetric(SymWay::Kernel(SymKernel::AllGather)));
        assert_eq!(go(&task(CollKind::ReduceScatter, 4), &GPU, &mut win(), None, &s), Route::Symmetric(SymWay::Kernel(SymKernel::ReduceScatter)));
        // Broadcast: the copy engines from CE_MIN, outside captures; else the planner.
        let bcast = |n: usize| task(CollKind::Broadcast { root: 1 }, n);
        assert_eq!(go(&bcast(8), &GPU, &mut win(), None, &s), Route::Planned(None));
        assert_eq!(go(&bcast((CE_MIN / 4) as usize), &GPU, &mut win(), None, &s), Route::Symmetric(SymWay::CopyEngine));
        let mut captured = Place { symmetric: true, capturing: true, ..Default::default() };
        assert_eq!(go(&bcast((CE_MIN / 4) as usize), &GPU, &mut captured, None, &s), Route::Planned(None));
        let mut failing = Place { symmetric: true, capture_fails: true, ..Default::default() };
        assert!(route(&bcast((CE_MIN / 4) as usize), &GPU, &mut failing, None, &s).is_err(), "a failed query is an error, not a guess");
        // Plain buffers: the planner; CPU backends: the CPU twin for every kind it has.
        assert_eq!(go(&task(CollKind::AllReduce, 2), &GPU, &mut Place::default(), None, &s), Route::Planned(None));
        assert_eq!(go(&bcast(8), &Caps { board: None, ..HOST }, &mut win(), None, &s), Route::Symmetric(SymWay::Cpu));
        // Reduce has no symmetric way.
        assert_eq!(go(&task(CollKind::Reduce { root: 0 }, 2), &Caps { board: None, ..HOST }, &mut win(), None, &s), Route::Planned(None));
        // No symmetric execution on the backend (AMD): no look-up at all.
        let mut p = win();
        assert_eq!(go(&task(CollKind::AllReduce, 2), &Caps { symmetric: SymExec::None, ..GPU }, &mut p, None, &s), Route::Planned(None));
        assert_eq!(p.lookups, 0);
    }

    #[test]
    fn all_reduce_takes_ll_then_two_shots() {
        let choose = |kind: &CollKind, bytes, nranks, in_place| choose_kernel(kind, bytes, nranks, in_place, SymSetting::Auto);
        let copy_engine = |kind: &CollKind, bytes| copy_engine(kind, bytes, SymSetting::Auto);
        assert_eq!(choose(&CollKind::AllReduce, 8, 2, false), Some(SymKernel::AllReduceLl));
        assert_eq!(choose(&CollKind::AllReduce, LL_MAX, 2, true), Some(SymKernel::AllReduceLl));
        assert_eq!(choose(&CollKind::AllReduce, LL_MAX + 8, 2, false), Some(SymKernel::AllReduceRsAg));
        assert_eq!(choose(&CollKind::AllReduce, 1 << 30, 8, true), Some(SymKernel::AllReduceRsAg));
        // The LL scratch of a half holds nranks regions: many ranks take two shots earlier.
        let ranks = 1024;
        assert!(SymKernel::ll_max_bytes(ranks) < LL_MAX);
        assert_eq!(choose(&CollKind::AllReduce, LL_MAX, ranks, false), Some(SymKernel::AllReduceRsAg));
        assert_eq!(choose(&CollKind::AllGather, 1 << 30, 8, false), Some(SymKernel::AllGather));
        assert_eq!(choose(&CollKind::ReduceScatter, 4, 8, true), Some(SymKernel::ReduceScatter));
        assert_eq!(choose(&CollKind::Broadcast { root: 0 }, 4, 8, false), None);
        assert!(copy_engine(&CollKind::Broadcast { root: 0 }, CE_MIN));
        assert!(!copy_engine(&CollKind::Broadcast { root: 0 }, CE_MIN - 1));
        assert!(!copy_engine(&CollKind::AllGather, 1 << 30));
    }

    #[test]
    fn rustccl_sym_kernel_forces_or_turns_off() {
        let s = settings();
        let win = || Place { symmetric: true, ..Default::default() };
        let with = |sym| Settings { sym, ..s };
        let ar = |n| task(CollKind::AllReduce, n);
        assert_eq!(go(&ar(2), &GPU, &mut win(), None, &with(SymSetting::Off)), Route::Planned(None));
        assert_eq!(go(&ar(2), &GPU, &mut win(), None, &with(SymSetting::Kernel(SymKernel::AllReduceRsAg))), Route::Symmetric(SymWay::Kernel(SymKernel::AllReduceRsAg)));
        assert_eq!(go(&ar(2), &GPU, &mut win(), None, &with(SymSetting::Kernel(SymKernel::AllReduceLd))), Route::Symmetric(SymWay::Kernel(SymKernel::AllReduceLd)));
        let mut in_place = ar(2);
        in_place.recv = in_place.send;
        assert_eq!(go(&in_place, &GPU, &mut win(), None, &with(SymSetting::Kernel(SymKernel::AllReduceLd))), Route::Symmetric(SymWay::Kernel(SymKernel::AllReduceLl)), "never the load kernel in place");
        let huge = ar(1 << 24);
        assert_eq!(go(&huge, &GPU, &mut win(), None, &with(SymSetting::Kernel(SymKernel::AllReduceLl))), Route::Symmetric(SymWay::Kernel(SymKernel::AllReduceRsAg)), "LL only where it fits");
        assert_eq!(go(&task(CollKind::AllGather, 2), &GPU, &mut win(), None, &with(SymSetting::CopyEngines)), Route::Symmetric(SymWay::CopyEngine));
        assert_eq!(go(&task(CollKind::Broadcast { root: 0 }, 2), &GPU, &mut win(), None, &with(SymSetting::CopyEngines)), Route::Symmetric(SymWay::CopyEngine));
        assert_eq!(SymSetting::parse(" LL "), Ok(SymSetting::Kernel(SymKernel::AllReduceLl)));
        assert_eq!(SymSetting::parse("off"), Ok(SymSetting::Off));
        assert_eq!(SymSetting::parse("ce"), Ok(SymSetting::CopyEngines));
        assert!(SymSetting::parse("fast").unwrap_err().contains("not one of"));
    }

    #[test]
    fn the_board_takes_small_calls_and_single_copies_large_gathers_reductions_and_broadcasts() {
        let s = settings();
        let ar = |n| task(CollKind::AllReduce, n);
        assert_eq!(go(&ar(8), &HOST, &mut Place::default(), None, &s), Route::Board);
        assert_eq!(go(&ar(BOARD_MAX_BYTES / 4), &HOST, &mut Place::default(), None, &s), Route::Board);
        assert_eq!(go(&ar(BOARD_MAX_BYTES / 4 + 1), &HOST, &mut Place::default(), None, &s), Route::Planned(None));
        // Copies: 4 KiB, counted as the most any rank sends (a reduce_scatter's whole buffer).
        assert_eq!(go(&task(CollKind::AllGather, 1024), &HOST, &mut Place::default(), None, &s), Route::Board);
        assert_eq!(go(&task(CollKind::AllGather, 1025), &HOST, &mut Place::default(), None, &s), Route::Planned(None));
        assert_eq!(go(&task(CollKind::ReduceScatter, BOARD_MAX_BYTES / 16), &HOST, &mut Place::default(), None, &s), Route::Board);
        assert_eq!(go(&task(CollKind::ReduceScatter, BOARD_MAX_BYTES / 16 + 1), &HOST, &mut Place::default(), None, &s), Route::Planned(None));
        let ag = task(CollKind::AllGather, 64 << 10);
        assert_eq!(go(&task(CollKind::AllGather, 8 << 10), &HOST, &mut Place::default(), None, &Settings { single_copy_min: 32 << 10, ..s }), Route::SingleCopy);
        assert_eq!(go(&ag, &HOST, &mut Place::default(), None, &s), Route::SingleCopy);
        let no_read = Caps { board: Some(BoardCaps { single_copy: false }), ..HOST };
        assert_eq!(go(&ag, &no_read, &mut Place::default(), None, &s), Route::Planned(None));
        // The other large collectives too, from the same size of a rank's send buffer.
        let bcast = task(CollKind::Broadcast { root: 1 }, 2 << 20);
        assert_eq!(go(&bcast, &HOST, &mut Place::default(), None, &Settings { single_copy_min: (1 << 20) + 1, ..s }), Route::Planned(None), "broadcast from 8 times the threshold");
        assert_eq!(go(&bcast, &HOST, &mut Place::default(), None, &Settings { single_copy_min: 1 << 20, ..s }), Route::SingleCopy);
        assert_eq!(go(&bcast, &no_read, &mut Place::default(), None, &Settings { single_copy_min: 1 << 20, ..s }), Route::Planned(None));
        assert_eq!(go(&ar(64 << 10), &HOST, &mut Place::default(), None, &s), Route::SingleCopy);
        assert_eq!(go(&ar((64 << 10) - 1), &HOST, &mut Place::default(), None, &s), Route::Planned(None));
        assert_eq!(go(&ar(64 << 10), &no_read, &mut Place::default(), None, &s), Route::Planned(None));
        assert_eq!(go(&task(CollKind::ReduceScatter, 16 << 10), &HOST, &mut Place::default(), None, &s), Route::SingleCopy, "4 ranks × 64 KiB sent");
        assert_eq!(go(&task(CollKind::Reduce { root: 0 }, 64 << 10), &HOST, &mut Place::default(), None, &s), Route::Planned(None), "reduce never single-copies");
        // What keeps a task off it: no board, NCCL_ALGO/PROTO, NCCL_SHM_DISABLE, the size setting.
        for (caps, s2) in [
            (Caps { board: None, ..HOST }, s),
            (HOST, Settings { algo_forced: true, ..s }),
            (HOST, Settings { shm_disabled: true, ..s }),
            (HOST, Settings { board_bytes: Some(0), single_copy_min: 0, ..s }),
        ] {
            assert_eq!(go(&ar(8), &caps, &mut Place::default(), None, &s2), Route::Planned(None), "{caps:?} {s2:?}");
        }
        assert_eq!(go(&ar(100), &HOST, &mut Place::default(), None, &Settings { board_bytes: Some(256), ..s }), Route::Planned(None));
    }

    #[test]
    fn windows_come_before_the_board_and_empty_or_point_to_point_tasks_plan() {
        let s = settings();
        let mut win = Place { symmetric: true, ..Default::default() };
        assert_eq!(go(&task(CollKind::AllReduce, 8), &HOST, &mut win, None, &s), Route::Symmetric(SymWay::Cpu));
        let mut p = Place { symmetric: true, ..Default::default() };
        for t in [task(CollKind::AllReduce, 0), task(CollKind::Send { peer: 1 }, 8), task(CollKind::Recv { peer: 1 }, 8)] {
            assert_eq!(go(&t, &HOST, &mut p, None, &s), Route::Planned(None), "{t:?}");
        }
        assert_eq!(p.lookups, 0);
        let check = Settings { check: true, ..s };
        assert_eq!(go(&task(CollKind::AllReduce, 8), &HOST, &mut win, None, &check), Route::Planned(None));
    }

    #[test]
    fn the_same_inputs_give_the_same_route_on_every_rank() {
        // The router reads nothing of the rank itself: ranks that agree on the inputs agree
        // on the route, whatever their rank (a broadcast's root included).
        let s = settings();
        for root in 0..4 {
            let t = task(CollKind::Broadcast { root }, 16);
            assert_eq!(go(&t, &HOST, &mut Place::default(), None, &s), Route::Board);
        }
    }
}
