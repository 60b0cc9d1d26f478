//! What went wrong, in words: the latest out-of-memory with the figures
//! that explain it and the events before it, and the leak verdict with the
//! allocation sizes whose live counts keep growing.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};
use ratatui::Frame;

use super::blockmap::stream_label;
use super::events::event_line;
use super::format;
use super::theme::Theme;
use crate::collect::ProcessEntry;
use crate::model::leak::{LeakConfig, LeakReport, StepSource};
use crate::model::view::OomRecord;

/// `e`'s latest OOM and leak verdict, aged against `now_ns` (the
/// snapshot's time).
pub fn render(frame: &mut Frame, area: Rect, e: &ProcessEntry, now_ns: u64, t: &Theme) {
    let v = &e.view;
    let title = if !v.ooms.is_empty() && v.leak.flagged {
        " Out of memory & leak "
    } else if !v.ooms.is_empty() {
        " Out of memory "
    } else if v.leak.flagged {
        " Leak suspected "
    } else {
        " Diagnosis "
    };
    let block = t.block(Span::styled(title, t.title()));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let mut lines: Vec<Line> = Vec::new();
    if v.leak.flagged {
        leak_lines(&v.leak, t, &mut lines);
        lines.push(Line::raw(""));
    }
    if let Some(oom) = v.ooms.last() {
        oom_lines(
            oom,
            v.ooms_total.max(v.ooms.len() as u64),
            now_ns,
            t,
            &mut lines,
        );
    }
    if lines.is_empty() {
        lines.push(Line::styled("No out-of-memory seen.", t.good()));
        lines.push(verdict_line(&v.leak, &v.leak_criterion, t));
    }
    frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}

/// The verdict when no leak is flagged, with the criterion it was judged
/// against: "too early" until enough steps were seen, never a growing
/// floor called healthy without saying why.
fn verdict_line(l: &LeakReport, c: &LeakConfig, t: &Theme) -> Line<'static> {
    let (n, need) = (l.window_steps, c.min_steps.max(2));
    let src = match l.source {
        StepSource::None => return Line::styled("No training steps recognised yet.", t.dim()),
        StepSource::Markers => "from markers",
        StepSource::Troughs => "inferred",
    };
    let slope = format::bytes_signed(l.floor_slope_bytes_per_step);
    if n < need {
        return Line::styled(
            format!(
                "Too early to tell: {n} of {need} steps ({src}); allocated floor {slope} per step so far."
            ),
            t.dim(),
        );
    }
    Line::styled(
        format!(
            "No leak suspected: {} steps ({src}); allocated floor {slope} per step, trend {:.2} (flagged at ≥ {:.2} and ≥ {} growth over {n} steps).",
            l.steps_observed,
            l.trend,
            c.min_trend,
            format::bytes(c.min_growth_bytes),
        ),
        t.good(),
    )
}

fn leak_lines(l: &LeakReport, t: &Theme, out: &mut Vec<Line<'static>>) {
    let src = match l.source {
        StepSource::Markers => "step markers",
        _ => "inferred steps",
    };
    out.push(Line::from(vec![
        Span::styled("LEAK SUSPECTED ", t.alert()),
        Span::raw(format!(
            "allocated floor grows {}/step over {} steps ({src}; trend {:.2}, {} in window)",
            format::bytes_signed(l.floor_slope_bytes_per_step),
            l.window_steps,
            l.trend,
            format::bytes_signed(l.floor_growth_bytes),
        )),
    ]));
    if l.top_sizes.is_empty() {
        out.push(Line::styled(
            "No single allocation size stands out.",
            t.dim(),
        ));
        return;
    }
    out.push(Line::styled(
        format!(
            "{:>10} {:>10} {:>6} {:>8} {:>7} {:>8}",
            "size", "block", "live", "grow/st", "grown", "oldest"
        ),
        t.header(),
    ));
    for s in &l.top_sizes {
        out.push(Line::raw(format!(
            "{:>10} {:>10} {:>6} {:>8} {:>7} {:>8}",
            format::bytes_short(s.requested),
            format::bytes_short(s.block_size),
            s.live,
            format!("+{:.1}", s.live_growth_per_step),
            format!("{:+}", s.live_growth),
            format::opt(s.oldest_age_ns, t.glyphs().absent, format::duration),
        )));
    }
    out.push(Line::styled(
        "Tensors of these sizes stay alive across steps: e.g. losses kept with their graph (use loss.item(), torch.no_grad()).",
        t.dim(),
    ));
}

fn oom_lines(o: &OomRecord, total: u64, now: u64, t: &Theme, out: &mut Vec<Line<'static>>) {
    let a = t.glyphs().absent;
    let ago = format::duration(now.saturating_sub(o.time_ns));
    out.push(Line::from(vec![
        Span::styled(format!("OUT OF MEMORY x{total}"), t.alert()),
        Span::raw(format!(
            " latest {ago} ago on cuda:{} {}",
            o.device,
            stream_label(o.stream)
        )),
    ]));
    out.push(Line::raw(format!(
        "  request {}   device free {}",
        format::bytes(o.request),
        format::bytes(o.device_free),
    )));
    out.push(Line::raw(format!(
        "  largest free block {} in its pool, {} anywhere",
        format::opt(o.largest_free_in_pool, a, format::bytes),
        format::opt(o.largest_free, a, format::bytes),
    )));
    let cached = o.reserved.saturating_sub(o.allocated);
    out.push(Line::raw(format!(
        "  allocated {}   reserved {}   cached {}",
        format::bytes(o.allocated),
        format::bytes(o.reserved),
        format::bytes(cached),
    )));
    let largest = o.largest_free.unwrap_or(0);
    let why = if cached >= o.request && largest < o.request {
        "The cache would hold the request, but only in pieces: fragmentation. Try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
    } else if o.device_free < o.request && cached < o.request {
        "The device is full of live tensors: reduce the batch, free references, or use checkpointing."
    } else {
        "The driver could not provide the memory (other processes, or the CUDA context)."
    };
    out.push(Line::styled(format!("  {why}"), t.warn()));
    if !o.recent.is_empty() {
        out.push(Line::styled("  events before it (newest first):", t.dim()));
        for ev in o.recent.iter().rev() {
            let mut l = event_line(ev, o.time_ns, t);
            l.spans.insert(0, Span::raw("  "));
            out.push(l);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(window_steps: usize, slope: f64, trend: f64) -> LeakReport {
        LeakReport {
            flagged: false,
            source: StepSource::Markers,
            steps_observed: window_steps as u64,
            window_steps,
            floor_slope_bytes_per_step: slope,
            floor_growth_bytes: slope * window_steps as f64,
            trend,
            last_floor: None,
            top_sizes: Vec::new(),
        }
    }

    fn text(l: &Line) -> String {
        l.spans.iter().map(|s| s.content.as_ref()).collect()
    }

    /// Issue 10, item 3: four steps of a rising floor are "too early to
    /// tell", not "no leak suspected"; a verdict names its criterion.
    #[test]
    fn the_verdict_says_too_early_and_names_its_criterion() {
        let t = Theme::new(false, true);
        let c = LeakConfig::default();
        let early = text(&verdict_line(&report(4, 388.0 * 1048576.0, 1.0), &c, &t));
        assert!(
            early.starts_with("Too early to tell: 4 of 8 steps"),
            "{early}"
        );
        let healthy = text(&verdict_line(&report(79, 1000.0, 0.24), &c, &t));
        assert!(
            healthy.starts_with("No leak suspected: 79 steps"),
            "{healthy}"
        );
        assert!(
            healthy.contains("trend 0.24 (flagged at ≥ 0.60"),
            "{healthy}"
        );
    }
}
