//! Whole frames drawn into a TestBackend from fixed snapshots (workshop
//! scenarios fed into the model, no clocks), compared as insta snapshots at
//! several sizes, plus checks of the monochrome and ASCII themes.

use std::sync::LazyLock;

use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::style::{Color, Modifier};
use ratatui::Terminal;
use vramscope_collect::demo::DemoStatus;
use vramscope_ui::app::ActionState;
use vramscope_ui::fixtures::{app_with, refresh, Fixture};
use vramscope_ui::{render_buffer, App, AppConfig, Overlay, Pane, Scroll, Theme};

static FX: LazyLock<Fixture> = LazyLock::new(|| Fixture::new(6));
static FX8: LazyLock<Fixture> = LazyLock::new(|| Fixture::new(8));
static NO_NVML: LazyLock<Fixture> = LazyLock::new(|| Fixture::without_nvml(2));

fn cfg() -> AppConfig {
    AppConfig {
        readonly: false,
        theme: Theme::new(true, false),
        ..AppConfig::default()
    }
}

fn text(buf: &Buffer) -> String {
    let mut t = Terminal::new(TestBackend::new(buf.area.width, buf.area.height)).unwrap();
    t.draw(|f| *f.buffer_mut() = buf.clone()).unwrap();
    t.backend().to_string()
}

fn frame(app: &App) -> String {
    text(&render_buffer(app, app.size.width, app.size.height))
}

/// `app`'s frame as the snapshot `name`, once it is seen to show `text`.
fn snapshot_showing(name: &str, app: &App, text: &str) {
    let f = frame(app);
    assert!(f.contains(text), "{f}");
    insta::assert_snapshot!(name, f);
}

fn process_app(fx: &Fixture, scenario: &str, w: u16, h: u16, pane: Pane) -> App {
    let mut app = app_with(fx, cfg(), w, h);
    app.overview.selected = fx.key_of(scenario);
    app.open();
    app.process.pane = pane;
    refresh(&mut app, fx);
    app
}

#[test]
fn overview_sizes() {
    for (w, h) in [(80, 24), (120, 40), (200, 60)] {
        let app = app_with(&FX, cfg(), w, h);
        insta::assert_snapshot!(format!("overview_{w}x{h}"), frame(&app));
    }
}

/// `app` with the process running `scenario` marked as exited.
fn with_dead(app: &mut App, fx: &Fixture, scenario: &str) {
    let key = fx.key_of(scenario).unwrap();
    let mut snap = (*app.snap).clone();
    for p in &mut snap.processes {
        if p.key() == key {
            p.identity.alive = false;
        }
    }
    app.set_snapshot(snap);
}

#[test]
fn a_dead_process_says_so_at_every_size() {
    for (w, h) in [(80, 24), (120, 40), (200, 60)] {
        let mut app = app_with(&FX, cfg(), w, h);
        with_dead(&mut app, &FX, "oom");
        let f = frame(&app);
        let line = f.lines().find(|l| l.contains("big_batch.py")).unwrap();
        assert!(line.contains("EXIT OOM"), "{line}");
        insta::assert_snapshot!(format!("overview_dead_{w}x{h}"), f);
    }
}

/// Issue 46, item 5: an exited process is dimmed and listed after the
/// live ones whatever the sort (the OOM job, the largest RESV, would head
/// the table), and `X` clears it from the table at once, saying so.
#[test]
fn exited_processes_go_last_and_x_clears_them() {
    let mut app = app_with(&FX, cfg(), 120, 40);
    let names = |app: &App| -> Vec<String> { app.rows().iter().map(|r| r.name.clone()).collect() };
    assert_eq!(names(&app)[0], "big_batch.py", "the largest RESV first");
    with_dead(&mut app, &FX, "oom");
    let live = names(&app);
    assert_eq!(
        live.last().map(String::as_str),
        Some("big_batch.py"),
        "{live:?}"
    );
    // Reversed, still after the live ones.
    press(&mut app, crossterm::event::KeyCode::Char('O'));
    let rev = names(&app);
    assert_eq!(
        rev.last().map(String::as_str),
        Some("big_batch.py"),
        "{rev:?}"
    );
    press(&mut app, crossterm::event::KeyCode::Char('X'));
    let f = frame(&app);
    assert!(!f.contains("big_batch.py"), "{f}");
    assert!(f.contains("1 exited process cleared"), "{f}");
    assert_eq!(names(&app).len(), live.len() - 1);
    // Nothing more to clear: said so.
    press(&mut app, crossterm::event::KeyCode::Char('X'));
    assert!(frame(&app).contains("no exited process to clear"));
}

/// Issue 46, item 4: an exited process's view opens on its last samples
/// (not on "no samples in this window"), and `←` stops where the window
/// starts at the oldest sample held, saying so, with data and labels on
/// screen all the way.
#[test]
fn the_timeline_stays_where_there_are_samples() {
    let mut app = app_with(&FX, cfg(), 120, 40);
    with_dead(&mut app, &FX, "oom");
    app.overview.selected = FX.key_of("oom");
    app.open();
    refresh(&mut app, &FX);
    let f = frame(&app);
    assert!(!f.contains("no samples in this window"), "{f}");
    assert!(f.contains(" ends "), "not live: {f}");
    let mut ends = Vec::new();
    for _ in 0..40 {
        press(&mut app, crossterm::event::KeyCode::Left);
        refresh(&mut app, &FX);
        let f = frame(&app);
        assert!(!f.contains("no samples in this window"), "{f}");
        ends.push(app.window().1);
    }
    assert!(ends.windows(2).all(|w| w[1] <= w[0]), "{ends:?}");
    assert_eq!(ends[38], ends[39], "the window stops: {ends:?}");
    assert!(frame(&app).contains("the window starts at the oldest sample held"));
}

#[test]
fn the_overview_uses_a_large_screen_for_history() {
    let app = app_with(&FX, cfg(), 200, 60);
    let f = frame(&app);
    assert!(f.contains("History · last 5m"), "{f}");
    assert!(
        f.contains("GPU 0 · NVIDIA H100") && f.contains("GPU 1 · NVIDIA H100"),
        "{f}"
    );
    // Each band has its value axis and data.
    assert_eq!(f.matches("       0B┤").count(), 2, "{f}");
    // Under the bands, the time axis of the window, as the process view's
    // timeline has it (issue 30, item 14).
    let lines: Vec<&str> = f.lines().collect();
    let axis = lines[lines.len() - 3];
    assert!(
        axis.starts_with("\"│          -5m ")
            && axis.contains(" -2m30s ")
            && axis.ends_with("now│\""),
        "{f}"
    );
    // The rows have sparklines: the leak's ends at the top.
    let leak = f.lines().find(|l| l.contains("eval_loop.py")).unwrap();
    assert!(
        leak.contains("LEAK") && leak.trim_end_matches(['│', '"', ' ']).ends_with('█'),
        "{leak}"
    );
    // Not at 120x40's table width: no sparkline column, but the band.
    let mid = frame(&app_with(&FX, cfg(), 120, 40));
    assert!(!mid.contains("LAST 5m") && mid.contains("History"), "{mid}");
    // At 80x24 the table keeps the screen.
    let small = frame(&app_with(&FX, cfg(), 80, 24));
    assert!(!small.contains("History"), "{small}");
}

#[test]
fn overview_eight_processes_scrolls_at_80x24() {
    let mut app = app_with(&FX8, cfg(), 80, 16);
    for _ in 0..8 {
        app.handle(vramscope_ui::AppEvent::Input(crossterm::event::Event::Key(
            crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Down),
        )));
    }
    insta::assert_snapshot!("overview_8_scrolled_80x16", frame(&app));
}

#[test]
fn overview_without_nvml() {
    let app = app_with(&NO_NVML, cfg(), 80, 24);
    snapshot_showing("overview_no_nvml_80x24", &app, "NVML library not found");
}

#[test]
fn text_is_cut_between_words_with_an_ellipsis() {
    // A long NVML error at 80 columns: cut between words, never "(a".
    let mut fx_app = app_with(&NO_NVML, cfg(), 80, 24);
    let mut snap = (*fx_app.snap).clone();
    snap.machine.nvml_error = Some(
        "NVML unavailable: driver/library version mismatch (kernel module 550.54, library 580.95)"
            .into(),
    );
    fx_app.set_snapshot(snap);
    let f = frame(&fx_app);
    let line = f.lines().nth(2).unwrap();
    assert!(
        line.contains("NVML unavailable: driver/library version mismatch (kernel module 550.54,…"),
        "{line}"
    );
    // The block map's device line at 80 columns keeps its warning and cuts
    // at a word.
    let app = process_app(&FX, "fragmentation", 80, 24, Pane::Blocks);
    let f = frame(&app);
    let line = f.lines().find(|l| l.contains("cuda:0")).unwrap();
    assert!(line.contains("(not synced)"), "{line}");
    assert!(!line.contains(" L 96.0 "), "{line}");
}

#[test]
fn overview_filtered_and_empty() {
    let mut app = app_with(&FX, cfg(), 80, 24);
    app.overview.filter = "seq2".into();
    refresh(&mut app, &FX);
    insta::assert_snapshot!("overview_filter_80x24", frame(&app));
    app.overview.filter = "nothing-matches".into();
    refresh(&mut app, &FX);
    insta::assert_snapshot!("overview_filter_none_80x24", frame(&app));
    let mut empty = App::new(cfg());
    empty.size = ratatui::layout::Rect::new(0, 0, 80, 24);
    insta::assert_snapshot!("overview_empty_80x24", frame(&empty));
}

#[test]
fn process_view_compact_tabs() {
    for pane in Pane::ALL {
        let app = process_app(&FX, "leak", 80, 24, pane);
        insta::assert_snapshot!(format!("process_leak_{pane:?}_80x24"), frame(&app));
    }
}

#[test]
fn process_view_wide() {
    for scenario in ["leak", "oom", "fragmentation"] {
        let app = process_app(&FX, scenario, 200, 60, Pane::Timeline);
        insta::assert_snapshot!(format!("process_{scenario}_200x60"), frame(&app));
    }
}

#[test]
fn oom_details_at_80x24() {
    let app = process_app(&FX, "oom", 80, 24, Pane::Diagnosis);
    snapshot_showing("process_oom_diagnosis_80x24", &app, "OUT OF MEMORY");
}

/// Issue 30, item 1: where the pane is about an OOM, the OOM block comes
/// first (its advice and the events before it in view), and Tab focuses
/// the pane, whose text PgDn and j scroll and Home brings back.
#[test]
fn oom_details_come_first_and_scroll_on_a_large_terminal() {
    use crossterm::event::KeyCode::{Char, Home, PageDown, Tab};
    for (w, h) in [(120, 40), (200, 60)] {
        let mut app = process_app(&FX, "oom", w, h, Pane::Timeline);
        let f = frame(&app);
        let pane = f.lines().skip_while(|l| !l.contains("Out of memory"));
        let first: Vec<&str> = pane.take(8).collect();
        let first = first.join("\n");
        assert!(first.contains("OUT OF MEMORY x1"), "{first}");
        assert!(first.contains("expandable_segments"), "{first}");
        assert!(!first.contains("Too early to tell"), "{first}");
        for _ in 0..4 {
            press(&mut app, Tab);
        }
        assert_eq!(app.process.pane, Pane::Diagnosis);
        press(&mut app, PageDown);
        press(&mut app, Char('j'));
        let page = vramscope_ui::layout::pane_rows(app.size, 0, Pane::Diagnosis);
        assert_eq!(app.process.diagnosis_scroll.offset(), page + 1);
        if (w, h) == (120, 40) {
            snapshot_showing("process_oom_scrolled_120x40", &app, "Out of memory · lines");
        }
        press(&mut app, Home);
        assert_eq!(app.process.diagnosis_scroll.offset(), 0);
    }
}

#[test]
fn nvml_only_process() {
    let mut app = app_with(&FX, cfg(), 80, 24);
    app.overview.selected = Some(vramscope_core::model::ProcessKey {
        pid: 4242,
        start_time: 777,
    });
    app.open();
    for pane in [Pane::Timeline, Pane::Blocks] {
        app.process.pane = pane;
        refresh(&mut app, &FX);
        insta::assert_snapshot!(format!("process_nvml_only_{pane:?}_80x24"), frame(&app));
    }
}

#[test]
fn help_overlay() {
    let mut app = app_with(&FX, cfg(), 80, 24);
    app.overlay = Some(Overlay::Help(Scroll::default()));
    insta::assert_snapshot!("help_80x24", frame(&app));
    app.size = ratatui::layout::Rect::new(0, 0, 200, 60);
    insta::assert_snapshot!("help_200x60", frame(&app));
    let mut ro = app_with(
        &FX,
        AppConfig {
            readonly: true,
            ..cfg()
        },
        80,
        24,
    );
    ro.overlay = Some(Overlay::Help(Scroll::default()));
    snapshot_showing("help_readonly_80x24", &ro, "Read-only");
}

#[test]
fn legend_overlay() {
    // Every column's meaning is on it.
    let mut app = app_with(&FX, cfg(), 120, 40);
    app.handle(vramscope_ui::AppEvent::Input(crossterm::event::Event::Key(
        crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char('L')),
    )));
    assert_eq!(app.overlay, Some(Overlay::Legend(Scroll::default())));
    let f = frame(&app);
    for c in vramscope_ui::rows::Col::ALL {
        assert!(f.contains(c.meaning()), "{:?} {f}", c);
    }
    insta::assert_snapshot!("legend_120x40", f);
    // At 80x24 it scrolls: the words at the end come into view.
    let mut small = app_with(&FX, cfg(), 80, 24);
    small.overlay = Some(Overlay::Legend(Scroll::default()));
    assert!(!frame(&small).contains("s#b0c0"));
    insta::assert_snapshot!("legend_80x24", frame(&small));
    press(&mut small, crossterm::event::KeyCode::Char('G'));
    snapshot_showing("legend_80x24_scrolled", &small, "s#b0c0");
}

#[test]
fn a_long_event_history_scrolled_and_searched() {
    use crossterm::event::{Event, KeyCode, KeyEvent};
    use vramscope_ui::AppEvent;
    let key = |c: KeyCode| AppEvent::Input(Event::Key(KeyEvent::from(c)));
    let mut app = process_app(&FX, "leak", 120, 40, Pane::Events);
    let total = app.selected_entry().unwrap().view.figures.events_total;
    assert!(total > 4000, "{total}");
    // Scrolling back asks for the events further back; each page is there.
    for _ in 0..160 {
        for fx in app.handle(key(KeyCode::PageDown)) {
            assert_eq!(fx, vramscope_ui::Effect::Refresh);
        }
        refresh(&mut app, &FX);
    }
    assert!(
        app.process.event_scroll.offset() > 1000,
        "{}",
        app.process.event_scroll.offset()
    );
    snapshot_showing("events_scrolled_120x40", &app, "from #");
    // `/` searches the whole history: only 16 MiB blocks and segments.
    app.handle(key(KeyCode::Char('/')));
    for c in "16.0m".chars() {
        app.handle(key(KeyCode::Char(c)));
    }
    app.handle(key(KeyCode::Enter));
    refresh(&mut app, &FX);
    let f = frame(&app);
    assert!(f.contains("search \"16.0m\""), "{f}");
    let areas = vramscope_ui::layout::process(
        app.size,
        app.process.pane,
        vramscope_ui::layout::screen(app.size, 0).body,
    );
    let ev = areas.events.unwrap();
    let rows: Vec<&str> = f
        .lines()
        .skip(ev.y as usize + 1)
        .take(ev.height as usize - 2)
        .collect();
    assert!(rows.iter().all(|r| r.contains("16.0M")), "{f}");
    assert!(rows.iter().any(|r| r.contains("ALLOC")), "{f}");
    insta::assert_snapshot!("events_searched_120x40", f);
}

#[test]
fn action_boxes() {
    let mut app = app_with(&FX, cfg(), 80, 24);
    app.overview.selected = FX.key_of("empty-cache");
    let e = app.selected_entry().unwrap();
    app.action = Some(ActionState::Confirm {
        key: e.key(),
        pid: e.identity.host_pid,
        name: "finetune.py".into(),
        reserved: Some(e.view.figures.reserved),
        allocated: Some(e.view.figures.allocated),
    });
    insta::assert_snapshot!("confirm_empty_cache_80x24", frame(&app));
}

#[test]
fn demo_caption() {
    let mut app = app_with(&FX, cfg(), 80, 24);
    app.set_demo_status(Some(DemoStatus {
        scenario: "leak".into(),
        caption: "step 7: the list of losses keeps each graph alive".into(),
        progress: 0.45,
        speed: 2.0,
        paused: true,
        runs: 0,
        replay: false,
        ended: false,
    }));
    insta::assert_snapshot!("demo_caption_80x24", frame(&app));
}

/// Issue 30, item 10: at the end of a replay nothing arrives, so every
/// events/s figure is 0 (the model's rate still counted the last events),
/// in this snapshot and the ones after it.
#[test]
fn a_replay_at_its_end_shows_no_events_arriving() {
    let mut app = process_app(&FX, "leak", 80, 24, Pane::Timeline);
    let fastest = |app: &App| {
        (app.snap.processes.iter())
            .filter_map(|p| p.view.figures.events_per_sec)
            .fold(0.0, f64::max)
    };
    assert!(fastest(&app) > 0.0);
    app.set_demo_status(Some(DemoStatus {
        scenario: "leak.vrec".into(),
        caption: "END of the recording: 2m recorded, 9000 inputs (q quits)".into(),
        progress: 1.0,
        speed: 1.0,
        paused: false,
        runs: 0,
        replay: true,
        ended: true,
    }));
    assert_eq!(fastest(&app), 0.0);
    refresh(&mut app, &FX);
    assert_eq!(fastest(&app), 0.0);
    let f = frame(&app);
    assert!(f.contains(" ev/s 0.0"), "{f}");
}

/// Issue 47: the Memory summary names what the simulated job holds
/// outside the caching allocator (its CUDA context and cuBLAS's
/// workspace) and what no one named of "Other" (the fixture's NVML figure
/// has 4 MiB more; absent without NVML); the header says it beside
/// "other" where the figures after it still fit, and the overview's
/// UNEXPL column where the width leaves room for it.
#[test]
fn the_summary_names_memory_outside_the_allocator() {
    let row = |f: &str, name: &str| -> String {
        let l = f
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("{name}: {f}"));
        l.split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let app = process_app(&FX, "leak", 80, 24, Pane::Stats);
    let f = frame(&app);
    assert!(f.contains("│Outside the allocator "), "{f}");
    assert!(row(&f, "   context ").contains("context 500 MiB —"), "{f}");
    assert!(row(&f, "   cuBLAS ").contains("cuBLAS 32.0 MiB —"), "{f}");
    assert!(
        row(&f, "   unexplained ").contains("unexplained 4.00 MiB —"),
        "{f}"
    );
    // At 80 columns the header keeps its figures; wider, it says more.
    assert!(
        f.contains("other 536M peak 5.43G frag 0.3% ev/s 257"),
        "{f}"
    );
    let wide = frame(&process_app(&FX, "leak", 160, 48, Pane::Stats));
    assert!(
        wide.contains(" other 536M (unexpl 4.00M) peak 5.43G"),
        "{wide}"
    );
    // Without NVML: the parts, and no figure of what no one named.
    let f = frame(&process_app(&NO_NVML, "leak", 80, 24, Pane::Stats));
    assert!(row(&f, "   context ").contains("context 500 MiB —"), "{f}");
    assert!(
        row(&f, "   unexplained ").contains("unexplained — —"),
        "{f}"
    );
    assert!(!f.contains("unexpl "), "{f}");
    // The overview's column, where the width leaves room (last to come).
    let f = frame(&app_with(&FX, cfg(), 200, 60));
    assert!(row(&f, "  PID ").contains(" OTHER UNEXPL PEAK "), "{f}");
    assert!(
        row(&f, "eval_loop.py").contains(" 536M 4.00M 5.43G "),
        "{f}"
    );
    let f = frame(&app_with(&FX, cfg(), 120, 40));
    assert!(!f.contains("UNEXPL") && f.contains("OTHER"), "{f}");
}

#[test]
fn monochrome_has_no_colours() {
    let theme = Theme::new(false, false);
    for pane in Pane::ALL {
        let mut app = process_app(&FX, "oom", 120, 40, pane);
        app.config.theme = theme;
        let buf = render_buffer(&app, 120, 40);
        for c in &buf.content {
            assert_eq!(c.fg, Color::Reset, "colour {:?} at {:?}", c.fg, c.symbol());
            assert_eq!(c.bg, Color::Reset);
        }
        // The selection is still visible: reversed.
        let overview = app_with(&FX, AppConfig { theme, ..cfg() }, 80, 24);
        let buf = render_buffer(&overview, 80, 24);
        assert!(buf
            .content
            .iter()
            .any(|c| c.modifier.contains(Modifier::REVERSED)));
    }
}

#[test]
fn ascii_has_only_ascii() {
    let theme = Theme::new(true, true);
    let mut frames = Vec::new();
    for pane in Pane::ALL {
        let mut app = process_app(&FX, "fragmentation", 80, 24, pane);
        app.config.theme = theme;
        frames.push(render_buffer(&app, 80, 24));
    }
    let mut app = process_app(&FX, "leak", 200, 60, Pane::Timeline);
    app.config.theme = theme;
    frames.push(render_buffer(&app, 200, 60));
    let mut o = app_with(&FX, AppConfig { theme, ..cfg() }, 80, 24);
    o.config.theme = theme;
    frames.push(render_buffer(&o, 80, 24));
    o.overlay = Some(Overlay::Help(Scroll::default()));
    frames.push(render_buffer(&o, 80, 24));
    for buf in &frames {
        for c in &buf.content {
            assert!(c.symbol().is_ascii(), "non-ASCII {:?}", c.symbol());
        }
    }
    insta::assert_snapshot!("ascii_overview_80x24", text(&frames[frames.len() - 2]));
    insta::assert_snapshot!("ascii_process_leak_200x60", text(&frames[frames.len() - 3]));
    insta::assert_snapshot!("ascii_blocks_fragmentation_80x24", text(&frames[1]));
}

#[test]
fn absent_is_a_dash_never_zero() {
    // The NVML-only process has no allocator figures: dashes, not zeros.
    let app = app_with(&FX, cfg(), 200, 60);
    let f = frame(&app);
    let line = f.lines().find(|l| l.contains("tritonserver")).unwrap();
    assert!(line.matches('—').count() >= 6, "{line}");
    assert!(!line.contains(" 0B"), "{line}");
}

/// Issue 10, item 2: the timeline marks where watching began, and says
/// that it began mid-run (and whether the state is anchored yet).
#[test]
fn the_timeline_marks_where_watching_began_mid_run() {
    let mut fx = Fixture::new(1);
    let key = fx.key_of("leak").unwrap();
    let began = fx.now_ns - 20_000_000_000;
    fx.model.watch(
        key,
        &vramscope_core::model::Watch {
            began_ns: Some(began),
            mid_run: true,
            ring_starts: vec![0, 4096],
            anchor_snapshot: None,
        },
    );
    let app = process_app(&fx, "leak", 120, 40, Pane::Timeline);
    let f = frame(&app);
    assert!(
        f.contains("attached mid-run: waiting for a snapshot"),
        "{f}"
    );
    assert!(f.contains('┆'), "{f}");
    // Not marked when the process was watched from its start before the window.
    let mut fx = Fixture::new(1);
    let key = fx.key_of("leak").unwrap();
    fx.model.watch(
        key,
        &vramscope_core::model::Watch {
            began_ns: Some(1),
            ..Default::default()
        },
    );
    let f = frame(&process_app(&fx, "leak", 120, 40, Pane::Timeline));
    assert!(!f.contains("mid-run") && !f.contains('┆'), "{f}");
}

#[test]
fn by_module_overlay() {
    use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
    use vramscope_ui::app::AppEvent;
    let press = |app: &mut App, code| {
        app.handle(AppEvent::Input(Event::Key(KeyEvent::new(
            code,
            KeyModifiers::NONE,
        ))));
    };
    // The leak scenario names its layers: M opens the table, o sorts by
    // module name, Esc closes.
    let mut app = process_app(&FX, "leak", 100, 30, Pane::Timeline);
    press(&mut app, KeyCode::Char('M'));
    snapshot_showing("by_module_100x30", &app, "model.layers.11");
    let f = frame(&app);
    assert!(f.contains("forward") && f.contains("optimizer"), "{f}");
    press(&mut app, KeyCode::Char('o'));
    let f = frame(&app);
    let first = f.find("model.head").unwrap();
    assert!(first < f.find("model.layers.0").unwrap(), "{f}");
    press(&mut app, KeyCode::Esc);
    assert!(!frame(&app).contains("By module"));
}

/// Issue 26: `r` in the By module table shows one role's bytes per
/// module, then the next role, then all again; at 80x24 and 120x40.
#[test]
fn by_module_role_filter() {
    use crossterm::event::KeyCode::Char;
    for (w, h) in [(80, 24), (120, 40)] {
        let mut app = process_app(&FX, "leak", w, h, Pane::Timeline);
        press(&mut app, Char('M'));
        let f = frame(&app);
        assert!(f.contains("r role: all") && f.contains("ROLE"), "{f}");
        assert!(f.contains("optim state"), "{f}");
        // The first role: parameters, each layer's weight and bias.
        press(&mut app, Char('r'));
        snapshot_showing(
            &format!("by_module_parameters_{w}x{h}"),
            &app,
            "role: parameter",
        );
        let f = frame(&app);
        assert!(f.contains("model.layers.0"), "{f}");
        assert!(f.contains("48.0 MiB") || f.contains("48.1 MiB"), "{f}");
        // In the table (the OOM & leak pane under it names "(no module)").
        let table = pane_text(&f, "By module").join("\n");
        assert!(
            !table.contains("(no module)"),
            "no parameter is outside every module: {f}"
        );
        // Buffers (none in this job), then gradients.
        press(&mut app, Char('r'));
        assert!(frame(&app).contains("role: buffer"));
        press(&mut app, Char('r'));
        assert!(frame(&app).contains("role: gradient"));
        // Through every role and back to all.
        for _ in 0..5 {
            press(&mut app, Char('r'));
        }
        let f = frame(&app);
        assert!(f.contains("r role: all"), "{f}");
    }
}

/// Every overlay fits a tiny terminal (cut, never out of bounds): the
/// legend, help, and the By module table.
#[test]
fn overlays_fit_a_tiny_terminal() {
    use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
    use vramscope_ui::app::AppEvent;
    for key in ['M', 'L', '?'] {
        let mut app = process_app(&FX, "leak", 24, 6, Pane::Timeline);
        app.handle(AppEvent::Input(Event::Key(KeyEvent::new(
            KeyCode::Char(key),
            KeyModifiers::NONE,
        ))));
        let f = frame(&app);
        assert_eq!(f.lines().count(), 6, "{key}: {f}");
    }
}

fn press(app: &mut App, code: crossterm::event::KeyCode) {
    use crossterm::event::{Event, KeyEvent, KeyModifiers};
    app.handle(vramscope_ui::app::AppEvent::Input(Event::Key(
        KeyEvent::new(code, KeyModifiers::NONE),
    )));
}

/// `c` colours the block map by module, then by phase, then by state
/// again; the legend says what each letter means; `v` shows one module
/// or phase only.
#[test]
fn block_map_by_module_and_phase() {
    use crossterm::event::KeyCode::Char;
    let mut app = process_app(&FX, "leak", 100, 30, Pane::Blocks);
    press(&mut app, Char('c'));
    snapshot_showing("blockmap_by_module_100x30", &app, "by module");
    let f = frame(&app);
    // The legend names the largest module's letter, and the map uses it.
    let top = &app.selected_entry().unwrap().view.attribution.by_module[0];
    assert!(f.contains(&format!("a {}", top.module)), "{f}");
    let map_lines: Vec<&str> = f.lines().filter(|l| l.contains(" s0 ")).collect();
    assert!(map_lines.iter().any(|l| l.contains("aaa")), "{f}");
    press(&mut app, Char('c'));
    let f = frame(&app);
    assert!(f.contains("by phase") && f.contains("f forward"), "{f}");
    assert!(f.contains("o optimizer"), "{f}");
    // v: only the first phase of the legend; the others are dimmed.
    press(&mut app, Char('v'));
    let f = frame(&app);
    assert!(f.contains("only forward"), "{f}");
    let buf = render_buffer(&app, 100, 30);
    let dimmed = buf
        .content
        .iter()
        .filter(|c| c.symbol() == "█" && c.fg == Color::DarkGray)
        .count();
    let forward = buf
        .content
        .iter()
        .filter(|c| c.symbol() == "f" && c.bg != Color::Reset)
        .count();
    assert!(dimmed > 0 && forward > 0, "{f}");
    // x: every block again; c back to states.
    press(&mut app, Char('x'));
    assert!(app.process.only.is_none());
    assert!(!frame(&app).contains("· only forward"));
    // c: by role (issue 26): the layers' weights are parameters (the
    // simulated job sends role lists), Adam's state optimizer state.
    press(&mut app, Char('c'));
    let f = frame(&app);
    assert!(f.contains("by role") && f.contains("P parameter"), "{f}");
    assert!(f.contains("O optim state") && f.contains("PPPP"), "{f}");
    // v: only parameters; a selected block names its role.
    press(&mut app, Char('v'));
    let f = frame(&app);
    assert!(f.contains("only parameter"), "{f}");
    press(&mut app, Char('n'));
    let f = frame(&app);
    assert!(f.contains("role parameter"), "{f}");
    press(&mut app, Char('x'));
    press(&mut app, Char('c'));
    let f = frame(&app);
    assert!(f.contains("allocated") && f.contains("pending-free"), "{f}");
}

/// Issue 34, item A: a module keeps its letter when the live bytes rank
/// the modules anew (letter `a` meant another module whenever the ranking
/// changed): in the map's legend and in the By module table, whose rows
/// are still by bytes.
#[test]
fn a_module_keeps_its_letter_when_the_ranking_turns_over() {
    use crossterm::event::KeyCode::Char;
    let mut app = process_app(&FX, "leak", 100, 30, Pane::Blocks);
    press(&mut app, Char('c'));
    let before = app.selected_entry().unwrap().view.attribution.clone();
    assert!(before.by_module.len() >= 2, "{before:?}");
    let label = |m: &str| match m {
        "" => "(no module)".to_string(),
        m => m.to_string(),
    };
    let (first, second) = (
        label(&before.by_module[0].module),
        label(&before.by_module[1].module),
    );
    let f = frame(&app);
    assert!(
        f.contains(&format!("a {first} ")) && f.contains(&format!("b {second} ")),
        "{f}"
    );
    // The next snapshot: the second module now holds the most.
    let key = app.overview.selected.unwrap();
    let mut snap = (*app.snap).clone();
    for p in &mut snap.processes {
        if p.key() == key {
            let m = &mut p.view.attribution.by_module;
            m[1].bytes = m[0].bytes + 1;
            m.swap(0, 1);
        }
    }
    app.set_snapshot(snap);
    let top = &app.selected_entry().unwrap().view.attribution.by_module[0];
    assert_eq!(label(&top.module), second);
    let f = frame(&app);
    assert!(
        f.contains(&format!("a {first} ")) && f.contains(&format!("b {second} ")),
        "{f}"
    );
    press(&mut app, Char('M'));
    snapshot_showing(
        "by_module_after_the_ranking_turned_100x30",
        &app,
        &format!("b {second}"),
    );
}

/// At 80x24 in monochrome ASCII the map by module is letters, and the
/// legend says which module each letter is.
#[test]
fn block_map_by_module_80x24_monochrome_ascii() {
    use crossterm::event::KeyCode::Char;
    let cfg = AppConfig {
        theme: Theme::new(false, true),
        ..cfg()
    };
    let mut app = app_with(&FX, cfg, 80, 24);
    app.overview.selected = FX.key_of("leak");
    app.open();
    app.process.pane = Pane::Blocks;
    refresh(&mut app, &FX);
    press(&mut app, Char('c'));
    snapshot_showing("blockmap_by_module_80x24_ascii", &app, "by module");
    let f = frame(&app);
    assert!(f.is_ascii(), "{f}");
    assert!(
        f.contains("a model.layers.0") && f.contains("~ M: all"),
        "{f}"
    );
}

/// Enter in the By module table shows only that module's blocks; `n`
/// selects a block and the pane's foot says its module, phase, step born
/// and age.
#[test]
fn by_module_enter_filters_and_a_selected_block_says_where_it_came_from() {
    use crossterm::event::KeyCode::{Char, Down, Enter};
    for (w, h) in [(100, 30), (80, 24)] {
        let mut app = process_app(&FX, "leak", w, h, Pane::Timeline);
        press(&mut app, Char('M'));
        press(&mut app, Down);
        let second = {
            let e = app.selected_entry().unwrap();
            e.view.attribution.by_module[1].module.clone()
        };
        press(&mut app, Enter);
        assert!(!matches!(app.overlay, Some(Overlay::Modules(_))));
        assert_eq!(app.process.pane, Pane::Blocks);
        let f = frame(&app);
        assert!(f.contains(&format!("only {second}")), "{f}");
        press(&mut app, Char('n'));
        let addr = app.process.selected_block.expect("a block selected");
        let e = app.selected_entry().unwrap();
        let b = vramscope_ui::blockmap::find_block(e, addr).unwrap().1;
        assert_eq!(e.view.attribution.module_of(b.block.origin.context), second);
        let f = frame(&app);
        assert!(f.contains(&format!("selected {addr:#x}")), "{f}");
        assert!(f.contains(&format!("module {second}")), "{f}");
        assert!(f.contains("born step") && f.contains("age "), "{f}");
        insta::assert_snapshot!(format!("blockmap_selected_{w}x{h}"), f);
        // N goes back (wrapping), x clears.
        press(&mut app, Char('N'));
        assert!(app.process.selected_block.is_some());
        press(&mut app, Char('x'));
        assert!(app.process.selected_block.is_none() && app.process.only.is_none());
    }
}

/// A flagged leak names the modules whose allocations outlive their steps
/// (the leak scenario's layers rolled up, the batch, the head), before the
/// sizes.
#[test]
fn leak_diagnosis_names_the_growing_modules() {
    for (w, h) in [(100, 30), (80, 24)] {
        let app = process_app(&FX, "leak", w, h, Pane::Diagnosis);
        let f = frame(&app);
        let by_module = f.find("Growing, by module").expect(&f);
        let layers = f.find("model.layers.* (12 modules): +").expect(&f);
        assert!(by_module < layers, "{f}");
        insta::assert_snapshot!(format!("diagnosis_leak_{w}x{h}"), f);
    }
}

/// `d`: what the step before the current one allocated and is still
/// alive, by module, phase and size; `+` goes one step further back.
#[test]
fn step_diff_overlay() {
    use crossterm::event::KeyCode::{Char, Esc};
    for (w, h) in [(100, 30), (80, 24)] {
        let mut app = process_app(&FX, "leak", w, h, Pane::Timeline);
        let view = &app.selected_entry().unwrap().view;
        let now = view.attribution.step.unwrap();
        let diff = vramscope_core::model::stepdiff::step_diff(view, now - 1);
        // The leak keeps every layer's validation activation of a step.
        assert!(diff.rows.iter().any(|r| r.module == "model.layers.11"
            && r.size == 16 << 20
            && r.phase.name() == "forward"));
        press(&mut app, Char('d'));
        let f = frame(&app);
        assert!(
            f.contains(&format!(
                "born in step {}, alive in step {now} (n=1)",
                now - 1
            )),
            "{f}"
        );
        assert!(
            f.contains(&vramscope_text::format::bytes(diff.bytes)),
            "{f}"
        );
        insta::assert_snapshot!(format!("step_diff_{w}x{h}"), f);
        press(&mut app, Char('+'));
        let f = frame(&app);
        assert!(f.contains(&format!("born in step {}", now - 2)), "{f}");
        press(&mut app, Esc);
        assert!(!matches!(app.overlay, Some(Overlay::Modules(_))));
    }
}

/// A click on the block map selects the block drawn under it; a click on
/// the device line selects nothing.
#[test]
fn a_click_on_the_block_map_selects_that_block() {
    use crossterm::event::{Event, KeyModifiers, MouseButton, MouseEvent, MouseEventKind};
    let click = |app: &mut App, column, row| {
        app.handle(vramscope_ui::app::AppEvent::Input(Event::Mouse(
            MouseEvent {
                kind: MouseEventKind::Down(MouseButton::Left),
                column,
                row,
                modifiers: KeyModifiers::NONE,
            },
        )));
    };
    let mut app = process_app(&FX, "leak", 80, 24, Pane::Blocks);
    let f = frame(&app);
    // The map's first lines: the device, then the first segment.
    let device_y = f.lines().position(|l| l.contains("│cuda:0")).unwrap() as u16;
    click(&mut app, 20, device_y);
    assert_eq!(app.process.selected_block, None);
    click(&mut app, 20, device_y + 1);
    let addr = app.process.selected_block.expect("a block selected");
    let e = app.selected_entry().unwrap();
    let (row, b) = vramscope_ui::blockmap::find_block(e, addr).unwrap();
    assert_eq!(row, 1, "the first segment's row");
    let f = frame(&app);
    assert!(f.contains(&format!("selected {addr:#x}")), "{f}");
    assert_eq!(b.addr, addr);
}

/// Issue 30, item 12: at 40×10 the help overlay scrolls (j/k) to its last
/// line, and says that it does.
#[test]
fn help_scrolls_on_a_small_terminal() {
    let mut app = app_with(&FX, cfg(), 40, 10);
    let key = |c: char| {
        vramscope_ui::AppEvent::Input(crossterm::event::Event::Key(
            crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char(c)),
        ))
    };
    app.handle(key('?'));
    assert_eq!(app.overlay, Some(Overlay::Help(Scroll::default())));
    let first = frame(&app);
    assert!(first.contains("j/k scroll"), "{first}");
    assert!(!first.contains("wheel"), "{first}");
    for _ in 0..200 {
        app.handle(key('j'));
    }
    let last = frame(&app);
    // The mouse section is the page's last.
    assert!(last.contains("wheel"), "{last}");
    insta::assert_snapshot!("help_40x10_scrolled", last);
    app.handle(key('?'));
    assert_eq!(app.overlay, None);
}

/// Issue 46, item 3: the legend at 80x24 after `j` fifty times, and
/// opened afresh then `G`: the same last page, the last line at the
/// bottom; one `k` then shows the line before it at once.
#[test]
fn item3_the_legend_80x24_at_its_end() {
    use crossterm::event::KeyCode::Char;
    let mut app = app_with(&FX, cfg(), 80, 24);
    press(&mut app, Char('L'));
    for _ in 0..50 {
        press(&mut app, Char('j'));
    }
    let after_j = frame(&app);
    snapshot_showing("legend_80x24_after_j50", &app, "G M K B");
    let mut fresh = app_with(&FX, cfg(), 80, 24);
    press(&mut fresh, Char('L'));
    press(&mut fresh, Char('G'));
    snapshot_showing("legend_80x24_after_G", &fresh, "G M K B");
    assert_eq!(frame(&fresh), after_j);
    press(&mut app, Char('k'));
    let up = frame(&app);
    assert_ne!(up, after_j, "k moves at once");
    assert!(!up.contains("G M K B"), "{up}");
}

/// Issue 46, item 17: at a width that leaves the sort column out, the
/// title says the sort is on a hidden column; where it is shown, it does
/// not.
#[test]
fn a_sort_on_a_hidden_column_says_so() {
    let mut app = app_with(&FX, cfg(), 50, 20);
    app.overview.sort = vramscope_ui::rows::Col::Frag;
    refresh(&mut app, &FX);
    let narrow = frame(&app);
    assert!(
        narrow.contains("sort FRAG") && narrow.contains("(hidden)"),
        "{narrow}"
    );
    app.size = ratatui::layout::Rect::new(0, 0, 200, 40);
    refresh(&mut app, &FX);
    let wide = frame(&app);
    assert!(
        wide.contains("sort FRAG") && !wide.contains("(hidden)"),
        "{wide}"
    );
}

/// The inside of the help overlay's box in frame `f`: its lines, between
/// its borders.
fn help_box(f: &str) -> Vec<String> {
    let lines: Vec<Vec<char>> = f.lines().map(|l| l.chars().collect()).collect();
    let top = (lines.iter())
        .position(|l| l.iter().collect::<String>().contains("┌ Keys"))
        .expect(f);
    let at = lines[top]
        .iter()
        .collect::<String>()
        .find("┌ Keys")
        .unwrap();
    let x = lines[top].iter().collect::<String>()[..at].chars().count();
    let right = (x + 1..lines[top].len())
        .find(|&i| lines[top][i] == '┐')
        .expect(f);
    (lines[top + 1..].iter())
        .take_while(|l| l[x] == '│')
        .map(|l| l[x + 1..right].iter().collect())
        .collect()
}

/// Issue 46, item 13: the help overlay's columns are as wide as their
/// lines, as many side by side as the width holds (it was 80 columns at
/// any width, its right column cut: "bytes by module, phase & r"): at
/// 80x24, 120x40 and 200x60, read-only too, every key's line shows whole
/// and the page fits without scrolling; no section title ends a column
/// with fewer than two of its lines (at 80x24 "Process view" ended the
/// left one with one).
#[test]
fn item13_the_help_overlay_shows_every_line_whole() {
    let sections = vramscope_ui::keys::manual();
    let titles: Vec<&str> = sections.iter().take(3).map(|(t, _)| *t).collect();
    assert_eq!(titles, ["Global", "Overview", "Process view"]);
    for (w, h) in [(80, 24), (120, 40), (200, 60)] {
        for readonly in [false, true] {
            let mut app = app_with(&FX, AppConfig { readonly, ..cfg() }, w, h);
            app.overlay = Some(Overlay::Help(Scroll::default()));
            let f = frame(&app);
            assert!(!f.contains("j/k scroll"), "{w}x{h}: it fits: {f}");
            let rows = help_box(&f);
            let text = rows.join("\n");
            for (_, keys) in sections.iter().take(3) {
                for (_, what) in keys {
                    assert!(text.contains(what), "{w}x{h}: {what:?} cut: {f}");
                }
            }
            // The keys' lines: all but the note under them.
            let keys_h = rows.len() - 1;
            for (i, r) in rows[..keys_h].iter().enumerate() {
                for t in titles.iter().chain(&["Mouse"]) {
                    let title_at = |s: &str| s.starts_with(t) || s.contains(&format!("  {t}"));
                    assert!(
                        !title_at(r) || i + 2 < keys_h,
                        "{w}x{h}: {t} with fewer than two lines under it: {f}"
                    );
                }
            }
        }
    }
    // At 200 columns the box is wider than 80: three columns.
    let mut app = app_with(&FX, cfg(), 200, 60);
    app.overlay = Some(Overlay::Help(Scroll::default()));
    let rows = help_box(&frame(&app));
    assert!(rows[0].chars().count() > 78, "{rows:#?}");
    assert!(rows.len() < 20, "{rows:#?}");
}

/// Issue 46, item 14: the step diff at 80x24 on step 1 (Adam's state:
/// 38 rows): PHASE and ROLE apart ("optimizeroptim state"); ASKED and
/// HELD both cover all of a row's blocks (ASKED was one block's size,
/// HELD their total), and a line says what each is; a list longer than
/// the overlay says which rows show, as other scrolled panes do.
#[test]
fn item14_the_step_diff_columns_apart_and_which_rows_show() {
    use crossterm::event::KeyCode::{Char, PageDown};
    let mut app = process_app(&FX, "leak", 80, 24, Pane::Timeline);
    press(&mut app, Char('d'));
    let now = app.selected_entry().unwrap().view.attribution.step.unwrap();
    for _ in 1..now - 1 {
        press(&mut app, Char('+'));
    }
    let f = frame(&app);
    assert!(f.contains("born in step 1,"), "{f}");
    assert!(!f.contains("optimizeroptim"), "{f}");
    let row = f.lines().find(|l| l.contains("optim state")).expect(&f);
    assert!(row.contains("optimizer optim state"), "{row}");
    assert!(
        f.contains("ASKED: blocks × the bytes each asked for"),
        "{f}"
    );
    // A layer's two Adam states: 2 blocks of 48 MiB asked, 96 MiB held
    // (one block's size beside their total before).
    assert!(row.contains("2 × 48.0 MiB  96.0 MiB"), "{row}");
    snapshot_showing("step_diff_step1_80x24", &app, "rows 1-17/38 (PgUp/PgDn)");
    press(&mut app, PageDown);
    assert!(frame(&app).contains("rows 18-34/38"), "{}", frame(&app));
}

/// Issue 46, item 15: By module at 80x24 covers the body to its bottom
/// (its bottom border sat on the pane's: two bottom borders), the footer
/// names the table's keys (it named the process view's) and the bottom
/// border its state whole (cut: "· E┘"); a role no module holds says so
/// (an empty table).
#[test]
fn item15_by_module_at_80x24_its_keys_and_an_empty_role() {
    use crossterm::event::KeyCode::Char;
    let mut app = process_app(&FX, "leak", 80, 24, Pane::Timeline);
    press(&mut app, Char('M'));
    let f = frame(&app);
    let lines: Vec<&str> = f.lines().collect();
    for pair in lines.windows(2) {
        assert!(
            !(pair[0].starts_with("\"└") && pair[1].starts_with("\"└")),
            "two bottom borders: {f}"
        );
    }
    let foot = lines[lines.len() - 1];
    for keys in [
        "↑↓ move",
        "Enter map only this",
        "o/O sort",
        "r role",
        "Esc close",
    ] {
        assert!(foot.contains(keys), "{keys}: {foot}");
    }
    assert!(
        !foot.contains("Tab pane") && !foot.contains("? help"),
        "{foot}"
    );
    let bottom = lines[lines.len() - 2];
    assert!(bottom.contains(" r role: all ─"), "{bottom}");
    insta::assert_snapshot!("by_module_80x24", f);
    // Parameters, then buffers: none in this job.
    press(&mut app, Char('r'));
    press(&mut app, Char('r'));
    let f = frame(&app);
    assert!(f.contains("r role: buffer"), "{f}");
    assert!(f.contains("No module holds buffer now"), "{f}");
    // The step diff's footer names its keys too.
    press(&mut app, Char('q'));
    press(&mut app, Char('d'));
    let f = frame(&app);
    let foot = f.lines().last().unwrap();
    assert!(
        foot.contains("+ older step") && foot.contains("Esc close") && !foot.contains("Tab pane"),
        "{foot}"
    );
}

/// The text of `app`'s frame inside the pane whose title has `title`: its
/// lines between the borders, from the title's column.
fn pane_text(f: &str, title: &str) -> Vec<String> {
    let lines: Vec<Vec<char>> = f.lines().map(|l| l.chars().collect()).collect();
    let top = (lines.iter())
        .position(|l| l.iter().collect::<String>().contains(title))
        .expect(f);
    let head: String = lines[top].iter().collect();
    let x = head[..head.find(title).unwrap()].chars().count() - 2;
    let right = (x + 1..lines[top].len())
        .find(|&i| lines[top][i] == '┐')
        .unwrap();
    (lines[top + 1..].iter())
        .take_while(|l| l[x] == '│')
        .map(|l| l[x + 1..right].iter().collect())
        .collect()
}

/// Issue 46, item 16: what was cut at 120x40. The block map's device line
/// ("largest free S 1.44M L…"); a demo caption longer than the width
/// (it goes on to a second line; at 80x24 it is cut between words, with
/// an ellipsis); the OOM pane's advice and the events before the OOM
/// (one or the other was out of view); the leak table's header ("since"
/// went on to a line of its own, in `open` too).
#[test]
fn item16_nothing_cut_at_120x40() {
    use crossterm::event::KeyCode::{Char, Tab};
    let app = process_app(&FX, "leak", 120, 40, Pane::Blocks);
    let f = frame(&app);
    let device = f.lines().find(|l| l.contains("│cuda:0 ·")).expect(&f);
    assert!(device.contains("largest free S 1.43M L 64.0M "), "{device}");
    assert!(!device.contains('…'), "{device}");

    let caption = "OOM: ~4.7 GiB reserved but unallocated, none of it in a free block \
                   over 100 MiB; expandable_segments:True avoids this";
    let status = DemoStatus {
        scenario: "oom".into(),
        caption: caption.into(),
        progress: 1.0,
        speed: 1.0,
        paused: false,
        runs: 1,
        replay: false,
        ended: false,
    };
    let mut app = process_app(&FX, "oom", 120, 40, Pane::Timeline);
    app.set_demo_status(Some(status.clone()));
    let f = frame(&app);
    let lines: Vec<&str> = f.lines().collect();
    let band = format!("{} {}", lines[1], lines[2]);
    let words: Vec<&str> = band.split([' ', '"']).filter(|w| !w.is_empty()).collect();
    let said = words.join(" ");
    assert!(said.contains(caption), "{f}");
    snapshot_showing("demo_caption_two_lines_120x40", &app, "avoids this");
    let mut small = app_with(&FX, cfg(), 80, 24);
    small.set_demo_status(Some(status));
    let f = frame(&small);
    let line = f.lines().nth(1).unwrap();
    assert!(line.contains("but unallocated,… "), "{line}");
    assert!(f.lines().nth(2).unwrap().contains("GPUs"), "one line: {f}");

    // The OOM pane: the advice and the first events before the OOM.
    let app = process_app(&FX, "oom", 120, 40, Pane::Timeline);
    let pane = pane_text(&frame(&app), "Out of memory").join("\n");
    assert!(pane.contains("expandable_segments:True."), "{pane}");
    assert!(pane.contains("events before it"), "{pane}");
    assert!(pane.contains("STEP      marker 3"), "{pane}");

    // The leak table at the pane's end: its header and rows on one line.
    let mut app = process_app(&FX, "leak", 120, 40, Pane::Timeline);
    for _ in 0..4 {
        press(&mut app, Tab);
    }
    press(&mut app, Char('G'));
    let pane = pane_text(&frame(&app), "Leak suspected");
    let header = pane
        .iter()
        .find(|l| l.contains("grow/st"))
        .expect("the header");
    assert!(header.trim_end().ends_with("since"), "{pane:#?}");
    let row = pane.iter().find(|l| l.contains("16.0M")).expect("a row");
    assert!(row.trim_end().ends_with("#0"), "{pane:#?}");
}
