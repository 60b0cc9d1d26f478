//! Commands to a process (`e`, `r`, `s`, `C`): the y/n question, the
//! command running, its report, and the NVML figures before and after.

use super::{ActionReport, ActionState, App, CommandDone, Effect, CAPTURE_STEPS};
use crate::keys::Action;
use crate::rows;
use vramscope_collect::ProcessEntry;
use vramscope_core::model::{Mode, ProcessKey};
use vramscope_wire::ring::Command;

impl App {
    /// The keys that send something to a process, and the y/n question
    /// and report of the one sent.
    pub(super) fn command_act(&mut self, action: Action) -> Vec<Effect> {
        use Action as A;
        match action {
            A::EmptyCache => self.ask_empty_cache(),
            A::ResetPeaks => self.simple_command(Command::ResetPeaks { device: None }),
            A::RequestSnapshot => self.simple_command(Command::Snapshot { device: None }),
            A::CaptureStacks => self.simple_command(Command::CaptureStacks {
                steps: CAPTURE_STEPS,
                depth: 0,
            }),
            A::ConfirmYes => self.confirm_empty_cache(),
            A::ConfirmNo => {
                self.action = None;
                self.say("empty_cache cancelled");
                vec![]
            }
            A::CloseReport => {
                self.action = None;
                vec![]
            }
            _ => vec![],
        }
    }

    pub(super) fn note_nvml_after(&mut self) {
        let Some(ActionState::Done(r)) = &self.action else {
            return;
        };
        if r.nvml_after.is_some() || r.outcome.is_none() {
            return;
        }
        let newer = match (self.snap.machine.sampled_ns, r.nvml_sampled_at_done) {
            (Some(now), Some(then)) => now > then,
            (Some(_), None) => true,
            _ => false,
        };
        if !newer {
            return;
        }
        let key = r.key;
        let used = self
            .snap
            .processes
            .iter()
            .find(|p| p.key() == key)
            .and_then(|p| p.view.figures.nvml_used);
        if let Some(ActionState::Done(r)) = &mut self.action {
            r.nvml_after = used;
        }
    }

    /// The y/n question quotes the figures of the latest snapshot, not
    /// those of the moment `e` was pressed.
    pub(super) fn update_confirm(&mut self) {
        let Some(ActionState::Confirm { key, .. }) = &self.action else {
            return;
        };
        let key = *key;
        let live = self
            .snap
            .processes
            .iter()
            .find(|p| p.key() == key)
            .map(|p| (p.view.figures.reserved, p.view.figures.allocated));
        if let Some(ActionState::Confirm {
            reserved,
            allocated,
            ..
        }) = &mut self.action
        {
            *reserved = live.map(|l| l.0);
            *allocated = live.map(|l| l.1);
        }
    }

    pub(super) fn nvml_of(&self, key: ProcessKey) -> Option<u64> {
        self.snap
            .processes
            .iter()
            .find(|p| p.key() == key)
            .and_then(|p| p.view.figures.nvml_used)
    }

    pub(super) fn command_done(&mut self, done: CommandDone) {
        let nvml_before = match &self.action {
            Some(ActionState::Running { nvml_before, .. }) => *nvml_before,
            _ => None,
        };
        let (status, outcome) = match done.result {
            Ok(o) => (Ok(o.status), Some(o)),
            Err(e) => (Err(e), None),
        };
        self.action = Some(ActionState::Done(ActionReport {
            pid: done.pid,
            key: done.key,
            command: done.command,
            status,
            outcome,
            nvml_before,
            nvml_after: None,
            nvml_sampled_at_done: self.snap.machine.sampled_ns,
        }));
        self.dirty = true;
    }

    pub(super) fn confirm_empty_cache(&mut self) -> Vec<Effect> {
        let Some(ActionState::Confirm { key, pid, .. }) = &self.action else {
            return vec![];
        };
        let (key, pid) = (*key, *pid);
        self.start_command(key, pid, Command::EmptyCache { device: None })
    }

    /// `command` goes to `pid`; the action box shows it running.
    pub(super) fn start_command(
        &mut self,
        key: ProcessKey,
        pid: u32,
        command: Command,
    ) -> Vec<Effect> {
        let segment = self
            .snap
            .processes
            .iter()
            .find(|p| p.key() == key)
            .and_then(|p| p.source.segment.as_deref())
            .map(std::path::PathBuf::from);
        let Some(segment) = segment else {
            self.action = None;
            self.say(format!("pid {pid} has no agent segment: no command sent"));
            return vec![];
        };
        let nvml_before = self.nvml_of(key);
        self.action = Some(ActionState::Running {
            pid,
            command,
            nvml_before,
        });
        vec![Effect::RunCommand {
            key,
            pid,
            segment,
            command,
        }]
    }

    /// The selected process if it answers commands (`allocator`: and has
    /// allocator figures); otherwise the footer's reason why not.
    pub(super) fn command_target(&self, allocator: bool) -> Result<&ProcessEntry, String> {
        let e = self
            .selected_entry()
            .ok_or_else(|| "no process selected".to_string())?;
        // An exited process answers nothing, agent or not: say that.
        if !e.identity.alive {
            return Err(format!(
                "pid {} has exited: no command sent",
                e.identity.host_pid
            ));
        }
        if !e.source.commands || (allocator && e.view.mode == Mode::NvmlOnly) {
            return Err(format!(
                "pid {} does not answer commands (no vramscope agent)",
                e.identity.host_pid
            ));
        }
        Ok(e)
    }

    pub(super) fn ask_empty_cache(&mut self) -> Vec<Effect> {
        if self.refused_readonly() {
            return vec![];
        }
        let e = match self.command_target(true) {
            Ok(e) => e,
            Err(why) => {
                self.say(why);
                return vec![];
            }
        };
        self.action = Some(ActionState::Confirm {
            key: e.key(),
            pid: e.identity.host_pid,
            name: rows::display_name(e),
            reserved: Some(e.view.figures.reserved),
            allocated: Some(e.view.figures.allocated),
        });
        vec![]
    }

    pub(super) fn simple_command(&mut self, command: Command) -> Vec<Effect> {
        if self.refused_readonly() {
            return vec![];
        }
        if matches!(self.action, Some(ActionState::Running { .. })) {
            self.say("a command is still running");
            return vec![];
        }
        match self.command_target(false) {
            Ok(e) => {
                let (key, pid) = (e.key(), e.identity.host_pid);
                self.start_command(key, pid, command)
            }
            Err(why) => {
                self.say(why);
                vec![]
            }
        }
    }

    /// A key that would send a command, in a read-only view: says so in
    /// the footer (issue 30, item 11: `e`, `r`, `C` did nothing, silently,
    /// under `--readonly` and in `replay --ui` and `open`).
    fn refused_readonly(&mut self) -> bool {
        if self.config.readonly {
            self.say(READONLY_NOTE);
        }
        self.config.readonly
    }
}

/// What a command key says in a read-only view.
pub(crate) const READONLY_NOTE: &str =
    "read-only: no command is sent to a process here (--readonly, a replay or a snapshot file)";

#[cfg(test)]
mod tests {
    use crossterm::event::KeyCode;

    use crate::advisor::tests::{press, process_view};

    /// Issue 46, item 6: `e` on a process that has exited says so, not
    /// that it has no agent, and asks nothing.
    #[test]
    fn e_on_an_exited_process_says_it_has_exited() {
        let mut app = process_view(80, 24);
        let key = app.overview.selected.unwrap();
        let mut snap = (*app.snap).clone();
        for p in snap.processes.iter_mut().filter(|p| p.key() == key) {
            p.identity.alive = false;
        }
        app.set_snapshot(snap);
        assert!(press(&mut app, KeyCode::Char('e')).is_empty());
        assert_eq!(
            app.message.as_deref(),
            Some(format!("pid {} has exited: no command sent", key.pid).as_str())
        );
        assert!(app.action.is_none());
    }

    /// Issue 46, item 2: Space pauses the demo's simulation with the step
    /// diff open (and under the other overlays that do not take it), and
    /// the overlay stays.
    #[test]
    fn space_pauses_the_demo_under_the_overlays() {
        use crate::app::Effect;
        use crate::Overlay;
        let mut app = process_view(80, 24);
        app.set_demo_status(Some(vramscope_collect::demo::DemoStatus {
            scenario: "leak".into(),
            caption: String::new(),
            progress: 0.5,
            speed: 1.0,
            paused: false,
            runs: 0,
            replay: false,
            ended: false,
        }));
        for (open, shown) in [
            (KeyCode::Char('d'), "step diff"),
            (KeyCode::Char('M'), "by module"),
            (KeyCode::Char('F'), "will it fit"),
        ] {
            app.overlay = None;
            press(&mut app, open);
            let before = app.overlay;
            assert!(before.is_some(), "{shown}");
            let fx = press(&mut app, KeyCode::Char(' '));
            assert_eq!(fx, vec![Effect::DemoTogglePause], "{shown}");
            assert_eq!(app.overlay, before, "{shown}");
        }
        app.overlay = Some(Overlay::Advisor(Default::default()));
        assert_eq!(
            press(&mut app, KeyCode::Char(' ')),
            vec![Effect::DemoTogglePause]
        );
    }
}
