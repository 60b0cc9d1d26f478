//! vramscope: a live terminal dashboard for GPU memory inside PyTorch processes.
//!
//! Module map (data flows one way: sources → model → view, and one narrow
//! channel back: commands to a process):
//!
//! - [`text`]: text that reaches a terminal (made printable); the floor.
//! - [`event`]: decoded allocator events, shared by every part.
//! - [`ring`]: the shared-memory wire (format, writer, reader, control block,
//!   discovery). The only module with `unsafe`.
//! - [`agent`]: the embedded PyTorch agent: extract, run a command with it,
//!   doctor checks.
//! - [`input`]: what sources tell the hub ([`input::Input`]), the one
//!   recordable way in.
//! - [`recording`]: the recording file format (a sequence of inputs).
//! - [`collect`]: the collector (rings, NVML, `/proc`) feeding the model
//!   through the [`collect::Hub`].
//! - [`model`]: pure allocator state rebuilt from events; no I/O.
//! - [`pickle`]: a restricted pickle reader (plain data only) for PyTorch
//!   memory snapshot files.
//! - [`snapfile`]: PyTorch memory snapshot files read into the model's
//!   inputs, and written from a recording.
//! - [`sim`]: the caching-allocator simulator and workshop scenarios.
//! - [`demo`]: the simulator writing into a real segment, for `vramscope demo`.
//! - [`ui`]: the terminal dashboard (ratatui): one loop, one pane per file,
//!   [`ui::run`] is its entry point.
//! - [`fleet`]: many machines through Prometheus (`vramscope fleet`).
//! - [`serve`]: the collector's picture as Prometheus metrics (`vramscope serve`).
pub mod agent;
pub mod collect;
pub mod demo;
pub mod event;
pub mod fleet;
pub mod input;
pub mod model;
pub mod pickle;
pub mod recording;
pub mod ring;
pub mod serve;
pub mod sim;
pub mod snapfile;
pub mod text;
pub mod ui;
