//! Hostile inputs: reader.
