//! Frame render time: the whole screen at 200×60 with 8 instrumented
//! processes (plus one NVML-only), drawn into a TestBackend. Targets: the
//! overview (with its history band and sparklines) ≤ 1 ms, the process
//! view (all panes) ≤ 2 ms. Also what the snapshot behind each costs (the
//! model's view, taken off the drawing path).

use criterion::{criterion_group, criterion_main, Criterion};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use vramscope_ui::fixtures::{app_with, refresh, Fixture};
use vramscope_ui::{draw, App, AppConfig, Pane, Theme};

fn config() -> AppConfig {
    AppConfig {
        readonly: false,
        theme: Theme::new(true, false),
        ..AppConfig::default()
    }
}

fn bench_frame(c: &mut Criterion, name: &str, app: &App) {
    let mut term = Terminal::new(TestBackend::new(app.size.width, app.size.height)).unwrap();
    let mut flip = false;
    c.bench_function(name, |b| {
        b.iter(|| {
            // Alternate the selection's highlight so every frame has changes
            // to diff and flush, as a live dashboard does.
            flip = !flip;
            let mut a = app.clone();
            a.paused = flip;
            term.draw(|f| draw(f, &a)).unwrap();
        })
    });
}

fn frames(c: &mut Criterion) {
    let fx = Fixture::new(8);
    let overview = app_with(&fx, config(), 200, 60);
    bench_frame(c, "frame 200x60 overview, 9 processes", &overview);

    let mut process = app_with(&fx, config(), 200, 60);
    process.overview.selected = fx.key_of("fragmentation");
    process.open();
    refresh(&mut process, &fx);
    bench_frame(c, "frame 200x60 process view (all panes)", &process);

    let mut compact = app_with(&fx, config(), 80, 24);
    compact.overview.selected = fx.key_of("fragmentation");
    compact.open();
    compact.process.pane = Pane::Blocks;
    refresh(&mut compact, &fx);
    bench_frame(c, "frame 80x24 block map tab", &compact);

    let opts = process.view_options();
    c.bench_function(
        "snapshot (model view) for the process view, 9 processes",
        |b| b.iter(|| fx.snapshot(&opts)),
    );
    let opts = overview.view_options();
    assert!(
        opts.timeline.is_some(),
        "the overview's history asks for timelines"
    );
    c.bench_function(
        "snapshot (model view) for the overview with history, 9 processes",
        |b| b.iter(|| fx.snapshot(&opts)),
    );
}

criterion_group!(benches, frames);
criterion_main!(benches);
