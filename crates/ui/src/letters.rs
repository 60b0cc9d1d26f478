//! The letters the block map (coloured by module) and the By module table
//! name modules with, stable for the life of the dashboard: the first time
//! a process's module is seen it takes the next free letter and keeps it,
//! whatever its live bytes do later (ranked anew each frame, letter `a`
//! would name another module whenever the ranking changed). Modules seen
//! once every letter is taken share `+`. The app keeps one table per
//! process ([`super::state::ProcessState::letters`]); the panes only read
//! it.

use vramscope_core::model::attrib::Attribution;

/// The letters of modules in the map, in the order modules are first seen
/// (no `x`: the block map marks an expandable segment with it).
pub(crate) const LETTERS: [&str; 25] = [
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s",
    "t", "u", "v", "w", "y", "z",
];

/// One process's modules by letter: the module at index `i` is drawn
/// with `LETTERS[i]` (at most `LETTERS.len()` of them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ModuleLetters {
    modules: Vec<String>,
}

impl ModuleLetters {
    /// Gives the modules of `a` not seen before the free letters, most
    /// live bytes first (the By module table's order); none once every
    /// letter is taken.
    pub(crate) fn note(&mut self, a: &Attribution) {
        for m in &a.by_module {
            if self.modules.len() >= LETTERS.len() {
                return;
            }
            if !self.modules.contains(&m.module) {
                self.modules.push(m.module.clone());
            }
        }
    }

    /// The module each letter names (`LETTERS[i]` for index `i`), as
    /// [`Self::note`] would leave it for `a` without changing the table
    /// (for tests).
    #[cfg(test)]
    pub(crate) fn keys<'a>(&'a self, a: &'a Attribution) -> Vec<&'a str> {
        keys_after(&self.modules, a)
    }
}

/// The module each letter names for `a` under `letters` (none yet: the
/// modules of `a`, most live bytes first, as a new table gives them).
pub(crate) fn keys<'a>(letters: Option<&'a ModuleLetters>, a: &'a Attribution) -> Vec<&'a str> {
    keys_after(letters.map_or(&[], |l| l.modules.as_slice()), a)
}

/// `given`, then the modules of `a` not among them while letters are left.
fn keys_after<'a>(given: &'a [String], a: &'a Attribution) -> Vec<&'a str> {
    let mut keys: Vec<&str> = given.iter().map(String::as_str).collect();
    for m in &a.by_module {
        if keys.len() >= LETTERS.len() {
            break;
        }
        if !keys.contains(&m.module.as_str()) {
            keys.push(&m.module);
        }
    }
    keys
}

/// Whether module `m` holds live memory in `a` (a module keeps its letter
/// after it freed everything; the legends list only these).
pub(crate) fn holds(a: &Attribution, m: &str) -> bool {
    a.by_module.iter().any(|b| b.module == m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_core::model::attrib::ModuleBytes;

    fn attribution(modules: &[(&str, u64)]) -> Attribution {
        Attribution {
            by_module: (modules.iter())
                .map(|&(m, bytes)| ModuleBytes {
                    module: m.into(),
                    bytes,
                    blocks: 1,
                })
                .collect(),
            ..Attribution::default()
        }
    }

    #[test]
    fn a_module_keeps_its_letter_when_the_ranking_changes() {
        let mut letters = ModuleLetters::default();
        let first = attribution(&[("model.mlp", 30), ("model.attn", 20), ("", 10)]);
        letters.note(&first);
        assert_eq!(letters.keys(&first), ["model.mlp", "model.attn", ""]);
        // The next frame: the ranking turned over, and a module came.
        let second = attribution(&[
            ("", 90),
            ("model.head", 50),
            ("model.attn", 40),
            ("model.mlp", 5),
        ]);
        assert_eq!(
            letters.keys(&second),
            ["model.mlp", "model.attn", "", "model.head"]
        );
        letters.note(&second);
        // A module gone keeps its letter when it comes back.
        let third = attribution(&[("model.head", 70), ("model.mlp", 60)]);
        assert_eq!(
            letters.keys(&third),
            ["model.mlp", "model.attn", "", "model.head"]
        );
    }

    #[test]
    fn modules_beyond_the_letters_share_the_overflow_key() {
        let mut letters = ModuleLetters::default();
        let many: Vec<(String, u64)> = (0..40).map(|i| (format!("m{i:02}"), 100 - i)).collect();
        let named: Vec<(&str, u64)> = many.iter().map(|(m, b)| (m.as_str(), *b)).collect();
        letters.note(&attribution(&named));
        // The last comers now hold the most: still no letter of their own.
        let turned: Vec<(&str, u64)> = named.iter().map(|&(m, b)| (m, 1000 - b)).rev().collect();
        let a = attribution(&turned);
        letters.note(&a);
        let keys = letters.keys(&a);
        assert_eq!(keys.len(), LETTERS.len());
        assert_eq!(keys[0], "m00");
        assert!(!keys.contains(&"m39"));
    }
}
