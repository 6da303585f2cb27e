//! rustccl-plugin-api (being written).
