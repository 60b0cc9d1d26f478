//! The settings file applied to the dashboard, its errors, and the shell
//! completions and man page generated from the command line.

mod common;

use common::{dashboard_screenshot, exited_with, succeeded, vramscope};

#[test]
fn the_settings_file_sets_the_sort_and_the_look() {
    let dir = tempfile::tempdir().unwrap();
    let sample =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/config/minimal.toml");
    let shot = dir.path().join("o.svg");
    succeeded(
        dashboard_screenshot(dir.path(), &shot)
            .env("VRAMSCOPE_CONFIG", &sample)
            .output()
            .unwrap(),
    );
    let svg = std::fs::read_to_string(&shot).unwrap();
    // sort = "nvml", descending by default for a figure; ASCII; no colour.
    assert!(svg.contains("sort NVML v"), "{svg}");
    assert!(!svg.contains('┌') && svg.contains("+-"), "ASCII borders");
    assert!(!svg.contains("#11a8cd"), "no colours");
}

#[test]
fn a_bad_settings_file_is_one_line_naming_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("config.toml");
    std::fs::write(&bad, "[dashboard]\nsort = \"RESV\"\nrefresh = 100\n").unwrap();
    let shot = dir.path().join("x.svg");
    let err = exited_with(
        1,
        vramscope()
            .env("VRAMSCOPE_CONFIG", &bad)
            .args(["demo", "--headless", "--duration", "0.1", "--screenshot"])
            .arg(&shot)
            .output()
            .unwrap(),
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("{}:3: key `dashboard.refresh`", bad.display())),
        "{err}"
    );
    // Issue 30, item 12: a headless demo draws no dashboard; the broken
    // file does not stop it.
    succeeded(
        vramscope()
            .env("VRAMSCOPE_CONFIG", &bad)
            .args(["demo", "--headless", "--duration", "0.1"])
            .output()
            .unwrap(),
    );
    // XDG_CONFIG_HOME is where it is looked for; absent is fine.
    let demo = || {
        vramscope()
            .env_remove("VRAMSCOPE_CONFIG")
            .env("XDG_CONFIG_HOME", dir.path())
            .args(["demo", "--headless", "--duration", "0.1", "--screenshot"])
            .arg(&shot)
            .output()
            .unwrap()
    };
    succeeded(demo());
    std::fs::create_dir_all(dir.path().join("vramscope")).unwrap();
    std::fs::write(dir.path().join("vramscope/config.toml"), "[dashboard\n").unwrap();
    assert!(exited_with(1, demo()).contains("vramscope/config.toml:1:"));
}

#[test]
fn completions_and_man_page_cover_every_subcommand() {
    let help = succeeded(vramscope().arg("--help").output().unwrap());
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let subs: Vec<&str> = help
        .split("Commands:")
        .nth(1)
        .unwrap()
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|s| *s != "help")
        .collect();
    assert!(subs.len() >= 10, "{subs:?}");
    for shell in ["bash", "zsh", "fish"] {
        let out = succeeded(vramscope().args(["completions", shell]).output().unwrap());
        let text = String::from_utf8_lossy(&out.stdout);
        for s in &subs {
            assert!(text.contains(s), "{shell}: {s}");
        }
    }
    exited_with(
        2,
        vramscope().args(["completions", "tcsh"]).output().unwrap(),
    );
    let man = succeeded(vramscope().arg("man").output().unwrap());
    let man = String::from_utf8_lossy(&man.stdout);
    assert!(
        man.starts_with(".ie") || man.contains(".TH vramscope 1"),
        "{man}"
    );
    // Issue 30, item 14: one page (one NAME), each command a subsection,
    // and the KEYS (from the key table), ENVIRONMENT and FILES sections.
    assert_eq!(man.matches(".SH NAME").count(), 1);
    for s in &subs {
        assert!(man.contains(&format!(".SS \"vramscope {s}\"")), "{s}");
    }
    for section in [".SH KEYS", ".SH ENVIRONMENT", ".SH FILES"] {
        assert!(man.contains(section), "{section}");
    }
    for key_help in [
        "empty_cache (asks y/n)",
        "legend of the screen",
        "save the screen as SVG",
    ] {
        assert!(man.contains(key_help), "{key_help}");
    }
    for var in ["VRAMSCOPE_SHM_DIR", "VRAMSCOPE_CONFIG", "NO_COLOR"] {
        assert!(man.contains(var), "{var}");
    }
}
