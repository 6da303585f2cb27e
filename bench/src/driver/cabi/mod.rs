//! The C-ABI driver: any libnccl-compatible library (NVIDIA's `libnccl.so.2`, or rustccl's
//! own C library), dlopened with libloading. Device memory and streams come from the CUDA
//! runtime (`libcudart.so`, dlopened too); with `--host-memory` buffers are host memory and
//! the stream is NULL (rustccl's library on its host backend).
//!
//! * [`abi`]: the C types (`ncclUniqueId` and its hex form, handles, constants, the
//!   functions' signatures);
//! * [`libraries`]: loading the libraries and resolving their symbols ([`NcclApi`],
//!   [`CudaApi`]);
//! * [`marshal`](mod@marshal): the pure part — turning a [`Call`](super::Call) into the
//!   sequence of NCCL calls it makes ([`Prim`]) — separate from the part that calls the
//!   library, so it is unit-tested without one;
//! * [`graph`]: CUDA graphs for `-G` through the runtime ([`CudaApi::begin_capture`], ...),
//!   used by both drivers;
//! * [`driver`]: [`CDriver`], the [`Driver`](super::Driver) that runs those calls on the
//!   loaded library.

pub mod abi;
pub mod driver;
pub mod graph;
pub mod libraries;
pub mod marshal;

pub use abi::{
    id_from_hex, id_to_hex, CudaGraph, CudaGraphExec, CudaStream, NcclComm, NcclUniqueId,
    CAPTURE_MODE_THREAD_LOCAL, MEMCPY_D2H, MEMCPY_H2D, SCALAR_HOST_IMMEDIATE,
};
pub use driver::CDriver;
pub use libraries::{CudaApi, NcclApi, CUDART_NAMES};
pub use marshal::{marshal, Prim};
