//! The "will it fit" overlay (`F` in the process view): the job on screen
//! at other multiples of its batch, from its last two steps, and the
//! largest multiple that fits its limit (`vramscope_core::sim::fit_live`,
//! made by the hub's live advisor with its forecast).
//!
//! It only renders [`LiveAdvice::fit`] from the snapshot; the advisor is
//! started by the run loop as for `A` ([`super::Effect::Advise`]).

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph, Wrap};
use ratatui::Frame;

use super::theme::Theme;
use vramscope_core::sim::fit_live::{times, FitAt, LiveFit, MAX_FIT_REQUESTS};
use vramscope_core::sim::live::LiveAdvice;
use vramscope_text::format::{bytes, count};

/// The heading: what the fit says, or why there is none yet.
fn heading(advice: Option<&LiveAdvice>, t: &Theme) -> Vec<Line<'static>> {
    let Some(l) = advice else {
        let e = t.glyphs().ellipsis;
        return vec![Line::styled(format!("starting the advisor{e}"), t.dim())];
    };
    let Some(f) = &l.fit else {
        let why = match &l.coverage.stopped {
            Some(why) => format!("the advisor stopped before two complete steps: {why}"),
            None => "waiting for two complete steps of the job: the fit is made as a step ends, with the forecast".into(),
        };
        return vec![Line::styled(why, t.dim())];
    };
    if let Some(why) = &f.cannot {
        return vec![Line::styled(
            format!("the job's steps cannot be repeated: {why}"),
            t.warn(),
        )];
    }
    let largest = match (f.largest, f.searched) {
        (Some(k), true) => format!(
            "Largest batch that fits: {} the batch it runs at (batch {} if it runs at 8)",
            times(k),
            k
        ),
        (Some(k), false) => format!(
            "Fits at {} the batch it runs at at least (the search stopped after {} requests)",
            times(k),
            count(MAX_FIT_REQUESTS)
        ),
        (None, true) => "Not even an eighth of the batch it runs at fits".into(),
        (None, false) => format!(
            "Not searched: one step is too long to repeat within {} requests",
            count(MAX_FIT_REQUESTS)
        ),
    };
    let stopped = l.coverage.stopped.as_ref().map(|why| {
        Line::styled(
            format!("the advisor stopped: {why}; this fit is from before"),
            t.warn(),
        )
    });
    let limit = if f.fraction {
        "its memory fraction"
    } else {
        "the device's memory"
    };
    let mut lines = vec![
        Line::styled(largest, t.header()),
        Line::styled(
            format!(
                "under {} ({limit}) · from its steps up to step {} · {} of {} allocations a step scale with the batch (freed within their step)",
                bytes(f.limit),
                f.at_step,
                f.scaled,
                f.allocations
            ),
            t.dim(),
        ),
    ];
    lines.extend(stopped);
    lines
}

/// The table's rows: one per multiple shown.
fn rows(f: &LiveFit, width: usize, ellipsis: &str) -> Vec<String> {
    let head = format!(
        "{:<10}  {:>14}  {:>14}",
        "BATCH", "PEAK RESERVED", "PEAK ALLOCATED"
    );
    let row = |p: &FitAt| {
        let batch = if p.eighths == 8 {
            format!("{} (now)", times(8))
        } else {
            times(p.eighths)
        };
        match p.oom {
            Some(o) => format!(
                "{batch:<10}  out of memory in its {} step (asked for {})",
                ordinal(o.step),
                bytes(o.bytes)
            ),
            None => format!(
                "{batch:<10}  {:>14}  {:>14}",
                bytes(p.peak_reserved),
                bytes(p.peak_allocated)
            ),
        }
    };
    std::iter::once(head)
        .chain(f.predictions.iter().map(row))
        .map(|s| vramscope_text::format::truncate(&s, width, ellipsis))
        .collect()
}

fn ordinal(n: u64) -> String {
    match n {
        1 => "first".into(),
        2 => "second".into(),
        3 => "third".into(),
        n => format!("{n}th"),
    }
}

/// Draws the overlay over `area`; `own_peak`: the process's own peak
/// reserved so far, for comparison.
pub(crate) fn render(
    frame: &mut Frame,
    area: Rect,
    advice: Option<&LiveAdvice>,
    own_peak: u64,
    t: &Theme,
) {
    let popup_w = area.width.min(100);
    let inner_w = popup_w.saturating_sub(2);
    let mut lines = heading(advice, t);
    let fit = advice
        .and_then(|l| l.fit.as_ref())
        .filter(|f| f.cannot.is_none() && !f.predictions.is_empty());
    if let Some(f) = fit {
        lines.push(Line::raw(""));
        let table = rows(f, inner_w as usize, t.glyphs().ellipsis);
        for (i, s) in table.into_iter().enumerate() {
            lines.push(if i == 0 {
                Line::styled(s, t.header())
            } else {
                Line::raw(s)
            });
        }
        lines.push(Line::raw(""));
        lines.push(Line::styled(
            format!(
                "Each peak is the last step repeated 3 times from an emptied cache; the job's own peak reserved so far is {}, and its first steps (optimizer state made) may peak higher.",
                bytes(own_peak)
            ),
            t.dim(),
        ));
    }
    // The heading and the note wrap; the table's rows are cut to fit.
    let body = Paragraph::new(lines).wrap(Wrap { trim: false });
    let body_h = body.line_count(inner_w) as u16;
    let popup = super::layout::centered(area, popup_w, body_h + 2);
    frame.render_widget(Clear, popup);
    let mut title = vec![Span::styled(" Will it fit ", t.title())];
    if let Some(d) = advice.and_then(|l| l.coverage.device) {
        title.push(Span::styled(format!("cuda:{d} "), t.dim()));
    }
    let block = t
        .block(Line::from(title))
        .title_bottom(Line::styled(" F or Esc closes ", t.dim()));
    let inner = block.inner(popup);
    frame.render_widget(block, popup);
    frame.render_widget(body, inner);
}

#[cfg(test)]
mod tests {
    use crossterm::event::KeyCode;

    use super::*;
    use crate::advisor::tests::{advice, advised, lines, press, process_view, prose};
    use crate::app::Effect;
    use crate::{render_buffer, Overlay};
    use vramscope_core::sim::fit_live::FitOom;

    const MIB: u64 = 1 << 20;

    /// A fit made at step 42 under a 2 GiB fraction: ×4 ran out of memory.
    fn fitted() -> LiveFit {
        let at = |eighths, reserved: u64, oom| FitAt {
            eighths,
            peak_reserved: reserved * MIB,
            peak_allocated: reserved * MIB - 40 * MIB,
            oom,
        };
        LiveFit {
            at_step: 42,
            limit: 2048 * MIB,
            fraction: true,
            allocations: 499,
            scaled: 392,
            allocated: 330 * MIB,
            predictions: vec![
                at(4, 592, None),
                at(8, 912, None),
                at(16, 1420, None),
                at(
                    32,
                    1990,
                    Some(FitOom {
                        step: 1,
                        bytes: 96 * MIB,
                    }),
                ),
            ],
            largest: Some(20),
            searched: true,
            requests: 13_205,
            cannot: None,
        }
    }

    fn shown(app: &crate::App, w: u16, h: u16) -> (String, String) {
        let l = lines(&render_buffer(app, w, h));
        (l.join("\n"), prose(&l))
    }

    /// `F` in the process view: the overlay, and the loop asked to advise
    /// the process, as `A` does; until two steps have ended it says what
    /// it waits for; `F`, Esc and `q` close it.
    #[test]
    fn key_f_opens_the_overlay_and_asks_the_loop_to_advise() {
        let mut app = process_view(80, 24);
        let key = app.overview.selected.unwrap();
        let fx = press(&mut app, KeyCode::Char('F'));
        assert_eq!(fx, vec![Effect::Advise { key, host: true }]);
        assert_eq!(app.overlay, Some(Overlay::Fit));
        let (all, _) = shown(&app, 80, 24);
        assert!(
            all.contains("Will it fit") && all.contains("starting the advisor…"),
            "{all}"
        );
        advised(&mut app, Some(advice()));
        let (all, text) = shown(&app, 80, 24);
        assert!(
            text.contains("the advisor stopped before two complete steps"),
            "{all}"
        );
        for close in [KeyCode::Char('F'), KeyCode::Esc, KeyCode::Char('q')] {
            app.overlay = Some(Overlay::Fit);
            assert!(press(&mut app, close).is_empty());
            assert_eq!(app.overlay, None, "{close:?}");
        }
        // Advised already: nothing asked again.
        assert!(press(&mut app, KeyCode::Char('F')).is_empty());
        assert_eq!(app.overlay, Some(Overlay::Fit));
        app.advise_refused(key, "the process's state is not known yet");
        assert_eq!(app.overlay, None);
    }

    /// The largest multiple, the limit, and one row per multiple (the one
    /// out of memory says in which step and what it asked for), at 80 and
    /// 120 columns.
    #[test]
    fn the_fit_shows_the_largest_batch_and_each_multiple() {
        let mut app = process_view(120, 40);
        press(&mut app, KeyCode::Char('F'));
        let mut l = advice();
        l.coverage.stopped = None;
        l.fit = Some(fitted());
        advised(&mut app, Some(l.clone()));
        for (w, h) in [(80, 24), (120, 40)] {
            let (all, text) = shown(&app, w, h);
            assert!(
                text.contains(
                    "Largest batch that fits: ×2.5 the batch it runs at (batch 20 if it runs at 8)"
                ),
                "{w}: {all}"
            );
            assert!(
                text.contains("under 2.00 GiB (its memory fraction)"),
                "{w}: {all}"
            );
            assert!(text.contains("392 of 499 allocations"), "{w}: {all}");
            assert!(text.contains("×0.5 592 MiB 552 MiB"), "{w}: {all}");
            assert!(text.contains("×1 (now) 912 MiB"), "{w}: {all}");
            assert!(
                text.contains("×4 out of memory in its first step (asked for 96.0 MiB)"),
                "{w}: {all}"
            );
        }
        // Stopped after the fit: the fit stays, said to be from before.
        l.coverage.stopped = Some("the job lost 12 events".into());
        advised(&mut app, Some(l.clone()));
        let (all, text) = shown(&app, 120, 40);
        assert!(
            text.contains("the advisor stopped: the job lost 12 events; this fit is from before"),
            "{all}"
        );
        assert!(text.contains("×1 (now) 912 MiB"), "{all}");
        // A job whose steps change shape says so, and shows no table.
        l.fit.as_mut().unwrap().cannot =
            Some("the last two steps allocate 7 and 5 tensors: their shapes change".into());
        advised(&mut app, Some(l));
        let (all, text) = shown(&app, 80, 24);
        assert!(
            text.contains("cannot be repeated: the last two steps allocate 7 and 5"),
            "{all}"
        );
        assert!(!all.contains("PEAK RESERVED"), "{all}");
    }
}
