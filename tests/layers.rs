//! The layers of `src/lib.rs`, enforced: every `crate::…` path in every
//! file under `src/` is read, and an import of a top-level module from one
//! on a lower floor (or from the same floor: floors are ordered, rooms on
//! one floor do not lean on each other) fails the test, naming the file
//! and the line. A circle between top-level modules is impossible then.
//!
//! The floors are read from `src/lib.rs` itself (its "Layers" list), so
//! the order is written once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The floors in `src/lib.rs`: lines `//! N. name, name …` under
/// "Layers", floor 0 first.
fn floors() -> BTreeMap<String, usize> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
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
    assert!(!out.is_empty(), "src/lib.rs has no \"Layers\" list");
    out
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
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

/// The top-level module a file belongs to (`src/model/device.rs` →
/// `model`); `None` for `lib.rs` and `main.rs` (the binary's `cmd`).
fn owner(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src()).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main" | "cmd")).then(|| name.to_string())
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
fn no_import_runs_up_or_sideways_between_top_level_modules() {
    let floors = floors();
    let mut all = Vec::new();
    files(&src(), &mut all);
    all.sort();
    let mut bad = Vec::new();
    for path in &all {
        let Some(me) = owner(path) else { continue };
        let Some(&my_floor) = floors.get(&me) else {
            bad.push(format!(
                "{}: module `{me}` is on no floor of src/lib.rs",
                path.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(path).unwrap();
        // Whole statements: a `use` may span lines; its first line is named.
        let mut pending: Option<(usize, String)> = None;
        for (i, line) in text.lines().enumerate() {
            let code = code_of(line);
            let stmt = match pending.take() {
                Some((at, mut s)) => {
                    s.push_str(&code);
                    if !code.contains(';') {
                        pending = Some((at, s));
                        continue;
                    }
                    (at, s)
                }
                None if code.trim_start().starts_with("use ")
                    || code.trim_start().starts_with("pub use ")
                    || code.trim_start().starts_with("pub(crate) use ") =>
                {
                    if !code.contains(';') {
                        pending = Some((i, code));
                        continue;
                    }
                    (i, code)
                }
                None => (i, code),
            };
            for m in named(&stmt.1) {
                if m == me {
                    continue;
                }
                match floors.get(&m) {
                    Some(&f) if f < my_floor => {}
                    Some(&f) => bad.push(format!(
                        "{}:{}: `{me}` (floor {my_floor}) imports `{m}` (floor {f}): {}",
                        path.strip_prefix(src().parent().unwrap())
                            .unwrap()
                            .display(),
                        stmt.0 + 1,
                        stmt.1.trim()
                    )),
                    None => {}
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "imports that run up or sideways ({}):\n{}",
        bad.len(),
        bad.join("\n")
    );
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

/// The module path of a file (`src/model/device/apply.rs` → `model`,
/// `device`, `apply`; a `mod.rs` is its folder's module).
fn module_path(path: &Path) -> Vec<String> {
    let rel = path.strip_prefix(src()).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.strip_suffix(".rs").unwrap_or(&last).to_string();
    if stem != "mod" {
        parts.push(stem);
    }
    parts
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
        if !rest.starts_with('{') {
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

/// Issue 45: inside a top-level module, the files (second-level modules,
/// `model::attrib`, `model::device` with its own files) import each other
/// in no circle, `super::` paths included.
#[test]
fn no_circle_between_the_files_of_a_module() {
    let mut all = Vec::new();
    files(&src(), &mut all);
    all.sort();
    // Second-level modules that exist: (top, second).
    let known: std::collections::BTreeSet<(String, String)> = all
        .iter()
        .map(|p| module_path(p))
        .filter(|m| m.len() >= 2)
        .map(|m| (m[0].clone(), m[1].clone()))
        .collect();
    let mut edges: BTreeMap<(String, String), std::collections::BTreeSet<String>> = BTreeMap::new();
    for path in &all {
        let me = module_path(path);
        if me.len() < 2 || me[1] == "tests" {
            continue;
        }
        let mine = (me[0].clone(), me[1].clone());
        let text = std::fs::read_to_string(path).unwrap();
        // (A file's own test module is not an import of another file: the
        // text stops at a `#[cfg(test)]` whose next line declares a module.)
        let text = test_module_start(&text).map_or(text.as_str(), |i| &text[..i]);
        // Whole statements: a `use` group may span lines.
        let mut stmt = String::new();
        for line in text.lines() {
            let code = code_of(line);
            let starts = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
                .iter()
                .any(|s| code.trim_start().starts_with(s));
            if !stmt.is_empty() || (starts && !code.contains(';')) {
                stmt.push_str(&code);
                if !code.contains(';') {
                    continue;
                }
            }
            let code = if stmt.is_empty() {
                code
            } else {
                std::mem::take(&mut stmt)
            };
            for p in paths_named(&code, &me) {
                if p.len() >= 2 && p[0] == mine.0 && p[1] != mine.1 {
                    let other = (p[0].clone(), p[1].clone());
                    if known.contains(&other) {
                        edges.entry(mine.clone()).or_default().insert(other.1);
                    }
                }
            }
        }
    }
    // A circle: a module that reaches itself.
    let mut circles = Vec::new();
    for (top, from) in edges.keys() {
        let mut seen = std::collections::BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for next in edges.get(&(top.clone(), m.clone())).into_iter().flatten() {
                if next == from {
                    circles.push(format!("{top}::{from} reaches itself (through {top}::{m})"));
                }
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
    }
    circles.dedup();
    assert!(
        circles.is_empty(),
        "import circles inside a module ({}):\n{}",
        circles.len(),
        circles.join("\n")
    );
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
    assert_eq!(
        module_path(&src().join("model/device/apply.rs")),
        ["model", "device", "apply"]
    );
    assert_eq!(module_path(&src().join("model/mod.rs")), ["model"]);
}
