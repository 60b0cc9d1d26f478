//! vramscope's core: the allocator as data, with no I/O of its own but
//! files handed to it. Everything here is a pure function of its inputs,
//! so the dashboard, the exporter, `replay` and the tests see one model.
//!
//! - [`pytorch`]: the size rules of PyTorch's caching allocator, which the
//!   model and the simulator both stand on.
//! - [`model`]: allocator state rebuilt from events.
//! - [`input`]: what sources tell the model ([`input::Input`]), the one
//!   recordable way in.
//! - [`pickle`]: a restricted pickle reader (plain data only) for PyTorch
//!   memory snapshot files.
//! - [`recording`]: the recording file format (a sequence of inputs).
//! - [`sim`]: the caching-allocator simulator and workshop scenarios.
//! - [`snapfile`]: PyTorch memory snapshot files read into the model's
//!   inputs, and written from a recording.
//!
//! Layers, floor 0 first (`tests/layers.rs` holds each crate's files to
//! its list):
//!
//! 0. pytorch
//! 1. model
//! 2. input, pickle
//! 3. recording, sim
//! 4. snapfile

pub(crate) mod pytorch;

pub mod input;
pub mod model;
pub mod pickle;
pub mod recording;
pub mod sim;
pub mod snapfile;
