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
