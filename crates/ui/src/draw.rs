//! The whole screen drawn for an [`App`]: each pane in its place, and the
//! same picture as a buffer or an SVG file (screenshots, tests).

use std::path::Path;

use anyhow::Result;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::{Frame, Terminal};

use vramscope_collect::demo::DemoStatus;
use vramscope_collect::Hub;

use crate::app::{App, AppEvent, Effect};
use crate::driver::{app_config, UiOptions};
use crate::shell;
use crate::state::{Overlay, Screen};
use crate::{
    advisor, attribution, bars, help, layout, legend, overview, popup, process, state, stepdiff,
    svg, theme, trace, willfit,
};

/// Draws the whole screen for `app`.
pub fn draw(frame: &mut Frame, app: &App) {
    let t = &app.config.theme;
    let areas = layout::screen(frame.area(), app.caption_lines());
    bars::render_header(frame, areas.header, app);
    if let (Some(area), Some(c)) = (areas.caption, app.caption()) {
        c.render(frame, area, t);
    }
    match app.screen {
        Screen::Overview => overview::render(
            frame,
            areas.body,
            &app.snap,
            &app.overview,
            (app.typing(), app.trace.is_some()),
            t,
        ),
        Screen::Process => process::render(frame, areas.body, app),
    }
    bars::render_footer(frame, areas.footer, app);
    if let Some(action) = &app.action {
        popup::render(frame, areas.body, action, t);
    }
    match (app.overlay, app.screen) {
        (Some(Overlay::Help(scroll)), _) => help::render(
            frame,
            frame.area(),
            (app.config.readonly, app.playing()),
            scroll,
            t,
        ),
        (Some(Overlay::Stacks), _) => {
            if let Some(s) = &app.trace {
                trace::render_stacks(frame, areas.body, s, t);
            }
        }
        (Some(Overlay::Legend(scroll)), _) => legend::render(frame, frame.area(), scroll, t),
        (Some(Overlay::Modules(m)), Screen::Process) => {
            if let Some(e) = app.selected_entry() {
                let letters = app.process.letters.get(&e.key());
                attribution::render(frame, areas.body, &e.view.attribution, letters, &m, t);
            }
        }
        (Some(Overlay::StepDiff(d)), Screen::Process) => {
            if let Some(e) = app.selected_entry() {
                stepdiff::render(frame, areas.body, &e.view, &d, t);
            }
        }
        (Some(Overlay::Advisor(v)), Screen::Process) => {
            if let Some(e) = app.selected_entry() {
                advisor::render(frame, areas.body, e.advice.as_ref(), &v, t);
            }
        }
        (Some(Overlay::Fit), Screen::Process) => {
            if let Some(e) = app.selected_entry() {
                let own_peak = e.view.figures.peak_reserved;
                willfit::render(frame, areas.body, e.advice.as_ref(), own_peak, t);
            }
        }
        _ => {}
    }
    if t.ascii {
        theme::asciify(frame.buffer_mut());
    }
}

/// A picture to take at once, with no terminal ([`screenshot_now`]).
pub struct Still<'a> {
    /// Columns, rows.
    pub size: (u16, u16),
    /// The collector clock the picture is taken at (ns).
    pub now_ns: u64,
    /// The timeline's window: the first of [`state::SPANS_NS`] at least
    /// this long (else the default).
    pub window_ns: Option<u64>,
    pub path: &'a Path,
}

/// Writes the dashboard as it shows `hub` at `still.now_ns` as SVG, with
/// no terminal: the process view of `opts.initial_process` when it is
/// there, else the overview; `demo` in the caption band. For `demo
/// --headless` and `snapshot`.
pub fn screenshot_now(
    hub: &Hub,
    demo: Option<DemoStatus>,
    opts: &UiOptions,
    still: Still,
) -> Result<()> {
    let (size, now) = (still.size, still.now_ns);
    let mut app = App::new(app_config(opts, shell::no_color_env()));
    app.size = Rect::new(0, 0, size.0, size.1);
    app.set_demo_status(demo);
    if let Some(w) = still.window_ns {
        app.process.span_index = state::SPANS_NS
            .iter()
            .position(|s| *s >= w)
            .unwrap_or(state::SPANS_NS.len() - 1);
    }
    let mut fx = app.handle(AppEvent::Tick { now_ns: now });
    // A snapshot for the screen shown; opening a process asks for another;
    // then the keys asked for, each answered as the dashboard would.
    let keys: Vec<AppEvent> = (opts.keys.chars())
        .map(|c| {
            let code = match c {
                '\n' | '\r' => crossterm::event::KeyCode::Enter,
                '\t' => crossterm::event::KeyCode::Tab,
                c => crossterm::event::KeyCode::Char(c),
            };
            AppEvent::Input(crossterm::event::Event::Key(
                crossterm::event::KeyEvent::new(code, crossterm::event::KeyModifiers::NONE),
            ))
        })
        .collect();
    let mut keys = keys.into_iter();
    for _ in 0..3 + opts.keys.len() * 3 {
        if !fx.contains(&Effect::Refresh) {
            match keys.next() {
                Some(k) => {
                    fx = app.handle(k);
                    fx.push(Effect::Refresh);
                    continue;
                }
                None => break,
            }
        }
        let snap = hub.snapshot_at(now, &app.view_options());
        fx = app.handle(AppEvent::Snapshot(Box::new(snap)));
    }
    svg::write_svg(&render_buffer(&app, size.0, size.1), still.path)
}

/// Draws `app` at `width`×`height` into a buffer (tests, benches, screenshots).
pub fn render_buffer(app: &App, width: u16, height: u16) -> Buffer {
    let mut app = app.clone();
    app.size = Rect::new(0, 0, width, height);
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test backend");
    terminal
        .draw(|f| draw(f, &app))
        .expect("drawing into a test backend")
        .buffer
        .clone()
}
