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
