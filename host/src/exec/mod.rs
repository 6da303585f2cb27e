//! Execution: what runs a group's work once the planner made it (`crate::work`) and its
//! connections exist. Two executors, chosen by what the backend offers
//! (`Capabilities::host_addressable`), never by which backend it is:
//! - [`host`]: CPU threads poll FIFOs in shared memory (the host backend);
//! - [`gpu`]: one launch of the collective interpreter per communicator and kernel, through
//!   the `DeviceBackend` trait (CUDA today, HIP later).
//!
//! Executors know nothing of communicators: what they need from one (its rank, whether to go
//! on, where to record an error) comes through [`CommSide`].

pub(crate) mod backoff;
pub mod gpu;
pub mod host;

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::program::Link;
use crate::transport::{Connection, Dir};

/// The connections of one communicator's work, by link and direction.
pub type Links = HashMap<(Link, Dir), Arc<Connection>>;

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
}
