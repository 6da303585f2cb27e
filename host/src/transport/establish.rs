//! Making connections: one [`Establish`] state machine per connection end, and
//! [`establish_all`], which advances every end of a group (or of a resume) together in NCCL's
//! order.
//!
//! Why an order: a network plugin may block in `accept` until the peer has connected, and
//! complete `connect` only in the background (Google's nccl-fastsocket does both). NCCL's
//! proxy copes because it sets up every receiving end first (listen, handle sent), then calls
//! `connect` on every sending end, and only then polls accepts and connects together (a NULL
//! comm meaning "call again"). Were a rank to accept before its own sends had connected, two
//! ranks could each sit in accept waiting for the other's connect. [`establish_all`] keeps
//! that order on every rank: no end is waited on (accept, or connect polled again) while
//! another end of the set has not yet reached its waiting step, and among the waiting ones
//! sends go before receives in every round.

use std::sync::Arc;

use super::{handle_tag, Connection, Context, Dir, Pending, Progress};
use crate::error::{Error, Result};
use crate::program::Link;

/// A connection being made.
pub struct Establish(State);

enum State {
    /// Receiver: nothing done yet.
    Start { link: Link },
    /// Sender: waiting for the receiver's message.
    AwaitMessage { link: Link },
    /// Set up (receiver: listening; sender: connect called once), waiting for the peer.
    Waiting(Box<dyn Pending>),
    Done,
}

/// Where a connection end stands, in the order [`establish_all`] moves them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Receiver: to be set up (listen, handle sent to the sender).
    SetUp,
    /// Sender: to connect once the receiver's handle arrives.
    Connect,
    /// Waiting for the peer (the network's accept, or a connect that returned no comm yet).
    Wait,
}

impl Establish {
    pub fn new(link: Link, dir: Dir) -> Establish {
        Establish(match dir {
            Dir::Recv => State::Start { link },
            Dir::Send => State::AwaitMessage { link },
        })
    }

    /// The step this end is at.
    pub fn phase(&self) -> Phase {
        match self.0 {
            State::Start { .. } => Phase::SetUp,
            State::AwaitMessage { .. } => Phase::Connect,
            State::Waiting(_) | State::Done => Phase::Wait,
        }
    }

    /// Advances one step; returns the connection once made. A receiver's first call sets up
    /// and sends its message without waiting for the peer (its accept comes with a later
    /// call); a sender connects as soon as the message is there (a transport's connect does
    /// not wait for the peer).
    pub fn poll(&mut self, cx: &Context) -> Result<Option<Arc<Connection>>> {
        let progress = match std::mem::replace(&mut self.0, State::Done) {
            State::Start { link } => {
                let (tag, transport) = cx.transport_for(link.peer);
                let (progress, body) = transport.setup_recv(cx, link)?;
                let mut msg = Vec::with_capacity(1 + body.len());
                msg.push(tag);
                msg.extend_from_slice(&body);
                cx.bootstrap.send(link.peer, handle_tag(link.purpose), &msg)?;
                // Not polled now: the sender may not have connected yet (see the module docs).
                return self.settle(progress);
            }
            State::AwaitMessage { link } => {
                let Some(msg) = cx.bootstrap.try_recv(link.peer, handle_tag(link.purpose))? else {
                    self.0 = State::AwaitMessage { link };
                    return Ok(None);
                };
                let (tag, transport) = cx.transport_for(link.peer);
                if msg.first() != Some(&tag) {
                    return Err(Error::internal(format!(
                        "rank {} sent a connection handle this rank cannot use (transport mismatch: {} expected)",
                        link.peer,
                        transport.name()
                    )));
                }
                transport.connect_send(cx, link, &msg[1..])?
            }
            State::Waiting(pending) => return self.settle(pending.poll(cx)?),
            State::Done => return Err(Error::internal("connection polled after it was made")),
        };
        match progress {
            // Just set up: the network's connect is called now, once.
            Progress::Waiting(pending) => self.settle(pending.poll(cx)?),
            made => self.settle(made),
        }
    }

    fn settle(&mut self, progress: Progress) -> Result<Option<Arc<Connection>>> {
        match progress {
            Progress::Made(conn) => Ok(Some(conn)),
            Progress::Waiting(pending) => {
                self.0 = State::Waiting(pending);
                Ok(None)
            }
        }
    }
}

/// One connection end to make: the caller's key (which communicator, which link), its
/// direction, and its state.
pub struct Wanted<K> {
    pub key: K,
    pub dir: Dir,
    pub est: Establish,
}

impl<K> Wanted<K> {
    pub fn new(key: K, link: Link, dir: Dir) -> Wanted<K> {
        Wanted { key, dir, est: Establish::new(link, dir) }
    }
}

/// Makes every connection of `wanted` together, in NCCL's order (see the module docs): all
/// receivers set up, then every sender connects, then accepts and connects are polled
/// together, sends first, until all are made. Used for a group's connections and for those a
/// resume makes again.
///
/// `poll` advances one end with its communicator's context (and may add context to an
/// error); `made` takes each connection when it is made; `between_rounds` runs after each
/// round that left some end unmade, given the first of them (the caller's deadline and
/// liveness checks; its error ends the attempt).
pub fn establish_all<K>(
    mut wanted: Vec<Wanted<K>>,
    mut poll: impl FnMut(&K, &mut Establish) -> Result<Option<Arc<Connection>>>,
    mut made: impl FnMut(K, Arc<Connection>),
    mut between_rounds: impl FnMut(&K) -> Result<()>,
) -> Result<()> {
    while !wanted.is_empty() {
        // Receivers set up first, then senders connect, then the waiting ends, sends first.
        wanted.sort_by_key(|w| (w.est.phase(), w.dir));
        let may_wait = wanted.iter().all(|w| w.est.phase() == Phase::Wait);
        let mut still = Vec::with_capacity(wanted.len());
        for mut w in wanted {
            if w.est.phase() == Phase::Wait && !may_wait {
                still.push(w);
                continue;
            }
            match poll(&w.key, &mut w.est)? {
                Some(conn) => made(w.key, conn),
                None => still.push(w),
            }
        }
        wanted = still;
        if let Some(first) = wanted.first() {
            between_rounds(&first.key)?;
            std::thread::yield_now();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_ordered_set_up_connect_wait_and_sends_sort_before_receives() {
        assert!(Phase::SetUp < Phase::Connect && Phase::Connect < Phase::Wait);
        assert!(Dir::Send < Dir::Recv);
        let link = Link { peer: 1, purpose: crate::program::Purpose::Ring(0) };
        assert_eq!(Establish::new(link, Dir::Recv).phase(), Phase::SetUp);
        assert_eq!(Establish::new(link, Dir::Send).phase(), Phase::Connect);
    }
}
