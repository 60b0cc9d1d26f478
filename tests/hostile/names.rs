//! Hostile inputs: names.
