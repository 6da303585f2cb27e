//! Device backends (being written).
