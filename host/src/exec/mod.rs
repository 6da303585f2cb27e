//! Execution: what runs a group's work once the planner made it (`crate::work`) and its
//! connections exist. Two executors, chosen by what the backend offers
//! (`Capabilities::host_addressable`), never by which backend it is, and described to coll by
//! an [`executor::Executor`] (where work runs, how the symmetric collectives run, what the
//! planner's programs need):
//! - [`host`]: the calling thread polls FIFOs in shared memory, the board of small
//!   collectives, single copies and the symmetric collectives' CPU twin (the host backend);
//! - [`gpu`]: one launch of the collective interpreter per communicator and kernel, through
//!   the `DeviceBackend` trait (CUDA today, HIP later).
//!
//! A communicator's `engine::Engine` keeps what they reuse from call to call: the
//! connections, the device executor's state and the planned route's memo (`memo`).
//!
//! Executors know nothing of communicators: what they need from one (its rank, whether to go
//! on, where to record an error) comes through [`CommSide`].

pub(crate) mod backoff;
pub(crate) mod engine;
pub mod executor;
pub mod gpu;
pub mod host;
pub(crate) mod memo;
pub mod observe;

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::{DeviceBackend, Stream};
use crate::error::{Error, Result};
use crate::program::Link;
use crate::transport::{Connection, Dir, Kind};
use crate::work::{LocalCopy, Work};

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

/// Copies within one rank's memory with nothing to compute (the one-rank route,
/// `coll::one_rank`), in order, by the executor the backend's capabilities choose: on a
/// device each on its stream ([`gpu::local_copies`]), on the host backend by the calling
/// thread ([`host::local_copies`]; the streams mean nothing there). The addresses are those
/// the planner resolves for the backend (`coll::plan::task_ctx`): host addresses where the
/// backend's memory is host-addressable, device addresses otherwise.
pub(crate) fn local_copies(backend: &dyn DeviceBackend, copies: &[(LocalCopy, Stream)]) -> Result<()> {
    if backend.capabilities().host_addressable {
        host::local_copies(copies.iter().map(|(c, _)| c));
        Ok(())
    } else {
        gpu::local_copies(backend, copies)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::DevicePtr;
    use crate::exec::gpu::fake::{Call, FakeDevice};

    /// On a device the one-rank copies are the backend's stream copies, each on its own
    /// stream, in order, and nothing else (no launch, no event: they go around the launch
    /// sequence).
    #[test]
    fn local_copies_on_a_device_are_stream_copies_in_order_each_on_its_stream() {
        let fake = FakeDevice::default();
        let copies = [
            (LocalCopy { src: 0xa000, dst: 0xb000, bytes: 64 }, Stream(7)),
            (LocalCopy { src: 0xc000, dst: 0xd000, bytes: 8 }, Stream(9)),
        ];
        local_copies(&fake, &copies).unwrap();
        let log = fake.log();
        let want: Vec<Call> = copies
            .iter()
            .map(|&(c, stream)| Call::Copy { dst: DevicePtr(c.dst as u64), src: DevicePtr(c.src as u64), bytes: c.bytes, stream })
            .collect();
        assert_eq!(log.calls, want);
        assert!(log.launches.is_empty());
        assert_eq!(log.events_recorded, 0);
    }

    /// On the host backend the calling thread moves the bytes (host addresses, as the planner
    /// resolves them there), in order: a later copy sees what an earlier one wrote.
    #[test]
    fn local_copies_on_the_host_backend_move_the_bytes_in_order() {
        let backend = crate::backend::HostBackend::shared().unwrap();
        let mut mem: Vec<u8> = (0..48).collect();
        let base = mem.as_mut_ptr() as usize;
        let at = |off: usize| base + off;
        let copies = [
            (LocalCopy { src: at(0), dst: at(16), bytes: 16 }, Stream::DEFAULT),
            (LocalCopy { src: at(16), dst: at(32), bytes: 16 }, Stream::DEFAULT),
        ];
        local_copies(&*backend, &copies).unwrap();
        let first: Vec<u8> = (0..16).collect();
        assert_eq!(&mem[..16], &first[..]);
        assert_eq!(&mem[16..32], &first[..]);
        assert_eq!(&mem[32..], &first[..], "the second copy read what the first wrote");
    }
}
