//! rustccl-net-socket (being written).
