//! The forecast by simulation (`vramscope_core::sim::ahead`) on real jobs
//! recorded on an H200 (torch 2.11, `tests/gpu/forecast_fit.sh`): GPT-2,
//! ViT, Llama and BERT, each keeping a fixed leak a step under a memory
//! fraction until its allocations fail. At 30 %, 50 % and 80 % of the way
//! to the first real out-of-memory error, the job's requests up to there
//! are replayed under its own limit and its last step repeated forward:
//! the step that fails must be within 2 of the real one. The same through
//! the live path: the recording played through a hub whose advisor
//! follows the job, the forecast read from its snapshots at each step as
//! the dashboard, `snapshot --json` and the exporter read it.

mod common;

use std::path::{Path, PathBuf};

use common::{forecasts_at_marks, marks_seen, recording, Advising};
use vramscope_collect::given::Given;
use vramscope_core::model::forecast::{Forecast, Method};
use vramscope_core::sim::ahead;
use vramscope_core::sim::from_events::step_ends;
use vramscope_core::sim::SimConfig;

/// The eight jobs recorded on the H200 (the last four held out).
const H200_JOBS: [&str; 8] = [
    "gpt2-leak48",
    "vit-leak80",
    "llama-leak64",
    "bert-leak24",
    "gpt2-leak32",
    "vit-leak40",
    "llama-leak96",
    "bert-leak16",
];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings/forecast")
}

/// The real first out-of-memory step and what it tried to allocate;
/// (share of the way, step the forecast was made at, step it names, what
/// it says fails).
type Made = Vec<(f64, u64, Option<u64>, Option<u64>)>;
fn forecasts(name: &str) -> ((u64, Option<u64>), Made) {
    let truth: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir().join(format!("{name}.truth.json"))).unwrap())
            .unwrap();
    let real = truth["first_oom_step"].as_u64().unwrap();
    // (The H100 recordings' truth does not say.)
    let tried = truth["first_oom"]["alloc_size"].as_u64();
    let pid = truth["pid"].as_u64().map(|p| p as u32);
    let rec = recording(&dir(), name);
    let given = Given::open(rec.path()).unwrap();
    let r = given.recorded(pid, 0).unwrap();
    let (limit, whole) = r.limit.expect("the job stated its limit");
    assert!(!whole, "{name}: a memory fraction");
    let capacity = r.capacity.expect("NVML's total").0;
    let cfg = SimConfig {
        capacity,
        memory_fraction: Some(limit as f64 / capacity as f64),
        ..SimConfig::default()
    };
    let ends = step_ends(&r.got.marks);
    let out = [0.3, 0.5, 0.8]
        .into_iter()
        .map(|share| {
            let k = (share * real as f64).round() as usize;
            let a = ahead::at_step(&r.got.requests, &ends, k, &cfg).unwrap();
            let f = a.failure;
            (
                share,
                k as u64,
                f.map(|f| k as u64 + f.step),
                f.map(|f| f.bytes),
            )
        })
        .collect();
    ((real, tried), out)
}

#[test]
fn the_replay_forward_names_the_real_oom_step_within_two() {
    let mut table = Vec::new();
    for name in [
        "gpt2-leak48",
        "vit-leak80",
        "llama-leak64",
        "bert-leak24",
        "leak-oom",
        "leak-oom-12",
        // Held out: recorded after the forecast was built.
        "gpt2-leak32",
        "llama-leak96",
        "vit-leak40",
        "bert-leak16",
    ] {
        let ((real, tried), made) = forecasts(name);
        println!("{name}: real OOM step {real}, tried to allocate {tried:?}; (share, at step, forecast, fails): {made:?}");
        table.push((name, real, tried, made));
    }
    for (name, real, tried, made) in table {
        for (share, at, f, bytes) in made {
            // The allocation that fails is the one torch said it tried.
            if tried.is_some() {
                assert_eq!(bytes, tried, "{name}: at step {at}");
            }
            let f = f.unwrap_or_else(|| panic!("{name}: no failure forecast at step {at}"));
            assert!(
                f.abs_diff(real) <= 2,
                "{name}: at {share} of the way (step {at}) the forecast is step {f}, the real OOM step {real}"
            );
        }
    }
}

/// The forecast at each of the job's own step marks, as a hub (with the
/// live advisor when `advise`) shows it: (step, forecast).
fn live_forecasts(name: &str, advise: Advising) -> Vec<(u64, Option<Forecast>)> {
    forecasts_at_marks(recording(&dir(), name).path(), advise)
}

/// Through the hub and its advisor: from 30 % of the way on, the forecast
/// is the simulator's, within 2 steps of the real out-of-memory step, and
/// never further from it than the projection a hub without the advisor
/// makes at the same step.
#[test]
fn the_live_forecast_is_the_simulators_from_30_percent_on() {
    for name in [
        "gpt2-leak48",
        "vit-leak80",
        "llama-leak64",
        "bert-leak24",
        "gpt2-leak32",
        "bert-leak16",
    ] {
        let ((real, tried), _) = forecasts(name);
        let all = live_forecasts(name, Advising::All);
        let projected: std::collections::HashMap<u64, Option<Forecast>> =
            live_forecasts(name, Advising::Off).into_iter().collect();
        let mut shown = Vec::new();
        for (step, f) in all.iter().filter(|(s, _)| *s * 10 >= real * 3 && *s < real) {
            // The user mark of step s opens it: the forecast is the one
            // made at the end of step s - 1.
            let f = f.unwrap_or_else(|| panic!("{name}: no forecast at step {step}"));
            assert_eq!(f.method, Method::Simulation, "{name}: at step {step}");
            assert_eq!(f.request, tried, "{name}: at step {step}");
            assert!(
                f.oom_step.abs_diff(real) <= 2,
                "{name}: at step {step} the forecast is step {}, the real OOM step {real}",
                f.oom_step
            );
            let p = projected[step].map(|p| {
                assert_eq!(p.method, Method::Projection);
                p.oom_step
            });
            if let Some(p) = p {
                assert!(
                    f.oom_step.abs_diff(real) <= p.abs_diff(real),
                    "{name}: at step {step} simulated {}, projected {p}, real {real}",
                    f.oom_step
                );
            }
            if shown.is_empty() {
                println!("{name}: {}", vramscope_ui::diagnosis::forecast_text(&f));
            }
            shown.push((*step, f.oom_step, p));
        }
        println!("{name}: real {real}; live (step, simulated, projected): {shown:?}");
        assert!(!shown.is_empty());
    }
}

/// Without `--advise` (the dashboard, `serve`): the advisor takes up a
/// process once its projected forecast shows, from the tensors it holds
/// then; a few steps later (its warm-up, then two steps to repeat) the
/// forecast is the simulator's, within 2 steps of the real OOM step.
#[test]
fn a_projected_forecast_brings_the_advisor_and_its_simulation() {
    for name in H200_JOBS {
        let ((real, _), _) = forecasts(name);
        let all = live_forecasts(name, Advising::WhenForecast);
        let first = all
            .iter()
            .find(|(_, f)| f.is_some())
            .map(|(s, _)| *s)
            .unwrap_or_else(|| panic!("{name}: no forecast"));
        let simulated: Vec<(u64, u64)> = (all.iter())
            .filter(|(s, _)| *s < real)
            .filter_map(|(s, f)| Some((*s, f.filter(|f| f.method == Method::Simulation)?.oom_step)))
            .collect();
        println!(
            "{name}: real {real}, projected from step {first}, simulated from step {:?}: {:?}",
            simulated.first().map(|s| s.0),
            simulated
                .iter()
                .map(|s| s.1)
                .collect::<std::collections::BTreeSet<_>>()
        );
        let from = simulated.first().map(|s| s.0).unwrap_or(u64::MAX);
        assert!(
            from <= first + 6,
            "{name}: simulated from step {from}, projected from {first}"
        );
        for (s, oom) in &simulated {
            assert!(
                oom.abs_diff(real) <= 2,
                "{name}: at step {s}: {oom} against {real}"
            );
        }
        // From then on it stays the simulator's.
        let later = all.iter().filter(|(s, _)| *s > from && *s < real);
        for (s, f) in later {
            assert_eq!(
                f.map(|f| f.method),
                Some(Method::Simulation),
                "{name}: step {s}"
            );
        }
    }
}

/// Events lost on the wire after the advisor began: its replay is no
/// longer the job's. It stops, saying why, and the forecast goes back to
/// the projection (the model resyncs from a snapshot; a replay cannot).
#[test]
fn events_lost_after_the_advisor_began_stop_it_and_say_so() {
    let name = "gpt2-leak48";
    let seen = marks_seen(
        recording(&dir(), name).path(),
        Advising::All,
        Some((30, 5000)),
    );
    for (step, f, stopped) in &seen {
        let method = f.map(|f| f.method);
        if (20..30).contains(step) {
            assert_eq!(method, Some(Method::Simulation), "step {step}");
            assert_eq!(stopped, &None, "step {step}");
        }
        if (30..45).contains(step) {
            assert_eq!(method, Some(Method::Projection), "step {step}");
        }
        // The snapshot that finds the loss stops the advisor; the next
        // one shows why.
        if (31..45).contains(step) {
            let why = stopped.as_deref().unwrap_or_default();
            assert!(why.contains("lost 5000 events"), "step {step}: {why:?}");
        }
    }
}
