//! rustccl-bench: an nccl-tests-like benchmark of rustccl (or of any libnccl-compatible
//! library through its C ABI), with ranks as local processes.
//!
//! * [`opts`]: the command line (nccl-tests' flags).
//! * [`ops`]: the operations, their buffer layouts and bandwidth formulas.
//! * [`data`]: predictable inputs and exact expected outputs per type and operator.
//! * [`driver`]: the Rust-API and C-ABI drivers behind one trait.
//! * [`bench`](mod@bench): one rank's sweep; [`format`](mod@format): the table and JSON.
//! * [`tune`]: `--tune`, the sweep that writes a tuner table; [`plot`]: `--plot`, the SVG.
//! * [`launch`]: starting the ranks as processes; [`layout`]: how many, and what happens
//!   when several share a GPU; [`mps`]: NVIDIA's MPS daemon.

pub mod bench;
pub mod data;
pub mod driver;
pub mod format;
pub mod launch;
pub mod layout;
pub mod mps;
pub mod ops;
pub mod opts;
pub mod plot;
pub mod tune;
