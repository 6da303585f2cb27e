//! rustccl-capi (being written).
