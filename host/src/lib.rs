//! rustccl: a GPU collective-communication library (the system NCCL and RCCL are), with a
//! host-memory backend for CPU tensors and CI.
//!
//! Modules follow NCCL's split: [`bootstrap`] (rendezvous and out-of-band messages between
//! ranks), [`comm`] (the communicator lifecycle), [`backend`] (device backends behind one
//! trait), plus the cross-cutting [`error`], [`params`], [`config`] and [`log`].
//!
//! [`typed`] is the safe, typed API over [`Communicator`]'s raw one (element types, buffers,
//! ranks and groups as Rust types); start there.

pub mod backend;
pub mod bootstrap;
pub mod coll;
pub mod comm;
pub mod config;
pub mod error;
pub mod exec;
#[doc(hidden)]
pub mod fuzzing;
pub mod log;
pub mod params;
pub mod plugin;
pub mod profile;
pub mod program;
pub mod reduce;
pub mod transport;
pub mod typed;
pub mod types;
pub mod version;
pub mod work;

pub use bootstrap::UniqueId;
pub use comm::{get_unique_id, Communicator, MemStat, MemStats, ShrinkFlags, SPLIT_NOCOLOR, SUSPEND_MEM};
pub use coll::{group_end, group_simulate_end, group_start, ReduceOp, Scalar};
pub use config::CommConfig;
pub use error::{Error, ErrorKind, Result, ResultCode};
