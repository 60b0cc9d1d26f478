//! Hostile inputs: memory.
