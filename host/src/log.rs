//! Logging (being written).
