//! Per-call options of one collective: what NCCL 2.31's `nccl*Config` calls carry in their
//! `ncclCollConfig_t` and the typed API's `CollConfig`, in the form the planner reads them.
//!
//! An operation takes its options from the calling thread's scope ([`scoped`]): the C API's
//! `ncclAllReduceConfig` runs the plain `Communicator::all_reduce` inside one, so every task
//! the call submits (the sends and receives of an AlltoAll too) carries them, and a plain
//! call outside a scope carries the defaults, which change nothing.
//!
//! What the planner honours: the channel bounds (NCCL's `minCTAs` / `maxCTAs`, within the
//! communicator's own limits) and the algorithm selection (which (algorithm, protocol) pairs
//! it may choose among; a task with either goes to the planner, never around it, so that the
//! choice is the one asked for). The profiler tag rides along to the observer's descriptors.
//!
//! Algorithm selections use NCCL's names and grammar: a name is a case-insensitive prefix of
//! one of NCCL's algorithm names (`RING` = `RING_LL`, `RING_LL128`, `RING_SIMPLE`; `tree_ll`;
//! `SYMK_...`), `,` joins alternatives, `+` keeps what two names share, `^` in front of a
//! name means every other one; spaces are ignored.

use std::cell::Cell;

use rustccl_plugin_api::{Algorithm, Protocol};

use crate::error::{Error, Result};
use crate::spec::Collective;

/// The collectives a name of NCCL's selection applies to (bits of [`coll_bit`]).
const AR: u8 = 1;
const AG: u8 = 2;
const RS: u8 = 4;
const BC: u8 = 8;
const RD: u8 = 16;
const ALL5: u8 = AR | AG | RS | BC | RD;

/// One name of NCCL 2.31's algorithm selection: the collectives it exists for, and the
/// (algorithm, protocol) of rustccl's planner it means (none for what rustccl has no
/// planner program for: CollNet, NVLS, PAT, and the symmetric kernels, which the router
/// picks by the buffers, not by name).
struct Name {
    name: &'static str,
    colls: u8,
    pair: Option<(Algorithm, Protocol)>,
}

const fn n(name: &'static str, colls: u8, pair: Option<(Algorithm, Protocol)>) -> Name {
    Name { name, colls, pair }
}

const fn p(a: Algorithm, pr: Protocol) -> Option<(Algorithm, Protocol)> {
    Some((a, pr))
}

/// NCCL's names, in its order (the bit of a name is its index).
const NAMES: &[Name] = &[
    n("TREE_LL", AR, p(Algorithm::Tree, Protocol::Ll)),
    n("TREE_LL128", AR, p(Algorithm::Tree, Protocol::Ll128)),
    n("TREE_SIMPLE", AR, p(Algorithm::Tree, Protocol::Simple)),
    n("RING_LL", ALL5, p(Algorithm::Ring, Protocol::Ll)),
    n("RING_LL128", ALL5, p(Algorithm::Ring, Protocol::Ll128)),
    n("RING_SIMPLE", ALL5, p(Algorithm::Ring, Protocol::Simple)),
    n("COLLNET_DIRECT_SIMPLE", AR | AG | RS, None),
    n("COLLNET_CHAIN_SIMPLE", AR, None),
    n("NVLS_SIMPLE", AR | AG | RS, None),
    n("NVLSTREE_SIMPLE", AR, None),
    n("PAT_SIMPLE", AG | RS, None),
    n("SYMK_AGxLL_R", AR, None),
    n("SYMK_AGxLLMC_R", AR, None),
    n("SYMK_RSxTmaLD_AGxTmaST", AR, None),
    n("SYMK_RSxLD_AGxST", AR, None),
    n("SYMK_RSxLDMC_AGxSTMC", AR, None),
    n("SYMK_LL", AG | RS, None),
    n("SYMK_LLMC", AG, None),
    n("SYMK_TmaST", AG, None),
    n("SYMK_ST", AG, None),
    n("SYMK_TmaSTMC", AG, None),
    n("SYMK_STMC", AG, None),
    n("SYMK_RailRing_LsaSTMC", AG, None),
    n("SYMK_TmaLD", RS, None),
    n("SYMK_LD", RS, None),
    n("SYMK_LDMC", RS, None),
    n("SYMK_RailA2A_LsaLD", RS, None),
    n("SYMK_RailA2A_LsaLDMC", RS, None),
];

/// Which of [`NAMES`] a collective may use (NCCL's; AlltoAll, Gather and Scatter have none:
/// a selection for them can never be honoured).
fn coll_bit(c: Collective) -> u8 {
    match c {
        Collective::AllReduce => AR,
        Collective::AllGather => AG,
        Collective::ReduceScatter => RS,
        Collective::Broadcast => BC,
        Collective::Reduce => RD,
        _ => 0,
    }
}

fn all_names() -> u64 {
    (1u64 << NAMES.len()) - 1
}

/// The names `tag` is a prefix of (case-insensitive); 0 if none.
fn names_of(tag: &str) -> u64 {
    NAMES
        .iter()
        .enumerate()
        .filter(|(_, e)| e.name.len() >= tag.len() && e.name[..tag.len()].eq_ignore_ascii_case(tag))
        .fold(0, |m, (i, _)| m | 1 << i)
}

/// A set of NCCL's algorithm names, parsed from a selection ([`AlgoSelection::parse`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlgoSelection(u64);

impl AlgoSelection {
    /// Parses NCCL's selection grammar (see the module's documentation). `Ok(None)`: empty,
    /// automatic selection. `Err` says what is wrong: an unknown name, a `^` or `+` with no
    /// name, or a `+` of names that share nothing.
    pub fn parse(sel: &str) -> std::result::Result<Option<AlgoSelection>, String> {
        let s: String = sel.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        if s.is_empty() {
            return Ok(None);
        }
        let mut mask = 0u64;
        for term in s.split(',').filter(|t| !t.is_empty()) {
            let mut term_mask = all_names();
            let mut factors = 0;
            for factor in term.split('+').filter(|f| !f.is_empty()) {
                let (neg, tag) = match factor.strip_prefix('^') {
                    Some(t) => (true, t),
                    None => (false, factor),
                };
                if tag.is_empty() {
                    return Err(format!("\"{term}\": a '^' must be followed by a name"));
                }
                let m = names_of(tag);
                if m == 0 {
                    return Err(format!("\"{tag}\" is not an algorithm name (names start like RING, TREE, RING_LL128, NVLS, PAT, SYMK)"));
                }
                term_mask &= if neg { all_names() & !m } else { m };
                factors += 1;
            }
            if factors == 0 {
                return Err(format!("\"{term}\" has no algorithm name"));
            }
            if term_mask == 0 {
                return Err(format!("\"{term}\" selects nothing (its names share no algorithm)"));
            }
            mask |= term_mask;
        }
        Ok(Some(AlgoSelection(mask)))
    }

    /// The (algorithm, protocol) pairs of the planner it allows for `coll`.
    fn pairs(self, coll: Collective) -> PairSet {
        let bit = coll_bit(coll);
        let mut set = PairSet::default();
        for (i, e) in NAMES.iter().enumerate() {
            if self.0 & (1 << i) != 0 && e.colls & bit != 0 {
                if let Some((a, pr)) = e.pair {
                    set.insert(a, pr);
                }
            }
        }
        set
    }

    /// Whether it names anything NCCL has for `coll`, whether rustccl runs it or not.
    fn exists_for(self, coll: Collective) -> bool {
        let bit = coll_bit(coll);
        NAMES.iter().enumerate().any(|(i, e)| self.0 & (1 << i) != 0 && e.colls & bit != 0)
    }
}

/// A set of (algorithm, protocol) pairs the planner may choose among.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairSet(u32);

impl PairSet {
    fn bit(a: Algorithm, pr: Protocol) -> u32 {
        1 << (a.index() * Protocol::ALL.len() + pr.index())
    }

    fn insert(&mut self, a: Algorithm, pr: Protocol) {
        self.0 |= Self::bit(a, pr);
    }

    pub fn contains(self, a: Algorithm, pr: Protocol) -> bool {
        self.0 & Self::bit(a, pr) != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The pairs, as `RING/SIMPLE, TREE/LL` (for messages).
    pub fn describe(self) -> String {
        let mut out = Vec::new();
        for &a in Algorithm::ALL {
            for &pr in Protocol::ALL {
                if self.contains(a, pr) {
                    out.push(format!("{}/{}", a.name(), pr.name()));
                }
            }
        }
        out.join(", ")
    }
}

/// The options of one operation (see the module's documentation). The default changes
/// nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollOptions {
    /// The fewest channels (NCCL's `minCTAs`), within the communicator's limits.
    pub min_channels: Option<u32>,
    /// The most channels (NCCL's `maxCTAs`), within the communicator's limits.
    pub max_channels: Option<u32>,
    /// The (algorithm, protocol) pairs the planner may choose among; `None`: any.
    pub pairs: Option<PairSet>,
    /// The caller's tag for the operation's profiler events (0: none).
    pub profiler_tag: u64,
}

impl CollOptions {
    /// Whether they steer the planner (the task then goes to it, never around it).
    pub fn steer_planner(&self) -> bool {
        self.pairs.is_some() || self.min_channels.is_some() || self.max_channels.is_some()
    }

    /// Whether the planner may choose `algo` / `proto`.
    pub fn allows(&self, algo: Algorithm, proto: Protocol) -> bool {
        self.pairs.is_none_or(|s| s.contains(algo, proto))
    }

    /// Sets the pairs from an algorithm selection for `coll` (the call named `what`), as
    /// NCCL does: with `force`, a selection that leaves `coll` nothing to run is an invalid
    /// argument; without, it falls back to automatic selection (logged at INFO).
    pub fn select(&mut self, sel: &str, force: bool, coll: Collective, what: &str) -> Result<()> {
        let parsed = AlgoSelection::parse(sel);
        let why = match parsed {
            Ok(None) => {
                self.pairs = None;
                return Ok(());
            }
            Err(e) => format!("the algorithm selection \"{sel}\" is malformed: {e}"),
            Ok(Some(s)) => {
                let pairs = s.pairs(coll);
                if !pairs.is_empty() {
                    self.pairs = Some(pairs);
                    return Ok(());
                }
                if s.exists_for(coll) {
                    format!(
                        "the algorithm selection \"{sel}\" names only algorithms rustccl does not plan for {} (CollNet, NVLS, PAT and the symmetric kernels are not selectable by name; RING, and TREE for AllReduce, are)",
                        coll.spec().name
                    )
                } else {
                    format!("the algorithm selection \"{sel}\" names no algorithm that {} has", coll.spec().name)
                }
            }
        };
        if force {
            return Err(Error::invalid_argument(format!(
                "{what}: {why}; fix the selection, or set forceAlgSelection to 0 to fall back to automatic selection"
            )));
        }
        tracing::info!(target: "TUNING", "{what}: {why}; forceAlgSelection is 0: automatic selection");
        self.pairs = None;
        Ok(())
    }

    /// The channels to use when the planner wants `wanted` and the communicator allows
    /// `comm_min..=comm_max`: the options' bounds within the communicator's.
    pub fn channels(&self, wanted: u32, comm_min: u32, comm_max: u32) -> u32 {
        let hi = self.max_channels.map_or(comm_max, |m| m.clamp(1, comm_max.max(1)));
        let lo = self.min_channels.map_or(comm_min, |m| m.max(1)).min(hi);
        wanted.clamp(lo.min(hi), hi)
    }
}

thread_local! {
    static CURRENT: Cell<CollOptions> = const { Cell::new(CollOptions { min_channels: None, max_channels: None, pairs: None, profiler_tag: 0 }) };
}

/// Runs `f` with `options` as the options of every operation it submits on this thread.
pub fn scoped<T>(options: CollOptions, f: impl FnOnce() -> T) -> T {
    struct Restore(CollOptions);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(options)));
    f()
}

/// The options of an operation submitted now on this thread.
pub(crate) fn current() -> CollOptions {
    CURRENT.with(|c| c.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(sel: &str, c: Collective) -> String {
        let mut o = CollOptions::default();
        o.select(sel, true, c, "t").unwrap();
        o.pairs.unwrap().describe()
    }

    #[test]
    fn names_are_prefixes_joined_by_nccls_grammar() {
        assert_eq!(pairs("RING", Collective::AllReduce), "RING/LL, RING/LL128, RING/SIMPLE");
        assert_eq!(pairs(" tree_simple ", Collective::AllReduce), "TREE/SIMPLE");
        // A prefix: RING_LL is RING_LL and RING_LL128, as in NCCL.
        assert_eq!(pairs("TREE,RING_LL", Collective::AllReduce), "TREE/LL, TREE/LL128, TREE/SIMPLE, RING/LL, RING/LL128");
        assert_eq!(pairs("RING_LL+^RING_LL128", Collective::AllReduce), "RING/LL");
        assert_eq!(pairs("RING+^RING_LL", Collective::AllGather), "RING/SIMPLE");
        assert_eq!(pairs("^TREE", Collective::AllReduce), "RING/LL, RING/LL128, RING/SIMPLE");
        // TREE exists only for AllReduce: the rest of the selection is what a broadcast gets.
        assert_eq!(pairs("TREE,RING_SIMPLE", Collective::Broadcast), "RING/SIMPLE");
        assert_eq!(AlgoSelection::parse("").unwrap(), None);
        assert_eq!(AlgoSelection::parse("  ").unwrap(), None);
        for bad in ["BOGUS", "^", "RING+TREE", "+", "RING,^"] {
            assert!(AlgoSelection::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_impossible_selection_is_an_error_only_when_forced() {
        let mut o = CollOptions::default();
        let e = o.select("TREE", true, Collective::AllGather, "ncclAllGatherConfig").unwrap_err();
        assert_eq!(e.code, crate::error::ResultCode::InvalidArgument);
        assert!(e.message.contains("names no algorithm that AllGather has") && e.message.contains("forceAlgSelection"), "{}", e.message);
        let e = o.select("NVLS", true, Collective::AllReduce, "x").unwrap_err();
        assert!(e.message.contains("does not plan"), "{}", e.message);
        assert!(o.select("RING", true, Collective::AlltoAll, "x").is_err(), "AlltoAll has no algorithm names");
        assert!(o.select("nope", true, Collective::AllReduce, "x").unwrap_err().message.contains("malformed"));
        o.select("TREE", false, Collective::AllGather, "x").unwrap();
        assert_eq!(o.pairs, None, "unforced: automatic");
    }

    #[test]
    fn channel_bounds_stay_within_the_communicators() {
        let o = CollOptions { max_channels: Some(1), ..Default::default() };
        assert_eq!(o.channels(8, 1, 16), 1);
        let o = CollOptions { min_channels: Some(4), ..Default::default() };
        assert_eq!(o.channels(2, 1, 16), 4);
        assert_eq!(o.channels(2, 1, 3), 3, "min above the communicator's max");
        let o = CollOptions { max_channels: Some(64), ..Default::default() };
        assert_eq!(o.channels(32, 1, 16), 16);
        let o = CollOptions { min_channels: Some(8), max_channels: Some(2), ..Default::default() };
        assert_eq!(o.channels(5, 1, 16), 2, "min above max: max");
        assert_eq!(CollOptions::default().channels(5, 2, 16), 5);
    }

    #[test]
    fn scoped_options_apply_inside_only() {
        let o = CollOptions { profiler_tag: 7, ..Default::default() };
        assert_eq!(scoped(o, current).profiler_tag, 7);
        assert_eq!(current(), CollOptions::default());
    }
}
