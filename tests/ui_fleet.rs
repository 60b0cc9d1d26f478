//! The fleet view's state machine driven by injected events, no terminal
//! and no Prometheus: its keys are the key table's (the dashboard's for the
//! same actions), and it has the dashboard's help overlay, legend and
//! footer. Frames drawn into a TestBackend.

use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use vramscope_collect::fleet::fixtures::fleet;
use vramscope_collect::fleet::view::{FleetView, ProcSeries, Screen, SortKey};
use vramscope_ui::fleet::{Ask, FleetApp, FleetEvent};
use vramscope_ui::shell::{Pace, Shot, Wake};
use vramscope_ui::{Overlay, Scroll, Theme};

/// A fleet view of [`fleet`], `w`×`h`.
fn app(w: u16, h: u16) -> FleetApp {
    let mut a = FleetApp::new(FleetView::new("http://p".into()), Theme::new(true, false));
    a.handle(FleetEvent::Shell(Wake::Input(Event::Resize(w, h))));
    assert!(a.handle(FleetEvent::Fleet(Ok(fleet()))).is_empty());
    a
}

fn key(c: KeyCode) -> FleetEvent {
    FleetEvent::Shell(Wake::Input(Event::Key(KeyEvent::new(
        c,
        KeyModifiers::NONE,
    ))))
}

fn ch(c: char) -> FleetEvent {
    key(KeyCode::Char(c))
}

fn names(a: &FleetApp) -> Vec<&str> {
    a.view.nodes().iter().map(|n| n.name()).collect()
}

/// The frame as text, one line per row.
fn frame(a: &FleetApp) -> String {
    let mut t = Terminal::new(TestBackend::new(a.size.width, a.size.height)).unwrap();
    t.draw(|f| vramscope_ui::fleet::render(f, a)).unwrap();
    t.backend().to_string()
}

/// The footer: the frame's last line (written in quotes).
fn footer(a: &FleetApp) -> String {
    let f = frame(a);
    f.lines().last().unwrap().trim_matches('"').to_string()
}

/// The walk of the view's own test (sort, open a node, series, filter,
/// jobs), now through the key table: `o` sorts, as in the dashboard (it
/// was `s`).
#[test]
fn sort_filter_and_drill_in() {
    let mut v = app(100, 30);
    assert_eq!(names(&v), ["alpha", "beta", "c:1"]);
    v.handle(ch('o'));
    assert_eq!(v.view.sort, SortKey::Reserved);
    assert_eq!(names(&v), ["beta", "alpha", "c:1"]);
    // Open beta: its biggest process is selected and its series asked for.
    let a = v.handle(key(KeyCode::Enter));
    assert_eq!(
        a,
        [Ask::Series {
            instance: "b:1".into(),
            pid: "20".into()
        }]
    );
    assert_eq!(v.view.node().unwrap().host, "beta");
    assert_eq!(
        v.handle(key(KeyCode::Down)),
        [Ask::Series {
            instance: "b:1".into(),
            pid: "21".into()
        }]
    );
    // An answer for a process no longer selected is dropped.
    let series = |pid: &str| FleetEvent::Series {
        instance: "b:1".into(),
        pid: pid.into(),
        result: Ok(ProcSeries::default()),
    };
    v.handle(series("20"));
    assert!(v.view.series.is_none());
    v.handle(series("21"));
    assert!(v.view.series.is_some());
    v.handle(key(KeyCode::Esc));
    assert_eq!(v.view.screen, Screen::Nodes);
    // Filter by a process name.
    v.handle(ch('/'));
    for c in "train10".chars() {
        v.handle(ch(c));
    }
    v.handle(key(KeyCode::Enter));
    assert_eq!(names(&v), ["alpha"]);
    // Jobs, fleet-wide, then into a job's node.
    v.handle(key(KeyCode::Esc));
    assert!(v.view.filter.is_empty(), "Esc clears the filter");
    v.handle(key(KeyCode::Tab));
    assert_eq!(v.view.jobs().len(), 3);
    assert_eq!(v.view.jobs()[0].pid, "20");
    v.handle(key(KeyCode::Down));
    v.handle(key(KeyCode::Enter));
    assert_eq!(v.view.selected_proc().unwrap().pid, "10");
    v.handle(key(KeyCode::Esc));
    assert_eq!(v.view.screen, Screen::Jobs);
    assert!(!v.quit);
    v.handle(ch('q'));
    assert!(v.quit);
}

/// `o` sorts by the next column and `O` reverses, as in the dashboard's
/// overview; the title says so. `s` and `S`, the old keys, do not.
#[test]
fn o_sorts_and_capital_o_reverses() {
    let mut a = app(100, 20);
    assert!(frame(&a).contains("sort NAME ▲"));
    a.handle(ch('s'));
    a.handle(ch('S'));
    assert_eq!((a.view.sort, a.view.descending), (SortKey::Name, false));
    a.handle(ch('o'));
    assert_eq!(a.view.sort, SortKey::Reserved);
    assert_eq!(names(&a), ["beta", "alpha", "c:1"]);
    let f = frame(&a);
    assert!(f.contains("sort RESV ▼"), "{f}");
    a.handle(ch('O'));
    assert!(a.view.descending);
    assert_eq!(names(&a), ["c:1", "alpha", "beta"]);
    assert!(frame(&a).contains("sort RESV ▲"));
    // Every column in turn, then NAME again.
    for _ in 0..5 {
        a.handle(ch('o'));
    }
    assert_eq!(a.view.sort, SortKey::Name);
    // On a node, `o` sorts its processes.
    let mut a = app(100, 30);
    a.handle(ch('o'));
    a.handle(key(KeyCode::Enter));
    let pids = |a: &FleetApp| -> Vec<String> {
        a.view.node_procs().iter().map(|p| p.pid.clone()).collect()
    };
    assert_eq!(pids(&a), ["20", "21"]);
    a.handle(ch('O'));
    assert_eq!(pids(&a), ["21", "20"]);
}

/// `?` shows the dashboard's help overlay with the fleet's sections (from
/// the key table); while it is up it takes the keys; Esc closes it.
#[test]
fn question_mark_shows_the_help_overlay() {
    let mut a = app(100, 30);
    a.handle(ch('?'));
    assert_eq!(a.overlay, Some(Overlay::Help(Scroll::default())));
    let f = frame(&a);
    for text in [
        " Keys ",
        "Fleet",
        "Nodes and jobs",
        "One node",
        "o  O",
        "sort column / reverse",
        "ask Prometheus now",
        "open the node (of the job)",
        "back to the list",
        "Absent figures show as a dash",
    ] {
        assert!(f.contains(text), "{text:?} not in\n{f}");
    }
    // Keys go to the overlay, not the list.
    a.handle(ch('o'));
    a.handle(key(KeyCode::Enter));
    assert_eq!(a.view.sort, SortKey::Name);
    assert_eq!(a.view.screen, Screen::Nodes);
    a.handle(key(KeyCode::Esc));
    assert_eq!(a.overlay, None);
    assert!(!frame(&a).contains(" Keys "));
    insta::assert_snapshot!("fleet_help_100x30", {
        a.handle(ch('?'));
        frame(&a)
    });
}

/// `L` shows the legend of the fleet's columns; j/k scroll it, Esc closes.
#[test]
fn l_shows_the_legend() {
    let mut a = app(100, 20);
    a.handle(ch('L'));
    assert_eq!(a.overlay, Some(Overlay::Legend(Scroll::default())));
    let f = frame(&a);
    assert!(
        f.contains(" Legend ") && f.contains("Columns (nodes)"),
        "{f}"
    );
    assert!(f.contains("Prometheus's last scrape of it failed"), "{f}");
    a.handle(ch('j'));
    assert!(matches!(a.overlay, Some(Overlay::Legend(s)) if s.offset() == 1));
    a.handle(key(KeyCode::Esc));
    assert_eq!(a.overlay, None);
}

/// The footer: the key table's hints for the screen, `L legend`, `? help`
/// and `q quit` at the right end; the node screen's `Esc back`; the filter
/// being typed; a message.
#[test]
fn the_footer_shows_the_screens_keys() {
    let mut a = app(120, 20);
    let f = footer(&a);
    for hint in [
        "↑↓ select",
        "Enter open",
        "Tab nodes/jobs",
        "/ filter",
        "o/O sort",
        "r refresh",
        "L legend",
        "? help",
        "q quit",
    ] {
        assert!(f.contains(hint), "{hint:?} not in {f:?}");
    }
    assert!(f.trim_end().ends_with("q quit"), "{f:?}");
    assert!(!f.contains("s sort"), "{f:?}");
    a.handle(key(KeyCode::Enter));
    let f = footer(&a);
    assert!(f.contains("Esc back") && !f.contains("Enter open"), "{f:?}");
    a.handle(key(KeyCode::Esc));
    a.handle(ch('/'));
    a.handle(ch('b'));
    let f = footer(&a);
    assert!(f.contains(" filter: b_"), "{f:?}");
    assert!(f.contains("Enter keep") && f.contains("Esc clear"), "{f:?}");
    assert_eq!(names(&a), ["beta"]);
    a.handle(key(KeyCode::Esc));
    assert!(a.view.filter.is_empty() && !a.typing());
    // A message (a screenshot written) for a while, then the hints again.
    a.handle(FleetEvent::Shell(Wake::Tick { now_ns: 1_000 }));
    a.handle(FleetEvent::Shell(Wake::ScreenshotWritten(Ok(
        "f.svg".into()
    ))));
    assert!(footer(&a).contains("screenshot f.svg written"));
    a.handle(FleetEvent::Shell(Wake::Tick {
        now_ns: 1_000 + vramscope_ui::app::MESSAGE_NS,
    }));
    assert!(footer(&a).contains("Enter open"));
    insta::assert_snapshot!("fleet_nodes_120x20", frame(&a));
}

/// The keys the dashboard has for the same things: `r` asks Prometheus
/// now, `S` asks for a screenshot of the next frame, Ctrl-C quits (also
/// while typing), a signal quits.
#[test]
fn refresh_screenshot_and_quit() {
    let mut a = app(100, 20);
    assert_eq!(a.handle(ch('r')), [Ask::Refresh]);
    a.handle(ch('S'));
    assert!(a.should_draw(0));
    assert_eq!(
        a.frame_drawn(0),
        Some(Shot {
            path: None,
            then_quit: false
        })
    );
    assert_eq!(a.frame_drawn(20_000_000), None);
    a.handle(ch('/'));
    a.handle(FleetEvent::Shell(Wake::Input(Event::Key(KeyEvent::new(
        KeyCode::Char('c'),
        KeyModifiers::CONTROL,
    )))));
    assert!(a.quit);
    let mut a = app(100, 20);
    a.handle(FleetEvent::Shell(Wake::Signal));
    assert!(a.quit);
}

/// Frames only when something changed, at least 10 ms apart.
#[test]
fn a_frame_only_when_something_changed() {
    const MS: u64 = 1_000_000;
    let mut a = app(100, 20);
    a.handle(FleetEvent::Shell(Wake::Tick { now_ns: 1000 * MS }));
    assert!(a.should_draw(1000 * MS));
    a.frame_drawn(1000 * MS);
    assert!(!a.should_draw(2000 * MS));
    assert!(a.deadline_ns() > 1000 * MS + 1000 * MS, "idle: a slow tick");
    a.handle(FleetEvent::Fleet(Ok(fleet())));
    assert!(!a.should_draw(1005 * MS), "the frame gap");
    assert_eq!(a.deadline_ns(), 1010 * MS);
    assert!(a.should_draw(1010 * MS));
}

/// Issue 46, item 3: the fleet's legend and help scroll within their
/// lines: `j` at the end does nothing, `k` then moves at once, `g`/Home
/// and `G`/End go to the top and the end, PgDn/PgUp a page.
#[test]
fn item3_the_fleet_overlays_are_bounded() {
    fn offset(a: &FleetApp) -> usize {
        match a.overlay {
            Some(Overlay::Legend(s)) | Some(Overlay::Help(s)) => s.offset(),
            ref o => panic!("{o:?}"),
        }
    }
    for (open, w, h) in [('L', 100, 20), ('?', 60, 12)] {
        let mut a = app(w, h);
        a.handle(ch(open));
        let top = frame(&a);
        for _ in 0..200 {
            a.handle(ch('j'));
        }
        let last = offset(&a);
        assert!(last > 2, "{open}: {last}");
        let at_end = frame(&a);
        a.handle(ch('k'));
        assert_eq!(offset(&a), last - 1, "{open}");
        assert_ne!(frame(&a), at_end, "{open}: k moves at once");
        for (end, home) in [(ch('G'), ch('g')), (key(KeyCode::End), key(KeyCode::Home))] {
            a.handle(end);
            assert_eq!((offset(&a), frame(&a)), (last, at_end.clone()), "{open}");
            a.handle(home);
            assert_eq!((offset(&a), frame(&a)), (0, top.clone()), "{open}");
        }
        a.handle(key(KeyCode::PageDown));
        assert!(offset(&a) > 1, "{open}: PgDn moves a page");
        a.handle(key(KeyCode::PageUp));
        assert_eq!(offset(&a), 0, "{open}");
    }
}
