//! vramscope's wire: what instrumented processes and vramscope say to each
//! other, and the only crate with `unsafe` code.
//!
//! - [`event`]: decoded allocator events and where they sat in their ring,
//!   shared by every crate above.
//! - [`ring`]: the shared-memory wire (format, writer, reader, control
//!   block, discovery), and the one channel back: [`ring::client`] sends a
//!   command to the producer of a segment. Its `shm` file holds the
//!   `unsafe` blocks (a mapping another process may truncate), each with a
//!   comment saying why it is sound.
//!
//! Layers, floor 0 first (`tests/layers.rs` holds each crate's files to
//! its list):
//!
//! 0. event
//! 1. ring
#![deny(unsafe_code)]

pub mod event;
#[allow(unsafe_code)]
pub mod ring;
