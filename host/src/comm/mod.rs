//! Communicator (being written).
