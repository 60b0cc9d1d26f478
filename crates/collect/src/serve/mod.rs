//! `vramscope serve`: the collector's picture as Prometheus metrics, for
//! the monitoring stack a team already runs.
//!
//! ```text
//!  Collector (its own runtime) ──▶ Hub ──snapshot (≤ 1 per max_age)──▶ exposition::render ──▶ GET /metrics
//! ```
//!
//! - [`exposition`]: a [`Snapshot`](crate::Snapshot) as the text
//!   format or OpenMetrics (pure).
//! - [`http`]: the read-only HTTP server (bounded connections, a newcomer
//!   taking the slot of the longest idle one so that idle clients cannot
//!   keep a scrape out, timeouts, 404/405 for anything that is not a
//!   scrape).

pub(crate) mod exposition;
pub mod http;

/// This machine's name (`/proc/sys/kernel/hostname`), made printable; empty
/// when it cannot be read.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| vramscope_text::printable(h.trim()))
        .unwrap_or_default()
}
