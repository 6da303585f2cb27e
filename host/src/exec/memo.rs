//! The planned route's memo: what a single collective of one shape ran with the first time
//! (the planner's work, the executor's prepared run, the protocol), kept by the engine
//! ([`super::engine::Engine`]) with the connections the prepared runs name, so that a call
//! of the same shape again skips the planner and the executor's preparation. coll decides
//! when a call may use it and points a kept work at each call's buffers (`coll::planned`);
//! this module only keeps entries and runs them.
//!
//! The key is plain data ([`MemoKey`]: collective, root or peer, count, type, operator), made
//! by coll from its task, so that the memo needs nothing from the layers above. An entry is
//! taken out while it runs and put back after; one whose run failed is not put back (the
//! communicator is broken by then anyway). When the connections go (suspend, destroy), the
//! memo goes with them: an entry taken from a memo goes back only into the same one
//! ([`Memo::put`] checks the memo's epoch).

use std::sync::atomic::{AtomicU64, Ordering};

use rustccl_plugin_api::Protocol;

use super::engine::Engine;
use super::gpu::cached::CachedLaunch;
use super::host::{HostRun, Prepared};
use super::{CommSide, Links};
use crate::error::Result;
use crate::spec::Collective;
use crate::types::{DataType, RedOp};
use crate::work::Work;

/// Entries kept per communicator (least recently used go first).
pub(crate) const MAX_ENTRIES: usize = 32;

/// [`MemoKey::rank`] of a collective without a root or peer.
pub(crate) const NO_RANK: u32 = u32::MAX;

/// What a plan depends on, of a single collective: everything but its buffers, its
/// PreMulSum scalar and its stream (call values, put into the kept work per call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemoKey {
    pub collective: Collective,
    /// The root, or the peer of a send or receive ([`NO_RANK`]: none).
    pub rank: u32,
    pub count: usize,
    pub dtype: DataType,
    /// The operator (the plan does not depend on it today; kept in the key so that it never
    /// silently starts to).
    pub op: RedOp,
}

/// One kept plan: the work (its context rewritten per call) and what runs it.
pub(crate) struct Entry {
    pub key: MemoKey,
    pub work: Work,
    pub exec: Exec,
    /// The protocol the planner chose (part of each call's context).
    pub proto: Protocol,
}

/// What runs a kept plan: the executor's run prepared once, for the backend's executor.
pub(crate) enum Exec {
    /// The host executor's run, with its steps' connections.
    Host(Prepared),
    /// The device launch (image, kernel, connections); boxed, as it is larger than the rest.
    Device(Box<CachedLaunch>),
}

impl Exec {
    /// The host executor's run of `work` over `links`.
    pub(crate) fn host(work: &Work, links: &Links) -> Exec {
        Exec::Host(Prepared::new(work, links))
    }

    /// The device launch made for `work` over `links` on `engine`'s device (see
    /// `CachedLaunch::new`); `None` when the work is not one launch (it then goes the full
    /// way every time).
    pub(crate) fn device(engine: &Engine, work: &Work, links: &Links) -> Result<Option<Exec>> {
        let launch = engine.with_device(|backend, device, _| CachedLaunch::new(backend, device, work, links))?;
        Ok(launch.map(|l| Exec::Device(Box::new(l))))
    }

    /// Whether its work runs on a device (and outlives the call).
    pub(crate) fn on_device(&self) -> bool {
        matches!(self, Exec::Device(_))
    }

    /// The connections a device launch names (a receive into a registered buffer is
    /// resolved against them per call); `None` on the host.
    pub(crate) fn device_links(&self) -> Option<&Links> {
        match self {
            Exec::Host(_) => None,
            Exec::Device(launch) => Some(launch.links()),
        }
    }

    /// Runs `work` (the entry's, pointed at this call's buffers) on `engine`'s executor:
    /// on the host to the end, on a device until it is enqueued.
    pub(crate) fn run(&mut self, work: &mut Work, engine: &Engine, side: &dyn CommSide) -> Result<()> {
        match self {
            Exec::Host(prep) => super::host::run(&mut [HostRun { work, prep, comm: side }]),
            Exec::Device(launch) => {
                engine.with_device(|backend, device, state| launch.launch(backend, device, state, work)).map_err(|e| e.context("collective"))
            }
        }
    }
}

/// A communicator's kept plans.
pub(crate) struct Memo {
    /// Names this memo (and so the connections its entries hold): an entry taken from one
    /// memo goes back only into the same one.
    epoch: u64,
    /// Least recently used first.
    entries: Vec<Entry>,
    /// Set when the communicator has a tuner: every call asks it, nothing is kept.
    bypass: bool,
}

impl Default for Memo {
    fn default() -> Memo {
        static EPOCH: AtomicU64 = AtomicU64::new(1);
        Memo { epoch: EPOCH.fetch_add(1, Ordering::Relaxed), entries: Vec::new(), bypass: false }
    }
}

/// What a look-up found. (Its entry is moved out by value: boxing it would allocate on every
/// hit.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Lookup {
    /// The entry (taken out while it runs) and the epoch to put it back under.
    Hit(Entry, u64),
    /// Nothing kept: a new entry goes in under this epoch.
    Miss(u64),
    /// The memo serves nothing (a tuner is asked on every call).
    Bypass,
}

impl Memo {
    pub(crate) fn take(&mut self, key: &MemoKey) -> Lookup {
        if self.bypass {
            return Lookup::Bypass;
        }
        match self.entries.iter().rposition(|e| e.key == *key) {
            Some(i) => Lookup::Hit(self.entries.remove(i), self.epoch),
            None => Lookup::Miss(self.epoch),
        }
    }

    pub(crate) fn put(&mut self, entry: Entry, epoch: u64) {
        if epoch != self.epoch {
            return;
        }
        if self.entries.len() >= MAX_ENTRIES {
            self.entries.remove(0);
        }
        self.entries.push(entry);
    }

    pub(crate) fn set_bypass(&mut self) {
        self.bypass = true;
        self.entries.clear();
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Stream;

    fn key(count: usize) -> MemoKey {
        MemoKey { collective: Collective::AllReduce, rank: NO_RANK, count, dtype: DataType::Float32, op: RedOp::Sum }
    }

    fn entry(key: MemoKey) -> Entry {
        let work = Work { ctxs: vec![], items: vec![], copies: vec![], stream: Stream(0) };
        let exec = Exec::host(&work, &Default::default());
        Entry { key, work, exec, proto: Protocol::Ll }
    }

    #[test]
    fn an_entry_goes_back_only_to_its_memo_and_a_bypassed_memo_serves_nothing() {
        let key = key(4);
        let mut memo = Memo::default();
        let Lookup::Miss(epoch) = memo.take(&key) else { panic!("empty memo hit") };
        memo.put(entry(key), epoch);
        let Lookup::Hit(e, epoch) = memo.take(&key) else { panic!("no hit") };
        assert_eq!(memo.len(), 0, "taken out while it runs");
        // The connections were replaced (suspend): a new memo; the old entry is not kept.
        let mut fresh = Memo::default();
        fresh.put(e, epoch);
        assert_eq!(fresh.len(), 0);
        assert!(matches!(fresh.take(&key), Lookup::Miss(_)));
        fresh.set_bypass();
        assert!(matches!(fresh.take(&key), Lookup::Bypass));
    }

    #[test]
    fn the_least_recently_used_entry_goes_first() {
        let mut memo = Memo::default();
        let epoch = memo.epoch();
        for c in 1..=MAX_ENTRIES {
            memo.put(entry(key(c)), epoch);
        }
        let Lookup::Hit(e, _) = memo.take(&key(1)) else { panic!() };
        memo.put(e, epoch);
        memo.put(entry(key(1000)), epoch);
        assert_eq!(memo.len(), MAX_ENTRIES);
        assert!(matches!(memo.take(&key(1)), Lookup::Hit(..)), "used lately: kept");
        assert!(matches!(memo.take(&key(2)), Lookup::Miss(_)), "least recently used: dropped");
    }

    #[test]
    fn entries_are_found_by_every_part_of_their_key() {
        let base = key(4);
        let others = [
            MemoKey { count: 5, ..base },
            MemoKey { dtype: DataType::Int32, ..base },
            MemoKey { op: RedOp::Max, ..base },
            MemoKey { collective: Collective::AllGather, ..base },
            MemoKey { collective: Collective::Broadcast, rank: 0, ..base },
            MemoKey { collective: Collective::Broadcast, rank: 1, ..base },
        ];
        let mut memo = Memo::default();
        let epoch = memo.epoch();
        memo.put(entry(base), epoch);
        for o in &others {
            assert!(matches!(memo.take(o), Lookup::Miss(_)), "{o:?}");
        }
        assert!(matches!(memo.take(&base), Lookup::Hit(..)));
    }
}
