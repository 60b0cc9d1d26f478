//! The shared-memory wire.
