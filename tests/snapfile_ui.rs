//! The dashboard of `vramscope open FILE` on a file real PyTorch 2.11 wrote:
//! App driven as the frame loop drives it (keys in, effects carried out:
//! `Seek` through the file's [`Stepper`], `Refresh` as a hub snapshot),
//! at a fixed clock. Stepping through the trace rebuilds the state the
//! model would have at that event; the caption says where; `t` shows the
//! event's stacks. Frames compared as insta snapshots at 80x24 and 120x40.

use std::path::Path;

use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

use vramscope_collect::trace::Stepper;
use vramscope_collect::Hub;
use vramscope_core::model::ViewOptions;
use vramscope_core::snapfile::inputs::{self, Plan};
use vramscope_core::snapfile::{self, SnapshotFile};
use vramscope_ui::{render_buffer, App, AppConfig, AppEvent, Effect, Theme};

/// The collector clock of every step and snapshot.
const NOW: u64 = 5_000_000_000_000;

fn fixture() -> SnapshotFile {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/snapshots/torch-2.11/torch-2.11-python.pickle");
    snapfile::read(&p).expect("the fixture reads")
}

/// The dashboard of one file, and what feeds it.
struct Open {
    hub: Hub,
    stepper: Stepper,
    app: App,
}

impl Open {
    fn new(w: u16, h: u16) -> Open {
        let hub = Hub::default();
        let mut stepper = Stepper::new(fixture(), "torch-2.11-python.pickle");
        let status = stepper.seek(&hub, usize::MAX, NOW);
        let mut app = App::new(AppConfig {
            readonly: true,
            theme: Theme::new(true, false),
            initial_process: Some(inputs::KEY.pid),
            ..AppConfig::default()
        });
        app.set_trace(Some(status));
        let mut o = Open { hub, stepper, app };
        o.event(AppEvent::Input(Event::Resize(w, h)));
        o.event(AppEvent::Tick { now_ns: NOW });
        o
    }

    /// Hands `ev` to App and carries out what it asks, as the loop does.
    fn event(&mut self, ev: AppEvent) {
        let mut fx = self.app.handle(ev);
        for _ in 0..8 {
            let mut refresh = false;
            for f in fx.drain(..) {
                match f {
                    Effect::Refresh => refresh = true,
                    Effect::Seek(at) => {
                        let s = self.stepper.seek(&self.hub, at, NOW);
                        self.app.set_trace(Some(s));
                        refresh = true;
                    }
                    _ => {}
                }
            }
            if !refresh {
                return;
            }
            let snap = self.hub.snapshot_at(NOW, &self.app.view_options());
            fx = self.app.handle(AppEvent::Snapshot(Box::new(snap)));
        }
    }

    fn key(&mut self, code: KeyCode) {
        let k = KeyEvent::new(code, KeyModifiers::NONE);
        self.event(AppEvent::Input(Event::Key(k)));
    }

    fn at(&self) -> usize {
        self.app.trace.as_ref().expect("a trace").at
    }

    /// The file's process as the dashboard shows it: allocated, reserved.
    fn figures(&self) -> (u64, u64) {
        let p = &self.app.snap.processes[0];
        (p.view.figures.allocated, p.view.figures.reserved)
    }

    fn frame(&self) -> String {
        let (w, h) = (self.app.size.width, self.app.size.height);
        let buf = render_buffer(&self.app, w, h);
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| *f.buffer_mut() = buf.clone()).unwrap();
        t.backend().to_string()
    }
}

/// The model's figures after the first `n` events, from a fresh hub (what
/// `open --json --at N` prints).
fn rebuilt(file: &SnapshotFile, n: Option<usize>) -> (u64, u64) {
    let hub = Hub::default();
    let mut last = 0;
    for (t, input) in inputs::inputs(file, "x", Plan { upto: n }) {
        last = t;
        hub.apply(input);
    }
    let snap = hub.snapshot_at(last, &ViewOptions::default());
    let f = &snap.processes[0].view.figures;
    (f.allocated, f.reserved)
}

#[test]
fn stepping_through_the_trace_rebuilds_the_state_at_each_event() {
    let file = fixture();
    let total = inputs::timeline(&file).len();
    assert!(total > 250, "the fixture has a long trace ({total})");
    let mut o = Open::new(80, 24);
    assert_eq!(o.at(), total);
    let end = o.figures();
    assert_eq!(end, rebuilt(&file, None));
    assert_eq!(end.0, file.totals()[0].allocated, "the file's own figures");

    o.key(KeyCode::Home);
    assert_eq!(o.at(), 0);
    assert_eq!(o.figures(), rebuilt(&file, Some(0)));
    assert_ne!(o.figures(), end, "the start differs from the end");

    // One event at a time: the figures follow the model's, and move.
    let mut seen = vec![o.figures()];
    for n in 1..=20 {
        o.key(KeyCode::Char(']'));
        assert_eq!(o.at(), n);
        assert_eq!(o.figures(), rebuilt(&file, Some(n)), "at event {n}");
        seen.push(o.figures());
    }
    seen.dedup();
    assert!(seen.len() > 3, "stepping changed the figures: {seen:?}");
    o.key(KeyCode::Char('['));
    assert_eq!(o.at(), 19);
    assert_eq!(o.figures(), rebuilt(&file, Some(19)));

    // A hundred at a time, never past either end.
    o.key(KeyCode::Char('}'));
    assert_eq!(o.at(), 119);
    assert_eq!(o.figures(), rebuilt(&file, Some(119)));
    o.key(KeyCode::Char('{'));
    o.key(KeyCode::Char('{'));
    assert_eq!(o.at(), 0);
    o.key(KeyCode::End);
    assert_eq!((o.at(), o.figures()), (total, end));
    o.key(KeyCode::Char('}'));
    assert_eq!(o.at(), total);
}

/// Issue 30, item 4: a file's timeline is its whole trace across the
/// width (3.5 s here, most of it in the last 0.1 s; never a 30 s LIVE
/// window with the trace squashed into its last column), and a file has
/// no event rate.
#[test]
fn the_timeline_spreads_the_whole_trace_and_a_file_has_no_rate() {
    let mut o = Open::new(80, 24);
    let f = o.frame();
    insta::assert_snapshot!("open_whole_trace_80x24", f);
    assert!(
        f.contains("Memory over time · the whole trace, 3.5s"),
        "{f}"
    );
    assert!(!f.contains("LIVE") && !f.contains("live"), "{f}");
    assert!(f.contains(" ev/s — "), "{f}");
    assert!(f.contains("0s                              +1.8s                          +3.5s"));
    // The plot (right of the value axis, inside the border): the trace's
    // busy last 0.1 s over several columns, up to the last.
    let plot: Vec<Vec<char>> = (f.lines().skip(6).take(15))
        .map(|l| l.chars().skip(12).take(68).collect())
        .collect();
    let filled = |x: usize| plot.iter().any(|row| row[x] != ' ');
    let cols = (0..68).filter(|&x| filled(x)).count();
    assert!(filled(67) && cols >= 6, "{cols} columns: {f}");
    // Zooming keeps the whole trace, and says why.
    o.key(KeyCode::Char('+'));
    let zoomed = o.frame();
    assert!(zoomed.contains("the whole trace, 3.5s"), "{zoomed}");
    assert!(
        zoomed.contains("the timeline shows the file's whole trace"),
        "{zoomed}"
    );
}

#[test]
fn the_caption_says_where_and_t_shows_the_stacks() {
    let mut o = Open::new(80, 24);
    assert!(o.frame().contains("the file's state, after 1313 events"));
    o.key(KeyCode::Home);
    for _ in 0..3 {
        o.key(KeyCode::Char(']'));
    }
    let f = o.frame();
    assert!(f.contains("event 3 of 1313"), "{f}");
    // Issue 46, item 21: a file's state has nothing to resync: no word
    // says so while stepping.
    assert!(!f.contains("resync"), "{f}");
    insta::assert_snapshot!("open_stepped_80x24", f);

    let mut wide = Open::new(120, 40);
    wide.key(KeyCode::Home);
    wide.key(KeyCode::Char('}'));
    wide.key(KeyCode::Char('t'));
    let f = wide.frame();
    assert!(f.contains("Stacks") && f.contains("event 100:"), "{f}");
    insta::assert_snapshot!("open_stacks_120x40", f);
    // Stepping with the overlay up shows the next event's stacks; t closes.
    wide.key(KeyCode::Char(']'));
    assert!(wide.frame().contains("event 101:"));
    wide.key(KeyCode::Char('t'));
    assert!(!wide.frame().contains("event 101:"));
    assert!(wide.frame().contains("event 101 of 1313"));
}
