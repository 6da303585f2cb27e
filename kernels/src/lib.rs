//! rustccl-kernels (being written).
