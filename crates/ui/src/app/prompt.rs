//! The prompt: a filter being typed, the overview's (processes) or the
//! process view's (a search of the events). While it is up, characters
//! are text, not commands.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::{App, Effect, Overlay, Screen};
use crate::keys::Action;

impl App {
    /// A filter is being typed (keys are text).
    pub fn typing(&self) -> bool {
        self.overlay == Some(Overlay::Prompt)
    }

    /// The filter being typed: the overview's (processes), or the process
    /// view's (events).
    pub(crate) fn filter(&self) -> &str {
        match self.screen {
            Screen::Overview => &self.overview.filter,
            Screen::Process => &self.process.event_filter,
        }
    }

    pub(super) fn filter_mut(&mut self) -> &mut String {
        match self.screen {
            Screen::Overview => &mut self.overview.filter,
            Screen::Process => &mut self.process.event_filter,
        }
    }

    /// A key while typing: `action` is what the Filter context binds it to
    /// (Enter keeps, Esc drops, Backspace, the arrows), else a character.
    pub(super) fn type_key(&mut self, k: KeyEvent, action: Option<Action>) -> Vec<Effect> {
        let mut fx = Vec::new();
        match action {
            Some(a @ (Action::Quit | Action::SelectUp | Action::SelectDown))
                if self.screen == Screen::Overview =>
            {
                return self.act(a)
            }
            Some(Action::SelectUp | Action::SelectDown) => {}
            Some(a) => fx = self.act(a),
            None => {
                if let KeyCode::Char(c) = k.code {
                    let f = self.filter_mut();
                    if !k.modifiers.contains(KeyModifiers::CONTROL) && f.chars().count() < 64 {
                        f.push(c);
                    }
                }
            }
        }
        match self.screen {
            Screen::Overview => {
                self.overview.scroll = Default::default();
                self.fix_selection();
            }
            // The event search runs over the whole history: a new snapshot.
            Screen::Process => {
                self.process.event_scroll = Default::default();
                fx.push(Effect::Refresh);
            }
        }
        fx
    }

    /// Keep the filter, drop it, or take its last character back.
    pub(super) fn prompt_act(&mut self, action: Action) -> Vec<Effect> {
        match action {
            Action::FilterKeep => self.overlay = None,
            Action::FilterClear => {
                self.filter_mut().clear();
                self.overlay = None;
            }
            Action::FilterBackspace => {
                self.filter_mut().pop();
            }
            _ => {}
        }
        vec![]
    }
}
