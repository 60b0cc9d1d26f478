//! The action box: the empty-cache question, a running command, and what a
//! finished command did (reserved before/after, bytes released, NVML used
//! before/after as the next NVML sample sees it).

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph, Wrap};
use ratatui::Frame;

use super::state::{ActionReport, ActionState};
use super::theme::Theme;
use vramscope_text::format;
use vramscope_wire::ring::{Command, Status};

fn command_name(c: Command) -> &'static str {
    match c {
        Command::EmptyCache { .. } => "empty_cache",
        Command::ResetPeaks { .. } => "reset peaks",
        Command::Snapshot { .. } => "snapshot",
        Command::Ping { .. } => "ping",
        Command::CaptureStacks { .. } => "capture stacks",
        Command::Unknown { .. } => "command",
    }
}

pub(crate) fn render(frame: &mut Frame, area: Rect, action: &ActionState, t: &Theme) {
    let a = t.glyphs().absent;
    let (title, lines): (String, Vec<Line>) = match action {
        ActionState::Confirm {
            pid,
            name,
            reserved,
            allocated,
            ..
        } => {
            let mut l = vec![Line::from(vec![
                Span::raw("Empty the CUDA cache of "),
                Span::styled(format!("pid {pid}"), t.header()),
                Span::raw(format!(" ({name})?")),
            ])];
            let cached = match (reserved, allocated) {
                (Some(r), Some(al)) => Some(r.saturating_sub(*al)),
                _ => None,
            };
            l.push(Line::raw(format!(
                "reserved {}, allocated {}: up to {} may be released",
                format::opt(*reserved, a, format::bytes),
                format::opt(*allocated, a, format::bytes),
                format::opt(cached, a, format::bytes),
            )));
            l.push(Line::styled(
                "(cached blocks in partly used segments stay reserved)",
                t.dim(),
            ));
            l.push(Line::from(vec![
                Span::styled("y", t.key()),
                Span::raw(" yes   "),
                Span::styled("n", t.key()),
                Span::raw(" / "),
                Span::styled("Esc", t.key()),
                Span::raw(" no"),
            ]));
            (" empty_cache ".into(), l)
        }
        ActionState::Running { pid, command, .. } => (
            format!(" {} ", command_name(*command)),
            vec![Line::raw(format!(
                "{} sent to pid {pid}; waiting for its answer...",
                command_name(*command)
            ))],
        ),
        ActionState::Done(r) => (format!(" {} ", command_name(r.command)), report(r, t)),
    };
    let w = 76.min(area.width);
    let inner_w = w.saturating_sub(2).max(1) as usize;
    let rows: usize = lines
        .iter()
        .map(|l| l.width().max(1).div_ceil(inner_w))
        .sum();
    let h = (rows as u16 + 2).min(area.height);
    let popup = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + area.height.saturating_sub(h + 2),
        width: w,
        height: h,
    };
    frame.render_widget(Clear, popup);
    let block = t.block(Span::styled(title, t.title()));
    frame.render_widget(
        Paragraph::new(lines)
            .block(block)
            .wrap(Wrap { trim: false }),
        popup,
    );
}

fn report(r: &ActionReport, t: &Theme) -> Vec<Line<'static>> {
    let a = t.glyphs().absent;
    let mut l = Vec::new();
    match &r.status {
        Err(e) => {
            l.push(Line::styled(
                format!("pid {}: failed: {e}", r.pid),
                t.alert(),
            ));
        }
        Ok(Status::Unsupported) if matches!(r.command, Command::CaptureStacks { .. }) => {
            l.push(Line::styled(
                format!(
                    "pid {}: stack capture unsupported (producer older than FORMAT 1.1)",
                    r.pid
                ),
                t.warn(),
            ));
        }
        Ok(s) if *s != Status::Ok => {
            l.push(Line::styled(
                format!("pid {} answered {s:?}", r.pid),
                t.warn(),
            ));
        }
        Ok(_) => {
            l.push(Line::styled(format!("pid {}: done", r.pid), t.good()));
            if let (Command::EmptyCache { .. }, Some(o)) = (r.command, r.outcome) {
                l.push(Line::raw(format!(
                    "reserved {} -> {}   released {}",
                    format::bytes(o.result0),
                    format::bytes(o.result1),
                    format::bytes(o.result0.saturating_sub(o.result1)),
                )));
                let after = match (r.nvml_before, r.nvml_after) {
                    (None, _) => "NVML used: not available".to_string(),
                    (Some(b), Some(x)) => format!(
                        "NVML used {} -> {}   ({})",
                        format::bytes(b),
                        format::bytes(x),
                        if x <= b {
                            format!("-{}", format::bytes(b - x))
                        } else {
                            format!("+{}", format::bytes(x - b))
                        }
                    ),
                    (Some(b), None) => format!(
                        "NVML used {} -> {} (waiting for the next NVML sample)",
                        format::bytes(b),
                        a
                    ),
                };
                l.push(Line::raw(after));
            }
            if let (Command::CaptureStacks { steps, .. }, Some(o)) = (r.command, r.outcome) {
                l.push(Line::raw(capture_line(steps, o.result0, o.result1)));
                l.push(Line::styled(
                    "blocks allocated meanwhile show their stack (n selects a block)",
                    t.dim(),
                ));
            }
            if let (Command::Snapshot { .. }, Some(o)) = (r.command, r.outcome) {
                // A state snapshot travels through the ring (no file):
                // the block map is rebuilt from it.
                l.push(Line::raw(format!(
                    "state snapshot #{} sent through the ring: the block map is exact again (no file is written; S saves the screen)",
                    o.result0
                )));
            }
        }
    }
    l.push(Line::styled("Esc closes", t.dim()));
    l
}

/// What a capture-stacks answer says: the steps asked and granted, and
/// the step capture began at (one line, for the report and the CLI).
pub fn capture_line(asked: u32, granted: u64, began: u64) -> String {
    if granted == 0 {
        return "stack capture stopped".to_string();
    }
    let bound = if granted < u64::from(asked) {
        format!(" (asked {asked}; the producer's bound)")
    } else {
        String::new()
    };
    format!("capturing stacks for {granted} steps from step {began}{bound}")
}
