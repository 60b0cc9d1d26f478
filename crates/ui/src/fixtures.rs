//! The dashboard on the deterministic pictures of
//! [`vramscope_collect::fixtures`], for tests, benchmarks and documentation
//! screenshots.

pub use vramscope_collect::fixtures::Fixture;

/// An app showing `fx` with the view options it asks for (fixed clock).
pub fn app_with(fx: &Fixture, config: crate::AppConfig, width: u16, height: u16) -> crate::App {
    let mut app = crate::App::new(config);
    app.size = ratatui::layout::Rect::new(0, 0, width, height);
    app.clock.now_ns = fx.now_ns;
    app.clock.changed_ns = fx.now_ns;
    app.set_snapshot(fx.snapshot(&app.view_options()));
    app
}

/// Takes a new snapshot of `fx` for what `app` shows now.
pub fn refresh(app: &mut crate::App, fx: &Fixture) {
    app.clock.now_ns = fx.now_ns;
    app.set_snapshot(fx.snapshot(&app.view_options()));
}
