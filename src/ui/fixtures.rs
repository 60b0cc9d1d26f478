//! The dashboard on the deterministic pictures of
//! [`crate::collect::fixtures`], for tests, benchmarks and documentation
//! screenshots.

pub use crate::collect::fixtures::Fixture;

/// An app showing `fx` with the view options it asks for (fixed clock).
pub fn app_with(
    fx: &Fixture,
    config: crate::ui::AppConfig,
    width: u16,
    height: u16,
) -> crate::ui::App {
    let mut app = crate::ui::App::new(config);
    app.size = ratatui::layout::Rect::new(0, 0, width, height);
    app.clock.now_ns = fx.now_ns;
    app.clock.changed_ns = fx.now_ns;
    app.set_snapshot(fx.snapshot(&app.view_options()));
    app
}

/// Takes a new snapshot of `fx` for what `app` shows now.
pub fn refresh(app: &mut crate::ui::App, fx: &Fixture) {
    app.clock.now_ns = fx.now_ns;
    app.set_snapshot(fx.snapshot(&app.view_options()));
}
