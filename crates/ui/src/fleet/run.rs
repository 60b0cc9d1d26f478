//! The fleet view as the shell runs it ([`crate::shell`]): [`FleetApp`]
//! decides, and its [`Ask`]s go to whoever queries Prometheus (off this
//! thread: `vramscope fleet` hands them to its own runtime, whose answers
//! come back through the shell's channel as [`FleetEvent`]s).

use anyhow::Result;
use ratatui::Frame;

use super::app::{Ask, FleetApp, FleetEvent};
use crate::shell::{Pace, Screen, Shell};

/// Runs the fleet view in `shell` until the person quits or a signal
/// comes; `ask` is called with every query the view needs.
pub fn run(shell: Shell<FleetEvent>, app: FleetApp, ask: impl FnMut(Ask)) -> Result<()> {
    shell.run(&mut Fleet { app, ask })
}

/// The fleet view and where its asks go.
struct Fleet<F> {
    app: FleetApp,
    ask: F,
}

impl<F: FnMut(Ask)> Screen for Fleet<F> {
    type Event = FleetEvent;

    fn wake(&mut self, events: Vec<FleetEvent>) {
        for ev in events {
            for a in self.app.handle(ev) {
                (self.ask)(a);
            }
        }
    }

    fn pace(&mut self) -> &mut dyn Pace {
        &mut self.app
    }

    fn draw(&self, frame: &mut Frame) {
        super::render(frame, &self.app)
    }
}
