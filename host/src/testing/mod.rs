//! Support shared by the project's tests and benchmark (`rustccl-tests`, `rustccl-bench`):
//! [`mod@reference`], the model of what every collective must produce.
//!
//! Public but hidden from the documentation, like [`crate::fuzzing`]: it is no API for users,
//! but both the rank workers of `tests/` and the benchmark's checks need the same model, and a
//! module here needs no crate of its own nor a feature (a feature would make `cargo build -p
//! rustccl` and the workspace build different libraries). It is pure: it imports only
//! [`crate::spec`], none of the code it checks.

pub mod reference;
