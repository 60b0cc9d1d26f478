//! `vramscope fleet`: many machines from one terminal, through the
//! Prometheus that already scrapes their exporters (`vramscope serve`).
//!
//! ```text
//!  Prometheus ──HTTP API──▶ prom::Client ──answers──▶ model::Fleet ──▶ view::FleetView ──▶ ui::fleet (render)
//!                                 ▲                                          │
//!                                 └──────── which node/process to chart ◀────┘
//! ```
//!
//! - [`prom`]: the client of Prometheus's HTTP API (instant and range
//!   queries), every failure one line; the boundary: answers bounded in
//!   size, series, labels and points, and every value past it finite and
//!   within ±2^64.
//! - [`model`]: nodes, GPUs and processes from the answers (pure, by key:
//!   O(n log n) in the series).
//! - [`view`]: what the person looks at (screen, sort, filter, selection)
//!   and what each key does (pure).

#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod model;
pub mod prom;
pub mod view;
