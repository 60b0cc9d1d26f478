//! The fleet view's reader of Prometheus answers on arbitrary bytes:
//! `scripts/fuzz.sh fleet_json 600`. Seeded with answers as Prometheus
//! writes them (vectors, matrices, errors; `NaN`, `±Inf`, `1e308`; many
//! series). Each input is read both as an instant query's answer and as a
//! range query's; what reads goes on through what the view does with it
//! (the fleet built from it, every screen and sort drawn, a process's chart
//! drawn from it), so a value that makes any of that spin or blow up is a
//! timeout (`-timeout`) or a crash here. Past the reader, every value and
//! timestamp must be finite and within ±2^64.
#![no_main]
use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
use libfuzzer_sys::fuzz_target;
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use vramscope_collect::fleet::model::{Fleet, Node, Proc};
use vramscope_collect::fleet::prom::{self, LARGEST};
use vramscope_collect::fleet::view::{FleetView, ProcSeries};
use vramscope_ui::fleet::{FleetApp, FleetEvent};
use vramscope_ui::shell::Wake;
use vramscope_ui::theme::Theme;

fn usable(v: f64) -> bool {
    v.is_finite() && v.abs() <= LARGEST
}

fn draw(v: &FleetApp) {
    let mut term = Terminal::new(TestBackend::new(100, 30)).expect("a test terminal");
    term.draw(|f| vramscope_ui::fleet::render(f, v))
        .expect("drawing to memory");
}

fn key(v: &mut FleetApp, c: KeyCode) {
    let k = Event::Key(KeyEvent::new(c, KeyModifiers::NONE));
    v.handle(FleetEvent::Shell(Wake::Input(k)));
}

fn app() -> FleetApp {
    FleetApp::new(FleetView::new("fuzz".into()), Theme::new(true, false))
}

fuzz_target!(|data: &[u8]| {
    if let Ok(samples) = prom::vector(data, "fuzz") {
        assert!(samples.len() <= prom::MAX_SERIES);
        for s in &samples {
            assert!(usable(s.value), "{s:?}");
            assert!(s.labels.len() <= prom::MAX_LABELS);
        }
        // The same answer as each of the three queries of a refresh.
        let fleet = Fleet::build(&samples, &samples, &samples);
        let mut v = app();
        v.handle(FleetEvent::Fleet(Ok(fleet)));
        // Every sort on the nodes screen, then the jobs, then one node.
        for _ in 0..6 {
            draw(&v);
            key(&mut v, KeyCode::Char('o'));
        }
        key(&mut v, KeyCode::Tab);
        draw(&v);
        key(&mut v, KeyCode::Tab);
        key(&mut v, KeyCode::Enter);
        draw(&v);
    }
    if let Ok(series) = prom::matrix(data, "fuzz") {
        assert!(series.len() <= prom::MAX_SERIES);
        for s in &series {
            assert!(s.points.len() <= prom::MAX_POINTS);
            for &(t, x) in &s.points {
                assert!(usable(t) && usable(x), "{t} {x}");
            }
        }
        // The first two series as one process's allocated and reserved
        // bytes, charted on its node's screen.
        let points = |i: usize| series.get(i).map(|s| s.points.clone()).unwrap_or_default();
        let proc = Proc {
            instance: "n:1".into(),
            pid: "1".into(),
            device: "0".into(),
            running: true,
            ..Proc::default()
        };
        let fleet = Fleet {
            nodes: vec![Node {
                instance: "n:1".into(),
                up: true,
                procs: vec![proc],
                ..Node::default()
            }],
        };
        let mut v = app();
        v.handle(FleetEvent::Fleet(Ok(fleet)));
        key(&mut v, KeyCode::Enter);
        v.handle(FleetEvent::Series {
            instance: "n:1".into(),
            pid: "1".into(),
            result: Ok(ProcSeries {
                instance: "n:1".into(),
                pid: "1".into(),
                allocated: points(0),
                reserved: points(1),
            }),
        });
        draw(&v);
    }
});
