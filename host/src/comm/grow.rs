//! Growing a communicator (NCCL 2.29's `ncclCommGetUniqueId` and `ncclCommGrow`): a new
//! communicator of more ranks, in which the existing ranks keep their ranks (so their order)
//! and the new ones take the ranks they were given.
//!
//! One existing rank (the coordinator) asks its communicator for a grow id: a fresh root,
//! exactly as `ncclGetUniqueId` starts one. It hands the id to the new ranks out of band. Then
//! every existing rank calls [`Communicator::grow`] (collective over the existing
//! communicator: they agree on the id, which the coordinator contributes, and on the size) and
//! every new rank calls [`Communicator::join_grow`] with the id; all of them initialise the
//! grown communicator at that root. The existing communicator is left as it was: it stays
//! usable until destroyed (NCCL advises destroying it once the grow has completed).

use serde::{Deserialize, Serialize};

use super::init::Origin;
use super::split::derive_hash;
use super::Communicator;
use crate::bootstrap::{self, UniqueId};
use crate::config::CommConfig;
use crate::error::{Error, Result};

/// What each existing rank says before a grow.
#[derive(Serialize, Deserialize)]
struct GrowVote {
    nranks: i32,
    /// The grow id in hex, from the coordinator.
    id: Option<String>,
    /// Whether this rank's arguments were valid; if any rank's were not, nobody grows.
    ok: bool,
}

/// The hash naming a grown communicator: every rank, old or new, derives it from the id.
fn grown_hash(id: &UniqueId) -> u64 {
    derive_hash(id.hash(), 0, -3)
}

impl Communicator {
    /// `ncclCommGetUniqueId`: the id of the next grow of this communicator, for the
    /// coordinator (one existing rank) to hand to the new ranks. One id at a time: the grow
    /// consumes it, and asking again before that is an `InvalidUsage`.
    pub fn grow_unique_id(&self) -> Result<UniqueId> {
        let _g = crate::log::rank_scope(self.inner.rank as i32);
        self.operational("get_unique_id")?;
        let mut pending = self.inner.grow_id.lock().unwrap_or_else(|p| p.into_inner());
        if pending.is_some() {
            return self.fail(Error::invalid_usage(
                "get_unique_id: the id made for the previous grow has not been used yet; each grow consumes one id (call grow on every rank first)",
            ));
        }
        let id = bootstrap::create_root_id().or_else(|e| self.fail(e.context("get_unique_id")))?;
        *pending = Some(id);
        Ok(id)
    }

    /// `ncclCommGrow` on an existing rank: collective over this communicator. `nranks` is the
    /// size of the grown communicator (larger than this one's); `id` is the coordinator's grow
    /// id (the others pass `None`; the coordinator may too, its communicator remembers it).
    /// Without a config the grown communicator inherits this one's.
    pub fn grow(&self, nranks: i32, id: Option<&UniqueId>, config: Option<&CommConfig>) -> Result<Communicator> {
        let _g = crate::log::rank_scope(self.inner.rank as i32);
        let bs = self.operational("grow")?;
        let n = self.inner.nranks as i32;
        let child_config = config.cloned().unwrap_or_else(|| self.inner.user_config.clone());
        let local_check = if nranks <= n {
            Err(Error::invalid_argument(format!(
                "grow: nRanks {nranks} must be larger than the communicator's {n} ranks"
            )))
        } else {
            child_config.resolve().map(|_| ())
        };
        let offered = id.copied().or_else(|| *self.inner.grow_id.lock().unwrap_or_else(|p| p.into_inner()));
        let vote = GrowVote { nranks, id: offered.map(|i| i.to_hex()), ok: local_check.is_ok() };
        let bytes = serde_json::to_vec(&vote).map_err(|e| Error::internal(e.to_string()))?;
        let all = bs.allgather(&bytes).or_else(|e| self.fail(e.context("grow")))?;
        local_check.or_else(|e| self.fail(e.context("grow")))?;
        let votes: Vec<GrowVote> = all
            .iter()
            .map(|b| serde_json::from_slice(b))
            .collect::<std::result::Result<_, _>>()
            .or_else(|e| self.fail(Error::remote(format!("grow: a rank sent a malformed vote: {e}"))))?;
        let id = agree(&votes).or_else(|e| self.fail(e.context("grow")))?;
        // Consumed, whatever happens next.
        self.inner.grow_id.lock().unwrap_or_else(|p| p.into_inner()).take();
        tracing::info!(target: "INIT", "rank {}: growing communicator {:016x} from {n} to {nranks} ranks", self.inner.rank, self.inner.comm_hash);
        let origin = Origin { shared: None, comm_hash: grown_hash(&id) };
        Communicator::create(nranks, self.inner.rank as i32, &[id], self.inner.device, &child_config, origin)
            .or_else(|e| self.fail(e.context("grow")))
    }

    /// `ncclCommGrow` on a new rank: joins the grown communicator of `nranks` ranks as `rank`
    /// (a rank the existing communicator does not have), with the coordinator's grow id.
    pub fn join_grow(nranks: i32, id: &UniqueId, rank: i32, device: i32, config: &CommConfig) -> Result<Communicator> {
        crate::log::init();
        let origin = Origin { shared: None, comm_hash: grown_hash(id) };
        Communicator::create(nranks, rank, std::slice::from_ref(id), device, config, origin)
            .map_err(|e| e.context("grow (new rank)").record())
    }
}

/// The id and size every existing rank agrees on, from their votes (the same verdict on
/// every rank, since every rank sees the same votes).
fn agree(votes: &[GrowVote]) -> Result<UniqueId> {
    if let Some(bad) = votes.iter().position(|v| !v.ok) {
        return Err(Error::invalid_argument(format!("rank {bad} passed invalid arguments")));
    }
    if let Some(r) = votes.iter().position(|v| v.nranks != votes[0].nranks) {
        return Err(Error::invalid_argument(format!(
            "ranks disagree about nRanks: rank 0 passed {}, rank {r} passed {}",
            votes[0].nranks, votes[r].nranks
        )));
    }
    let mut ids: Vec<&str> = votes.iter().filter_map(|v| v.id.as_deref()).collect();
    ids.sort();
    ids.dedup();
    match ids.as_slice() {
        [] => Err(Error::invalid_usage(
            "no rank has a grow id: one rank calls ncclCommGetUniqueId on this communicator first (and hands the id to the new ranks)",
        )),
        [one] => UniqueId::from_hex(one),
        _ => Err(Error::invalid_usage(format!(
            "ranks passed {} different grow ids: exactly one ncclCommGetUniqueId call precedes each grow",
            ids.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(nranks: i32, id: Option<&UniqueId>) -> GrowVote {
        GrowVote { nranks, id: id.map(|i| i.to_hex()), ok: true }
    }

    #[test]
    fn ranks_agree_on_one_id_and_one_size() {
        let a = UniqueId::from_parts([1; 16], "127.0.0.1:1".parse().unwrap());
        let b = UniqueId::from_parts([2; 16], "127.0.0.1:2".parse().unwrap());
        assert_eq!(agree(&[vote(3, None), vote(3, Some(&a))]).unwrap(), a);
        assert_eq!(agree(&[vote(3, Some(&a)), vote(3, Some(&a))]).unwrap(), a);
        let e = agree(&[vote(3, None), vote(3, None)]).unwrap_err();
        assert!(e.message.contains("ncclCommGetUniqueId"), "{}", e.message);
        let e = agree(&[vote(3, Some(&a)), vote(3, Some(&b))]).unwrap_err();
        assert!(e.message.contains("different grow ids"), "{}", e.message);
        let e = agree(&[vote(3, Some(&a)), vote(4, None)]).unwrap_err();
        assert!(e.message.contains("rank 1 passed 4"), "{}", e.message);
        let bad = GrowVote { ok: false, ..vote(3, Some(&a)) };
        assert!(agree(&[vote(3, None), bad]).unwrap_err().message.contains("rank 1"));
    }
}
