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
