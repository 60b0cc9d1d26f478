//! Flags are scoped to the commands they mean something for: a flag given to
//! a command that does not take it is one line on stderr and exit 2.

use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_flag_of_another_command_is_one_line_and_exit_2() {
    for (args, flag, command) in [
        (
            &["doctor", "--screenshot", "x.svg"][..],
            "--screenshot",
            "vramscope doctor",
        ),
        (&["rings", "--pid", "3"][..], "--pid", "vramscope rings"),
        (
            &["sim", "--interval", "5", "--trace", "t"][..],
            "--interval",
            "vramscope sim",
        ),
        (
            &["agent", "path", "--no-nvml"][..],
            "--no-nvml",
            "vramscope agent path",
        ),
        (&["--readonly", "rings"][..], "--readonly", "vramscope"),
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
        assert!(
            err.contains(&format!("`{command} --help`")),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn help_and_version_still_print_and_succeed() {
    let out = run(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("vramscope "));
    let out = run(&["doctor", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--shm-dir"));
    let out = run(&["sim", "--help"]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("--shm-dir"));
}

/// Issue 30, item 13: a mistyped subcommand, flag or scenario name is one
/// line that suggests the name meant, and exit 2 like every usage error.
#[test]
fn a_mistyped_name_suggests_the_one_meant() {
    for (args, typed, meant) in [
        (&["snapshpt"][..], "snapshpt", "did you mean 'snapshot'?"),
        (
            &["--intervall", "5"][..],
            "--intervall",
            "did you mean '--interval'?",
        ),
        (&["demo", "leek"][..], "leek", "did you mean 'leak'?"),
        (
            &["demo", "leak", "--headles"][..],
            "--headles",
            "did you mean '--headless'?",
        ),
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains(typed) && err.contains(meant),
            "{args:?}: {err}"
        );
    }
}

/// Issue 30, item 3: a missing required argument is named (it was "the
/// following required arguments were not provided:" and nothing).
#[test]
fn a_missing_argument_is_named() {
    for (args, named) in [
        (&["run"][..], "<COMMAND>"),
        (&["demo", "--keys", "M"][..], "--headless"),
        (&["empty-cache"][..], "<PID>"),
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(named), "{args:?}: {err}");
    }
}

/// Issue 30, item 12: `open --at` past the trace is refused with the range
/// (it was clamped without a word), and a negative index is a range error
/// (it was "unexpected argument").
#[test]
fn open_at_outside_the_trace_names_the_range() {
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/snapshots/torch-2.11/torch-2.11-all.pickle"
    );
    let out = run(&["open", file, "--json", "--at", "99999"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("601 trace events") && err.contains("0 (before the first) to 601"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    let out = run(&["open", file, "--json", "--at", "-1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("'-1'") && err.contains("at least 0"), "{err}");
    // The whole trace is still a valid --at.
    let out = run(&["open", file, "--json", "--at", "601"]);
    assert_eq!(out.status.code(), Some(0));
}

/// Issue 30, item 12: `open` on a recording says what it is and which
/// command opens it (it was "opcode 0x56 is not one snapshot files use").
#[test]
fn open_on_a_recording_points_to_replay() {
    let rec = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/recordings/diag/gpt2-fast.mid.vsrec"
    );
    let out = run(&["open", rec, "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("is a vramscope recording") && err.contains("vramscope replay"),
        "{err}"
    );
}

/// Issue 30, item 12: `doctor --json` is one JSON document (it was JSON
/// Lines, where `snapshot --json` is one document).
#[test]
fn doctor_json_is_one_document() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&[
        "doctor",
        "--json",
        "--shm-dir",
        dir.path().to_str().unwrap(),
    ]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let checks = doc["checks"].as_array().expect("checks");
    assert!(!checks.is_empty());
    assert!(checks
        .iter()
        .all(|c| c["name"].is_string() && c["level"].is_string()));
    let failed = checks
        .iter()
        .filter(|c| c["level"] == "Fail" || c["level"] == "fail")
        .count();
    assert_eq!(doc["failed"].as_u64(), Some(failed as u64), "{doc}");
    assert_eq!(out.status.success(), failed == 0);
}

/// Issue 46, item 22: the help (every subcommand's, as the man page holds
/// them) points at no source file, which an installed binary's user does
/// not have.
#[test]
fn help_points_at_no_source_file() {
    let out = run(&["man"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let sources: Vec<&str> = (text.split_whitespace())
        .filter(|w| {
            let w = w.trim_matches(|c: char| !c.is_alphanumeric() && c != '.' && c != '/');
            w.ends_with(".rs") || w.contains("src/")
        })
        .collect();
    assert!(text.contains("sim"), "{text}");
    assert!(sources.is_empty(), "{sources:?}");
}
