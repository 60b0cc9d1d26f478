//! The overlays' keys: help, legend, "By module", step diff, the allocator
//! advisor and a snapshot file's stacks. One overlay at a time
//! ([`Overlay`]); while one is up it takes the keys (see
//! [`App::key_contexts`]).

use super::{App, Effect, Overlay};
use crate::keys::Action;
use crate::scroll::{Move, Scroll};
use crate::{attribution, blockmap, help, layout, legend, stepdiff};
use vramscope_core::model::ProcessKey;
use vramscope_core::sim::live::LiveAdvice;

impl App {
    /// Opens, closes or sorts an overlay.
    pub(super) fn overlay_act(&mut self, action: Action) -> Vec<Effect> {
        use Action as A;
        match action {
            A::Help => self.overlay = Some(Overlay::Help(Scroll::default())),
            A::Legend => self.overlay = Some(Overlay::Legend(Scroll::default())),
            A::Modules => self.overlay = Some(Overlay::Modules(Default::default())),
            A::StepDiff => self.overlay = Some(Overlay::StepDiff(Default::default())),
            A::Advisor => return self.open_advisor(Overlay::Advisor(Default::default())),
            A::Fit => return self.open_advisor(Overlay::Fit),
            A::AdvisorCopy => return self.copy_advice(),
            A::TraceStacks => {
                self.overlay = match self.overlay {
                    Some(Overlay::Stacks) => None,
                    _ => Some(Overlay::Stacks),
                }
            }
            A::CloseHelp
            | A::CloseLegend
            | A::CloseModules
            | A::CloseStepDiff
            | A::CloseAdvisor
            | A::CloseFit
            | A::CloseStacks => self.overlay = None,
            A::ModulesOnly => self.modules_only(),
            A::ModulesSort | A::ModulesReverse | A::ModulesRole => {
                let Some(Overlay::Modules(mut m)) = self.overlay else {
                    return vec![];
                };
                match action {
                    A::ModulesSort => m.sort_next(),
                    A::ModulesReverse => m.reverse(),
                    _ => m.role_next(),
                }
                self.overlay = Some(Overlay::Modules(m));
            }
            A::StepDiffOlder | A::StepDiffNewer => {
                let Some(Overlay::StepDiff(mut d)) = self.overlay else {
                    return vec![];
                };
                match action {
                    A::StepDiffOlder => {
                        d.older(self.selected_entry().and_then(|e| e.view.attribution.step))
                    }
                    _ => d.newer(),
                }
                self.overlay = Some(Overlay::StepDiff(d));
            }
            _ => {}
        }
        vec![]
    }

    /// A scroll key in the overlay that is up: the help, the legend and the
    /// step diff scroll (within their lines, as drawn now); By module and
    /// the advisor move their selected row.
    pub(super) fn overlay_scroll(&mut self, m: Move) {
        let body = layout::screen(self.size, self.caption_lines()).body;
        let moved = |s: Scroll, (len, height): (usize, usize)| {
            let mut s = s.fit(len, height);
            s.go(m);
            s
        };
        self.overlay = match self.overlay {
            // Both over the whole frame.
            Some(Overlay::Help(s)) => Some(Overlay::Help(moved(
                s,
                help::extent(self.size, self.playing()),
            ))),
            Some(Overlay::Legend(s)) => {
                let lines = legend::lines(&self.config.theme).len();
                Some(Overlay::Legend(moved(s, legend::extent(self.size, lines))))
            }
            Some(Overlay::StepDiff(mut d)) => {
                let extent =
                    (self.selected_entry()).map_or((0, 0), |e| stepdiff::extent(body, &e.view, &d));
                d.scroll = moved(d.scroll, extent);
                Some(Overlay::StepDiff(d))
            }
            Some(Overlay::Modules(mut v)) => {
                if let Some(e) = self.selected_entry() {
                    let a = &e.view.attribution;
                    v.go(
                        m,
                        &attribution::sorted(a, &v),
                        attribution::rows_shown(body, a),
                    );
                }
                Some(Overlay::Modules(v))
            }
            Some(Overlay::Advisor(mut v)) if matches!(m, Move::Up | Move::Down) => {
                let advice = self.selected_advice().and_then(|l| l.advice.as_ref());
                v.step(advice, m == Move::Down);
                Some(Overlay::Advisor(v))
            }
            other => other,
        };
    }

    /// The selected process's live advice, as the snapshot shows it.
    pub(crate) fn selected_advice(&self) -> Option<&LiveAdvice> {
        self.selected_entry()?.advice.as_ref()
    }

    /// `A` and `F`: opens the advisor's overlay (its advice, or "will it
    /// fit"), and asks the loop to advise the selected process unless the
    /// snapshot shows it advised already.
    fn open_advisor(&mut self, overlay: Overlay) -> Vec<Effect> {
        let Some(e) = self.selected_entry() else {
            self.say("no process selected");
            return vec![];
        };
        let (key, advised) = (e.key(), e.advice.is_some());
        self.overlay = Some(overlay);
        if advised {
            return vec![];
        }
        // The advisor reads a process's PYTORCH_CUDA_ALLOC_CONF from its
        // environment only on this host: a demo's processes are simulated,
        // and a replay's or a snapshot file's ran elsewhere or earlier.
        let host = self.demo.is_none() && self.trace.is_none();
        vec![Effect::Advise { key, host }]
    }

    /// The loop could not advise `key` ([`Effect::Advise`]): the overlay
    /// would wait for nothing, so it closes, and the footer says why.
    pub(crate) fn advise_refused(&mut self, key: ProcessKey, why: &str) {
        if matches!(self.overlay, Some(Overlay::Advisor(_) | Overlay::Fit))
            && self.overview.selected == Some(key)
        {
            self.overlay = None;
        }
        self.say(format!("advisor: {why}"));
    }

    /// `y`: the selected row's `PYTORCH_CUDA_ALLOC_CONF=…` line to the
    /// clipboard, and into the footer for a terminal that does not take
    /// OSC 52 (over ssh, in some multiplexers); the word first, so that a
    /// narrow footer cuts the line's end, which the overlay's last line
    /// shows whole.
    fn copy_advice(&mut self) -> Vec<Effect> {
        let line = match self.overlay {
            Some(Overlay::Advisor(v)) => self.selected_advice().and_then(|l| v.env_line(l)),
            _ => None,
        };
        let Some(line) = line else {
            self.say("no advice to copy yet");
            return vec![];
        };
        self.say(format!("copied {line}"));
        vec![Effect::Copy(line)]
    }

    /// Enter in "By module": the block map shows only the module of the
    /// selected row.
    fn modules_only(&mut self) {
        let module = self.selected_entry().and_then(|e| {
            let Some(Overlay::Modules(m)) = self.overlay else {
                return None;
            };
            let rows = attribution::sorted(&e.view.attribution, &m);
            rows.get(m.cursor_in(&rows)).map(|r| r.module.to_string())
        });
        if let Some(module) = module {
            self.overlay = None;
            self.show_only(blockmap::Only::Module(module));
        }
    }
}
