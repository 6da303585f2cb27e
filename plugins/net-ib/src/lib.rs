//! rustccl-net-ib (being written).
