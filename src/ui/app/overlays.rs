//! The overlays' keys: help, legend, "By module", step diff and a snapshot
//! file's stacks. One overlay at a time ([`Overlay`]); while one is up it
//! takes the keys (see [`App::key_contexts`]).

use super::{App, Effect, Overlay};
use crate::ui::keys::Action;
use crate::ui::{attribution, blockmap, legend, stepdiff};

impl App {
    /// Opens, closes, scrolls or sorts an overlay.
    pub(super) fn overlay_act(&mut self, action: Action) -> Vec<Effect> {
        use Action as A;
        match action {
            A::Help => self.overlay = Some(Overlay::Help(0)),
            A::Legend => self.overlay = Some(Overlay::Legend(0)),
            A::Modules => self.overlay = Some(Overlay::Modules(Default::default())),
            A::StepDiff => self.overlay = Some(Overlay::StepDiff(Default::default())),
            A::TraceStacks => {
                self.overlay = match self.overlay {
                    Some(Overlay::Stacks) => None,
                    _ => Some(Overlay::Stacks),
                }
            }
            A::CloseHelp | A::CloseLegend | A::CloseModules | A::CloseStepDiff | A::CloseStacks => {
                self.overlay = None
            }
            A::OverlayUp | A::OverlayDown => {
                let (v, n) = match &mut self.overlay {
                    Some(Overlay::Legend(v)) => (v, legend::lines(&self.config.theme).len()),
                    Some(Overlay::Help(v)) => (v, crate::ui::help::lines(self.trace.is_some())),
                    _ => return vec![],
                };
                *v = if action == A::OverlayUp {
                    v.saturating_sub(1)
                } else {
                    (*v + 1).min(n)
                };
            }
            A::ModulesOnly => self.modules_only(),
            A::ModulesSort | A::ModulesReverse | A::ModulesRole | A::ModulesUp | A::ModulesDown => {
                let Some(Overlay::Modules(mut m)) = self.overlay else {
                    return vec![];
                };
                let rows = (self.selected_entry())
                    .map_or(0, |e| attribution::sorted(&e.view.attribution, &m).len());
                match action {
                    A::ModulesSort => m.sort_next(),
                    A::ModulesReverse => m.reverse(),
                    A::ModulesRole => m.role_next(),
                    _ => m.scroll_by(action == A::ModulesDown, rows),
                }
                self.overlay = Some(Overlay::Modules(m));
            }
            A::StepDiffOlder | A::StepDiffNewer | A::StepDiffUp | A::StepDiffDown => {
                let Some(Overlay::StepDiff(mut d)) = self.overlay else {
                    return vec![];
                };
                let (now, rows) = self.selected_entry().map_or((None, 0), |e| {
                    let rows = stepdiff::row_count(&e.view, &d);
                    (e.view.attribution.step, rows)
                });
                match action {
                    A::StepDiffOlder => d.older(now),
                    A::StepDiffNewer => d.newer(),
                    _ => d.scroll_by(action == A::StepDiffDown, rows),
                }
                self.overlay = Some(Overlay::StepDiff(d));
            }
            _ => {}
        }
        vec![]
    }

    /// Enter in "By module": the block map shows only the module of the
    /// selected row.
    fn modules_only(&mut self) {
        let module = self.selected_entry().and_then(|e| {
            let Some(Overlay::Modules(m)) = self.overlay else {
                return None;
            };
            let rows = attribution::sorted(&e.view.attribution, &m);
            rows.get(m.scroll.min(rows.len().saturating_sub(1)))
                .map(|r| r.module.to_string())
        });
        if let Some(module) = module {
            self.overlay = None;
            self.show_only(blockmap::Only::Module(module));
        }
    }
}
