//! What went wrong, in words: the latest out-of-memory with the figures
//! that explain it and the events before it, and the leak verdict with the
//! modules (and code locations) whose surviving allocations grow and the
//! allocation sizes whose live counts keep growing.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};
use ratatui::Frame;

use super::blockmap::stream_label;
use super::events::event_line;
use super::scroll::Scroll;
use super::theme::Theme;
use vramscope_collect::ProcessEntry;
pub use vramscope_core::model::leak::{LeakConfig, LeakOrigin, LeakReport, StepSource};
use vramscope_core::model::view::OomRecord;
use vramscope_text::format;

/// `e`'s latest OOM and leak verdict, aged against `now_ns` (the
/// snapshot's time), scrolled where they do not fit.
pub(crate) fn render(
    frame: &mut Frame,
    area: Rect,
    e: &ProcessEntry,
    (now_ns, scroll): (u64, Scroll),
    t: &Theme,
) {
    let text = paragraph(e, now_ns, t);
    let inner_w = area.width.saturating_sub(2);
    let (total, page) = (
        text.line_count(inner_w),
        area.height.saturating_sub(2) as usize,
    );
    // Never past the last full page (a scroll kept from a smaller terminal).
    let scroll = scroll.fit(total, page);
    let mut title = vec![Span::styled(title(&e.view), t.title())];
    title.extend(scroll.hint("lines", t));
    let block = t.block(Line::from(title));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    frame.render_widget(text.scroll((scroll.offset() as u16, 0)), inner);
}

/// Lines the pane's text takes, wrapped `width` cells wide (for scrolling).
pub(crate) fn line_count(e: &ProcessEntry, now_ns: u64, width: u16) -> usize {
    paragraph(e, now_ns, &Theme::default()).line_count(width)
}

fn title(v: &vramscope_core::model::ProcessView) -> &'static str {
    match (!v.ooms.is_empty(), v.leak.flagged) {
        (true, true) => " Out of memory & leak ",
        (true, false) => " Out of memory ",
        (false, true) => " Leak suspected ",
        (false, false) => " Diagnosis ",
    }
}

/// The pane's text, wrapped: the latest OOM first when there is one (the
/// title says so; issue 30, item 1), then the leak verdict.
fn paragraph(e: &ProcessEntry, now_ns: u64, t: &Theme) -> Paragraph<'static> {
    let v = &e.view;
    let mut lines: Vec<Line> = Vec::new();
    match v.ooms.last() {
        Some(oom) => {
            let total = v.ooms_total.max(v.ooms.len() as u64);
            oom_lines(oom, total, now_ns, t, &mut lines);
            lines.push(Line::raw(""));
            leak_lines(v, t, &mut lines);
        }
        None => {
            leak_lines(v, t, &mut lines);
            lines.push(Line::raw(""));
            lines.push(Line::styled("No out-of-memory seen.", t.good()));
        }
    }
    Paragraph::new(lines).wrap(Wrap { trim: false })
}

/// How a verdict reads: whether it alarms, and its sentence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Alarm,
    Calm,
    Unsure,
}

/// Where the steps come from and how sure that is, in words: the same in
/// the dashboard, `snapshot`, `replay` and `demo --headless`.
pub fn steps_text(l: &LeakReport) -> String {
    match l.source {
        StepSource::None => "Steps: none found yet (no vramscope.mark(), no optimizer.step(), \
             no repeating allocation pattern)"
            .to_string(),
        StepSource::AllocationPeriod => format!(
            "Steps: {} from the allocation pattern (every {} allocations; confidence {:.2})",
            l.steps_observed,
            l.period_allocations.map_or("?".into(), |n| n.to_string()),
            l.step_confidence,
        ),
        s => format!(
            "Steps: {} from {} (confidence {:.2})",
            l.steps_observed,
            s.describe(),
            l.step_confidence
        ),
    }
}

/// The leak verdict in one sentence, with the figures it rests on: "too
/// early" until enough steps were seen, never a growing floor called
/// healthy without saying why.
pub fn verdict_text(l: &LeakReport, c: &LeakConfig) -> (Tone, String) {
    let (n, need) = (l.window_steps, c.min_steps.max(2));
    let slope = format::bytes_signed(l.floor_slope_bytes_per_step);
    let run = if l.run > 1 {
        format!(" (run {})", l.run)
    } else {
        String::new()
    };
    if l.flagged {
        let when = match (l.flagged_at_step, l.flagged_after_ns) {
            (Some(s), Some(ns)) => format!(
                "; flagged at step {s}, {} after the first",
                format::duration(ns)
            ),
            (Some(s), None) => format!("; flagged at step {s}"),
            _ => String::new(),
        };
        let floor = l.trend >= c.min_trend && l.floor_growth_bytes >= c.min_growth_bytes as f64;
        if l.survivors.flagged && !floor {
            // The survivor test alone (issue 26, item 3): floors that swing
            // hide the trend, the blocks each step leaves alive do not.
            let s = &l.survivors;
            return (
                Tone::Alarm,
                format!(
                    "LEAK SUSPECTED{run}: {} of the last {} finished steps left blocks that are still alive ({} in all), however the floor swings{when}.",
                    s.steps_with_survivors,
                    s.window_steps,
                    format::bytes(s.bytes),
                ),
            );
        }
        return (
            Tone::Alarm,
            format!(
                "LEAK SUSPECTED{run}: the allocated floor grows {slope}/step over {n} steps (trend {:.2}, {} in the window){when}.",
                l.trend,
                format::bytes_signed(l.floor_growth_bytes),
            ),
        );
    }
    if l.source == StepSource::None {
        return (
            Tone::Unsure,
            format!("No verdict yet{run}: no steps found."),
        );
    }
    if n < need {
        return (
            Tone::Unsure,
            // No figure yet: the first steps allocate optimizer state and
            // caches, and their floor growth read like an alarm (issue 30,
            // item 9: "+864 MiB per step so far" on a healthy job).
            format!("Too early to tell{run}: {n} of {need} steps; the first steps allocate optimizer state and caches, so the verdict waits for {need}."),
        );
    }
    (
        Tone::Calm,
        format!(
            "No leak suspected{run}: {} steps; allocated floor {slope} per step, trend {:.2} (flagged at ≥ {:.2} and ≥ {} growth over {n} steps).",
            l.steps_observed,
            l.trend,
            c.min_trend,
            format::bytes(c.min_growth_bytes),
        ),
    )
}

/// What a verdict is judged against, in words (the pane and the help).
pub(crate) fn criterion_text(c: &LeakConfig) -> String {
    format!(
        "Criterion: each step's floor is its lowest allocated total; over the last {} floors (a run's warm-up floors that later ones undercut left out) a leak is flagged when they rise consistently (Kendall's trend ≥ {:.2}), the robust slope is positive and the growth is ≥ {}; no verdict before {} steps.",
        c.window_steps,
        c.min_trend,
        format::bytes(c.min_growth_bytes),
        c.min_steps.max(2),
    )
}

/// A growing module in one line: bytes per step still alive, in how many
/// steps, and where (the first frames of its stack, joined by `arrow`).
pub(crate) fn origin_text(o: &LeakOrigin, arrow: &str) -> String {
    let modules = if o.modules > 1 {
        format!(" ({} modules)", o.modules)
    } else {
        String::new()
    };
    let mut line = format!(
        "{}{modules}: +{}/step, {}/{} steps, {} alive",
        super::blockmap::module_label(&o.module),
        format::bytes(o.bytes_per_step),
        o.steps_with_survivors,
        o.window_steps,
        format::bytes(o.live_bytes),
    );
    if !o.stack.is_empty() {
        let frames: Vec<&str> = o.stack.iter().take(3).map(String::as_str).collect();
        line.push_str(" at ");
        line.push_str(&frames.join(arrow));
        if o.stack.len() > 3 {
            line.push_str(arrow);
            line.push('…');
        }
    }
    line
}

/// The growing modules of a flagged leak, one line each, and a last line
/// for those left out.
/// "Live by role: parameter 576M · gradient 576M · ... · other 2.88G
/// (outlived its step, named by no role list)": where a leak's bytes sit
/// among what PyTorch holds (None when no block has a role but other).
pub fn roles_text(a: &vramscope_core::model::attrib::Attribution) -> Option<String> {
    use vramscope_core::model::roles::Role;
    if a.roles.iter().all(|r| r.role == Role::Other) {
        return None;
    }
    let parts: Vec<String> = (a.roles.iter())
        .map(|r| format!("{} {}", r.role.label(), format::bytes_short(r.bytes)))
        .collect();
    let other = a.roles.iter().any(|r| r.role == Role::Other);
    Some(format!(
        "Live by role: {}{}",
        parts.join(" · "),
        if other {
            " (other: outlived its step, named by no role list)"
        } else {
            ""
        }
    ))
}

pub fn origins_text(l: &LeakReport, arrow: &str) -> Vec<String> {
    let mut out: Vec<String> = l.origins.iter().map(|o| origin_text(o, arrow)).collect();
    if l.more_origins > 0 {
        out.push(format!(
            "and {} more growing modules or locations",
            l.more_origins
        ));
    }
    out
}

/// Earlier runs' verdicts (a looping job), newest last.
pub fn runs_text(l: &LeakReport) -> Option<String> {
    if l.earlier_runs.is_empty() {
        return None;
    }
    let runs: Vec<String> = (l.earlier_runs.iter())
        .map(|r| match r.flagged_at_step {
            Some(s) => format!("#{} flagged at step {s} of {}", r.run, r.steps),
            None => format!("#{} not flagged in {} steps", r.run, r.steps),
        })
        .collect();
    Some(format!("Earlier runs: {}.", runs.join("; ")))
}

/// `Out of memory at about step 49 (in about 2.1s): reserved 1.19 GiB of
/// the 2.38 GiB the memory fraction allows, +32.0 MiB a step; the 32.0 MiB
/// allocation would fail.`
pub fn forecast_text(f: &vramscope_core::model::forecast::Forecast) -> String {
    use vramscope_text::format::{bytes, duration};
    let simulated = f.method == vramscope_core::model::forecast::Method::Simulation;
    let mut said: Vec<String> = (f.in_ns.into_iter())
        .map(|ns| format!("in about {}", duration(ns)))
        .collect();
    if simulated {
        said.push("the last step replayed forward through the simulator".into());
    }
    let when = if said.is_empty() {
        String::new()
    } else {
        format!(" ({})", said.join("; "))
    };
    let of = if f.fraction {
        "the memory fraction allows"
    } else {
        "the device has for PyTorch"
    };
    let request = f
        .request
        .map(|r| format!("; the {} allocation would fail", bytes(r)))
        .unwrap_or_default();
    let why = match f.cause {
        vramscope_core::model::forecast::Cause::Leak => String::new(),
        vramscope_core::model::forecast::Cause::ReservedGrowth => format!(
            "Reserved memory grew at each of the last {} steps (no leak flagged): ",
            vramscope_core::model::forecast::GROWING_STEPS
        ),
    };
    let about = if simulated { "" } else { "about " };
    format!(
        "{why}{}ut of memory at {about}step {}{when}: reserved {} of the {} {of}, +{} a step{request}.",
        if why.is_empty() { "O" } else { "o" },
        f.oom_step,
        bytes(f.reserved),
        bytes(f.limit),
        bytes(f.growth_per_step),
    )
}

fn leak_lines(v: &vramscope_core::model::ProcessView, t: &Theme, out: &mut Vec<Line<'static>>) {
    let l = &v.leak;
    let (tone, verdict) = verdict_text(l, &v.leak_criterion);
    out.push(match tone {
        Tone::Alarm => Line::styled(verdict, t.alert()),
        Tone::Calm => Line::styled(verdict, t.good()),
        Tone::Unsure => Line::styled(verdict, t.dim()),
    });
    out.push(Line::styled(steps_text(l), t.dim()));
    if let Some(runs) = runs_text(l) {
        out.push(Line::styled(runs, t.dim()));
    }
    if let Some(f) = &v.forecast {
        out.push(Line::styled(forecast_text(f), t.alert()));
    }
    if !l.flagged {
        out.push(Line::styled(criterion_text(&v.leak_criterion), t.dim()));
        return;
    }
    if !l.origins.is_empty() {
        out.push(Line::styled(
            "Growing, by module (bytes born per step, still alive):",
            t.header(),
        ));
        for text in origins_text(l, " ← ") {
            out.push(Line::raw(format!(" {text}")));
        }
    } else if v.attribution.tagged() {
        out.push(Line::styled(
            "No module's allocations outlive most of the last steps.",
            t.dim(),
        ));
    }
    if let Some(text) = roles_text(&v.attribution) {
        out.push(Line::styled(text, t.dim()));
    }
    if l.top_sizes.is_empty() {
        out.push(Line::styled(
            "No single allocation size stands out.",
            t.dim(),
        ));
        return;
    }
    // 51 columns: the pane's 58 at 120x40 hold a row (issue 46, item 16:
    // at 61 "since" went on to a line of its own).
    out.push(Line::styled(
        format!(
            "{:>6} {:>6} {:>6} {:>8} {:>6} {:>7} {:>6}",
            "size", "block", "live", "grow/st", "grown", "oldest", "since"
        ),
        t.header(),
    ));
    for s in &l.top_sizes {
        out.push(Line::raw(format!(
            "{:>6} {:>6} {:>6} {:>8} {:>6} {:>7} {:>6}",
            format::bytes_short(s.requested),
            format::bytes_short(s.block_size),
            s.live,
            format!("+{:.1}", s.live_growth_per_step),
            format!("{:+}", s.live_growth),
            format::opt(s.oldest_age_ns, t.glyphs().absent, format::duration),
            format!("#{}", s.first_step),
        )));
    }
    out.push(Line::styled(
        "Tensors of these sizes stay alive across steps (\"since\": the step they were first allocated at): e.g. losses kept with their graph (use loss.item(), torch.no_grad()).",
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

    #[test]
    fn a_forecast_says_why_it_is_made() {
        use vramscope_core::model::forecast::{Cause, Forecast, Method};
        const MIB: u64 = 1 << 20;
        let mut f = Forecast {
            oom_step: 57,
            steps_left: 20,
            in_ns: None,
            limit: 2048 * MIB,
            reserved: 1024 * MIB,
            growth_per_step: 50 * MIB,
            fraction: true,
            request: None,
            cause: Cause::Leak,
            method: Method::Projection,
        };
        assert_eq!(
            forecast_text(&f),
            "Out of memory at about step 57: reserved 1.00 GiB of the 2.00 GiB the memory fraction allows, +50.0 MiB a step."
        );
        f.cause = Cause::ReservedGrowth;
        assert_eq!(
            forecast_text(&f),
            "Reserved memory grew at each of the last 8 steps (no leak flagged): out of memory at about step 57: reserved 1.00 GiB of the 2.00 GiB the memory fraction allows, +50.0 MiB a step."
        );
        // By simulation: the step itself, and how it was found.
        f.cause = Cause::Leak;
        f.method = Method::Simulation;
        f.request = Some(64 * MIB);
        assert_eq!(
            forecast_text(&f),
            "Out of memory at step 57 (the last step replayed forward through the simulator): reserved 1.00 GiB of the 2.00 GiB the memory fraction allows, +50.0 MiB a step; the 64.0 MiB allocation would fail."
        );
    }

    #[test]
    fn a_leak_found_by_its_survivors_alone_says_so() {
        let mut l = report(64, 0.0, 0.1);
        l.flagged = true;
        l.flagged_at_step = Some(57);
        l.survivors = vramscope_core::model::leak::SurvivorTest {
            window_steps: 48,
            steps_with_survivors: 48,
            bytes: 12 << 20,
            flagged: true,
        };
        let (tone, text) = verdict_text(&l, &LeakConfig::default());
        assert_eq!(tone, Tone::Alarm);
        assert_eq!(
            text,
            "LEAK SUSPECTED: 48 of the last 48 finished steps left blocks that are still alive (12.0 MiB in all), however the floor swings; flagged at step 57."
        );
    }

    fn report(window_steps: usize, slope: f64, trend: f64) -> LeakReport {
        LeakReport {
            flagged: false,
            survivors: Default::default(),
            source: StepSource::OptimizerSteps,
            steps_observed: window_steps as u64,
            steps_total: window_steps as u64,
            window_steps,
            floor_slope_bytes_per_step: slope,
            floor_growth_bytes: slope * window_steps as f64,
            trend,
            last_floor: None,
            top_sizes: Vec::new(),
            step_confidence: 1.0,
            period_allocations: None,
            flagged_at_step: None,
            flagged_after_ns: None,
            run: 1,
            earlier_runs: Vec::new(),
            origins: Vec::new(),
            more_origins: 0,
        }
    }

    /// A growing module reads as one line, its code location (the first
    /// three frames) after it.
    #[test]
    fn a_growing_module_names_its_location() {
        let mut l = report(16, 1e6, 1.0);
        l.origins = vec![LeakOrigin {
            module: "model.layers.*".into(),
            modules: 12,
            stack: ["a.py:1 f", "b.py:2 g", "c.py:3 h", "d.py:4 main"]
                .map(String::from)
                .to_vec(),
            bytes_per_step: 3 << 20,
            steps_with_survivors: 15,
            window_steps: 16,
            live_bytes: 45 << 20,
            first_step: 2,
        }];
        l.more_origins = 2;
        assert_eq!(
            origins_text(&l, " <- "),
            [
                "model.layers.* (12 modules): +3.00 MiB/step, 15/16 steps, 45.0 MiB alive at a.py:1 f <- b.py:2 g <- c.py:3 h <- …",
                "and 2 more growing modules or locations",
            ]
        );
    }

    /// Issue 10, item 3: four steps of a rising floor are "too early to
    /// tell", not "no leak suspected"; a verdict names its criterion.
    #[test]
    fn the_verdict_says_too_early_and_names_its_criterion() {
        let c = LeakConfig::default();
        let (tone, early) = verdict_text(&report(4, 388.0 * 1048576.0, 1.0), &c);
        assert_eq!(tone, Tone::Unsure);
        assert!(
            early.starts_with("Too early to tell: 4 of 8 steps"),
            "{early}"
        );
        // Issue 30, item 9: no growth figure before a verdict (the first
        // steps' floors rise on healthy jobs too).
        assert!(
            !early.contains("MiB") && !early.contains("per step"),
            "{early}"
        );
        let (tone, healthy) = verdict_text(&report(79, 1000.0, 0.24), &c);
        assert_eq!(tone, Tone::Calm);
        assert!(
            healthy.starts_with("No leak suspected: 79 steps"),
            "{healthy}"
        );
        assert!(
            healthy.contains("trend 0.24 (flagged at ≥ 0.60"),
            "{healthy}"
        );
        assert!(
            steps_text(&report(79, 0.0, 0.0)).contains("79 from optimizer steps (confidence 1.00)")
        );
        assert!(criterion_text(&c).contains("last 64 floors"));
    }

    #[test]
    fn a_flagged_verdict_says_when_and_keeps_earlier_runs() {
        let mut r = report(20, 1048576.0, 0.98);
        r.flagged = true;
        r.flagged_at_step = Some(9);
        r.flagged_after_ns = Some(4_200_000_000);
        r.run = 3;
        r.earlier_runs = vec![
            vramscope_core::model::leak::RunVerdict {
                run: 1,
                steps: 40,
                flagged_at_step: Some(9),
            },
            vramscope_core::model::leak::RunVerdict {
                run: 2,
                steps: 40,
                flagged_at_step: None,
            },
        ];
        let (tone, v) = verdict_text(&r, &LeakConfig::default());
        assert_eq!(tone, Tone::Alarm);
        assert!(
            v.starts_with("LEAK SUSPECTED (run 3): the allocated floor grows +1.00 MiB/step"),
            "{v}"
        );
        assert!(v.contains("flagged at step 9, 4.2s after the first"), "{v}");
        assert_eq!(
            runs_text(&r).unwrap(),
            "Earlier runs: #1 flagged at step 9 of 40; #2 not flagged in 40 steps."
        );
    }
}
