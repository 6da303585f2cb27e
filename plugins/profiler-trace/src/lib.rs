//! rustccl-profiler-trace (being written).
