//! The allocator advisor overlay (`A` in the process view): the hub's live
//! advisor (`vramscope_core::sim::live`) replays the selected process's allocator
//! requests under every candidate `PYTORCH_CUDA_ALLOC_CONF`, and this shows
//! its answer: the recommendation in one line, what the replay covers,
//! whether the job's own setting replays as the job ran, then one row per
//! candidate, best first. j/k select a row, `y` copies its environment line.
//!
//! It only renders [`LiveAdvice`] from the snapshot; the advisor itself is
//! started by the run loop ([`super::Effect::Advise`]).

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph, Wrap};
use ratatui::Frame;

use super::theme::Theme;
use vramscope_core::sim::advice_text::{
    coverage_line, env_line, range_bytes, range_count, shown, signed_bytes, summary,
};
use vramscope_core::sim::advise::{Advice, Outcome};
use vramscope_core::sim::live::LiveAdvice;
use vramscope_text::format;

/// The overlay's state: the row selected (None: the recommendation, else
/// the first row, so the default follows the advice as it changes until a
/// row is picked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdvisorView {
    pub(crate) selected: Option<usize>,
}

impl AdvisorView {
    /// The index of the selected outcome in `a` (None: no rows).
    pub(crate) fn selected(&self, a: &Advice) -> Option<usize> {
        let last = a.outcomes.len().checked_sub(1)?;
        Some(self.selected.or(a.best).unwrap_or(0).min(last))
    }

    /// One row up or down, within the rows of `a`.
    pub(crate) fn step(&mut self, a: Option<&Advice>, down: bool) {
        let Some((a, at)) = a.and_then(|a| Some((a, self.selected(a)?))) else {
            return;
        };
        self.selected = Some(if down {
            (at + 1).min(a.outcomes.len() - 1)
        } else {
            at.saturating_sub(1)
        });
    }

    /// The selected row's `PYTORCH_CUDA_ALLOC_CONF=…` line (what `y` copies).
    pub(crate) fn env_line(&self, advice: &LiveAdvice) -> Option<String> {
        let a = advice.advice.as_ref()?;
        let o = &a.outcomes[self.selected(a)?];
        Some(env_line(&o.candidate.conf))
    }
}

/// A figure column of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Col {
    Peak,
    Change,
    ReservedNow,
    SplitNow,
    Retries,
    Ooms,
}

impl Col {
    /// Left to right.
    const ALL: [Col; 6] = [
        Col::Peak,
        Col::Change,
        Col::ReservedNow,
        Col::SplitNow,
        Col::Retries,
        Col::Ooms,
    ];
    /// Left out first where the terminal is narrow: the figures after the
    /// run before those that decide the recommendation (peak, OOMs).
    const DROPPED_FIRST: [Col; 4] = [Col::SplitNow, Col::ReservedNow, Col::Retries, Col::Change];

    fn header(self) -> &'static str {
        match self {
            Col::Peak => "PEAK RESERVED",
            Col::Change => "VS OWN",
            Col::ReservedNow => "RESERVED NOW",
            Col::SplitNow => "SPLIT NOW",
            Col::Retries => "RETRIES",
            Col::Ooms => "OOMS",
        }
    }

    fn cell(self, o: &Outcome) -> String {
        let t = &o.totals;
        match self {
            Col::Peak => range_bytes(t.reserved_peak),
            Col::Change => signed_bytes(o.peak_change),
            Col::ReservedNow => range_bytes(t.reserved_now),
            Col::SplitNow => range_bytes(t.inactive_split_now),
            Col::Retries => range_count(t.alloc_retries),
            Col::Ooms => range_count(t.ooms),
        }
    }
}

/// The rank column: `*` marks the recommendation, `-` a candidate the job
/// cannot use.
const RANK_W: usize = 4;
/// Columns apart.
const GAP: usize = 2;
/// The setting's column is cut (with an ellipsis) no narrower than this.
const CONF_MIN: usize = 24;
const CONF_HEADER: &str = "PYTORCH_CUDA_ALLOC_CONF";
const OWN: &str = " (own)";

/// The table's layout for `a` in `width` columns: the figure columns
/// kept (with their widths) and the setting's width.
fn columns(a: &Advice, width: usize) -> (Vec<(Col, usize)>, usize) {
    let mut cols: Vec<(Col, usize)> = Col::ALL
        .iter()
        .map(|&c| {
            let cells = a.outcomes.iter().map(|o| c.cell(o).chars().count());
            (c, cells.chain([c.header().len()]).max().unwrap_or(0))
        })
        .collect();
    let conf_need = (a.outcomes.iter())
        .map(|o| {
            shown(&o.candidate.conf).chars().count() + if o.candidate.own { OWN.len() } else { 0 }
        })
        .chain([CONF_HEADER.len()])
        .max()
        .unwrap_or(0);
    let figures = |cols: &[(Col, usize)]| cols.iter().map(|(_, w)| w + GAP).sum::<usize>();
    for drop in Col::DROPPED_FIRST {
        if RANK_W + conf_need.min(CONF_MIN) + figures(&cols) <= width {
            break;
        }
        cols.retain(|(c, _)| *c != drop);
    }
    let conf_w = width.saturating_sub(RANK_W + figures(&cols)).min(conf_need);
    (cols, conf_w)
}

/// One candidate's row text: rank, setting (cut to `conf_w`, its own mark
/// kept), the figures.
fn row_text(i: usize, a: &Advice, cols: &[(Col, usize)], conf_w: usize, ellipsis: &str) -> String {
    let o = &a.outcomes[i];
    let c = &o.candidate;
    let rank = match (&c.unusable, a.best == Some(i)) {
        (Some(_), _) => "-".to_string(),
        (None, true) => format!("{}*", i + 1),
        (None, false) => (i + 1).to_string(),
    };
    let own = if c.own { OWN } else { "" };
    let conf = format::truncate(&shown(&c.conf), conf_w.saturating_sub(own.len()), ellipsis);
    let mut s = format!("{rank:>3} {:<conf_w$}", format!("{conf}{own}"));
    for (col, w) in cols {
        s.push_str(&format!("{:>w$}", col.cell(o), w = w + GAP));
    }
    s
}

fn header_text(cols: &[(Col, usize)], conf_w: usize, ellipsis: &str) -> String {
    let conf = format::truncate(CONF_HEADER, conf_w, ellipsis);
    let mut s = format!("{:>3} {conf:<conf_w$}", "#");
    for (col, w) in cols {
        s.push_str(&format!("{:>w$}", col.header(), w = w + GAP));
    }
    s
}

/// Whether the job's own setting replays as the job ran: the statistics
/// samples compared and matching, or why that was not checked.
fn own_check(advice: &LiveAdvice, a: &Advice, t: &Theme) -> Line<'static> {
    let o = &a.own;
    if !advice.coverage.from_start {
        return Line::styled(
            "own setting: not checked (watched from mid-run: its cache before then is not known)",
            t.dim(),
        );
    }
    if o.compared == 0 {
        return Line::styled(
            "own setting: no statistics samples to compare with yet",
            t.dim(),
        );
    }
    let text = format!(
        "own setting {} replayed: {} of {} statistics samples match; OOMs {} (the job: {})",
        shown(&advice.conf),
        o.matching,
        o.compared,
        o.replay_ooms,
        o.job_ooms
    );
    if o.reproduces() {
        Line::styled(text, t.good())
    } else {
        let first = (o.first_difference.as_deref())
            .map(|d| format!("; first difference: {d}"))
            .unwrap_or_default();
        Line::styled(
            format!("{text}: the figures are relative to the replay{first}"),
            t.warn(),
        )
    }
}

/// The overlay over `area`: `advice` is the selected process's (None: the
/// advisor has not published anything for it yet).
pub(crate) fn render(
    frame: &mut Frame,
    area: Rect,
    advice: Option<&LiveAdvice>,
    v: &AdvisorView,
    t: &Theme,
) {
    let g = t.glyphs();
    let popup_w = area.width.min(140);
    let inner_w = popup_w.saturating_sub(2);
    let mut head = match advice {
        None => vec![Line::styled(format!("starting{}", g.ellipsis), t.dim())],
        Some(l) => {
            let style = match l.best() {
                Some(_) => t.good().add_modifier(ratatui::style::Modifier::BOLD),
                None => t.header(),
            };
            vec![
                Line::styled(summary(l), style),
                Line::styled(coverage_line(&l.coverage), t.dim()),
            ]
        }
    };
    let table = advice.and_then(|l| Some((l, l.advice.as_ref()?)));
    if let Some((l, a)) = table {
        head.push(own_check(l, a, t));
    }
    // The heading lines wrap (the stop reason must show at 80 columns).
    let head = Paragraph::new(head).wrap(Wrap { trim: true });
    let head_h = head.line_count(inner_w) as u16;
    let rows = table.map_or(0, |(_, a)| {
        let unusable = a.outcomes.iter().filter(|o| o.candidate.unusable.is_some());
        a.outcomes.len() + unusable.count()
    });
    // Heading, a gap, the table's header and rows, a gap, the line `y`
    // copies; and the border.
    let table_h = if rows > 0 { rows as u16 + 4 } else { 0 };
    let popup = super::layout::centered(area, popup_w, head_h + table_h + 2);
    frame.render_widget(Clear, popup);
    let mut title = vec![Span::styled(" Allocator advisor ", t.title())];
    if let Some(d) = advice.and_then(|l| l.coverage.device) {
        title.push(Span::styled(format!("cuda:{d} "), t.dim()));
    }
    let block = t.block(Line::from(title)).title_bottom(Line::styled(
        " j/k select · y copy · * recommended · Esc closes ",
        t.dim(),
    ));
    let inner = block.inner(popup);
    frame.render_widget(block, popup);
    frame.render_widget(
        head,
        Rect {
            height: head_h.min(inner.height),
            ..inner
        },
    );
    let Some((_, a)) = table else { return };
    // Under the heading: a gap, the table's header, its rows, a gap, and
    // the line `y` copies last.
    let body_h = inner.height.saturating_sub(head_h + 4) as usize;
    if a.outcomes.is_empty() || body_h == 0 {
        return;
    }
    let width = inner.width as usize;
    let (cols, conf_w) = columns(a, width);
    let sel = v.selected(a);
    let mut lines = vec![Line::styled(
        header_text(&cols, conf_w, g.ellipsis),
        t.header(),
    )];
    // Each row and its "not usable" line, keeping the selected one in view
    // where the terminal is too short for all of them.
    let height = |i: usize| 1 + usize::from(a.outcomes[i].candidate.unusable.is_some());
    let mut first = 0;
    if let Some(s) = sel {
        while first < s && (first..=s).map(height).sum::<usize>() > body_h {
            first += 1;
        }
    }
    for (i, o) in a.outcomes.iter().enumerate().skip(first) {
        let c = &o.candidate;
        let style = if sel == Some(i) {
            t.selected()
        } else if a.best == Some(i) {
            t.good()
        } else if c.unusable.is_some() {
            t.dim()
        } else {
            ratatui::style::Style::new()
        };
        let text = row_text(i, a, &cols, conf_w, g.ellipsis);
        lines.push(Line::styled(format!("{text:<width$}"), style));
        if let Some(why) = &c.unusable {
            let why = format!("    not usable: {why}");
            lines.push(Line::styled(
                format::truncate(&why, width, g.ellipsis),
                t.dim(),
            ));
        }
    }
    lines.truncate(body_h + 1);
    let table_area = Rect {
        y: inner.y + head_h + 1,
        height: body_h as u16 + 1,
        ..inner
    };
    frame.render_widget(Paragraph::new(lines), table_area);
    // The whole line `y` copies, for a terminal that does not take OSC 52.
    if let Some(line) = table.and_then(|(l, _)| v.env_line(l)) {
        let copy = Line::from(vec![
            Span::styled("y", t.key()),
            Span::raw(" copies "),
            Span::raw(line),
        ]);
        let last = Rect {
            y: inner.y + inner.height - 1,
            height: 1,
            ..inner
        };
        frame.render_widget(
            Paragraph::new(crate::fit::fit_line(copy, width, g.ellipsis)),
            last,
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::LazyLock;

    use vramscope_core::sim::spread::Range;

    use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
    use ratatui::backend::TestBackend;
    use ratatui::buffer::Buffer;
    use ratatui::Terminal;

    use super::*;
    use crate::app::{App, AppConfig, AppEvent, Effect};
    use crate::fixtures::{app_with, Fixture};
    use crate::{clipboard, render_buffer, Overlay};
    use vramscope_core::sim::advise::{Candidate, OwnCheck};
    use vramscope_core::sim::live::Coverage;
    use vramscope_core::sim::spread::Totals;
    use vramscope_core::sim::AllocConf;

    static FX: LazyLock<Fixture> = LazyLock::new(|| Fixture::new(6));

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const STOPPED: &str =
        "the job makes events faster than the advisor replays them within 5 % of a core";

    fn one(x: u64) -> Range {
        Range { lo: x, hi: x }
    }

    /// A candidate's outcome: (setting, own, unusable), then peak
    /// reserved, its change against the own setting, retries and OOMs.
    fn outcome(
        (conf, own, unusable): (&str, bool, Option<&str>),
        peak: u64,
        change: i64,
        retries: u64,
        ooms: u64,
    ) -> Outcome {
        Outcome {
            candidate: Candidate {
                conf: conf.into(),
                what: "what it changes".into(),
                unusable: unusable.map(String::from),
                own,
                parsed: AllocConf::parse(conf).unwrap(),
            },
            totals: Totals {
                reserved_now: one(peak - GIB),
                reserved_peak: one(peak),
                allocated_peak: one(5 * GIB),
                inactive_split_now: one(96 * MIB),
                inactive_split_peak: one(512 * MIB),
                alloc_retries: one(retries),
                ooms: one(ooms),
            },
            tied_steps: 0,
            job_ooms: Vec::new(),
            peak_change: change,
        }
    }

    /// The advice after 40 steps, stopped: the best candidate (expandable
    /// segments) is not usable, so the second is recommended.
    pub(crate) fn advice() -> LiveAdvice {
        let outcomes = vec![
            outcome(
                (
                    "expandable_segments:True",
                    false,
                    Some("the job's PyTorch 2.0 has no expandable segments"),
                ),
                5 * GIB,
                -3 * GIB as i64,
                0,
                0,
            ),
            outcome(
                ("max_split_size_mb:512", false, None),
                6 * GIB,
                -2 * GIB as i64,
                0,
                0,
            ),
            outcome(
                (
                    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
                    false,
                    None,
                ),
                7 * GIB + 512 * MIB,
                -512 * MIB as i64,
                1,
                0,
            ),
            outcome(("", true, None), 8 * GIB, 0, 3, 1),
        ];
        LiveAdvice {
            coverage: Coverage {
                requests: 120_000,
                steps: 40,
                first_step: Some(3),
                last_step: Some(42),
                from_start: true,
                device: Some(0),
                stopped: Some(STOPPED.into()),
                ..Coverage::default()
            },
            advice: Some(Advice {
                requests: 120_000,
                capacity: 80 * GIB,
                memory_fraction: None,
                own: OwnCheck {
                    compared: 40,
                    matching: 40,
                    replay_ooms: 1,
                    job_ooms: 1,
                    ..OwnCheck::default()
                },
                outcomes,
                best: Some(1),
            }),
            conf: String::new(),
            ahead: None,
            fit: None,
        }
    }

    pub(crate) fn lines(buf: &Buffer) -> Vec<String> {
        let a = buf.area;
        (0..a.height)
            .map(|y| (0..a.width).map(|x| buf[(x, y)].symbol()).collect())
            .collect()
    }

    /// The overlay alone, drawn over a `w`×`h` terminal.
    fn overlay(advice: Option<&LiveAdvice>, v: AdvisorView, w: u16, h: u16) -> Vec<String> {
        let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
        let t = Theme::new(false, false);
        term.draw(|f| render(f, f.area(), advice, &v, &t)).unwrap();
        lines(term.backend().buffer())
    }

    /// The overlay's text inside its border, one string, spaces collapsed
    /// (a wrapped sentence reads whole).
    pub(crate) fn prose(lines: &[String]) -> String {
        let inside: Vec<&str> = lines.iter().map(|l| l.trim().trim_matches('│')).collect();
        inside
            .join(" ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub(crate) fn press(app: &mut App, code: KeyCode) -> Vec<Effect> {
        app.handle(AppEvent::Input(Event::Key(KeyEvent::new(
            code,
            KeyModifiers::NONE,
        ))))
    }

    /// The process view of the leak scenario, `w`×`h`.
    pub(crate) fn process_view(w: u16, h: u16) -> App {
        let cfg = AppConfig {
            theme: Theme::new(false, false),
            ..AppConfig::default()
        };
        let mut app = app_with(&FX, cfg, w, h);
        app.overview.selected = FX.key_of("leak");
        app.open();
        app.set_snapshot(FX.snapshot(&app.view_options()));
        app
    }

    /// A new snapshot in which the selected process has `advice`.
    pub(crate) fn advised(app: &mut App, advice: Option<LiveAdvice>) {
        let key = app.overview.selected.unwrap();
        let mut snap = FX.snapshot(&app.view_options());
        for p in snap.processes.iter_mut().filter(|p| p.key() == key) {
            p.advice = advice.clone();
        }
        app.set_snapshot(snap);
    }

    /// Issue 44, item 5: advice whose settings and stop reason hold the
    /// job's raw bytes (line and page breaks, an escape) draws none of
    /// them: every setting shown goes through `printable`.
    #[test]
    fn item5_the_overlay_draws_no_control_character_of_a_setting() {
        let raw = "max_split_size_mb:\r512\n\x0b\x0c\u{85}\u{2028}\u{2029}\x1b[2J";
        let mut l = advice();
        l.conf = raw.to_string();
        l.coverage.stopped = Some(format!("PYTORCH_CUDA_ALLOC_CONF={raw}: refused"));
        for o in &mut l.advice.as_mut().unwrap().outcomes {
            o.candidate.conf = format!("{}{raw}", o.candidate.conf);
        }
        let bad = |c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}';
        for (w, h) in [(80, 24), (160, 40)] {
            let shown = overlay(Some(&l), AdvisorView::default(), w, h);
            let all = shown.join("\n");
            assert!(!all.chars().filter(|c| *c != '\n').any(bad), "{w}: {all:?}");
            assert!(all.contains("max_split_size_mb:\u{fffd}512"), "{w}: {all}");
        }
    }

    #[test]
    fn the_recommendation_coverage_and_stop_show_at_80_and_160_columns() {
        let l = advice();
        for (w, h) in [(80, 24), (160, 40)] {
            let shown = overlay(Some(&l), AdvisorView::default(), w, h);
            let all = shown.join("\n");
            let text = prose(&shown);
            // The title line: the recommendation and what it saves.
            assert!(
                text.contains(
                    "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512: saves 2.00 GiB (25%) of peak reserved"
                ),
                "{w}: {all}"
            );
            // What the advice covers, and where it stopped.
            assert!(
                text.contains("120000 requests from the job's start, steps 3 to 42"),
                "{w}: {all}"
            );
            assert!(
                text.contains(&format!("stopped there: {STOPPED}")),
                "{w}: {all}"
            );
            assert!(
                text.contains("40 of 40 statistics samples match; OOMs 1 (the job: 1)"),
                "{w}: {all}"
            );
            // The recommended row: ranked 2 and marked, with its figures.
            let row = shown
                .iter()
                .find(|r| r.contains("2* max_split_size_mb:512"))
                .unwrap_or_else(|| panic!("{w}: {all}"));
            assert!(
                row.contains("6.00 GiB") && row.contains("-2.00 GiB"),
                "{row}"
            );
            // The unusable candidate: no rank, and why underneath.
            let at = shown
                .iter()
                .position(|r| r.contains(" - expandable_segments:True"))
                .unwrap_or_else(|| panic!("{w}: {all}"));
            assert!(
                shown[at + 1].contains("not usable: the job's PyTorch 2.0 has no"),
                "{all}"
            );
            assert!(all.contains("(defaults) (own)"), "{all}");
            // The line `y` copies: the recommendation's, by default.
            assert!(
                all.contains("y copies PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512"),
                "{all}"
            );
            for r in &shown {
                assert!(r.chars().count() == w as usize, "{r}");
            }
            // Narrow: the figures after the run give way to the setting.
            let header = shown.iter().find(|r| r.contains("PEAK RESERVED")).unwrap();
            assert!(
                header.contains("OOMS") && header.contains("VS OWN"),
                "{header}"
            );
            assert_eq!(header.contains("SPLIT NOW"), w == 160, "{header}");
            assert_eq!(header.contains("RESERVED NOW"), w == 160, "{header}");
        }
    }

    #[test]
    fn before_the_advice_the_overlay_says_what_it_waits_for() {
        let shown = overlay(None, AdvisorView::default(), 80, 24).join("\n");
        assert!(shown.contains("starting…"), "{shown}");
        let warm = LiveAdvice {
            coverage: Coverage {
                requests: 1234,
                ..Coverage::default()
            },
            advice: None,
            conf: String::new(),
            ahead: None,
            fit: None,
        };
        let shown = overlay(Some(&warm), AdvisorView::default(), 80, 24).join("\n");
        assert!(
            shown.contains("choosing the candidates (1234 requests seen)"),
            "{shown}"
        );
        assert!(!shown.contains("PEAK RESERVED"), "{shown}");
    }

    #[test]
    fn a_job_watched_from_mid_run_has_its_own_replay_not_checked() {
        let mut l = advice();
        l.coverage.from_start = false;
        let text = prose(&overlay(Some(&l), AdvisorView::default(), 80, 30));
        assert!(text.contains("own setting: not checked"), "{text}");
        assert!(!text.contains("samples match"), "{text}");
    }

    #[test]
    fn a_short_terminal_keeps_the_selected_row_in_view() {
        let l = advice();
        let v = AdvisorView { selected: Some(3) };
        let shown = overlay(Some(&l), v, 80, 14).join("\n");
        assert!(shown.contains("(defaults) (own)"), "{shown}");
    }

    /// `A` in the process view: the overlay, and the loop asked to advise
    /// the process (this host's: its environment is read); `A`, Esc and
    /// `q` close it; an advised process is not asked for again.
    #[test]
    fn key_a_opens_the_overlay_and_asks_the_loop_to_advise() {
        let mut app = process_view(80, 24);
        let key = app.overview.selected.unwrap();
        let fx = press(&mut app, KeyCode::Char('A'));
        assert_eq!(fx, vec![Effect::Advise { key, host: true }]);
        assert!(matches!(app.overlay, Some(Overlay::Advisor(_))));
        let f = lines(&render_buffer(&app, 80, 24)).join("\n");
        assert!(
            f.contains("Allocator advisor") && f.contains("starting…"),
            "{f}"
        );
        // The overlay takes the keys: `d` opens no step diff.
        press(&mut app, KeyCode::Char('d'));
        assert!(matches!(app.overlay, Some(Overlay::Advisor(_))));
        for close in [KeyCode::Char('A'), KeyCode::Esc, KeyCode::Char('q')] {
            app.overlay = Some(Overlay::Advisor(Default::default()));
            assert!(press(&mut app, close).is_empty());
            assert_eq!(app.overlay, None, "{close:?}");
            assert!(!app.quit);
        }
        advised(&mut app, Some(advice()));
        assert!(press(&mut app, KeyCode::Char('A')).is_empty());
        assert!(matches!(app.overlay, Some(Overlay::Advisor(_))));
        // A replay's processes ran elsewhere: no environment to read.
        let mut app = process_view(80, 24);
        app.set_demo_status(Some(vramscope_collect::demo::DemoStatus {
            scenario: "run.vrec".into(),
            caption: String::new(),
            progress: 1.0,
            speed: 1.0,
            paused: false,
            runs: 0,
            replay: true,
            ended: true,
        }));
        let fx = press(&mut app, KeyCode::Char('A'));
        assert_eq!(fx, vec![Effect::Advise { key, host: false }]);
        // Refused: the overlay closes and the footer says why.
        app.advise_refused(key, "the process's state is not known yet");
        assert_eq!(app.overlay, None);
        assert_eq!(
            app.message.as_deref(),
            Some("advisor: the process's state is not known yet")
        );
    }

    /// j/k select a row; `y` copies the selected row's line (OSC 52) and
    /// shows it in the footer.
    #[test]
    fn y_copies_the_selected_setting() {
        let mut app = process_view(80, 24);
        advised(&mut app, Some(advice()));
        press(&mut app, KeyCode::Char('A'));
        // By default the recommendation.
        let fx = press(&mut app, KeyCode::Char('y'));
        let line = "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512";
        assert_eq!(fx, vec![Effect::Copy(line.into())]);
        assert_eq!(
            clipboard::osc52(line),
            "\x1b]52;c;UFlUT1JDSF9DVURBX0FMTE9DX0NPTkY9bWF4X3NwbGl0X3NpemVfbWI6NTEy\x07"
        );
        let said = format!("copied {line}");
        assert_eq!(app.message.as_deref(), Some(said.as_str()));
        let f = lines(&render_buffer(&app, 80, 24));
        assert!(f.last().unwrap().contains(&said), "{}", f.join("\n"));
        // Down: the own setting, the last row (and no further).
        for _ in 0..3 {
            press(&mut app, KeyCode::Char('j'));
        }
        let fx = press(&mut app, KeyCode::Char('y'));
        assert_eq!(fx, vec![Effect::Copy("PYTORCH_CUDA_ALLOC_CONF=".into())]);
        for _ in 0..5 {
            press(&mut app, KeyCode::Up);
        }
        let fx = press(&mut app, KeyCode::Char('y'));
        assert_eq!(
            fx,
            vec![Effect::Copy(
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into()
            )]
        );
        // Nothing to copy during the warm-up.
        advised(&mut app, None);
        assert!(press(&mut app, KeyCode::Char('y')).is_empty());
        assert_eq!(app.message.as_deref(), Some("no advice to copy yet"));
    }

    /// What the user sees, whole, at 80 and 160 columns.
    #[test]
    fn frames() {
        for (w, h) in [(80u16, 24u16), (160, 40)] {
            let mut app = process_view(w, h);
            advised(&mut app, Some(advice()));
            press(&mut app, KeyCode::Char('A'));
            let f = lines(&render_buffer(&app, w, h)).join("\n");
            insta::assert_snapshot!(format!("advisor_{w}x{h}"), f);
        }
    }
}
