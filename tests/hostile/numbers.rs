//! Hostile inputs: numbers.
