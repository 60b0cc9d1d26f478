//! The state machine driven by injected events, no terminal: navigation,
//! sorting, filtering, the process view, zoom and scroll, the empty-cache
//! dialogue to a real segment that answers, read-only mode, help, pause,
//! demo controls, mouse, and Press-only keys.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crossterm::event::{
    Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use vramscope_collect::demo::DemoStatus;
use vramscope_core::model::ProcessKey;
use vramscope_ui::app::{ActionState, SPANS_NS};
use vramscope_ui::fixtures::{app_with, refresh, Fixture};
use vramscope_ui::rows::Col;
use vramscope_ui::{
    layout, send_command, App, AppConfig, AppEvent, Driver, Effect, Overlay, Screen, Scroll, Theme,
};
use vramscope_wire::ring::{Command, Outcome, Producer, SegmentConfig, SegmentWriter, Status};

mod common;

static FX: LazyLock<Fixture> = LazyLock::new(|| Fixture::new(6));

fn cfg(readonly: bool) -> AppConfig {
    AppConfig {
        readonly,
        theme: Theme::new(true, false),
        ..AppConfig::default()
    }
}

fn app() -> App {
    app_with(&FX, cfg(false), 80, 24)
}

fn key(code: KeyCode) -> AppEvent {
    AppEvent::Input(Event::Key(KeyEvent::new(code, KeyModifiers::NONE)))
}

fn ch(c: char) -> AppEvent {
    key(KeyCode::Char(c))
}

fn type_str(app: &mut App, s: &str) -> Vec<Effect> {
    s.chars().flat_map(|c| app.handle(ch(c))).collect()
}

fn pids(app: &App) -> Vec<u32> {
    app.rows().iter().map(|r| r.pid).collect()
}

fn selected_pid(app: &App) -> u32 {
    app.selected_entry().unwrap().identity.host_pid
}

#[test]
fn navigation() {
    let mut a = app();
    let order = pids(&a);
    assert_eq!(selected_pid(&a), order[0]);
    a.handle(key(KeyCode::Down));
    assert_eq!(selected_pid(&a), order[1]);
    a.handle(ch('j'));
    assert_eq!(selected_pid(&a), order[2]);
    a.handle(ch('k'));
    a.handle(key(KeyCode::Up));
    a.handle(key(KeyCode::Up)); // clamps at the top
    assert_eq!(selected_pid(&a), order[0]);
    a.handle(key(KeyCode::End));
    assert_eq!(selected_pid(&a), *order.last().unwrap());
    a.handle(ch('g'));
    assert_eq!(selected_pid(&a), order[0]);
}

#[test]
fn selection_scrolls_the_table() {
    let fx = Fixture::new(12);
    let mut a = app_with(&fx, cfg(false), 80, 16);
    let visible = a.table_rows();
    assert!(visible < 13, "{visible}");
    for _ in 0..12 {
        a.handle(key(KeyCode::Down));
    }
    assert_eq!(a.overview.scroll.offset(), 13 - visible);
    a.handle(key(KeyCode::Home));
    assert_eq!(a.overview.scroll.offset(), 0);
}

#[test]
fn sorting() {
    let mut a = app();
    assert_eq!(a.overview.sort, Col::Reserved);
    assert!(a.overview.descending);
    let resv: Vec<Option<u64>> = a.rows().iter().map(|r| r.reserved).collect();
    // Descending, absent (NVML-only) last.
    assert!(resv.windows(2).all(|w| match (w[0], w[1]) {
        (Some(x), Some(y)) => x >= y,
        (Some(_), None) | (None, None) => true,
        (None, Some(_)) => false,
    }));
    a.handle(ch('o'));
    assert_eq!(a.overview.sort, Col::Allocated);
    let alloc: Vec<u64> = a.rows().iter().filter_map(|r| r.allocated).collect();
    assert!(alloc.windows(2).all(|w| w[0] >= w[1]));
    a.handle(ch('O'));
    assert!(!a.overview.descending);
    let alloc: Vec<u64> = a.rows().iter().filter_map(|r| r.allocated).collect();
    assert!(alloc.windows(2).all(|w| w[0] <= w[1]));
    // Absent values stay last in either direction.
    assert_eq!(a.rows().last().unwrap().pid, 4242);
    // `o` walks the columns on screen left to right, and comes back round.
    let shown: Vec<Col> = a.columns().cols().collect();
    let mut seen = vec![a.overview.sort];
    for _ in 1..shown.len() {
        a.handle(ch('o'));
        seen.push(a.overview.sort);
    }
    let at = shown.iter().position(|c| *c == Col::Allocated).unwrap();
    let mut expected = shown[at..].to_vec();
    expected.extend_from_slice(&shown[..at]);
    assert_eq!(seen, expected);
    a.handle(ch('o'));
    assert_eq!(a.overview.sort, Col::Allocated);
}

#[test]
fn clicking_a_column_header_sorts_by_it() {
    let mut a = app();
    let body = a.table_body();
    let cols = a.columns();
    let click = |col: Col| {
        let (_, x, _) = cols.0.iter().find(|c| c.0 == col).copied().unwrap();
        AppEvent::Input(Event::Mouse(MouseEvent {
            kind: MouseEventKind::Down(MouseButton::Left),
            column: body.x + x + 1,
            row: body.y - 1,
            modifiers: KeyModifiers::NONE,
        }))
    };
    a.handle(click(Col::Pid));
    assert_eq!(a.overview.sort, Col::Pid);
    assert!(!a.overview.descending);
    let p = pids(&a);
    assert!(p.windows(2).all(|w| w[0] < w[1]), "{p:?}");
    // The same header again reverses.
    a.handle(click(Col::Pid));
    assert!(a.overview.descending);
    a.handle(click(Col::Nvml));
    assert_eq!(a.overview.sort, Col::Nvml);
    assert!(a.overview.descending);
    // The selection is unchanged by a header click, and the screen too.
    assert_eq!(a.screen, Screen::Overview);
}

#[test]
fn filtering() {
    let mut a = app();
    a.handle(ch('/'));
    assert!(a.typing());
    // While typing, letters are text, not commands ('q' does not quit).
    let fx = type_str(&mut a, "seq");
    assert!(fx.is_empty());
    assert!(!a.quit);
    assert_eq!(a.overview.filter, "seq");
    assert_eq!(pids(&a).len(), 1);
    assert_eq!(a.rows()[0].name, "seq2seq.py");
    assert_eq!(selected_pid(&a), a.rows()[0].pid);
    a.handle(key(KeyCode::Backspace));
    assert_eq!(a.overview.filter, "se");
    a.handle(key(KeyCode::Enter));
    assert!(!a.typing());
    assert_eq!(a.overview.filter, "se");
    // By pid and by command line.
    a.overview.filter = "4242".into();
    assert_eq!(pids(&a), vec![4242]);
    a.overview.filter = "--scenario oom".into();
    assert_eq!(pids(&a).len(), 1);
    // Esc clears.
    a.handle(key(KeyCode::Esc));
    assert!(a.overview.filter.is_empty());
    assert_eq!(pids(&a).len(), 7);
}

#[test]
fn open_process_view_and_back() {
    let mut a = app();
    let fx = a.handle(key(KeyCode::Enter));
    assert_eq!(fx, vec![Effect::Refresh]);
    assert_eq!(a.screen, Screen::Process);
    let opts = a.view_options();
    assert!(opts.block_map);
    let tl = opts.timeline.expect("a timeline request");
    assert_eq!(tl.to_ns - tl.from_ns, SPANS_NS[a.process.span_index]);
    assert_eq!(tl.to_ns, FX.now_ns);
    assert_eq!(tl.columns, 80 - 2 - layout::AXIS_WIDTH as usize);
    // Tabs.
    a.handle(key(KeyCode::Tab));
    assert_eq!(a.process.pane, vramscope_ui::Pane::Blocks);
    a.handle(ch('5'));
    assert_eq!(a.process.pane, vramscope_ui::Pane::Diagnosis);
    a.handle(key(KeyCode::BackTab));
    assert_eq!(a.process.pane, vramscope_ui::Pane::Events);
    // Back.
    assert_eq!(a.handle(key(KeyCode::Esc)), vec![Effect::Refresh]);
    assert_eq!(a.screen, Screen::Overview);
    assert!(!a.view_options().block_map);
}

#[test]
fn zoom_and_scroll_time() {
    let mut a = app();
    a.handle(key(KeyCode::Enter));
    let span0 = a.span_ns();
    assert_eq!(a.handle(ch('+')), vec![Effect::Refresh]);
    assert!(a.span_ns() < span0);
    let span = a.span_ns();
    // Back in time (samples there): stop following, move by half a window.
    refresh(&mut a, &FX);
    a.handle(key(KeyCode::Left));
    assert!(!a.process.follow);
    let (from, to) = a.window();
    assert_eq!(to, FX.now_ns - span / 2);
    assert_eq!(to - from, span);
    // Forward past now: follow again.
    a.handle(key(KeyCode::Right));
    assert!(a.process.follow);
    a.handle(ch('-'));
    a.handle(ch('-'));
    assert!(a.span_ns() > span0);
    // A window wider than the samples held does not go back: nothing
    // would be left to show (issue 46, item 4); it still follows.
    a.handle(key(KeyCode::Left));
    assert!(a.process.follow);
    // f toggles follow; End turns it on.
    a.handle(ch('f'));
    assert!(!a.process.follow);
    a.handle(key(KeyCode::End));
    assert!(a.process.follow);
    // Zooming stops at both ends.
    for _ in 0..40 {
        a.handle(ch('+'));
    }
    assert_eq!(a.span_ns(), SPANS_NS[0]);
    for _ in 0..40 {
        a.handle(ch('-'));
    }
    assert_eq!(a.span_ns(), *SPANS_NS.last().unwrap());
}

#[test]
fn block_map_scrolls() {
    let mut a = app();
    a.overview.selected = FX.key_of("leak");
    a.handle(key(KeyCode::Enter));
    refresh(&mut a, &FX);
    a.handle(ch('2'));
    a.handle(key(KeyCode::PageDown));
    let page = a.process.block_scroll.offset();
    assert!(page > 5, "{page}");
    a.handle(key(KeyCode::Down));
    assert_eq!(a.process.block_scroll.offset(), page + 1);
    a.handle(key(KeyCode::PageUp));
    a.handle(key(KeyCode::PageUp));
    assert_eq!(a.process.block_scroll.offset(), 0);
    // PgDn stops at the last full page: the map's last row at the bottom.
    for _ in 0..50 {
        a.handle(key(KeyCode::PageDown));
    }
    let e = a.selected_entry().unwrap();
    let rows = vramscope_ui::blockmap::row_count(e);
    let page = layout::pane_rows(a.size, 0, vramscope_ui::Pane::Blocks);
    assert_eq!(a.process.block_scroll.offset(), rows - page);
}

#[test]
fn tab_moves_the_focus_on_a_large_terminal_and_j_k_scroll_it() {
    use vramscope_ui::Pane;
    let mut a = app_with(&FX, cfg(false), 200, 60);
    a.overview.selected = FX.key_of("leak");
    a.handle(key(KeyCode::Enter));
    refresh(&mut a, &FX);
    // Tab goes round the panes that scroll.
    let mut seen = Vec::new();
    for _ in 0..3 {
        a.handle(key(KeyCode::Tab));
        seen.push(a.process.pane);
    }
    assert_eq!(seen, vec![Pane::Blocks, Pane::Stats, Pane::Events]);
    // j scrolls the events pane in focus, not the block map.
    a.handle(ch('j'));
    assert_eq!(a.process.event_scroll.offset(), 1);
    assert_eq!(a.process.block_scroll.offset(), 0);
    // The focused pane's border is drawn in the focus style.
    let buf = vramscope_ui::render_buffer(&a, 200, 60);
    let areas = layout::process(a.size, a.process.pane, layout::screen(a.size, 0).body);
    let ev = areas.events.unwrap();
    assert_eq!(buf[(ev.x, ev.y)].style().fg, a.config.theme.focus().fg);
    let bl = areas.blocks.unwrap();
    assert_ne!(buf[(bl.x, bl.y)].style().fg, a.config.theme.focus().fg);
}

#[test]
fn a_scroll_set_small_never_empties_a_pane_when_enlarged() {
    let mut a = app();
    a.overview.selected = FX.key_of("leak");
    a.handle(key(KeyCode::Enter));
    refresh(&mut a, &FX);
    a.handle(ch('4'));
    for _ in 0..100 {
        a.handle(key(KeyCode::PageDown));
    }
    assert!(a.process.event_scroll.offset() > 0);
    a.handle(AppEvent::Input(Event::Resize(200, 60)));
    refresh(&mut a, &FX);
    let buf = vramscope_ui::render_buffer(&a, 200, 60);
    let areas = layout::process(a.size, a.process.pane, layout::screen(a.size, 0).body);
    let ev = areas.events.unwrap();
    // Every row of the events pane has an event on it.
    for y in ev.y + 1..ev.y + ev.height - 1 {
        let row: String = (ev.x + 1..ev.x + 10)
            .map(|x| buf[(x, y)].symbol())
            .collect();
        assert!(row.trim_start().starts_with('-'), "row {y}: {row:?}");
    }
}

/// A driver whose processes may be sent commands.
struct Sends;

impl Driver for Sends {
    fn refusal(&self) -> Option<&str> {
        None
    }
    fn on_signal(&self, _f: Box<dyn Fn() + Send + Sync>) {}
}

/// Makes `seg`'s header name the process `key` (pid and start time), as
/// the segment of a fixture's process would.
fn name_the_process(seg: &SegmentWriter, key: ProcessKey) {
    use std::os::unix::fs::FileExt;
    use vramscope_wire::ring::layout::{OFF_PID, OFF_START_TIME};
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(seg.path())
        .unwrap();
    f.write_all_at(&key.pid.to_le_bytes(), OFF_PID as u64)
        .unwrap();
    f.write_all_at(&key.start_time.to_le_bytes(), OFF_START_TIME as u64)
        .unwrap();
}

#[test]
fn empty_cache_confirm_cancel_and_run() {
    let mut a = app();
    a.overview.selected = FX.key_of("empty-cache");
    let key_ = a.overview.selected.unwrap();
    // Cancel.
    assert!(a.handle(ch('e')).is_empty());
    assert!(matches!(a.action, Some(ActionState::Confirm { .. })));
    // Other keys are ignored while asking.
    a.handle(ch('j'));
    assert_eq!(a.overview.selected, Some(key_));
    a.handle(ch('n'));
    assert!(a.action.is_none());
    // Confirm.
    a.handle(ch('e'));
    let fx = a.handle(ch('y'));
    let [Effect::RunCommand {
        key: k,
        pid,
        segment,
        command,
    }] = fx.as_slice()
    else {
        panic!("{fx:?}")
    };
    assert_eq!(*k, key_);
    assert_eq!(*command, Command::EmptyCache { device: None });
    let shown = a.selected_entry().unwrap().source.segment.clone();
    assert_eq!(Some(segment.display().to_string()), shown);
    assert!(matches!(a.action, Some(ActionState::Running { .. })));
    let nvml_before = a.selected_entry().unwrap().view.figures.nvml_used;
    // Send it as the loop does, to a real segment of that process whose
    // producer answers from another thread, releasing 2 GiB.
    let dir = tempfile::tempdir().unwrap();
    let cfg = SegmentConfig::new(dir.path(), Producer::TorchExact, 1, 16);
    let seg = SegmentWriter::create(&cfg).unwrap();
    name_the_process(&seg, *k);
    let calls = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel();
    let hub = Arc::new(vramscope_collect::Hub::default());
    let done = common::answering(
        &seg,
        |req| {
            assert_eq!(req.command, *command);
            calls.fetch_add(1, Ordering::SeqCst);
            (Status::Ok, 3 << 30, 1 << 30)
        },
        || {
            let segment = seg.path().to_path_buf();
            send_command(&Sends, &hub, &tx, *k, *pid, segment, *command);
            rx.recv_timeout(Duration::from_secs(5)).unwrap()
        },
    );
    assert!(matches!(done, AppEvent::CommandDone(_)));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(a.handle(done), vec![Effect::Refresh]);
    let Some(ActionState::Done(r)) = &a.action else {
        panic!("{:?}", a.action)
    };
    assert_eq!(r.released(), Some(2 << 30));
    assert_eq!(r.nvml_before, nvml_before);
    assert_eq!(r.nvml_after, None);
    // The same NVML sample: still waiting. A newer one: filled in.
    refresh(&mut a, &FX);
    let Some(ActionState::Done(r)) = &a.action else {
        panic!()
    };
    assert_eq!(r.nvml_after, None);
    let mut snap = FX.snapshot(&a.view_options());
    snap.machine.sampled_ns = Some(FX.now_ns + 1_000_000_000);
    for p in &mut snap.processes {
        if p.key() == key_ {
            p.view.figures.nvml_used = Some(1 << 30);
        }
    }
    a.set_snapshot(snap);
    let Some(ActionState::Done(r)) = &a.action else {
        panic!()
    };
    assert_eq!(r.nvml_after, Some(1 << 30));
    let f = vramscope_ui::render_buffer(&a, 80, 24);
    let text: String = f.content.iter().map(|c| c.symbol()).collect();
    assert!(text.contains("reserved 3.00 GiB -> 1.00 GiB   released 2.00 GiB"));
    assert!(text.contains("NVML used"));
    // Esc closes the report.
    a.handle(key(KeyCode::Esc));
    assert!(a.action.is_none());
}

#[test]
fn the_empty_cache_question_quotes_the_latest_figures() {
    let mut a = app();
    a.overview.selected = FX.key_of("empty-cache");
    a.handle(ch('e'));
    let key_ = a.overview.selected.unwrap();
    // The process moves on: a newer snapshot with other figures.
    let mut snap = (*a.snap).clone();
    let p = snap.processes.iter_mut().find(|p| p.key() == key_).unwrap();
    p.view.figures.reserved = 7 << 30;
    p.view.figures.allocated = 1 << 30;
    a.set_snapshot(snap);
    match &a.action {
        Some(ActionState::Confirm {
            reserved,
            allocated,
            ..
        }) => assert_eq!((*reserved, *allocated), (Some(7 << 30), Some(1 << 30))),
        other => panic!("{other:?}"),
    }
    let buf = vramscope_ui::render_buffer(&a, 80, 24);
    let text: String = buf.content.iter().map(|c| c.symbol()).collect();
    assert!(text.contains("reserved 7.00 GiB, allocated 1.00 GiB: up to 6.00 GiB"));
}

#[test]
fn commands_need_an_agent() {
    let mut a = app();
    a.overview.selected = Some(ProcessKey {
        pid: 4242,
        start_time: 777,
    });
    assert!(a.handle(ch('e')).is_empty());
    assert!(a.action.is_none());
    assert!(a.message.as_deref().unwrap().contains("does not answer"));
    assert!(a.handle(ch('r')).is_empty());
}

#[test]
fn reset_peaks_and_snapshot() {
    let mut a = app();
    let fx = a.handle(ch('r'));
    assert!(matches!(
        fx.as_slice(),
        [Effect::RunCommand {
            command: Command::ResetPeaks { device: None },
            ..
        }]
    ));
    // A second command while one runs is refused.
    assert!(a.handle(ch('s')).is_empty());
    a.action = None;
    let fx = a.handle(ch('s'));
    assert!(matches!(
        fx.as_slice(),
        [Effect::RunCommand {
            command: Command::Snapshot { device: None },
            ..
        }]
    ));
}

#[test]
fn readonly_blocks_actions() {
    let mut a = app_with(&FX, cfg(true), 80, 24);
    for c in ['e', 'r', 's'] {
        a.message = None;
        assert!(a.handle(ch(c)).is_empty(), "{c}");
        assert!(a.action.is_none(), "{c}");
        // Issue 30, item 11: the key says why it does nothing.
        let said = a.message.as_deref().unwrap_or_default();
        assert!(said.starts_with("read-only"), "{c}: {said:?}");
    }
    a.handle(ch('e'));
    a.handle(ch('y'));
    assert!(a.action.is_none());
    // Viewing still works.
    a.handle(key(KeyCode::Down));
    assert_eq!(a.handle(key(KeyCode::Enter)), vec![Effect::Refresh]);
    // The process view's C (capture stacks) says so too.
    a.message = None;
    assert!(a.handle(ch('C')).is_empty());
    let said = a.message.as_deref().unwrap_or_default();
    assert!(said.starts_with("read-only"), "C: {said:?}");
}

#[test]
fn help_overlay() {
    let mut a = app();
    a.handle(ch('?'));
    assert_eq!(a.overlay, Some(Overlay::Help(Scroll::default())));
    let sel = a.overview.selected;
    a.handle(ch('j'));
    assert_eq!(a.overview.selected, sel);
    assert!(a.handle(ch('e')).is_empty());
    assert!(a.action.is_none());
    a.handle(key(KeyCode::Esc));
    assert_ne!(a.overlay, Some(Overlay::Help(Scroll::default())));
    // Every key the footer names is in the help.
    let all: Vec<&str> = vramscope_ui::keys::KEYS
        .iter()
        .filter_map(|b| b.help.map(|h| h.0))
        .collect();
    for k in [
        "q Ctrl-C", "?", "p", "space", "[ ]", "S", "e", "r", "s", "/", "Enter",
    ] {
        assert!(all.contains(&k), "{k}");
    }
}

#[test]
fn quit_paths() {
    let mut a = app();
    assert_eq!(a.handle(ch('q')), vec![Effect::Quit]);
    let mut a = app();
    let ctrl_c = AppEvent::Input(Event::Key(KeyEvent::new(
        KeyCode::Char('c'),
        KeyModifiers::CONTROL,
    )));
    assert_eq!(a.handle(ctrl_c), vec![Effect::Quit]);
    // Ctrl-C quits even while typing a filter.
    let mut a = app();
    a.handle(ch('/'));
    let ctrl_c = AppEvent::Input(Event::Key(KeyEvent::new(
        KeyCode::Char('c'),
        KeyModifiers::CONTROL,
    )));
    assert_eq!(a.handle(ctrl_c), vec![Effect::Quit]);
    let mut a = app();
    assert_eq!(a.handle(AppEvent::Signal), vec![Effect::Quit]);
}

#[test]
fn only_presses_count() {
    let mut a = app();
    let before = a.overview.selected;
    let mut release = KeyEvent::new(KeyCode::Down, KeyModifiers::NONE);
    release.kind = KeyEventKind::Release;
    a.handle(AppEvent::Input(Event::Key(release)));
    assert_eq!(a.overview.selected, before);
    let mut release = KeyEvent::new(KeyCode::Char('q'), KeyModifiers::NONE);
    release.kind = KeyEventKind::Release;
    assert!(a.handle(AppEvent::Input(Event::Key(release))).is_empty());
}

#[test]
fn pause_freezes_the_view() {
    let mut a = app();
    assert_eq!(a.handle(AppEvent::Changed), vec![Effect::Refresh]);
    assert!(a.handle(ch('p')).is_empty());
    assert!(a.paused);
    assert!(a.handle(AppEvent::Changed).is_empty());
    // Without a demo, space pauses the view too.
    assert_eq!(a.handle(ch(' ')), vec![Effect::Refresh]);
    assert!(!a.paused);
    let f = {
        a.paused = true;
        vramscope_ui::render_buffer(&a, 80, 24)
    };
    let top: String = f.content[..80].iter().map(|c| c.symbol()).collect();
    assert!(top.contains("PAUSED"), "{top}");
}

#[test]
fn demo_keys() {
    let mut a = app_with(&FX, cfg(false), 80, 24);
    a.set_demo_status(Some(DemoStatus {
        scenario: "leak".into(),
        caption: "x".into(),
        progress: 0.1,
        speed: 1.0,
        paused: false,
        runs: 0,
        replay: false,
        ended: false,
    }));
    assert_eq!(a.handle(ch(' ')), vec![Effect::DemoTogglePause]);
    assert!(!a.paused, "space pauses the simulation, not the view");
    assert_eq!(a.handle(ch(']')), vec![Effect::DemoSpeed(2.0)]);
    assert_eq!(a.handle(ch('[')), vec![Effect::DemoSpeed(0.5)]);
    // p still pauses the view.
    a.handle(ch('p'));
    assert!(a.paused);
}

#[test]
fn mouse_selects_opens_and_scrolls() {
    let mut a = app();
    let body = a.table_body();
    let click = |row: u16| {
        AppEvent::Input(Event::Mouse(MouseEvent {
            kind: MouseEventKind::Down(MouseButton::Left),
            column: body.x + 3,
            row,
            modifiers: KeyModifiers::NONE,
        }))
    };
    let order = pids(&a);
    a.handle(click(body.y + 2));
    assert_eq!(selected_pid(&a), order[2]);
    assert_eq!(a.screen, Screen::Overview);
    // A click outside the rows does nothing.
    a.handle(click(body.y + 15));
    assert_eq!(selected_pid(&a), order[2]);
    // Clicking the selected row opens it.
    assert_eq!(a.handle(click(body.y + 2)), vec![Effect::Refresh]);
    assert_eq!(a.screen, Screen::Process);
    a.handle(key(KeyCode::Esc));
    let wheel = AppEvent::Input(Event::Mouse(MouseEvent {
        kind: MouseEventKind::ScrollDown,
        column: 10,
        row: 10,
        modifiers: KeyModifiers::NONE,
    }));
    a.handle(wheel);
    assert_eq!(selected_pid(&a), order[3]);
}

#[test]
fn resize_asks_for_a_new_snapshot() {
    let mut a = app();
    a.handle(key(KeyCode::Enter));
    let before = a.view_options().timeline.unwrap().columns;
    assert_eq!(
        a.handle(AppEvent::Input(Event::Resize(200, 60))),
        vec![Effect::Refresh]
    );
    let after = a.view_options().timeline.unwrap().columns;
    assert!(after > before);
}

#[test]
fn initial_process_by_pid() {
    let mut a = app();
    assert!(a.open_pid(FX.key_of("oom").unwrap().pid));
    assert_eq!(a.screen, Screen::Process);
    assert!(!app().open_pid(1));
}

/// `C` in the process view posts command 5 (capture stacks, 10 steps,
/// the producer's depth); the report says what was granted and from which
/// step, or in one line that an older producer does not capture.
#[test]
fn capture_stacks_key_posts_command_5_and_reports_the_answer() {
    let mut a = app();
    a.overview.selected = FX.key_of("leak");
    a.open();
    refresh(&mut a, &FX);
    let fx = a.handle(ch('C'));
    let [Effect::RunCommand {
        key, pid, command, ..
    }] = fx.as_slice()
    else {
        panic!("{fx:?}")
    };
    assert_eq!(
        *command,
        Command::CaptureStacks {
            steps: 10,
            depth: 0
        }
    );
    assert_eq!(command.encode(), (5, 10));
    let (key, pid, command) = (*key, *pid, *command);
    let done = |status, result0, result1| {
        AppEvent::CommandDone(vramscope_ui::CommandDone {
            key,
            pid,
            command,
            result: Ok(Outcome {
                status,
                result0,
                result1,
                result2: 0,
            }),
        })
    };
    let text = |a: &App| -> String {
        let buf = vramscope_ui::render_buffer(a, 100, 30);
        buf.content.iter().map(|c| c.symbol()).collect()
    };
    a.handle(done(Status::Ok, 10, 41));
    assert!(text(&a).contains("capturing stacks for 10 steps from step 41"));
    a.handle(key_esc());
    // A producer that bounds the steps says so.
    a.handle(ch('C'));
    a.handle(done(Status::Ok, 4, 41));
    assert!(text(&a).contains("capturing stacks for 4 steps from step 41 (asked 10"));
    a.handle(key_esc());
    a.handle(ch('C'));
    a.handle(done(Status::Unsupported, 0, 0));
    assert!(text(&a).contains("stack capture unsupported (producer older than FORMAT 1.1)"));
    // Read-only: nothing is sent.
    let mut ro = app_with(&FX, cfg(true), 80, 24);
    ro.overview.selected = FX.key_of("leak");
    ro.open();
    assert!(ro.handle(ch('C')).is_empty());
}

fn key_esc() -> AppEvent {
    key(KeyCode::Esc)
}

// Issue 46, item 3: scrolling is bounded everywhere, with the same keys in
// every scrolled pane (one scroll type, `vramscope_ui::Scroll`).

/// Where a scrolled pane of an app is: the first line it shows.
type Offset = fn(&App) -> usize;

/// What `a` draws, as text.
fn screen(a: &App) -> String {
    let buf = vramscope_ui::render_buffer(a, a.size.width, a.size.height);
    buf.content.iter().map(|c| c.symbol()).collect()
}

/// `k` pressed into `a`, and the snapshot it then asks for taken (the
/// events pane asks for the history further back as it scrolls).
fn press(a: &mut App, k: KeyCode) {
    if a.handle(key(k)).contains(&Effect::Refresh) {
        refresh(a, &FX);
    }
}

/// The scroll keys on whatever scrolls in `a` (its first line shown:
/// `offset`): `end_keys` go to the end, where `j` does nothing and `k`
/// then moves at once (no press is lost past the end); `g` and Home go
/// to the top; PgDn goes a page and never past the end, PgUp back; any
/// number of `j` stops at the end.
fn scrolls_within_its_lines(a: &mut App, offset: Offset, end_keys: &[KeyCode]) {
    use KeyCode::{Char, Home, PageDown, PageUp};
    press(a, end_keys[0]);
    let last = offset(a);
    assert!(
        last > 2,
        "the lines fit: nothing to scroll ({last})\n{}",
        screen(a)
    );
    let at_end = screen(a);
    for _ in 0..3 {
        press(a, Char('j'));
        assert_eq!(offset(a), last, "j at the end");
    }
    assert_eq!(screen(a), at_end);
    press(a, Char('k'));
    assert_eq!(offset(a), last - 1, "k after j at the end");
    assert_ne!(screen(a), at_end, "k moves the lines at once");
    for top in [Char('g'), Home] {
        press(a, top);
        assert_eq!(offset(a), 0, "{top:?}");
        for &end in end_keys {
            press(a, end);
            assert_eq!(offset(a), last, "{end:?}");
            assert_eq!(screen(a), at_end, "{end:?}");
            press(a, top);
        }
    }
    press(a, PageDown);
    let page = offset(a);
    assert!(page > 1 && page <= last, "PgDn: {page} of {last}");
    press(a, PageUp);
    assert_eq!(offset(a), 0, "PgUp");
    press(a, end_keys[0]);
    press(a, PageUp);
    assert_eq!(offset(a), last - page, "PgUp from the end");
    press(a, PageDown);
    press(a, PageDown);
    assert_eq!(offset(a), last, "PgDn stops at the end");
    for _ in 0..50 {
        press(a, Char('j'));
    }
    assert_eq!(offset(a), last, "j stops at the end");
    press(a, Char('k'));
    assert_eq!(offset(a), last - 1, "k after many j");
}

fn legend_offset(a: &App) -> usize {
    match a.overlay {
        Some(Overlay::Legend(s)) => s.offset(),
        ref o => panic!("no legend: {o:?}"),
    }
}

fn help_offset(a: &App) -> usize {
    match a.overlay {
        Some(Overlay::Help(s)) => s.offset(),
        ref o => panic!("no help: {o:?}"),
    }
}

/// The issue's own steps: at 80x24, `j` fifty times in the legend, then
/// one `k` shows the line before at once; Home, `g` and PgUp go back up.
#[test]
fn item3_the_legend_stops_at_its_last_line() {
    let mut a = app();
    a.handle(ch('L'));
    let top = screen(&a);
    let mut seen = Vec::new();
    for _ in 0..50 {
        a.handle(ch('j'));
        seen.push(legend_offset(&a));
    }
    let last = *seen.last().unwrap();
    // The offset climbs to the last line's page and stays there.
    let first_at_end = seen.iter().position(|o| *o == last).unwrap();
    assert!(first_at_end < 49, "j went on counting: {seen:?}");
    assert!(seen[first_at_end..].iter().all(|o| *o == last), "{seen:?}");
    let at_end = screen(&a);
    assert!(at_end.contains("G M K B"), "the legend's last line");
    a.handle(ch('k'));
    assert_eq!(legend_offset(&a), last - 1);
    assert_ne!(screen(&a), at_end, "k moved nothing");
    for top_key in [KeyCode::Home, KeyCode::Char('g'), KeyCode::PageUp] {
        a.handle(ch('G'));
        assert_eq!(screen(&a), at_end, "G: the end");
        for _ in 0..3 {
            a.handle(key(top_key));
        }
        assert_eq!(legend_offset(&a), 0, "{top_key:?}");
        assert_eq!(screen(&a), top, "{top_key:?}");
    }
}

#[test]
fn item3_every_overlay_that_scrolls_is_bounded() {
    use KeyCode::{Char, End};
    // The legend at 80x24, the help at 40x10.
    let mut a = app();
    a.handle(ch('L'));
    scrolls_within_its_lines(&mut a, legend_offset, &[Char('G'), End]);
    let mut a = app_with(&FX, cfg(false), 40, 10);
    a.handle(ch('?'));
    scrolls_within_its_lines(&mut a, help_offset, &[Char('G'), End]);
}

/// The process view's panes (one tab each at 80x16): `G` goes to the end
/// of the pane (End still follows live on the timeline), and the rest as
/// in every scrolled pane.
#[test]
fn item3_every_pane_of_the_process_view_is_bounded() {
    let panes: [(&str, char, Offset); 4] = [
        ("leak", '2', |a| a.process.block_scroll.offset()),
        ("leak", '3', |a| a.process.stats_scroll.offset()),
        ("leak", '4', |a| a.process.event_scroll.offset()),
        ("oom", '5', |a| a.process.diagnosis_scroll.offset()),
    ];
    for (scenario, tab, offset) in panes {
        let mut a = app_with(&FX, cfg(false), 80, 16);
        a.overview.selected = FX.key_of(scenario);
        a.open();
        refresh(&mut a, &FX);
        a.handle(ch(tab));
        scrolls_within_its_lines(&mut a, offset, &[KeyCode::Char('G')]);
        a.handle(ch('f'));
        assert!(!a.process.follow);
        a.handle(key(KeyCode::End));
        assert!(a.process.follow, "End follows live");
    }
}

/// The step diff overlay scrolls its rows the same way (a row with its
/// code location takes two lines: the last page is the rows that fit).
#[test]
fn item3_the_step_diff_is_bounded() {
    let mut a = app_with(&FX, cfg(false), 80, 16);
    a.overview.selected = FX.key_of("leak");
    a.open();
    refresh(&mut a, &FX);
    a.handle(ch('d'));
    fn offset(a: &App) -> usize {
        match a.overlay {
            Some(Overlay::StepDiff(d)) => d.scroll.offset(),
            ref o => panic!("no step diff: {o:?}"),
        }
    }
    scrolls_within_its_lines(&mut a, offset, &[KeyCode::Char('G'), KeyCode::End]);
    // At the end, the table's last row is on the overlay's last line.
    a.handle(ch('G'));
    let f = screen(&a);
    assert!(f.contains("model.head"), "{f}");
}

/// By module moves its cursor with the same keys: `G`/End to the last
/// row (where any number of `j` stops too), `g`/Home to the first, PgDn a
/// page of rows; Enter shows the module under it in the block map.
#[test]
fn item3_by_module_moves_its_cursor_with_the_scroll_keys() {
    use vramscope_ui::blockmap::Only;
    let module_at = |keys: &[KeyCode]| -> Option<Only> {
        let mut a = app_with(&FX, cfg(false), 80, 24);
        a.overview.selected = FX.key_of("leak");
        a.open();
        refresh(&mut a, &FX);
        a.handle(ch('M'));
        for k in keys {
            a.handle(key(*k));
        }
        a.handle(key(KeyCode::Enter));
        assert_eq!(a.overlay, None);
        a.process.only.clone()
    };
    use KeyCode::{Char, End, Home, PageDown};
    let first = module_at(&[]);
    let last = module_at(&[Char('j'); 200]);
    assert!(first.is_some() && last.is_some() && first != last);
    assert_eq!(module_at(&[Char('G')]), last);
    assert_eq!(module_at(&[End]), last);
    assert_eq!(module_at(&[Char('G'), Char('g')]), first);
    assert_eq!(module_at(&[End, Home]), first);
    assert_eq!(module_at(&[Char('G'), Char('k'), Char('j')]), last);
    let one = module_at(&[Char('j')]);
    let page = module_at(&[PageDown]);
    assert!(page != first && page != one, "PgDn moves a page of rows");
    assert_eq!(module_at(&[PageDown; 20]), last);
}

/// Issue 46, item 24: the By module cursor follows the module, not the
/// row: when the rows reorder (live, or a new sort), Enter takes the
/// module that was highlighted, wherever its row went.
#[test]
fn item24_by_module_selection_follows_the_module_when_rows_reorder() {
    let module_after = |keys: &[char]| {
        let mut a = app_with(&FX, cfg(false), 100, 30);
        a.overview.selected = FX.key_of("leak");
        a.open();
        refresh(&mut a, &FX);
        a.handle(ch('M'));
        for k in keys {
            a.handle(ch(*k));
        }
        a.handle(key(KeyCode::Enter));
        a.process.only.clone()
    };
    // The third row by bytes, Enter at once and after the rows were
    // sorted by name (the cursor's row then holds another module).
    let picked = module_after(&['j', 'j']);
    assert!(picked.is_some());
    assert_ne!(
        module_after(&['o', 'j', 'j']),
        picked,
        "the rows did reorder"
    );
    assert_eq!(module_after(&['j', 'j', 'o']), picked);
    assert_eq!(module_after(&['j', 'j', 'o', 'O']), picked);
}
