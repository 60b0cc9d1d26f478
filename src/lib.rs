//! vramscope: a live terminal dashboard for GPU memory inside PyTorch processes.
//!
//! Module map (data flows one way: sources → model → view):
//!
//! - [`event`]: decoded allocator events, shared by every part.
//! - [`ring`]: the shared-memory wire (format, writer, reader, control block,
//!   discovery). The only module with `unsafe`.
//! - [`ui`]: the terminal dashboard (ratatui): one loop, one pane per file,
//!   [`ui::run`] is its entry point.
pub mod collect;
pub mod demo;
pub mod event;
pub mod model;
pub mod ring;
pub mod sim;
pub mod ui;
