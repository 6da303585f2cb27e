//! rustccl-tests (being written).
