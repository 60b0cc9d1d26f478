//! The fleet view's state machine: [`FleetView`] (what is shown) and what
//! the dashboard's [`App`](crate::App) has around it too: the help and
//! legend overlays, the filter prompt, the footer's message, screenshots
//! and when to draw. Keys go through the one key table ([`keys`], contexts
//! `Fleet`, `FleetList`, `FleetNode`), so the fleet's help, footer and
//! dispatch never disagree, and an action the dashboard has takes the
//! dashboard's keys. Pure: events in, [`Ask`]s out; no terminal, no I/O,
//! no clock.

use std::path::PathBuf;

use crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::layout::Rect;

use crate::app::{IDLE_TICK_NS, MESSAGE_NS, MIN_FRAME_NS};
use crate::keys::{self, Action, Context};
use crate::scroll::Scroll;
use crate::shell::{Pace, Shot, Wake};
use crate::state::Overlay;
use crate::theme::Theme;
use crate::{help, legend};
use vramscope_collect::fleet::model::Fleet;
use vramscope_collect::fleet::view::{self, FleetView, ProcSeries, Screen};

/// Everything the fleet view hears, through the shell's channel.
#[derive(Debug)]
pub enum FleetEvent {
    /// Time, keys, resizes, signals, screenshots written.
    Shell(Wake),
    /// A refresh's outcome: the fleet, or why there is none.
    Fleet(Result<Fleet, String>),
    /// A process's series, or why there are none.
    Series {
        instance: String,
        pid: String,
        result: Result<ProcSeries, String>,
    },
}

impl From<Wake> for FleetEvent {
    fn from(w: Wake) -> FleetEvent {
        FleetEvent::Shell(w)
    }
}

/// What to ask Prometheus (the runner's queries, off this thread).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// The fleet, now (besides every `--refresh`).
    Refresh,
    /// One process's allocated and reserved bytes over time.
    Series { instance: String, pid: String },
}

/// The fleet view's state.
#[derive(Debug, Clone)]
pub struct FleetApp {
    pub view: FleetView,
    pub(crate) theme: Theme,
    /// Help, legend or the filter prompt (the overlays the fleet has).
    pub overlay: Option<Overlay>,
    /// Terminal size.
    pub size: Rect,
    /// One line for the footer, shown until `message_until_ns`.
    pub(crate) message: Option<String>,
    pub(crate) message_until_ns: u64,
    /// Now, as of the last tick.
    pub(crate) now_ns: u64,
    /// The next frame is to be written (`S`).
    pub(crate) shot: Option<Shot>,
    /// Something changed since the last frame.
    pub(crate) dirty: bool,
    pub(crate) last_frame_ns: Option<u64>,
    pub quit: bool,
}

/// Rows a page key moves.
const PAGE: usize = 10;

impl FleetApp {
    pub fn new(view: FleetView, theme: Theme) -> FleetApp {
        FleetApp {
            view,
            theme,
            overlay: None,
            size: Rect::new(0, 0, 80, 24),
            message: None,
            message_until_ns: 0,
            now_ns: 0,
            shot: None,
            dirty: true,
            last_frame_ns: None,
            quit: false,
        }
    }

    /// Applies one event; returns what to ask Prometheus.
    pub fn handle(&mut self, ev: FleetEvent) -> Vec<Ask> {
        match ev {
            FleetEvent::Shell(Wake::Tick { now_ns }) => {
                self.now_ns = now_ns;
                if self.message.is_some() && now_ns >= self.message_until_ns {
                    self.message = None;
                    self.dirty = true;
                }
                vec![]
            }
            FleetEvent::Shell(Wake::Input(Event::Key(k))) if k.kind == KeyEventKind::Press => {
                self.dirty = true;
                self.key(k)
            }
            FleetEvent::Shell(Wake::Input(Event::Resize(w, h))) => {
                self.size = Rect::new(0, 0, w, h);
                self.dirty = true;
                vec![]
            }
            FleetEvent::Shell(Wake::Input(_)) => vec![],
            FleetEvent::Shell(Wake::Signal) => {
                self.quit = true;
                vec![]
            }
            FleetEvent::Shell(Wake::ScreenshotWritten(r)) => {
                self.screenshot_written(r);
                vec![]
            }
            FleetEvent::Fleet(r) => {
                self.dirty = true;
                let a = self.view.refreshed(r);
                self.ask(a)
            }
            FleetEvent::Series {
                instance,
                pid,
                result,
            } => {
                self.view.series_loaded(result, &instance, &pid);
                self.dirty = true;
                vec![]
            }
        }
    }

    /// The screen's contexts in the key table (the footer's hints).
    pub(crate) fn screen_contexts(&self) -> [Context; 2] {
        match self.view.screen {
            Screen::Node { .. } => [Context::Fleet, Context::FleetNode],
            Screen::Nodes | Screen::Jobs => [Context::Fleet, Context::FleetList],
        }
    }

    /// Where a key is looked up: an overlay or the prompt takes every key;
    /// otherwise the fleet's keys, then the screen's.
    pub(crate) fn key_contexts(&self) -> Vec<Context> {
        let mut c = vec![Context::Always];
        match self.overlay {
            Some(Overlay::Prompt) => c.push(Context::Filter),
            Some(Overlay::Help(_)) => c.push(Context::Help),
            Some(Overlay::Legend(_)) => c.push(Context::Legend),
            _ => c.extend(self.screen_contexts()),
        }
        c
    }

    /// The filter is being typed (keys are text).
    pub fn typing(&self) -> bool {
        self.overlay == Some(Overlay::Prompt)
    }

    fn key(&mut self, k: KeyEvent) -> Vec<Ask> {
        let action = keys::action(&k, &self.key_contexts());
        if self.typing() {
            return self.type_key(k, action);
        }
        action.map_or_else(Vec::new, |a| self.act(a))
    }

    /// A key while typing the filter: Enter keeps it, Esc drops it, the
    /// arrows still select; a character is text.
    fn type_key(&mut self, k: KeyEvent, action: Option<Action>) -> Vec<Ask> {
        let f = &mut self.view.filter;
        match action {
            Some(a @ (Action::Quit | Action::SelectUp | Action::SelectDown)) => return self.act(a),
            Some(Action::FilterKeep) => self.overlay = None,
            Some(Action::FilterClear) => {
                f.clear();
                self.overlay = None;
            }
            Some(Action::FilterBackspace) => {
                f.pop();
            }
            Some(_) => return vec![],
            None => match k.code {
                KeyCode::Char(c)
                    if !c.is_control()
                        && !k.modifiers.contains(KeyModifiers::CONTROL)
                        && f.chars().count() < 64 =>
                {
                    f.push(c)
                }
                _ => return vec![],
            },
        }
        self.view.filter_changed();
        vec![]
    }

    /// Carries out what a key asked for.
    fn act(&mut self, action: Action) -> Vec<Ask> {
        use Action as A;
        let v = &mut self.view;
        let done = match action {
            A::Quit => {
                self.quit = true;
                view::Action::Nothing
            }
            A::Refresh => return vec![Ask::Refresh],
            A::Help | A::Legend | A::CloseHelp | A::CloseLegend | A::Scroll(_) => {
                self.overlay_act(action);
                view::Action::Nothing
            }
            A::EditFilter => {
                self.overlay = Some(Overlay::Prompt);
                view::Action::Nothing
            }
            A::ClearFilter => {
                self.message = None;
                if v.filter.is_empty() {
                    return vec![];
                }
                v.filter.clear();
                v.filter_changed()
            }
            A::Screenshot => {
                self.shot.get_or_insert(Shot {
                    path: None,
                    then_quit: false,
                });
                view::Action::Nothing
            }
            A::NextPane => v.switch_list(),
            A::SortNext => v.sort_next(),
            A::SortReverse => v.reverse(),
            A::SelectUp => v.select(v.selected.saturating_sub(1)),
            A::SelectDown => v.select(v.selected.saturating_add(1)),
            A::SelectPageUp => v.select(v.selected.saturating_sub(PAGE)),
            A::SelectPageDown => v.select(v.selected.saturating_add(PAGE)),
            A::SelectFirst => v.select(0),
            A::SelectLast => v.select(usize::MAX),
            A::Open => v.open(),
            A::Back => v.back(),
            _ => view::Action::Nothing,
        };
        self.ask(done)
    }

    /// Help and legend: open, close, scroll.
    fn overlay_act(&mut self, action: Action) {
        use Action as A;
        match action {
            A::Help => self.overlay = Some(Overlay::Help(Scroll::default())),
            A::Legend => self.overlay = Some(Overlay::Legend(Scroll::default())),
            A::CloseHelp | A::CloseLegend => self.overlay = None,
            // Within their lines, as drawn now (over the whole frame).
            A::Scroll(m) => {
                let (s, (len, height)) = match &mut self.overlay {
                    Some(Overlay::Legend(s)) => {
                        let lines = legend::fleet_lines(&self.theme).len();
                        (s, legend::extent(self.size, lines))
                    }
                    Some(Overlay::Help(s)) => (s, help::fleet_extent(self.size)),
                    _ => return,
                };
                *s = s.fit(len, height);
                s.go(m);
            }
            _ => {}
        }
    }

    /// What the view's step needs from Prometheus.
    fn ask(&mut self, a: view::Action) -> Vec<Ask> {
        match a {
            view::Action::LoadSeries { instance, pid } => vec![Ask::Series { instance, pid }],
            view::Action::Redraw | view::Action::Nothing => vec![],
        }
    }

    /// Shows `text` in the footer for [`MESSAGE_NS`].
    pub(crate) fn say(&mut self, text: impl Into<String>) {
        self.message = Some(text.into());
        self.message_until_ns = self.now_ns + MESSAGE_NS;
        self.dirty = true;
    }

    fn screenshot_written(&mut self, r: Result<PathBuf, String>) {
        self.say(crate::svg::written_said(&r));
    }
}

impl Pace for FleetApp {
    fn quit(&self) -> bool {
        self.quit
    }

    fn shot_pending(&self) -> bool {
        self.shot.is_some()
    }

    /// When to wake up if nothing arrives: a frame held back by the frame
    /// gap, the message's end, else a slow tick.
    fn deadline_ns(&self) -> u64 {
        let mut d = self.now_ns + IDLE_TICK_NS;
        if self.dirty {
            d = d.min(self.last_frame_ns.map_or(0, |t| t + MIN_FRAME_NS));
        }
        if self.message.is_some() {
            d = d.min(self.message_until_ns);
        }
        d
    }

    /// Draw now: something changed, and the last frame is at least
    /// [`MIN_FRAME_NS`] old.
    fn should_draw(&self, now_ns: u64) -> bool {
        self.dirty
            && self
                .last_frame_ns
                .is_none_or(|t| now_ns >= t + MIN_FRAME_NS)
    }

    /// A frame was drawn at `now_ns`; the screenshot it is to be written
    /// as, if `S` asked for one.
    fn frame_drawn(&mut self, now_ns: u64) -> Option<Shot> {
        self.dirty = false;
        self.last_frame_ns = Some(now_ns);
        self.shot.take()
    }
}
