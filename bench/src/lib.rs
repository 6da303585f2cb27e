//! rustccl-bench (being written).
