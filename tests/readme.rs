//! The README's claims that a machine can check (issue 30, item D), and
//! those of the reference pages it links (`docs/*.md`, issue 46, item 25):
//! the example outputs they say a command prints are what the command
//! prints, every flag they name is one the command takes (its `--help`),
//! the binary's size is the release binary's (when one was built), every
//! relative link (screenshots included) leads to a file and heading that
//! exist, and the README stays short.
mod common;

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("README.md")
}

/// The pages under `dir` (relative to the repository) whose names end `.md`,
/// sorted.
fn pages_in(dir: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    out.sort();
    out
}

/// The README and the reference pages it links (`docs/*.md`), as (name,
/// text): what moved out of the README is checked as it was there.
fn texts() -> Vec<(String, String)> {
    let mut out = vec![("README.md".to_string(), readme())];
    for path in pages_in("docs") {
        let name = path
            .strip_prefix(root())
            .unwrap_or(&path)
            .display()
            .to_string();
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        out.push((name, text));
    }
    assert!(out.len() > 1, "no docs/*.md beside the README");
    out
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

/// A page outside its fenced code blocks.
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

/// Every block (of the README and docs/*.md) whose paragraph says
/// "`vramscope …` prints" is what that command prints, exactly; one whose
/// paragraph ends "(`demo …`):" holds lines of what it prints.
#[test]
fn example_outputs_are_what_the_commands_print() {
    let mut checked = 0;
    for (name, text) in texts() {
        checked += example_outputs_of(&name, &text);
    }
    assert!(checked >= 2, "{checked} example outputs found");
}

/// Checks the example outputs of one page (`name`), and says how many.
fn example_outputs_of(name: &str, text: &str) -> usize {
    let mut checked = 0;
    for (before, body) in blocks(text) {
        if let Some(cmd) = excerpt_of(&before) {
            // "On the demo's `leak` scenario (`demo leak --headless`):":
            // lines of what it prints.
            let out = run(cmd);
            for line in body.lines() {
                let line = line.trim();
                assert!(
                    out.lines().any(|l| l.trim() == line),
                    "{name}'s line of `vramscope {cmd}` is not in its output: {line}\n{out}"
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
        assert_eq!(run(args), body, "{name}'s output of `{cmd}`");
        checked += 1;
    }
    checked
}

/// The commands a page shows (code spans and code lines that begin
/// with `vramscope`), as (subcommand, its long flags); what follows `--`
/// is another program's.
fn commands(text: &str, subs: &[String]) -> Vec<(String, Vec<String>)> {
    let mut lines: Vec<String> = Vec::new();
    for (_, body) in blocks(text) {
        lines.extend(body.lines().map(str::to_string));
    }
    let p = prose(text);
    lines.extend(p.lines().map(str::to_string));
    // A code span may wrap across lines (`vramscope` at one line's end,
    // `stacks PID --steps N` at the next's start): it is one command.
    lines.extend(
        p.split('`')
            .skip(1)
            .step_by(2)
            .map(|s| s.replace('\n', " ")),
    );
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

/// Every flag the README and docs/*.md name with a command is one that
/// command takes, and so is every flag of their "(the dashboard, `demo`,
/// …)" lists.
#[test]
fn flags_named_in_the_readme_are_accepted() {
    let subs = subcommands();
    assert!(subs.iter().any(|s| s == "snapshot"), "{subs:?}");
    let mut helps = std::collections::HashMap::new();
    let mut checked = 0;
    let mut lists = 0;
    let mut wrong = Vec::new();
    for (name, text) in texts() {
        let pairs = commands(&text, &subs)
            .into_iter()
            .flat_map(|(sub, flags)| flags.into_iter().map(move |f| (sub.clone(), f)));
        let listed = flag_lists(&text, &subs);
        lists += listed.len();
        let listed = listed
            .into_iter()
            .flat_map(|(flag, subs)| subs.into_iter().map(move |s| (s, flag.clone())));
        for (sub, flag) in pairs.chain(listed) {
            let h = helps.entry(sub.clone()).or_insert_with(|| help(&sub));
            if !takes(h, &flag) {
                wrong.push(format!("{name}: vramscope {sub} {flag}"));
            }
            checked += 1;
        }
    }
    assert!(lists >= 2, "the --no-nvml and --interval lists: {lists}");
    assert!(checked >= 20, "{checked} flags checked");
    assert!(
        wrong.is_empty(),
        "flags the README or docs/*.md name that are refused: {wrong:?}"
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

/// The README is for a newcomer (what it is, install, the demo and the
/// tests, a tour, each command, headline figures, troubleshooting); the
/// reference is in docs/ and the performance log in benches/.
#[test]
fn the_readme_is_short() {
    let lines = readme().lines().count();
    assert!(
        lines < 400,
        "README.md has {lines} lines: move reference material to docs/"
    );
}

/// The relative links of a page outside its code (`[text](target)`,
/// images included), as written.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    // Code spans are not links: drop them before looking.
    let p: String = prose(text)
        .split('`')
        .step_by(2)
        .collect::<Vec<_>>()
        .join(" ");
    for (i, _) in p.match_indices("](") {
        let rest = &p[i + 2..];
        let Some(end) = rest.find(')') else {
            continue;
        };
        let target = rest[..end].trim();
        if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        out.push(target.to_string());
    }
    out
}

/// The anchors of a Markdown page's headings, as GitHub makes them: lower
/// case, only letters, digits, `-`, `_` and spaces kept, spaces as `-`, a
/// repeated one numbered.
fn anchors(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for line in prose(text).lines() {
        let title = line.trim_start_matches('#');
        if title.len() == line.len() || !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.push(if *n == 0 { slug } else { format!("{slug}-{n}") });
        *n += 1;
    }
    out
}

/// Every relative link of the README, docs/*.md and benches/*.md (the
/// screenshots the README shows, the pages text moved to, the sources it
/// names) leads to a file that exists, and a `#heading` to a heading of
/// that page.
#[test]
fn relative_links_lead_to_files_that_exist() {
    let mut pages = vec![root().join("README.md")];
    pages.extend(pages_in("docs"));
    pages.extend(pages_in("benches"));
    let mut checked = 0;
    let mut wrong = Vec::new();
    for page in &pages {
        let name = page
            .strip_prefix(root())
            .unwrap_or(page)
            .display()
            .to_string();
        let text = std::fs::read_to_string(page).unwrap_or_else(|e| panic!("{name}: {e}"));
        let dir = page.parent().expect("a page's folder");
        for link in links(&text) {
            let (path, anchor) = match link.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                page.clone()
            } else {
                dir.join(path)
            };
            checked += 1;
            if !target.exists() {
                wrong.push(format!("{name}: ({link}): no such file"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            let Ok(linked) = std::fs::read_to_string(&target) else {
                wrong.push(format!("{name}: ({link}): not a page with headings"));
                continue;
            };
            if !anchors(&linked).iter().any(|a| a == anchor) {
                wrong.push(format!("{name}: ({link}): no such heading"));
            }
        }
    }
    assert!(checked >= 30, "{checked} links checked");
    assert!(wrong.is_empty(), "links that lead nowhere: {wrong:#?}");
}

/// Every page of docs/ is linked from the README, so that nothing moved
/// there is out of a newcomer's reach.
#[test]
fn every_page_of_docs_is_linked_from_the_readme() {
    let linked = links(&readme());
    let missing: Vec<String> = pages_in("docs")
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(|n| format!("docs/{n}")))
        .filter(|n| {
            !linked
                .iter()
                .any(|l| l.split('#').next() == Some(n.as_str()))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "pages the README does not link: {missing:?}"
    );
}
