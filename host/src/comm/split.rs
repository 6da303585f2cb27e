//! Children of a communicator: split by colour and key (collective over the parent), and
//! shrink (collective over the ranks that remain, which works when excluded ranks are dead).
//!
//! A child is named by its number among the parent's children (its hash is derived from it,
//! and a split's messages are tagged with it). Each rank counts the children it made, but
//! failures can leave the counts unequal: after a rank's death, a split that fails inside its
//! all-gather on one survivor is refused at the door on another that heard of the death
//! first. So the number is agreed, never taken from the local count: a split's votes carry
//! each rank's count and every rank takes the largest of them; a shrink's members agree on
//! the largest of theirs through its coordinator (`agree.rs`). Either way every rank sets its
//! count past the agreed number. (A grow needs no number: the grown communicator's hash comes
//! from the grow id, which every rank agrees on in its all-gather, `grow.rs`.)
//!
//! In a split, the child's rank 0 starts a fresh root and sends its id to the other members
//! over the parent's peer connections; in a shrink, the coordinator (the child's rank 0)
//! starts the root and sends the id with its decision. Then every member initialises the
//! child with that id.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::init::Origin;
use super::{Communicator, SPLIT_NOCOLOR};
use crate::bootstrap::{self, Bootstrap, UniqueId};
use crate::config::CommConfig;
use crate::error::{Error, Result};

/// `ncclCommShrink` flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShrinkFlags {
    /// `NCCL_SHRINK_DEFAULT`: the parent has no operation in flight.
    Default,
    /// `NCCL_SHRINK_ABORT`: operations in flight on the parent are aborted first (use this
    /// after a rank failed).
    Abort,
}

impl ShrinkFlags {
    pub fn from_i32(v: i32) -> Result<ShrinkFlags> {
        match v {
            0 => Ok(ShrinkFlags::Default),
            1 => Ok(ShrinkFlags::Abort),
            _ => Err(Error::invalid_argument(format!(
                "shrink flags {v:#x}: expected NCCL_SHRINK_DEFAULT (0) or NCCL_SHRINK_ABORT (1)"
            ))),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct SplitVote {
    color: i32,
    key: i32,
    /// Whether this rank's arguments were valid; if any rank's were not, nobody splits.
    ok: bool,
    /// This rank's count of children made so far: the split's number is the largest.
    children: u64,
}

/// The child's rank 0 starts its root and sends the id to the others; the others receive it.
fn share_child_id(bs: &Bootstrap, members: &[u32], me: u32, tag: u64) -> Result<UniqueId> {
    if members[0] == me {
        let id = bootstrap::create_root_id()?;
        for &m in &members[1..] {
            bs.send_survivor(m, tag, id.as_bytes())?;
        }
        Ok(id)
    } else {
        UniqueId::from_bytes(&bs.recv_survivor(members[0], tag)?)
    }
}

impl Communicator {
    fn child_config(&self, config: Option<&CommConfig>) -> CommConfig {
        config.cloned().unwrap_or_else(|| self.inner.user_config.clone())
    }

    /// `ncclCommSplit`: collective over this communicator. Ranks passing the same `color`
    /// form a child, ordered by `key` then by rank; `SPLIT_NOCOLOR` gets `None`. Without a
    /// config the child inherits this communicator's.
    pub fn split(&self, color: i32, key: i32, config: Option<&CommConfig>) -> Result<Option<Communicator>> {
        let _g = crate::log::rank_scope(self.inner.rank as i32);
        let bs = self.operational("split")?;
        let child_config = self.child_config(config);
        let local_check = if color < 0 && color != SPLIT_NOCOLOR {
            Err(Error::invalid_argument(format!("split color {color} is negative and not NCCL_SPLIT_NOCOLOR")))
        } else {
            child_config.resolve().map(|_| ())
        };
        let vote = SplitVote { color, key, ok: local_check.is_ok(), children: self.inner.children.load(Ordering::Relaxed) };
        let bytes = serde_json::to_vec(&vote).map_err(|e| Error::internal(e.to_string()))?;
        let all = bs.allgather(&bytes).or_else(|e| self.fail(e.context("split")))?;
        let votes: Vec<SplitVote> = all
            .iter()
            .map(|b| serde_json::from_slice(b))
            .collect::<std::result::Result<_, _>>()
            .or_else(|e| self.fail(Error::remote(format!("split: a rank sent a malformed vote: {e}"))))?;
        // Every rank sees the same votes: the same number, and the same count after it, also
        // when the split is refused below. The number is past every number a rank used, so
        // an id message an earlier failed split left (under its own number) is never read.
        let seq = votes.iter().map(|v| v.children).max().unwrap_or(0);
        self.inner.children.fetch_max(seq + 1, Ordering::Relaxed);
        local_check.or_else(|e| self.fail(e.context("split")))?;
        if let Some(bad) = votes.iter().position(|v| !v.ok) {
            return self.fail(Error::invalid_argument(format!("split: rank {bad} passed invalid arguments")));
        }
        if color == SPLIT_NOCOLOR {
            return Ok(None);
        }
        let mut members: Vec<u32> = (0..self.inner.nranks).filter(|&r| votes[r as usize].color == color).collect();
        members.sort_by_key(|&r| (votes[r as usize].key, r));
        let me = self.inner.rank;
        let new_rank = members.iter().position(|&r| r == me).expect("a rank is in its own colour") as i32;
        let tag = crate::bootstrap::tags::child_id(seq);
        let id = share_child_id(bs, &members, me, tag).or_else(|e| self.fail(e.context("split")))?;
        let resolved_share = child_config.resolve().map(|c| c.split_share).unwrap_or(false);
        let origin = Origin {
            shared: resolved_share.then(|| Arc::clone(&self.inner.shared)),
            comm_hash: derive_hash(self.inner.comm_hash, seq, color),
        };
        Communicator::create(members.len() as i32, new_rank, &[id], self.inner.device, &child_config, origin)
            .map(Some)
            .or_else(|e| self.fail(e.context("split")))
    }

    /// `ncclCommShrink`: called by every rank that is not in `exclude` (excluded ranks must
    /// not call it; they may be dead). The child keeps the remaining ranks in their order.
    /// A shrink that failed may be called again (also after `ShrinkFlags::Abort`).
    pub fn shrink(&self, exclude: &[i32], config: Option<&CommConfig>, flags: ShrinkFlags) -> Result<Communicator> {
        let _g = crate::log::rank_scope(self.inner.rank as i32);
        let bs = self.shrink_gate()?;
        let n = self.inner.nranks;
        let mut excluded = HashSet::new();
        for &r in exclude {
            if r < 0 || r as u32 >= n {
                return self.fail(Error::invalid_argument(format!("shrink: rank {r} to exclude is out of range for {n} ranks")));
            }
            if !excluded.insert(r as u32) {
                return self.fail(Error::invalid_argument(format!("shrink: rank {r} is listed twice")));
            }
        }
        let me = self.inner.rank;
        if excluded.contains(&me) {
            return self.fail(Error::invalid_usage(format!("shrink: rank {me} is in the exclude list; excluded ranks must not call shrink")));
        }
        if flags == ShrinkFlags::Abort {
            // Ends whatever else is waiting on the parent; the shrink itself does not use the
            // stop flags. Marked first, so that a retry passes the gate.
            self.inner.shrink_stopped.store(true, Ordering::Release);
            self.inner.stop.abort.store(true, Ordering::Release);
        }
        let child_config = self.child_config(config);
        // An invalid config is this rank's error, told to the other members through the
        // agreement, so that they fail at once too instead of waiting for this rank.
        let resolved = child_config.resolve();
        let members: Vec<u32> = (0..n).filter(|r| !excluded.contains(r)).collect();
        let new_rank = members.iter().position(|&r| r == me).unwrap() as i32;
        let children = self.inner.children.load(Ordering::Relaxed);
        let refusal = resolved.as_ref().err().map(|e| e.message.clone());
        let agreed = super::agree::agree(bs, &members, me, children, refusal);
        let resolved = resolved.or_else(|e| self.fail(e.context("shrink")))?;
        let agreed = agreed.or_else(|e| self.fail(e.context("shrink")))?;
        self.inner.children.fetch_max(agreed.seq + 1, Ordering::Relaxed);
        let origin = Origin {
            shared: resolved.shrink_share.then(|| Arc::clone(&self.inner.shared)),
            comm_hash: derive_hash(self.inner.comm_hash, agreed.seq, -2),
        };
        Communicator::create(members.len() as i32, new_rank, &[agreed.id], self.inner.device, &child_config, origin)
            .or_else(|e| self.fail(e.context("shrink")))
    }

    /// The gate of shrink: [`ready`](Self::ready), except that a communicator stopped by an
    /// earlier shrink's `ShrinkFlags::Abort` (not destroyed, nor aborted by the user, which
    /// destroys it) may be shrunk again: that shrink may have failed.
    fn shrink_gate(&self) -> Result<&Bootstrap> {
        if self.inner.shrink_stopped.load(Ordering::Acquire) && !self.inner.destroyed.load(Ordering::Acquire) {
            if let Some(bs) = self.inner.bootstrap.get() {
                return Ok(bs);
            }
        }
        self.ready("shrink")
    }
}

pub(super) fn derive_hash(parent: u64, seq: u64, color: i32) -> u64 {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(format!("{parent:016x}-{seq}-{color}").as_bytes());
    u64::from_le_bytes(d[..8].try_into().unwrap())
}
