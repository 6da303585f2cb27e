//! Config (being written).
