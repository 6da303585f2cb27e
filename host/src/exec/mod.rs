//! Execution: what runs a group's work once the planner made it (`crate::work`) and its
//! connections exist. Two executors, chosen by what the backend offers
//! (`Capabilities::host_addressable`), never by which backend it is:
//! - [`host`]: the calling thread polls FIFOs in shared memory, the board of small
//!   collectives, single copies and the symmetric collectives' CPU twin (the host backend);
//! - [`gpu`]: one launch of the collective interpreter per communicator and kernel, through
//!   the `DeviceBackend` trait (CUDA today, HIP later).
//!
//! A communicator's [`engine::Engine`] keeps what they reuse from call to call: the
//! connections, the device executor's state and the planned route's memo ([`memo`]).
//!
//! Executors know nothing of communicators: what they need from one (its rank, whether to go
//! on, where to record an error) comes through [`CommSide`].

pub(crate) mod backoff;
pub(crate) mod engine;
pub mod gpu;
pub mod host;
pub(crate) mod memo;
pub mod observe;

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::program::Link;
use crate::transport::{Connection, Dir, Kind};
use crate::work::Work;

/// The connections of one communicator's work, by link and direction.
pub type Links = HashMap<(Link, Dir), Arc<Connection>>;

/// The receiving network connections of a work and how many slots it consumes from each (one
/// per step that receives on it). Executors tell the proxy of them ([`NetReceives::expect`])
/// each time the work runs, before it runs: the proxy posts receives only for slots an
/// operation will consume (see `Connection::expected`). The host executor tells it itself;
/// the device executor at launch, or from a host callback at each replay of a captured launch
/// (`gpu::announce_receives`).
#[derive(Clone)]
pub struct NetReceives(Vec<(Arc<Connection>, u64)>);

impl NetReceives {
    pub fn of(work: &Work, links: &Links) -> NetReceives {
        if !links.values().any(|c| c.kind == Kind::Net && c.dir == Dir::Recv) {
            return NetReceives(Vec::new());
        }
        let mut out: Vec<(Arc<Connection>, u64)> = Vec::new();
        let recvs = work.items.iter().flat_map(|item| item.steps.iter().flat_map(|(_, s)| s.recv.iter()));
        for link in recvs {
            let Some(c) = links.get(&(*link, Dir::Recv)).filter(|c| c.kind == Kind::Net) else { continue };
            match out.iter_mut().find(|(have, _)| Arc::ptr_eq(have, c)) {
                Some((_, n)) => *n += 1,
                None => out.push((Arc::clone(c), 1)),
            }
        }
        NetReceives(out)
    }

    /// Whether the work receives nothing over the network.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Tells each connection's proxy that the work is about to consume its slots.
    pub fn expect(&self) {
        for (c, n) in &self.0 {
            c.expect_slots(*n);
        }
    }
}

/// What an executor needs from the communicator whose work it runs.
pub trait CommSide {
    fn rank(&self) -> u32;
    /// An error when the work must stop: the communicator was aborted or revoked, a peer
    /// failed, or the operation waited past its time limit (hang reports are made here too).
    fn check(&self, what: &str) -> Result<()>;
    /// Records an error as the communicator's last.
    fn record(&self, e: Error) -> Error;
    /// Ranks of the communicator on this host (this one included): the host executor yields
    /// the core early when they outnumber the cores.
    fn local_ranks(&self) -> u32 {
        1
    }
    /// Host backend: the communicator's board (`host::board`), where it has one. The FIFO
    /// poller reads the peers' route entries on it while it waits.
    fn board(&self) -> Option<Arc<host::board::Board>> {
        None
    }
}
