//! The typed API: rustccl's collectives with Rust types instead of addresses, counts and
//! codes. (The raw API, [`Communicator`](crate::Communicator)'s methods, mirrors NCCL's C
//! API and stays for the C library and for experts.)
//!
//! # Guide
//!
//! * **Communicators**: a [`Comm`] is one rank's. Make it with [`Comm::init`] (one process
//!   per rank, every rank passing the same [`UniqueId`](crate::UniqueId) that one rank made
//!   with [`get_unique_id`](crate::get_unique_id) and sent the others; launchers such as
//!   torchrun or Slurm can provide what `Communicator::from_env` reads), [`Comm::init_all`]
//!   (several ranks of one process), or [`Comm::init_nonblocking`] (a [`PendingInit`] to
//!   poll). Dropping a `Comm` completes its work, finalizes and destroys it;
//!   [`Comm::abort`] stops it at once; [`Comm::split`] and [`Comm::shrink`] make children.
//!   A `Comm` is `Send` but not `Sync` (its operations come from one thread at a time);
//!   an [`AbortHandle`] stops it from another thread.
//! * **Elements** are the [`Element`] types: `f32`, `f64`, [`f16`](struct@f16), [`bf16`], `i8`, `u8`,
//!   `i32`, `u32`, `i64`, `u64`, [`F8E4M3`], [`F8E5M2`]. A call's buffers must hold the same
//!   element type; a mismatch does not compile.
//! * **Buffers** are [`SendBuf`]s and [`RecvBuf`]s: host memory (`&[T]`, `&mut [T]`,
//!   `Vec<T>`, arrays) on the host backend; a [`DeviceBuffer`] (from [`Comm::alloc`] or
//!   [`Comm::buffer_from`]) on any backend; cudarc's `CudaSlice`/`CudaView(Mut)` with the
//!   `cudarc` feature. Host memory on a GPU communicator, or memory of another backend or
//!   device, is refused ([`ErrorKind::Memory`]) before anything is enqueued; so are lengths
//!   that do not fit the operation ([`ErrorKind::Length`]) and roots or peers that are not
//!   ranks ([`ErrorKind::Rank`]).
//! * **Operations** ([`Comm::all_reduce`], [`Comm::broadcast`], [`Comm::reduce`],
//!   [`Comm::all_gather`], [`Comm::reduce_scatter`], [`Comm::all_to_all`], [`Comm::gather`],
//!   [`Comm::scatter`], [`Comm::send`], [`Comm::recv`], and the `_in_place` variants) take a
//!   stream ([`Stream::DEFAULT`], [`Comm::stream`], or a cudarc stream) and return a
//!   [`Pending`], which borrows the buffers until the operation has completed:
//!   [`Pending::wait`], [`Pending::poll`], [`Pending::is_ready`]. On the host backend the
//!   operation has completed when the call returns; on a GPU it runs on the stream; on a
//!   non-blocking communicator in the background.
//! * **Reductions** are [`Op`]s; `Op::PreMulSum(x)` takes a scalar of the element type.
//! * **Groups**: [`Comm::group`] queues operations on a [`Group`] and runs them together
//!   when the closure returns (nothing runs if it returns an error); sends and receives that
//!   depend on each other, and several ranks driven by one thread, need one.
//! * **Errors** are [`Error`]s: an [`ErrorKind`] to branch on, the NCCL code
//!   ([`Error::code`]), a message; they convert from and into [`crate::Error`].
//!
//! # Example
//!
//! Two ranks as threads of one process (separate processes work the same way, each calling
//! [`Comm::init`]):
//!
//! ```
//! # std::env::set_var("RUSTCCL_BACKEND", "host");
//! # std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
//! use rustccl::typed::prelude::*;
//!
//! let comms = Comm::init_all(&[0, 1])?;
//! std::thread::scope(|s| {
//!     for comm in comms {
//!         s.spawn(move || -> Result<(), rustccl::typed::Error> {
//!             let me = comm.rank().get() as f32;
//!             let mut grads = vec![me + 1.0; 4];                 // rank 0: 1s, rank 1: 2s
//!             comm.all_reduce_in_place(&mut grads, Op::Avg, &Stream::DEFAULT)?.wait()?;
//!             assert_eq!(grads, [1.5; 4]);
//!
//!             let mut everyone = vec![0.0f32; 2];
//!             comm.all_gather(&[me], &mut everyone, &Stream::DEFAULT)?.wait()?;
//!             assert_eq!(everyone, [0.0, 1.0]);
//!
//!             let too_short = &mut [0.0f32; 1];
//!             let e = comm.all_gather(&[me], too_short, &Stream::DEFAULT).unwrap_err();
//!             assert_eq!(e.kind(), ErrorKind::Length); // refused before anything ran
//!             Ok(())                                   // dropping `comm` finalizes it
//!         });
//!     }
//! });
//! # Ok::<(), rustccl::typed::Error>(())
//! ```
//!
//! # What does not compile
//!
//! Each refused program below sits beside the same program made right, which compiles (a
//! `compile_fail` test alone would also pass for a typo). Rustdoc checks error codes only on
//! nightly.
//!
//! Buffers of different element types (an `f32` send buffer, an `f64` receive buffer):
//!
//! ```compile_fail,E0277
//! # use rustccl::typed::prelude::*;
//! fn step(comm: &Comm) {
//!     let send = vec![1.0f32; 4];
//!     let mut recv = vec![0.0f64; 4];
//!     let _ = comm.all_reduce(&send, &mut recv, Op::Sum, &Stream::DEFAULT);
//! }
//! ```
//!
//! ```no_run
//! # use rustccl::typed::prelude::*;
//! fn step(comm: &Comm) {
//!     let send = vec![1.0f32; 4];
//!     let mut recv = vec![0.0f32; 4];
//!     let _ = comm.all_reduce(&send, &mut recv, Op::Sum, &Stream::DEFAULT);
//! }
//! ```
//!
//! A PreMulSum scalar of another type than the buffers:
//!
//! ```compile_fail,E0308
//! # use rustccl::typed::prelude::*;
//! fn scale(comm: &Comm, grads: &mut [f32]) {
//!     let _ = comm.all_reduce_in_place(grads, Op::PreMulSum(0.5f64), &Stream::DEFAULT);
//! }
//! ```
//!
//! ```no_run
//! # use rustccl::typed::prelude::*;
//! fn scale(comm: &Comm, grads: &mut [f32]) {
//!     let _ = comm.all_reduce_in_place(grads, Op::PreMulSum(0.5f32), &Stream::DEFAULT);
//! }
//! ```
//!
//! Reading a buffer while its operation may still run:
//!
//! ```compile_fail,E0502
//! # use rustccl::typed::prelude::*;
//! fn step(comm: &Comm) -> Result<f32, rustccl::typed::Error> {
//!     let mut grads = vec![1.0f32; 4];
//!     let pending = comm.all_reduce_in_place(&mut grads, Op::Sum, &Stream::DEFAULT)?;
//!     let early = grads[0];
//!     pending.wait()?;
//!     Ok(early)
//! }
//! ```
//!
//! ```no_run
//! # use rustccl::typed::prelude::*;
//! fn step(comm: &Comm) -> Result<f32, rustccl::typed::Error> {
//!     let mut grads = vec![1.0f32; 4];
//!     let pending = comm.all_reduce_in_place(&mut grads, Op::Sum, &Stream::DEFAULT)?;
//!     pending.wait()?;
//!     let done = grads[0];
//!     Ok(done)
//! }
//! ```
//!
//! A buffer that does not outlive its group:
//!
//! ```compile_fail,E0597
//! # use rustccl::typed::prelude::*;
//! fn step(comm: &Comm) -> Result<(), rustccl::typed::Error> {
//!     comm.group(|g| {
//!         let mut local = vec![0u8; 4];
//!         g.all_reduce_in_place(&mut local, Op::Sum, &Stream::DEFAULT)
//!     })
//! }
//! ```
//!
//! ```no_run
//! # use rustccl::typed::prelude::*;
//! fn step(comm: &Comm) -> Result<(), rustccl::typed::Error> {
//!     let mut outside = vec![0u8; 4];
//!     comm.group(|g| {
//!         g.all_reduce_in_place(&mut outside, Op::Sum, &Stream::DEFAULT)
//!     })
//! }
//! ```
//!
//! Sharing a communicator between threads (operations of one communicator come from one
//! thread at a time; move it to the thread, or share an [`AbortHandle`]):
//!
//! ```compile_fail,E0277
//! # use rustccl::typed::prelude::*;
//! fn shared<T: Sync>(_: &T) {}
//! fn check(comm: &Comm) {
//!     shared(comm);
//! }
//! ```
//!
//! ```no_run
//! # use rustccl::typed::prelude::*;
//! fn shared<T: Sync>(_: &T) {}
//! fn check(comm: &Comm) {
//!     shared(&comm.abort_handle());
//! }
//! ```

mod buffer;
mod build;
mod call;
mod comm;
mod config;
#[cfg(feature = "cudarc")]
pub mod cudarc;
mod device_buffer;
mod element;
mod error;
mod group;
pub mod host_mem;
mod ops;
mod pending;
mod rank;
mod stream;
#[cfg(test)]
mod tests;

pub use buffer::{RecvBuf, SendBuf};
pub use comm::{AbortHandle, Comm, PendingInit};
pub use config::CollConfig;
pub use device_buffer::DeviceBuffer;
pub use element::{bf16, f16, Element, F8E4M3, F8E5M2};
pub use error::{Error, ErrorKind, Result};
pub use group::Group;
pub use pending::Pending;
pub use rank::{Op, Rank};
pub use stream::{AsStream, Stream};

/// The names most programs need: `use rustccl::typed::prelude::*;`.
///
/// ```
/// use rustccl::typed::prelude::*;
/// let _: Op<f32> = Op::Sum;
/// let _ = Rank::new(0);
/// ```
pub mod prelude {
    pub use super::{bf16, f16, AbortHandle, CollConfig, Comm, DeviceBuffer, Element, ErrorKind, Group, Op, Pending, Rank, RecvBuf, SendBuf, Stream, F8E4M3, F8E5M2};
}
