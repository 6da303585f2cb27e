//! How the ranks of a shrink agree on the child they make: its number among the parent's
//! children (the child's hash is derived from it) and its unique id.
//!
//! Each rank counts the children it has made of its parent, but after a failure the counts of
//! the survivors can differ: a split that one rank entered (and that failed in its all-gather
//! when a peer died) was refused at the door on another rank that had already heard of the
//! death. So a rank's count cannot name the child by itself. The members take the largest of
//! their counts, through a coordinator (the lowest member: the child's rank 0, which also
//! starts the child's root):
//!
//! 1. the coordinator sends each member an invitation carrying a nonce, fresh and random for
//!    each attempt;
//! 2. a member answers each invitation it reads with the nonce, its count, and whether its own
//!    arguments were valid;
//! 3. once every member answered this nonce, the coordinator decides (the largest count and
//!    the child's id; or the refusal, or the failure) and sends the decision, with the nonce,
//!    to every member that answered it;
//! 4. every member sets its count past the decided number (the caller does, `Agreed::seq`).
//!
//! It all goes over the parent's survivor channel (`Bootstrap::send_survivor`, which works
//! while other ranks are dead and the parent is aborted) under one tag per member set
//! (`tags::shrink_agreement`); another member set's messages are never read here, nor are
//! those of splits (their all-gathers and child ids are in other tag spaces), failed or not.
//!
//! Stale messages. An attempt can end on one rank and not on another (a member that never
//! came, or came after the coordinator's wait ran out; a member that gave up waiting for the
//! decision), leaving messages under the same tag for the next attempt with the same members
//! to find first: invitations a member never read, answers the coordinator never read,
//! decisions a member stopped waiting for. None is taken for fresh:
//! - the coordinator counts only answers carrying its current nonce; an answer to any earlier
//!   invitation is skipped;
//! - a member answers every invitation it reads (an answer to an old one is skipped, as just
//!   said) and takes a decision only for a nonce it answered in this call. The coordinator
//!   decides a nonce only for members that answered it, and a member reads each invitation
//!   once, so a decision for a nonce this call answered is that of the coordinator's attempt
//!   this call took part in; a decision left by an earlier call carries a nonce that call
//!   answered, and is skipped.
//!
//! Every wait is bounded by the bootstrap timeout and ends at once when the peer it waits
//! for is dead. The decided number is the largest count of the members, so it is past every
//! number any of them used for an earlier child (each sets its count past the number it
//! used), and the child's hash and the messages of its making differ from every earlier one's.

use std::collections::HashSet;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::bootstrap::{self, tags, Bootstrap, UniqueId};
use crate::error::{Error, Result, ResultCode};

/// What the members of a shrink agreed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Agreed {
    /// The child's number among the parent's children, the same on every member.
    pub seq: u64,
    pub id: UniqueId,
}

#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    /// Coordinator to member: an attempt has started.
    Invite { nonce: u64 },
    /// Member to coordinator: its count of children, and why its arguments are invalid if
    /// they are.
    Answer { nonce: u64, children: u64, refusal: Option<String> },
    /// Coordinator to member: how the attempt `nonce` ends.
    Decide { nonce: u64, outcome: Outcome },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum Outcome {
    Go { seq: u64, id: String },
    /// A member's arguments were invalid.
    Refused { reason: String },
    /// A member could not take part (dead, never came), or the child's root did not start.
    Failed { code: i32, reason: String },
}

/// This rank's part in the agreement of the members (`members`, sorted, `me` among them) of
/// a shrink. `children` is this rank's count of children of the parent; `refusal`, why this
/// rank's own arguments are invalid (the others then fail alike, at once, instead of
/// waiting for it).
pub(super) fn agree(bs: &Bootstrap, members: &[u32], me: u32, children: u64, refusal: Option<String>) -> Result<Agreed> {
    let tag = tags::shrink_agreement(members);
    let outcome = if members[0] == me {
        coordinate(bs, &members[1..], me, tag, children, refusal)?
    } else {
        join(bs, members[0], tag, children, refusal)?
    };
    match outcome {
        Outcome::Go { seq, id } => Ok(Agreed { seq, id: UniqueId::from_hex(&id)? }),
        Outcome::Refused { reason } => Err(Error::invalid_argument(reason)),
        Outcome::Failed { code, reason } => {
            Err(Error::new(ResultCode::from_i32(code).unwrap_or(ResultCode::RemoteError), reason))
        }
    }
}

fn send(bs: &Bootstrap, peer: u32, tag: u64, msg: &Msg) -> Result<()> {
    let bytes = serde_json::to_vec(msg).map_err(|e| Error::internal(e.to_string()))?;
    bs.send_survivor(peer, tag, &bytes)
}

fn decode(peer: u32, bytes: Vec<u8>) -> Result<Msg> {
    serde_json::from_slice(&bytes).map_err(|e| Error::remote(format!("rank {peer} sent a malformed shrink message: {e}")))
}

/// The coordinator's part: invite, collect the answers to this attempt, decide, tell.
fn coordinate(bs: &Bootstrap, others: &[u32], me: u32, tag: u64, children: u64, refusal: Option<String>) -> Result<Outcome> {
    let nonce = u64::from_le_bytes(bootstrap::id::random_bytes()?);
    let mut failure: Option<Error> = None;
    let mut refusal = refusal.map(|r| format!("rank {me}: {r}"));
    let mut seq = children;
    let mut invited = Vec::new();
    for &m in others {
        match send(bs, m, tag, &Msg::Invite { nonce }) {
            Ok(()) => invited.push(m),
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    // Every member invited is heard (or given up on) even after a failure, so that those
    // who answered learn of it now rather than at their timeout; all within one timeout, a
    // little shorter than the members' own wait for the decision (as the bootstrap root's),
    // so that the decision (which names the missing rank) reaches them before they give up.
    let deadline = Instant::now() + bootstrap::root::root_limit(bs.timeout());
    let mut answered = Vec::new();
    for &m in &invited {
        match answer_to(bs, m, tag, nonce, deadline) {
            Ok((count, why)) => {
                answered.push(m);
                seq = seq.max(count);
                if let Some(why) = why {
                    refusal.get_or_insert(format!("rank {m}: {why}"));
                }
            }
            Err(e) => {
                failure.get_or_insert(e.context(format!(
                    "waiting for rank {m} to join the shrink (every rank not excluded calls shrink, with the same exclude list)"
                )));
            }
        }
    }
    let outcome = match (refusal, failure) {
        (Some(reason), _) => Outcome::Refused { reason },
        (None, Some(e)) => Outcome::Failed { code: e.code as i32, reason: e.message },
        (None, None) => match bootstrap::create_root_id() {
            Ok(id) => Outcome::Go { seq, id: id.to_hex() },
            Err(e) => Outcome::Failed { code: e.code as i32, reason: e.context(format!("rank {me}: starting the child's root")).message },
        },
    };
    for &m in &answered {
        // A member that died since cannot be told; the others still are.
        let _ = send(bs, m, tag, &Msg::Decide { nonce, outcome: outcome.clone() });
    }
    Ok(outcome)
}

/// `m`'s answer to the invitation `nonce` (answers to earlier ones are stale: skipped).
fn answer_to(bs: &Bootstrap, m: u32, tag: u64, nonce: u64, deadline: Instant) -> Result<(u64, Option<String>)> {
    loop {
        match decode(m, bs.recv_survivor_by(m, tag, deadline)?)? {
            Msg::Answer { nonce: n, children, refusal } if n == nonce => return Ok((children, refusal)),
            Msg::Answer { .. } => continue,
            other => return Err(Error::remote(format!("rank {m} sent {other:?} to the shrink's coordinator"))),
        }
    }
}

/// A member's part: answer every invitation, take the decision of one answered here.
fn join(bs: &Bootstrap, coordinator: u32, tag: u64, children: u64, refusal: Option<String>) -> Result<Outcome> {
    let mut answered = HashSet::new();
    loop {
        let msg = bs.recv_survivor(coordinator, tag).map_err(|e| {
            e.context(format!("waiting for rank {coordinator}, the shrink's coordinator (the lowest rank not excluded)"))
        })?;
        match decode(coordinator, msg)? {
            Msg::Invite { nonce } => {
                send(bs, coordinator, tag, &Msg::Answer { nonce, children, refusal: refusal.clone() })?;
                answered.insert(nonce);
            }
            Msg::Decide { nonce, outcome } if answered.contains(&nonce) => return Ok(outcome),
            Msg::Decide { .. } => continue,
            other => return Err(Error::remote(format!("rank {coordinator} sent {other:?} to a member of the shrink"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::{JoinRequest, StopFlags};
    use std::sync::Arc;
    use std::time::Duration;

    /// `n` ranks' bootstraps in this process, over loopback.
    fn bootstraps(n: u32) -> Vec<Bootstrap> {
        std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
        let id = bootstrap::create_root_id().unwrap();
        let threads: Vec<_> = (0..n)
            .map(|rank| {
                std::thread::spawn(move || {
                    let req = JoinRequest { ids: &[id], nranks: n, rank, device: 0 };
                    Bootstrap::init(&req, Arc::new(StopFlags::default())).unwrap()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    /// Every rank of `members` runs its part at once, with its count and refusal.
    fn run(bss: &[Bootstrap], members: &[u32], counts: &[u64], refusals: &[Option<&str>]) -> Vec<Result<Agreed>> {
        run_by(bss, members, members, counts, refusals)
    }

    /// As `run`, with only `callers` (of `members`) calling.
    fn run_by(bss: &[Bootstrap], members: &[u32], callers: &[u32], counts: &[u64], refusals: &[Option<&str>]) -> Vec<Result<Agreed>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = callers
                .iter()
                .enumerate()
                .map(|(i, &m)| {
                    let (count, refusal) = (counts[i], refusals[i].map(str::to_string));
                    s.spawn(move || agree(&bss[m as usize], members, m, count, refusal))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn members_whose_counts_differ_agree_on_the_largest_and_one_id() {
        let bss = bootstraps(4);
        let got = run(&bss, &[0, 2, 3], &[1, 5, 0], &[None, None, None]);
        let first = got[0].as_ref().unwrap().clone();
        assert_eq!(first.seq, 5);
        for g in &got {
            assert_eq!(g.as_ref().unwrap(), &first);
        }
        // Again, with the counts set past the decided number: a new number and a new id.
        let again = run(&bss, &[0, 2, 3], &[6, 6, 6], &[None, None, None]);
        let second = again[1].as_ref().unwrap();
        assert_eq!(second.seq, 6);
        assert_ne!(second.id, first.id);
    }

    #[test]
    fn messages_left_by_abandoned_attempts_are_not_taken_for_fresh_ones() {
        let bss = bootstraps(3);
        let members = [0, 1, 2];
        let tag = tags::shrink_agreement(&members);
        let old = bootstrap::create_root_id().unwrap().to_hex();
        // Left for rank 1: an invitation it never read, then the decision of an attempt an
        // earlier call of rank 1 answered and stopped waiting for.
        send(&bss[0], 1, tag, &Msg::Invite { nonce: 11 }).unwrap();
        send(&bss[0], 1, tag, &Msg::Decide { nonce: 7, outcome: Outcome::Go { seq: 99, id: old.clone() } }).unwrap();
        // Left for rank 0 (the coordinator): answers to invitations of its earlier attempts.
        send(&bss[2], 0, tag, &Msg::Answer { nonce: 7, children: 1000, refusal: None }).unwrap();
        send(&bss[1], 0, tag, &Msg::Answer { nonce: 3, children: 0, refusal: Some("stale".into()) }).unwrap();
        let got = run(&bss, &members, &[2, 1, 3], &[None, None, None]);
        for g in &got {
            let g = g.as_ref().unwrap();
            assert_eq!(g.seq, 3, "{got:?}");
            assert_ne!(g.id.to_hex(), old);
            assert_eq!(g, got[0].as_ref().unwrap());
        }
        // Nothing is left that the next attempt could take.
        let next = run(&bss, &members, &[4, 4, 4], &[None, None, None]);
        assert!(next.iter().all(|g| g.as_ref().unwrap() == next[0].as_ref().unwrap()), "{next:?}");
        assert_eq!(next[0].as_ref().unwrap().seq, 4);
    }

    #[test]
    fn a_member_with_invalid_arguments_fails_every_member_at_once() {
        let bss = bootstraps(3);
        let t0 = Instant::now();
        let got = run(&bss, &[0, 1, 2], &[0, 0, 0], &[None, Some("config: bad value"), None]);
        assert!(t0.elapsed() < Duration::from_secs(5));
        for g in got {
            let e = g.unwrap_err();
            assert_eq!(e.code, ResultCode::InvalidArgument);
            assert!(e.message.contains("rank 1: config: bad value"), "{}", e.message);
        }
        // The coordinator's own refusal reaches the others too.
        let got = run(&bss, &[0, 1, 2], &[0, 0, 0], &[Some("no"), None, None]);
        assert!(got.iter().all(|g| g.as_ref().unwrap_err().message.contains("rank 0: no")));
    }

    #[test]
    fn members_that_never_come_fail_the_attempt_within_one_timeout_and_a_retry_works() {
        let mut bss = bootstraps(4);
        for b in &mut bss {
            b.set_timeout(Duration::from_secs(2));
        }
        let members = [0, 1, 2, 3];
        // Ranks 2 and 3 stay away: their invitations stay unread.
        let t0 = Instant::now();
        let got = run_by(&bss, &members, &[0, 1], &[0, 0], &[None, None]);
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(3), "{took:?}: one timeout for all the answers");
        for g in &got {
            let e = g.as_ref().unwrap_err();
            assert_eq!(e.code, ResultCode::RemoteError);
            assert!(e.message.contains("waiting for rank 2 to join the shrink"), "{}", e.message);
        }
        // Everyone comes now: the stale invitations are answered and skipped, and the retry
        // agrees.
        let again = run(&bss, &members, &[0, 2, 1, 0], &[None, None, None, None]);
        for g in &again {
            assert_eq!(g.as_ref().unwrap(), again[0].as_ref().unwrap(), "{again:?}");
        }
        assert_eq!(again[0].as_ref().unwrap().seq, 2);
    }

    #[test]
    fn a_dead_member_fails_the_others_at_once() {
        let mut bss = bootstraps(3);
        bss.pop().unwrap().close(false);
        std::thread::sleep(std::time::Duration::from_millis(100));
        let t0 = Instant::now();
        let got = run_by(&bss, &[0, 1, 2], &[0, 1], &[0, 0], &[None, None]);
        assert!(t0.elapsed() < Duration::from_secs(5));
        for g in got {
            assert_eq!(g.unwrap_err().code, ResultCode::RemoteError);
        }
    }
}
