//! The README's claims that a machine can check (issue 30, item D): the
//! example outputs it says a command prints are what the command prints,
//! every flag it names is one the command takes (its `--help`), and the
//! binary's size is the release binary's (when one was built).
mod common;

use std::path::Path;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md")
}

/// The fenced code blocks, each with the paragraph before it.
fn blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut para = String::new();
    let mut ended = false;
    let mut block: Option<(String, String)> = None;
    for line in text.lines() {
        match block.as_mut() {
            Some(_) if line.starts_with("```") => {
                out.extend(block.take());
                para.clear();
            }
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None if line.starts_with("```") => block = Some((para.clone(), String::new())),
            None if line.trim().is_empty() => ended = true,
            None => {
                if std::mem::take(&mut ended) {
                    para.clear();
                }
                para.push_str(line);
                para.push(' ');
            }
        }
    }
    out
}

/// The README outside its fenced code blocks.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn help(sub: &str) -> String {
    let mut cmd = common::vramscope();
    cmd.args(sub.split_whitespace()).arg("--help");
    let out = common::succeeded(cmd.output().expect("runs"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The subcommands `vramscope --help` lists.
fn subcommands() -> Vec<String> {
    let top = help("");
    let list = top.split("Commands:").nth(1).expect("a command list");
    let list = list.split("Options:").next().unwrap_or_default();
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| *w != "help")
        .map(str::to_string)
        .collect()
}

/// Whether `help` names `flag` as an option.
fn takes(help: &str, flag: &str) -> bool {
    help.split(|c: char| c.is_whitespace() || c == ',' || c == '=')
        .any(|w| w == flag)
}

/// What `vramscope ARGS` prints.
fn run(args: &str) -> String {
    let out = common::succeeded(
        common::vramscope()
            .args(args.split_whitespace())
            .output()
            .expect("runs"),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The command of a paragraph that ends "(`demo leak --headless`):" (its
/// block: lines of what the command prints).
fn excerpt_of(before: &str) -> Option<&str> {
    let inner = before.trim_end().strip_suffix("`):")?;
    let start = inner.rfind("(`")?;
    Some(&inner[start + 2..])
}

/// Every block whose paragraph says "`vramscope …` prints" is what that
/// command prints, exactly; one whose paragraph ends "(`demo …`):" holds
/// lines of what it prints.
#[test]
fn example_outputs_are_what_the_commands_print() {
    let mut checked = 0;
    for (before, body) in blocks(&readme()) {
        if let Some(cmd) = excerpt_of(&before) {
            // "On the demo's `leak` scenario (`demo leak --headless`):":
            // lines of what it prints.
            let out = run(cmd);
            for line in body.lines() {
                let line = line.trim();
                assert!(
                    out.lines().any(|l| l.trim() == line),
                    "the README's line of `vramscope {cmd}` is not in its output: {line}\n{out}"
                );
            }
            checked += 1;
            continue;
        }
        let Some(at) = before.find("` prints") else {
            continue;
        };
        let Some(start) = before[..at].rfind('`') else {
            continue;
        };
        let cmd = &before[start + 1..at];
        let Some(args) = cmd.strip_prefix("vramscope ") else {
            continue;
        };
        assert_eq!(run(args), body, "the README's output of `{cmd}`");
        checked += 1;
    }
    assert!(checked >= 2, "{checked} example outputs found");
}

/// The commands the README shows (code spans and code lines that begin
/// with `vramscope`), as (subcommand, its long flags); what follows `--`
/// is another program's.
fn commands(text: &str, subs: &[String]) -> Vec<(String, Vec<String>)> {
    let mut lines: Vec<String> = Vec::new();
    for (_, body) in blocks(text) {
        lines.extend(body.lines().map(str::to_string));
    }
    let p = prose(text);
    lines.extend(p.lines().map(str::to_string));
    lines.extend(p.split('`').skip(1).step_by(2).map(str::to_string));
    let mut out = Vec::new();
    for line in lines {
        let line = line.trim().trim_start_matches("$ ");
        let Some(rest) = line.strip_prefix("vramscope ") else {
            continue;
        };
        let mut words = rest
            .split_whitespace()
            .take_while(|w| *w != "--")
            .peekable();
        let mut sub = match words.peek() {
            Some(w) if subs.iter().any(|s| s == w) => words.next().unwrap_or_default().to_string(),
            _ => String::new(),
        };
        // A subcommand's own subcommand (`vramscope agent build --force`):
        // its flags are that one's.
        if let Some(w) = words.peek().copied() {
            if !sub.is_empty() && nested(&sub).iter().any(|n| n == w) {
                sub = format!("{sub} {w}");
                words.next();
            }
        }
        let flags = words
            .map(|w| w.trim_matches(|c| "[]().,;|".contains(c)))
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(|w| w.split('=').next().unwrap_or(w).to_string())
            .collect();
        out.push((sub, flags));
    }
    out
}

/// The subcommands of `vramscope SUB` (none for most), asked once each.
fn nested(sub: &str) -> Vec<String> {
    static SEEN: std::sync::Mutex<Vec<(String, Vec<String>)>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, n)) = seen.iter().find(|(s, _)| s == sub) {
        return n.clone();
    }
    let h = help(sub);
    let n: Vec<String> = h
        .split("Commands:")
        .nth(1)
        .and_then(|list| list.split("Options:").next())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| *w != "help")
        .map(str::to_string)
        .collect();
    seen.push((sub.to_string(), n.clone()));
    n
}

/// The prose's lists of the commands a flag belongs to: "`--no-nvml`
/// skips NVML (the dashboard, `demo`, `snapshot`)", as (flag, commands;
/// the dashboard is "").
fn flag_lists(text: &str, subs: &[String]) -> Vec<(String, Vec<String>)> {
    let p = prose(text).replace('\n', " ");
    let mut out = Vec::new();
    for (i, _) in p.match_indices('(') {
        let Some(len) = p[i..].find(')') else {
            continue;
        };
        let inner = p[i + 1..i + len].split(';').next().unwrap_or_default();
        let items: Option<Vec<String>> = inner
            .split(", ")
            .map(|it| match it.trim() {
                "the dashboard" => Some(String::new()),
                it => {
                    let name = it.strip_prefix('`')?.strip_suffix('`')?;
                    subs.iter().any(|s| s == name).then(|| name.to_string())
                }
            })
            .collect();
        let Some(items) = items else {
            continue;
        };
        // The flag: the last code span before, with no other code span
        // between it and the list.
        let before = &p[..i];
        let Some(open) = before.rfind("`--") else {
            continue;
        };
        let span = &before[open + 1..];
        let Some(close) = span.find('`') else {
            continue;
        };
        if span[close + 1..].contains('`') {
            continue;
        }
        let flag = span[..close].split_whitespace().next().unwrap_or_default();
        out.push((flag.to_string(), items));
    }
    out
}

/// Every flag the README names with a command is one that command takes,
/// and so is every flag of its "(the dashboard, `demo`, …)" lists.
#[test]
fn flags_named_in_the_readme_are_accepted() {
    let text = readme();
    let subs = subcommands();
    assert!(subs.iter().any(|s| s == "snapshot"), "{subs:?}");
    let mut helps = std::collections::HashMap::new();
    let mut checked = 0;
    let mut wrong = Vec::new();
    let pairs = commands(&text, &subs)
        .into_iter()
        .flat_map(|(sub, flags)| flags.into_iter().map(move |f| (sub.clone(), f)));
    let listed = flag_lists(&text, &subs)
        .into_iter()
        .flat_map(|(flag, subs)| subs.into_iter().map(move |s| (s, flag.clone())));
    let lists = flag_lists(&text, &subs).len();
    assert!(lists >= 2, "the --no-nvml and --interval lists: {lists}");
    for (sub, flag) in pairs.chain(listed) {
        let h = helps.entry(sub.clone()).or_insert_with(|| help(&sub));
        if !takes(h, &flag) {
            wrong.push(format!("vramscope {sub} {flag}"));
        }
        checked += 1;
    }
    assert!(checked >= 20, "{checked} flags checked");
    assert!(
        wrong.is_empty(),
        "flags the README names that are refused: {wrong:?}"
    );
}

/// "about N MB": the release binary's size, within 10 % (when
/// `cargo build --release` has built it; else skipped, saying so).
#[test]
fn the_binary_size_is_the_release_binarys() {
    let text = readme();
    let at = text.find("builds one binary").expect("the install section");
    let claim = text[at..]
        .split("about ")
        .nth(1)
        .and_then(|s| s.split(" MB").next())
        .and_then(|s| s.parse::<f64>().ok())
        .expect("`about N MB`");
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let bin = dir.join("release/vramscope");
    let Ok(meta) = std::fs::metadata(&bin) else {
        println!(
            "SKIPPED: the README's binary size ({claim} MB): no release binary at {} (cargo build --release)",
            bin.display()
        );
        return;
    };
    let mb = meta.len() as f64 / 1e6;
    assert!(
        (mb - claim).abs() <= claim * 0.1,
        "the README says about {claim} MB; {} is {mb:.1} MB",
        bin.display()
    );
}
