//! rustccl: a collective-communication library for GPUs (all-reduce, all-gather,
//! reduce-scatter, broadcast, reduce, all-to-all, send/receive between ranks), built as NCCL
//! and RCCL are, in Rust, with a host-memory backend for CPU tensors and machines without a GPU.
//!
//! # Backends
//!
//! One communicator runs on one device backend ([`backend`]), chosen by `RUSTCCL_BACKEND`:
//! `cuda` (NVIDIA GPUs through the driver API, kernels compiled at run time) or `host` (host
//! memory, CPU threads; what CI runs); `hip` is named but not built yet. Unset: CUDA when a
//! GPU is present, else host. Ranks on one node talk through shared memory or the GPUs' peer access,
//! ranks on different nodes through a net plugin ([`plugin`]: TCP sockets built in,
//! InfiniBand / RoCE, or any library named by `NCCL_NET_PLUGIN`, including NCCL's own C
//! plugins). The same library also ships as a drop-in `libnccl.so.2` (the `rustccl-capi`
//! package) for programs written against NCCL's C API.
//!
//! # Starting
//!
//! * One process per rank, started by a cluster launcher (torchrun, Slurm's `srun`, Open
//!   MPI's `mpirun`): [`Communicator::from_env`] reads the launcher's variables and the
//!   rendezvous address (`MASTER_ADDR` / `MASTER_PORT` or `NCCL_COMM_ID`) and returns this
//!   rank's communicator, on GPU `LOCAL_RANK % <GPUs>`. See the `from_env_all_reduce` example.
//! * One process per rank, started by your own code: rank 0 calls [`get_unique_id`], sends
//!   the id to the other ranks (its [`UniqueId::to_hex`] text travels anywhere), and every rank
//!   calls [`Communicator::init_rank`] (or [`Communicator::init_rank_config`] with a device
//!   and a [`CommConfig`]).
//! * Every rank in this process, one per device: [`Communicator::init_all`].
//!
//! Then the collectives are methods of [`Communicator`] (`all_reduce`, `all_gather`, ...)
//! on device pointers and a stream of the communicator's backend, grouped with
//! [`group_start`] / [`group_end`] as in NCCL, and the communicator ends with
//! [`Communicator::destroy`] (or [`Communicator::abort`] after a failure). [`typed`] is
//! the safe, typed API over these raw calls (element types, buffers, ranks and groups as Rust
//! types, lifetimes tied to the operation); most programs should start there.
//!
//! ```no_run
//! use rustccl::{Communicator, ReduceOp};
//! use rustccl::types::DataType;
//!
//! # fn main() -> rustccl::Result<()> {
//! let comm = Communicator::from_env()?;
//! let backend = comm.backend().clone();
//! let device = comm.device()? as usize;
//! let stream = backend.create_stream(device)?;
//! let buf = backend.alloc(device, 1024 * 4)?;
//! backend.copy_to_device(buf, &[0u8; 1024 * 4], stream)?;
//! comm.all_reduce(buf, buf, 1024, DataType::Float32, ReduceOp::Sum, stream)?;
//! backend.synchronize(stream)?;
//! backend.free(buf)?;
//! comm.destroy()?;
//! # Ok(())
//! # }
//! ```
//!
//! # Errors and settings
//!
//! Every call returns [`Result`]; an [`Error`] has NCCL's result code ([`ResultCode`]) and a
//! message that says what to do, also kept as the communicator's and the process's last error
//! (`ncclGetLastError`). Settings come from NCCL's environment variables (`NCCL_DEBUG`,
//! `NCCL_SOCKET_IFNAME`, `NCCL_ALGO`, ... see [`params`]) and from [`CommConfig`].
//!
//! # Modules
//!
//! They follow NCCL's split: [`bootstrap`] (rendezvous and out-of-band messages between
//! ranks), [`comm`] (the communicator lifecycle), [`coll`] (enqueue, groups, the planner),
//! [`transport`] (connections between ranks), [`exec`] (running a planned operation on a
//! backend), [`backend`] (device backends behind one trait), [`plugin`] (net, tuner and
//! profiler plugins), plus the cross-cutting [`error`], [`params`], [`config`] and [`log`].

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
pub mod observe;
pub mod params;
pub mod plugin;
pub mod profile;
pub mod program;
pub mod reduce;
pub mod spec;
#[doc(hidden)]
pub mod testing;
pub mod transport;
pub mod typed;
pub mod types;
pub mod version;
pub mod window;
pub mod work;

pub use bootstrap::UniqueId;

/// Encrypts rustccl's TCP traffic (bootstrap, socket transport) with a pre-shared key of at
/// least 32 bytes, or, with `None`, turns encryption off; process-global, as NCCL's
/// `ncclSetEncryption`: call it before [`get_unique_id`] and the first communicator. Every
/// rank must use the same key: a rank with another one, or none, is refused at init. Without
/// this call, `NCCL_ENCRYPTION_PSK` or `NCCL_ENCRYPTION_PSK_FILE` give the key.
pub fn set_encryption(psk: Option<&[u8]>) -> Result<()> {
    bootstrap::encryption::set(psk)
}
pub use comm::{get_unique_id, Communicator, LaunchEnv, Launcher, MemStat, MemStats, ShrinkFlags, SPLIT_NOCOLOR, SUSPEND_MEM};
pub use coll::{group_end, group_simulate_end, group_start, ReduceOp, Scalar};
pub use config::CommConfig;
pub use error::{Error, ErrorKind, Result, ResultCode};
