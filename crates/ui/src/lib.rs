//! The terminal screens: the dashboard (a ratatui view of the hub's
//! snapshots) and the fleet view, both run by one shell.
//!
//! One thread, one loop ([`shell::Shell`]), one channel of events. The
//! shell owns the terminal (set up and restored in [`terminal`]), the
//! thread reading keys, the colours ([`ShellOptions::theme`]) and the frame
//! loop; a [`shell::Screen`] decides the rest. The dashboard's, in
//! [`run::Dashboard`], meets the rest of the program through the channel:
//!
//! - the hub: [`Hub::on_change`](vramscope_collect::Hub::on_change) sends `Changed`, coalesced (at most one
//!   queued until the next snapshot is taken);
//! - a process: a command App asks for ([`Effect::RunCommand`], with the
//!   segment the snapshot shows for the process) goes through the ring's
//!   command client ([`vramscope_wire::ring::client`]) on a thread of its own, and
//!   its answer comes back as `CommandDone` ([`send_command`]); unless the
//!   [`Driver`] refuses every command ([`Driver::refusal`]: `--readonly`, a
//!   recording played back, a snapshot file), when that is the answer;
//! - the hub's live advisor: `A` or `F` ([`Effect::Advise`]) starts it on the
//!   hub and has it advise the selected process; its advice arrives in
//!   the snapshots (`ProcessEntry::advice`), and `y` copies a setting
//!   through the terminal ([`Effect::Copy`], OSC 52, written by the shell);
//! - the [`Driver`]'s [`Driver::on_signal`] callback sends `Signal`
//!   (SIGINT, SIGTERM, SIGHUP);
//! - the keyboard and mouse: the shell's thread blocked in crossterm's reader
//!   sends `Input`;
//! - time: the shell sends `Tick { now_ns }` on every wake-up.
//!
//! The pure [`App`] state machine turns each event into state and
//! [`Effect`]s and makes every decision (what to draw, when to take a
//! snapshot, when to wake up); [`run::Dashboard`] carries them out, takes
//! at most one snapshot per request (snapshot-then-render: the hub's lock
//! is never held while drawing), and the shell draws at most one frame per
//! wake-up — only when App says so, at least 10 ms after the previous one,
//! bracketed by a synchronized update.
//!
//! ```text
//!  crossterm thread ─Input──┐
//!  Hub::on_change ───Changed┤                      ┌ Refresh ─▶ hub.snapshot ─▶ Snapshot
//!  Driver::on_signal ─Signal┼─▶ mpsc ─▶ App::handle ┼ RunCommand{segment} ─▶ thread: ring::client::command
//!  command thread ────Done──┤                      └ DemoSpeed…, Quit
//!  shell ──Tick{now_ns}─────┘        draw(frame, &App) ─▶ one pane file each
//! ```
//!
//! Modules: [`shell`] the frame loop every screen runs in; [`run`](mod@run) the
//! dashboard's effects; [`app`] the state machine, with its state grouped
//! by screen in [`state`]; [`keys`] the one key table (dispatch, help,
//! footer) of every screen, the fleet's included; [`fleet`] the fleet view
//! (its keys in the same table). Panes, one file each, each given
//! what it draws: [`overview`], [`process`] (with [`timeline`],
//! [`blockmap`], [`stats`], [`events`], [`diagnosis`]), [`bars`] (header,
//! demo caption, footer), [`help`], [`legend`], [`popup`], [`attribution`]
//! (the "By module" overlay), [`stepdiff`] (the step diff overlay),
//! [`advisor`] (the allocator advisor overlay; [`clipboard`] copies its
//! line through the terminal).
//! [`scroll`] is the one scroll type of every scrolled pane and overlay
//! (bounded at both ends, the same keys everywhere).
//! [`layout`] places them (pure geometry); [`rows`] the overview's rows;
//! [`theme`] owns colours and glyphs; [`svg`] writes screenshots;
//! `fixtures` builds deterministic snapshots for tests.

pub(crate) mod advisor;
pub mod app;
pub(crate) mod attribution;
pub(crate) mod bars;
pub mod blockmap;
pub(crate) mod caption;
pub(crate) mod clipboard;
pub mod diagnosis;
mod draw;
mod driver;
pub(crate) mod events;
pub(crate) mod fit;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod fleet;
pub(crate) mod help;
pub(crate) mod history;
pub mod keys;
pub mod layout;
pub(crate) mod legend;
pub(crate) mod letters;
pub mod overview;
pub mod popup;
pub(crate) mod process;
pub mod rows;
pub mod run;
pub(crate) mod scroll;
pub mod shell;
pub mod state;
pub mod stats;
pub(crate) mod stepdiff;
pub(crate) mod svg;
pub(crate) mod terminal;
pub mod theme;
pub(crate) mod timeline;
pub(crate) mod trace;
pub(crate) mod willfit;

pub use app::{App, AppConfig, AppEvent, CommandDone, Effect, ScreenshotAfter, Shot};
pub use draw::{draw, render_buffer, screenshot_now, Still};
pub use driver::{app_config, send_command, DemoHandle, Driver, UiOptions};
pub use keys::ReplaySeek;
pub use run::run;
pub use scroll::Scroll;
pub use shell::{Pace, Shell, ShellOptions};
pub use state::{Overlay, Pane, Screen};
pub use theme::Theme;
