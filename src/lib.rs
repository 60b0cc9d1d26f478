//! vramscope: a live terminal dashboard for GPU memory inside PyTorch processes.
//!
//! Module map (data flows one way: sources → model → view, and one narrow
//! channel back: commands to a process):
//!
//! - [`text`]: text that reaches a terminal: the formatters for bytes,
//!   counts and durations, and untrusted text made printable.
//! - [`event`]: decoded allocator events and where they sat in their ring,
//!   shared by every part.
//! - [`pytorch`]: the size rules of PyTorch's caching allocator, which the
//!   model and the simulator both stand on.
//! - [`ring`]: the shared-memory wire (format, writer, reader, control block,
//!   discovery), and the one channel back: [`ring::client`] sends a command
//!   to the producer of a segment. The only module with `unsafe`.
//! - [`model`]: pure allocator state rebuilt from events; no I/O.
//! - [`input`]: what sources tell the hub ([`input::Input`]), the one
//!   recordable way in.
//! - [`pickle`]: a restricted pickle reader (plain data only) for PyTorch
//!   memory snapshot files.
//! - [`recording`]: the recording file format (a sequence of inputs).
//! - [`sim`]: the caching-allocator simulator and workshop scenarios.
//! - [`collect`]: the collector (rings, NVML, `/proc`) feeding the model
//!   through the [`collect::Hub`].
//! - [`agent`]: the embedded PyTorch agent: extract, run a command with it,
//!   doctor checks.
//! - [`snapfile`]: PyTorch memory snapshot files read into the model's
//!   inputs, and written from a recording.
//! - [`demo`]: the simulator writing into a real segment, for `vramscope demo`.
//! - [`serve`]: the collector's picture as Prometheus metrics (`vramscope serve`).
//! - [`fleet`]: many machines through Prometheus (`vramscope fleet`).
//! - [`attach`]: `vramscope attach PID`: the agent put into a running
//!   Python process (a ptrace injector of its own, or `sys.remote_exec`).
//! - [`ui`]: the terminal dashboard (ratatui): one loop, one pane per file,
//!   [`ui::run`] is its entry point.
//! - [`given`]: a file named on the command line (a recording or a snapshot
//!   file), told apart and read once whatever it is (a pipe too).
//!
//! Layers, floor 0 first. A module imports only from floors below its own
//! (`tests/layers.rs` reads every `crate::` path and holds the code to this
//! list), so no import runs upward and no two modules lean on each other:
//!
//! 0. text
//! 1. event
//! 2. pytorch, ring
//! 3. model
//! 4. input, pickle
//! 5. recording, sim
//! 6. collect, agent
//! 7. snapfile, demo, serve, fleet, attach
//! 8. ui, given
pub mod agent;
pub mod attach;
pub mod collect;
pub mod demo;
pub mod event;
pub mod fleet;
pub mod given;
pub mod input;
pub mod model;
pub mod pickle;
pub(crate) mod pytorch;
pub mod recording;
pub mod ring;
pub mod serve;
pub mod sim;
pub mod snapfile;
pub mod text;
pub mod ui;
