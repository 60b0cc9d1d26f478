//! The loop's decisions, made by App with time injected (no clocks, no
//! terminal): the start, the slow tick's freshness label, the data-rate
//! gate, the `--pid` wait, screenshots (automatic and `S`), the frame gap,
//! and no snapshots while paused.

use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::Duration;

use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
use vramscope_ui::app::{MIN_FRAME_NS, PID_WAIT_NS, TICK_NS};
use vramscope_ui::fixtures::{app_with, Fixture};
use vramscope_ui::{App, AppConfig, AppEvent, Effect, Pace, Screen, ScreenshotAfter, Shot, Theme};

static FX: LazyLock<Fixture> = LazyLock::new(|| Fixture::new(6));

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

fn cfg() -> AppConfig {
    AppConfig {
        theme: Theme::new(true, false),
        ..AppConfig::default()
    }
}

fn tick(app: &mut App, now_ns: u64) -> Vec<Effect> {
    app.handle(AppEvent::Tick { now_ns })
}

fn snapshot(app: &mut App) -> Vec<Effect> {
    let snap = FX.snapshot(&app.view_options());
    app.handle(AppEvent::Snapshot(Box::new(snap)))
}

fn key(code: KeyCode) -> AppEvent {
    AppEvent::Input(Event::Key(KeyEvent::new(code, KeyModifiers::NONE)))
}

/// An app started at `t0` (its first tick and first snapshot), drawn once.
fn started(config: AppConfig, t0: u64) -> App {
    let mut a = App::new(config);
    assert_eq!(a.deadline_ns(), 0, "before the first tick: wake at once");
    assert_eq!(tick(&mut a, t0), vec![Effect::Refresh]);
    assert!(snapshot(&mut a).is_empty());
    assert_eq!(a.clock.changed_ns, t0, "the first data counts as fresh");
    assert!(a.should_draw(t0));
    assert_eq!(a.frame_drawn(t0), None);
    a
}

#[test]
fn the_tick_redraws_only_when_the_freshness_label_moves() {
    let t0 = FX.now_ns;
    let mut a = started(cfg(), t0);
    assert_eq!(a.age_label(), "live");
    assert!(!a.dirty);
    assert_eq!(a.deadline_ns(), t0 + TICK_NS);
    // Not due yet: nothing.
    tick(&mut a, t0 + 500 * MS);
    assert!(!a.dirty);
    // Due, but still "live": no frame.
    tick(&mut a, t0 + TICK_NS);
    assert!(!a.dirty);
    // "updated 2s ago": a frame.
    tick(&mut a, t0 + 2 * TICK_NS);
    assert!(a.dirty);
    assert_eq!(a.age_label(), "updated 2s ago");
    a.frame_drawn(t0 + 2 * TICK_NS);
    // Idle for a minute: the tick slows down to 5 s.
    tick(&mut a, t0 + 61 * S);
    assert_eq!(a.clock.next_tick_ns, t0 + 66 * S);
}

#[test]
fn new_data_is_taken_at_most_every_data_interval_keys_at_once() {
    let t0 = FX.now_ns;
    let mut a = started(
        AppConfig {
            data_interval: Duration::from_millis(250),
            ..cfg()
        },
        t0,
    );
    // A change 100 ms after the last snapshot waits...
    tick(&mut a, t0 + 100 * MS);
    assert!(a.handle(AppEvent::Changed).is_empty());
    assert!(a.clock.data_pending);
    assert_eq!(a.deadline_ns(), t0 + 250 * MS);
    // ...while keys are answered at once.
    let before = a.overview.selected;
    assert!(a.handle(key(KeyCode::Down)).is_empty());
    assert_ne!(a.overview.selected, before);
    assert!(a.dirty);
    // Not yet, then due.
    assert!(tick(&mut a, t0 + 200 * MS).is_empty());
    assert_eq!(tick(&mut a, t0 + 250 * MS), vec![Effect::Refresh]);
    snapshot(&mut a);
    assert!(!a.clock.data_pending);
    // A change after the interval is taken at once.
    tick(&mut a, t0 + 600 * MS);
    assert_eq!(a.handle(AppEvent::Changed), vec![Effect::Refresh]);
}

#[test]
fn no_snapshot_while_paused() {
    let mut a = app_with(&FX, cfg(), 80, 24);
    a.handle(key(KeyCode::Char('p')));
    assert!(a.paused);
    assert!(a.handle(AppEvent::Changed).is_empty());
    assert!(a.handle(AppEvent::Input(Event::Resize(100, 30))).is_empty());
    assert!(a.handle(key(KeyCode::Enter)).is_empty());
    assert_eq!(a.screen, Screen::Process);
}

#[test]
fn pid_opens_its_view_once_it_appears() {
    let pid = FX.key_of("oom").unwrap().pid;
    let t0 = FX.now_ns;
    let mut a = App::new(AppConfig {
        initial_process: Some(pid),
        ..cfg()
    });
    tick(&mut a, t0);
    // Not there yet.
    assert!(a.handle(AppEvent::Snapshot(Box::default())).is_empty());
    assert_eq!(
        a.message.as_deref(),
        Some(format!("waiting for pid {pid} to appear...").as_str())
    );
    assert_eq!(a.screen, Screen::Overview);
    // There: its view opens, and a snapshot for it is asked for.
    tick(&mut a, t0 + S);
    assert_eq!(snapshot(&mut a), vec![Effect::Refresh]);
    assert_eq!(a.screen, Screen::Process);
    assert_eq!(a.selected_entry().unwrap().identity.host_pid, pid);
    assert_eq!(a.message, None);
    assert!(snapshot(&mut a).is_empty());
}

#[test]
fn pid_wait_gives_up_after_10_s() {
    let t0 = FX.now_ns;
    let mut a = App::new(AppConfig {
        initial_process: Some(1),
        ..cfg()
    });
    tick(&mut a, t0);
    snapshot(&mut a);
    assert_eq!(a.message.as_deref(), Some("waiting for pid 1 to appear..."));
    tick(&mut a, t0 + PID_WAIT_NS + S);
    snapshot(&mut a);
    assert_eq!(
        a.message.as_deref(),
        Some("pid 1 is not an instrumented or GPU process")
    );
    assert_eq!(a.startup.wanted_pid, None);
    // Esc clears it, and it does not come back.
    a.handle(key(KeyCode::Esc));
    snapshot(&mut a);
    assert_eq!(a.message, None);
}

#[test]
fn pid_wait_gives_up_on_time_even_with_no_new_data() {
    let t0 = FX.now_ns;
    let mut a = App::new(AppConfig {
        initial_process: Some(424242),
        ..cfg()
    });
    tick(&mut a, t0);
    snapshot(&mut a);
    // Nothing changes in the hub: only ticks arrive.
    let mut t = t0;
    while t < t0 + PID_WAIT_NS + 2 * S {
        t = a.deadline_ns().max(t + MS);
        tick(&mut a, t);
    }
    assert_eq!(a.startup.wanted_pid, None);
    assert_eq!(
        a.message.as_deref(),
        Some("pid 424242 is not an instrumented or GPU process")
    );
}

/// The footer line of `a` at 80x24.
fn footer(a: &App) -> String {
    let buf = vramscope_ui::render_buffer(a, 80, 24);
    (0..80).map(|x| buf[(x, 23)].symbol()).collect()
}

#[test]
fn footer_messages_expire_and_the_key_hints_come_back() {
    use vramscope_ui::app::MESSAGE_NS;
    let t0 = FX.now_ns;
    let mut shown = String::new();
    // Each way a message reaches the footer.
    type Way = (&'static str, fn(&mut App));
    let ways: [Way; 5] = [
        ("S screenshot", |a| {
            a.handle(AppEvent::ScreenshotWritten(Ok(
                "/tmp/vramscope-001.svg".into()
            )));
        }),
        ("e then n", |a| {
            a.handle(key(KeyCode::Char('e')));
            a.handle(key(KeyCode::Char('n')));
        }),
        ("e on a process without agent", |a| {
            a.handle(key(KeyCode::End));
            a.handle(key(KeyCode::Char('e')));
        }),
        ("zoom while paused", |a| {
            a.handle(key(KeyCode::Enter));
            a.handle(key(KeyCode::Char('p')));
            a.handle(key(KeyCode::Char('+')));
        }),
        ("--pid not found", |a| {
            a.startup.wanted_pid = Some(1);
            a.clock.started_ns = Some(a.clock.now_ns - PID_WAIT_NS - S);
            snapshot(a);
        }),
    ];
    for (what, f) in ways {
        let mut a = started(cfg(), t0);
        f(&mut a);
        let during = footer(&a);
        assert!(a.message.is_some(), "{what}");
        assert!(during.contains("? help  q quit"), "{what}: {during}");
        // The loop wakes up for the expiry, and the hints come back.
        let due = a.deadline_ns();
        assert!(due <= t0 + MESSAGE_NS, "{what}");
        tick(&mut a, t0 + MESSAGE_NS);
        assert_eq!(a.message, None, "{what}");
        assert!(a.dirty, "{what}: redrawn when the message goes");
        let after = footer(&a);
        shown.push_str(&format!("{what}:\n{during}\n{after}\n"));
    }
    insta::assert_snapshot!("footer_messages_expire_80x24", shown);
}

#[test]
fn automatic_screenshot_is_written_after_its_delay_then_quits() {
    let t0 = FX.now_ns;
    let path = PathBuf::from("shot.svg");
    let mut a = started(
        AppConfig {
            screenshot: Some(ScreenshotAfter {
                path: path.clone(),
                after: Duration::from_secs(3),
            }),
            ..cfg()
        },
        t0,
    );
    assert_eq!(a.deadline_ns(), t0 + TICK_NS);
    tick(&mut a, t0 + 2 * S);
    a.frame_drawn(t0 + 2 * S);
    assert_eq!(a.deadline_ns(), t0 + 3 * S);
    tick(&mut a, t0 + 3 * S);
    assert!(a.should_draw(t0 + 3 * S));
    assert_eq!(
        a.frame_drawn(t0 + 3 * S),
        Some(Shot {
            path: Some(path.clone()),
            then_quit: true
        })
    );
    assert_eq!(
        a.handle(AppEvent::ScreenshotWritten(Ok(path))),
        vec![Effect::Quit]
    );
    assert!(a.quit);
}

#[test]
fn s_writes_the_next_frame_and_says_where() {
    let t0 = FX.now_ns;
    let mut a = started(cfg(), t0);
    assert!(a.handle(key(KeyCode::Char('S'))).is_empty());
    assert!(a.should_draw(t0 + MIN_FRAME_NS));
    assert_eq!(
        a.frame_drawn(t0 + MIN_FRAME_NS),
        Some(Shot {
            path: None,
            then_quit: false
        })
    );
    let p = PathBuf::from("/tmp/vramscope-001.svg");
    assert!(a.handle(AppEvent::ScreenshotWritten(Ok(p))).is_empty());
    assert_eq!(
        a.message.as_deref(),
        Some("screenshot vramscope-001.svg written in /tmp")
    );
    assert!(a.dirty, "the message shows in the next frame");
    assert!(!a.quit);
    a.handle(key(KeyCode::Char('S')));
    a.frame_drawn(t0 + 2 * MIN_FRAME_NS);
    a.handle(AppEvent::ScreenshotWritten(Err("disk full".into())));
    assert_eq!(a.message.as_deref(), Some("screenshot failed: disk full"));
}

#[test]
fn frames_are_at_least_10_ms_apart() {
    let t0 = FX.now_ns;
    let mut a = started(cfg(), t0);
    a.handle(key(KeyCode::Down));
    assert!(!a.should_draw(t0 + 5 * MS));
    assert_eq!(a.deadline_ns(), t0 + MIN_FRAME_NS);
    assert!(a.should_draw(t0 + MIN_FRAME_NS));
    a.frame_drawn(t0 + MIN_FRAME_NS);
    assert!(!a.should_draw(t0 + 100 * MS), "nothing changed");
}

#[test]
fn a_signal_quits() {
    let mut a = started(cfg(), FX.now_ns);
    assert_eq!(a.handle(AppEvent::Signal), vec![Effect::Quit]);
    assert!(a.quit);
}

#[test]
fn no_color_is_applied_once_by_the_ui() {
    use vramscope_ui::{app_config, UiOptions};
    let opts = UiOptions::default();
    assert!(app_config(&opts, false).theme.color);
    assert!(!app_config(&opts, true).theme.color, "NO_COLOR");
    let mono = UiOptions {
        monochrome: true,
        ..UiOptions::default()
    };
    assert!(!app_config(&mono, false).theme.color, "--no-color");
}
