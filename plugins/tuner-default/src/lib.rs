//! rustccl-tuner-default (being written).
