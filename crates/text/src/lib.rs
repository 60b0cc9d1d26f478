//! Text that reaches a terminal. The bottom floor: it imports nothing from
//! the crate, and every layer may use it.
//!
//! - [`format`](mod@format): the one formatter for bytes, counts and durations.
//! - [`printable`]: untrusted text made safe to print (no escapes, no line
//!   breaks, no reordering).
//! - [`stderr_line`]: the one way a line reaches standard error; it goes
//!   through [`printable`], so a file name, a settings key or a message
//!   that quotes either cannot drive the terminal. `tests/hostile/names.rs`
//!   checks that nothing under `src/` writes to standard error otherwise.
use std::io::Write;

pub mod format;

/// Untrusted text (a segment's label and framework, a command line from
/// `/proc`, the strings of a recording, a file name in an error) made safe
/// to print: every control character (C0, DEL, C1: escapes, carriage
/// returns, line feeds), the line and paragraph separators and the
/// bidirectional overrides become U+FFFD, so no terminal escape, line break
/// or reordering survives.
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    push_printable(&mut out, s);
    out
}

/// [`printable`] text appended to `out` (no copy made on the way).
pub fn push_printable(out: &mut String, s: &str) {
    if !s.chars().any(unsafe_char) {
        out.push_str(s);
        return;
    }
    out.extend(
        s.chars()
            .map(|c| if unsafe_char(c) { '\u{fffd}' } else { c }),
    );
}

/// Whether [`printable`] replaces `c` (for writers with escapes of their
/// own, as the exporter's labels).
pub fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{061c}'
        )
        || ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
}

/// Writes `line` (made [`printable`]) and a newline to standard error. A
/// failed write is ignored: there is nowhere left to report it.
pub fn stderr_line(line: impl std::fmt::Display) {
    let text = printable(&line.to_string());
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "{text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_breaks_and_overrides_are_replaced() {
        assert_eq!(printable("a\x1b[2Jb"), "a\u{fffd}[2Jb");
        assert_eq!(printable("x\ny\rz"), "x\u{fffd}y\u{fffd}z");
        assert_eq!(printable("\u{9b}31m"), "\u{fffd}31m");
        assert_eq!(printable("a\u{202e}b\u{2066}"), "a\u{fffd}b\u{fffd}");
        assert_eq!(printable("plain · text"), "plain · text");
    }
}
