//! The layers inside each crate of the workspace, enforced. Between crates
//! the compiler holds the floors (a crate uses only the crates it depends
//! on, and Cargo refuses a circle); inside a crate this test does:
//!
//! - where a crate's `lib.rs` has a "Layers" list (`//! N. name, name …`,
//!   floor 0 first), every `crate::…` and `super::…` path in every file is
//!   read, and an import of a module from one on a lower floor (or from the
//!   same floor: rooms on one floor do not lean on each other) fails,
//!   naming the file and the line;
//! - in every crate, at every depth, modules that share a parent import
//!   each other in no circle (`model::attrib` → `model::roles` →
//!   `model::attrib` fails; a file's own test module is not counted).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every crate of the workspace: its name and its `src` folder (the
/// binary's own `src/` too).
fn crates() -> Vec<(String, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = vec![("vramscope".to_string(), root.join("src"))];
    for e in std::fs::read_dir(root.join("crates")).unwrap() {
        let dir = e.unwrap().path();
        if dir.join("Cargo.toml").is_file() {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            out.push((format!("vramscope-{name}"), dir.join("src")));
        }
    }
    out.sort();
    assert!(
        out.len() >= 5,
        "the workspace's crates were not found: {out:?}"
    );
    out
}

/// The floors in a crate's `lib.rs`: lines `//! N. name, name …` under
/// "Layers", floor 0 first. Empty when it has no such list.
fn floors(src: &Path) -> BTreeMap<String, usize> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    let mut out = BTreeMap::new();
    let mut on = false;
    for line in lib.lines() {
        let Some(text) = line.strip_prefix("//!") else {
            if on {
                break;
            }
            continue;
        };
        let text = text.trim();
        if text.starts_with("Layers") {
            on = true;
            continue;
        }
        if !on {
            continue;
        }
        let Some((n, names)) = text.split_once(". ") else {
            if out.is_empty() {
                continue;
            }
            break;
        };
        let Ok(n) = n.trim().parse::<usize>() else {
            break;
        };
        for name in names.split(|c: char| c == ',' || c.is_whitespace()) {
            let name = name.trim_matches(|c: char| c == '`' || c == '[' || c == ']');
            if !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                out.insert(name.to_string(), n);
            }
        }
    }
    out
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file inside its crate (`model/device/apply.rs` →
/// `model`, `device`, `apply`; a `mod.rs` is its folder's module; `lib.rs`
/// and `main.rs` are the crate's root, the empty path).
fn module_path(src: &Path, path: &Path) -> Vec<String> {
    let rel = path.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.strip_suffix(".rs").unwrap_or(&last).to_string();
    if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
        parts.push(stem);
    }
    parts
}

/// A file's code as whole statements (a `use` group may span lines), each
/// with the line it starts on, its own test module left out.
fn statements(text: &str) -> Vec<(usize, String)> {
    let text = test_module_start(text).map_or(text, |i| &text[..i]);
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let code = code_of(line);
        if let Some((at, mut s)) = pending.take() {
            s.push_str(&code);
            if code.contains(';') {
                out.push((at, s));
            } else {
                pending = Some((at, s));
            }
            continue;
        }
        let starts = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .any(|s| code.trim_start().starts_with(s));
        if starts && !code.contains(';') {
            pending = Some((i, code));
        } else {
            out.push((i, code));
        }
    }
    out
}

/// One crate's files with their module paths and statements.
type Parsed = Vec<(PathBuf, Vec<String>, Vec<(usize, String)>)>;

fn parse(src: &Path) -> Parsed {
    let mut all = Vec::new();
    files(src, &mut all);
    all.sort();
    all.into_iter()
        .map(|p| {
            let me = module_path(src, &p);
            let text = std::fs::read_to_string(&p).unwrap();
            let stmts = statements(&text);
            (p, me, stmts)
        })
        .collect()
}

#[test]
fn no_import_runs_up_or_sideways_between_the_floors_of_a_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut bad = Vec::new();
    let mut listed = 0;
    for (name, src) in crates() {
        let floors = floors(&src);
        if floors.is_empty() {
            continue;
        }
        listed += 1;
        for (path, me, stmts) in parse(&src) {
            let Some(mine) = me.first() else { continue };
            let Some(&my_floor) = floors.get(mine) else {
                bad.push(format!(
                    "{}: module `{mine}` is on no floor of {name}'s lib.rs",
                    path.display()
                ));
                continue;
            };
            for (line, stmt) in &stmts {
                let mut seen = BTreeSet::new();
                for p in paths_named(stmt, &me) {
                    let Some(m) = p.first() else { continue };
                    if m == mine || !seen.insert(m.clone()) {
                        continue;
                    }
                    match floors.get(m) {
                        Some(&f) if f < my_floor => {}
                        Some(&f) => bad.push(format!(
                            "{}:{}: `{mine}` (floor {my_floor}) imports `{m}` (floor {f}): {}",
                            path.strip_prefix(root).unwrap().display(),
                            line + 1,
                            stmt.trim()
                        )),
                        None => {}
                    }
                }
            }
        }
    }
    assert!(listed >= 3, "fewer crates than expected list their floors");
    assert!(
        bad.is_empty(),
        "imports that run up or sideways ({}):\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// Issue 45: in every crate, modules that share a parent (the files of the
/// crate's root, the files of a folder) import each other in no circle,
/// `super::` paths included.
#[test]
fn no_circle_between_modules_that_share_a_parent() {
    let mut circles = Vec::new();
    for (name, src) in crates() {
        let parsed = parse(&src);
        circles.extend(circles_in(&name, &parsed));
    }
    assert!(
        circles.is_empty(),
        "import circles between modules of one parent ({}):\n{}",
        circles.len(),
        circles.join("\n")
    );
}

/// The circles among sibling modules of one crate, each named once by
/// where it starts.
fn circles_in(name: &str, parsed: &Parsed) -> Vec<String> {
    // Every module that exists: each file's path and its prefixes.
    let known: BTreeSet<Vec<String>> = parsed
        .iter()
        .flat_map(|(_, me, _)| (1..=me.len()).map(move |n| me[..n].to_vec()))
        .collect();
    // parent -> (child -> children it imports)
    type Edges = BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>>;
    let mut edges: Edges = BTreeMap::new();
    for (_, me, stmts) in parsed {
        if me.iter().any(|m| m == "tests") {
            continue;
        }
        for (_, stmt) in stmts {
            for p in paths_named(stmt, me) {
                let k = me.iter().zip(&p).take_while(|(a, b)| a == b).count();
                if k >= me.len() || k >= p.len() {
                    continue;
                }
                if known.contains(&p[..=k]) {
                    let from = me[k].clone();
                    edges
                        .entry(p[..k].to_vec())
                        .or_default()
                        .entry(from)
                        .or_default()
                        .insert(p[k].clone());
                }
            }
        }
    }
    let mut out = Vec::new();
    for (parent, graph) in &edges {
        let at = if parent.is_empty() {
            name.to_string()
        } else {
            format!("{name}::{}", parent.join("::"))
        };
        for from in graph.keys() {
            let mut seen = BTreeSet::new();
            let mut todo = vec![from.clone()];
            while let Some(m) = todo.pop() {
                for next in graph.get(&m).into_iter().flatten() {
                    if next == from {
                        out.push(format!("{at}: `{from}` reaches itself (through `{m}`)"));
                    }
                    if seen.insert(next.clone()) {
                        todo.push(next.clone());
                    }
                }
            }
        }
    }
    out.dedup();
    out
}

#[test]
fn a_circle_is_found_at_any_depth() {
    let file = |m: &[&str], code: &str| {
        (
            PathBuf::new(),
            m.iter().map(|s| s.to_string()).collect(),
            statements(code),
        )
    };
    let parsed = vec![
        file(&["model", "a"], "use super::b::X;"),
        file(&["model", "b"], "use crate::model::a::Y;"),
        file(&["model", "c"], "use super::a::Z;"),
        file(&["ui"], "use crate::model::c::W;"),
    ];
    let found = circles_in("demo", &parsed);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].contains("demo::model: `a` reaches itself"),
        "{found:?}"
    );
    // The same shape through a test module is no circle.
    let parsed = vec![
        file(&["model", "a"], "use super::b::X;"),
        file(
            &["model", "b"],
            "fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::model::a::Y;\n}\n",
        ),
    ];
    assert!(circles_in("demo", &parsed).is_empty());
}

/// Code without comments or string literals (so a doc line naming a
/// module is not an import).
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut in_str = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if in_str {
            if c == '\\' {
                chars.next();
            } else if c == '"' {
                in_str = false;
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

/// The top-level modules `text` names after `crate::`, including the
/// first names in a `crate::{a::…, b}` group (the group may span lines:
/// `text` is a whole `use` statement).
fn named(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item = String::new();
            let mut first = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => {
                        if first && !item.is_empty() {
                            out.push(item.clone());
                        }
                        first = true;
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 1 && first {
                    if c.is_ascii_alphanumeric() || c == '_' {
                        item.push(c);
                    } else if !item.is_empty() {
                        out.push(item.clone());
                        first = false;
                    }
                }
            }
            if first && !item.is_empty() {
                out.push(item);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

#[test]
fn the_reader_of_imports_reads_groups_and_paths() {
    assert_eq!(named("use crate::ring::layout::printable;"), ["ring"]);
    assert_eq!(
        named("use crate::{model::{Mode, ProcessKey}, text, ring::x};"),
        ["model", "text", "ring"]
    );
    assert_eq!(named("let t = crate::ring::monotonic_ns();"), ["ring"]);
    assert_eq!(
        code_of("let s = \"crate::ui\"; // crate::model"),
        "let s = ; "
    );
}

/// The modules `stmt` names, as absolute paths: `super::x` (relative to
/// `me`, the file's module path) and `crate::a::b`.
fn paths_named(stmt: &str, me: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let word = |s: &str| -> Vec<String> {
        s.split("::")
            .map(|w| {
                w.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|w| !w.is_empty())
            .collect()
    };
    for (i, _) in stmt.match_indices("super::") {
        // Only the first `super` of a run (`super::super::x`).
        if stmt[..i].ends_with("super::") {
            continue;
        }
        let mut rest = &stmt[i..];
        let mut base = me.to_vec();
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        if let Some(group) = rest.strip_prefix('{') {
            for item in group.split(',') {
                let mut p = base.clone();
                p.extend(word(item.trim()));
                out.push(p);
            }
        } else {
            let mut p = base;
            p.extend(word(rest));
            out.push(p);
        }
    }
    for (i, _) in stmt.match_indices("crate::") {
        let rest = &stmt[i + "crate::".len()..];
        if rest.starts_with('{') {
            // A group: its first names (`crate::{model::x, text}`).
            out.extend(named(&stmt[i..]).into_iter().map(|n| vec![n]));
        } else {
            out.push(word(rest));
        }
    }
    out
}

/// Where a file's `#[cfg(test)]` module begins, if it has one.
fn test_module_start(text: &str) -> Option<usize> {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if line.trim() == "#[cfg(test)]" {
            let next = text[at + line.len()..].lines().next().unwrap_or_default();
            let next = next.trim_start();
            if ["mod ", "pub mod ", "pub(crate) mod ", "pub(super) mod "]
                .iter()
                .any(|p| next.starts_with(p))
            {
                return Some(at);
            }
        }
        at += line.len();
    }
    None
}

#[test]
fn the_reader_of_module_paths_follows_super_and_crate() {
    let me: Vec<String> = ["model", "device", "apply"].map(String::from).to_vec();
    assert_eq!(
        paths_named("use super::super::attrib::Origin;", &me),
        vec![vec!["model", "attrib", "Origin"]]
    );
    assert_eq!(
        paths_named("use super::{Block, snapshot};", &me),
        vec![
            vec!["model", "device", "Block"],
            vec!["model", "device", "snapshot"]
        ]
    );
    assert_eq!(
        paths_named("let x: crate::model::roles::Role;", &me),
        vec![vec!["model", "roles", "Role"]]
    );
    let src = Path::new("/x/src");
    assert_eq!(
        module_path(src, &src.join("model/device/apply.rs")),
        ["model", "device", "apply"]
    );
    assert_eq!(module_path(src, &src.join("model/mod.rs")), ["model"]);
    assert!(module_path(src, &src.join("lib.rs")).is_empty());
}
