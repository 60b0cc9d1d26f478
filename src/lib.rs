//! vramscope: a live terminal dashboard for GPU memory inside PyTorch processes.
//!
//! Module map (data flows one way: sources → model → view):
//!
//! - [`event`]: decoded allocator events, shared by every part.
//! - [`ring`]: the shared-memory wire (format, writer, reader, control block,
//!   discovery). The only module with `unsafe`.
//! - [`agent`]: the embedded PyTorch agent: extract, run a command with it,
//!   doctor checks.
pub mod agent;
pub mod event;
pub mod ring;
