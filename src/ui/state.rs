//! The dashboard's state, grouped by screen: what [`super::App`] changes and
//! the panes draw. Plain data and small derived values; no events here.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Screen {
    Overview,
    Process,
}

/// The panes of the process view (tabs when the terminal is small).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pane {
    Timeline,
    Blocks,
    Stats,
    Events,
    Diagnosis,
}

impl Pane {
    pub const ALL: [Pane; 5] = [
        Pane::Timeline,
        Pane::Blocks,
        Pane::Stats,
        Pane::Events,
        Pane::Diagnosis,
    ];
    pub fn title(self) -> &'static str {
        match self {
            Pane::Timeline => "Timeline",
            Pane::Blocks => "Blocks",
            Pane::Stats => "Stats",
            Pane::Events => "Events",
            Pane::Diagnosis => "OOM/Leak",
        }
    }
    pub fn index(self) -> usize {
        Pane::ALL.iter().position(|p| *p == self).unwrap_or(0)
    }
}
