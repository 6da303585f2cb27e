//! Children of a communicator: split by colour and key (collective over the parent), and
//! shrink (collective over the ranks that remain, which works when excluded ranks are dead).
//!
//! In both, the child's rank 0 starts a fresh root and sends its id to the other members over
//! the parent's peer connections; then every member initialises the child with that id.

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
}

/// Tag of the message carrying a child's id: kind (1 split, 2 shrink) and child number.
fn child_tag(kind: u64, seq: u64) -> u64 {
    crate::bootstrap::tags::child_id(kind, seq)
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
        let vote = SplitVote { color, key, ok: local_check.is_ok() };
        let seq = self.inner.children.fetch_add(1, Ordering::Relaxed);
        let bytes = serde_json::to_vec(&vote).map_err(|e| Error::internal(e.to_string()))?;
        let all = bs.allgather(&bytes).or_else(|e| self.fail(e.context("split")))?;
        local_check.or_else(|e| self.fail(e.context("split")))?;
        let votes: Vec<SplitVote> = all
            .iter()
            .map(|b| serde_json::from_slice(b))
            .collect::<std::result::Result<_, _>>()
            .or_else(|e| self.fail(Error::remote(format!("split: a rank sent a malformed vote: {e}"))))?;
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
        let tag = child_tag(1, seq);
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
    pub fn shrink(&self, exclude: &[i32], config: Option<&CommConfig>, flags: ShrinkFlags) -> Result<Communicator> {
        let _g = crate::log::rank_scope(self.inner.rank as i32);
        let bs = self.ready("shrink")?;
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
            // stop flags.
            self.inner.stop.abort.store(true, Ordering::Release);
        }
        let child_config = self.child_config(config);
        let resolved = child_config.resolve().or_else(|e| self.fail(e.context("shrink")))?;
        let members: Vec<u32> = (0..n).filter(|r| !excluded.contains(r)).collect();
        let new_rank = members.iter().position(|&r| r == me).unwrap() as i32;
        let seq = self.inner.children.fetch_add(1, Ordering::Relaxed);
        let id = share_child_id(bs, &members, me, child_tag(2, seq)).or_else(|e| self.fail(e.context("shrink")))?;
        let origin = Origin {
            shared: resolved.shrink_share.then(|| Arc::clone(&self.inner.shared)),
            comm_hash: derive_hash(self.inner.comm_hash, seq, -2),
        };
        Communicator::create(members.len() as i32, new_rank, &[id], self.inner.device, &child_config, origin)
            .or_else(|e| self.fail(e.context("shrink")))
    }
}

pub(super) fn derive_hash(parent: u64, seq: u64, color: i32) -> u64 {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(format!("{parent:016x}-{seq}-{color}").as_bytes());
    u64::from_le_bytes(d[..8].try_into().unwrap())
}
