//! A snapshot file's text shown on one line each: a value, a stack as
//! `file:line name` lines. Bounded, so that a hostile file cannot make a
//! line or a stack as long as it likes.

use super::file::{head, SnapshotFile, TraceEntry};
use vramscope_wire::event::PoolId;

/// The most frames of a stack shown (then one line saying how many more),
/// and the most bytes of a frame's line: a stack can name one frame of a
/// long filename thousands of times, which shown whole would be far larger
/// than the file.
pub const MAX_STACK_LINES: usize = 128;
pub const MAX_LINE: usize = 512;

/// Text of the file shown on one line: at most [`MAX_LINE`] bytes (then
/// `…`).
pub fn line(s: &str) -> String {
    let mut out = head(s, MAX_LINE).to_string();
    if s.len() > MAX_LINE {
        out.push('…');
    }
    out
}

/// A stack as `file:line name` lines, innermost first ([`stack_line_iter`]).
pub fn stack_lines(file: &SnapshotFile, stack: Option<u32>) -> Vec<String> {
    stack_line_iter(file, stack).collect()
}

/// A stack as `file:line name` lines, innermost first, made as they are
/// taken: at most [`MAX_STACK_LINES`] frames (and a line counting the rest),
/// each line at most [`MAX_LINE`] bytes (and `…`).
pub fn stack_line_iter(
    file: &SnapshotFile,
    stack: Option<u32>,
) -> impl Iterator<Item = String> + '_ {
    let frames = stack.and_then(|s| file.stacks.get(s)).unwrap_or_default();
    let more = frames.len().saturating_sub(MAX_STACK_LINES);
    (frames.iter().take(MAX_STACK_LINES))
        .filter_map(|&f| file.frames.get(f as usize))
        .map(|f| {
            let mut line = format!(
                "{}:{} {}",
                head(&f.filename, MAX_LINE),
                f.line,
                head(&f.name, MAX_LINE)
            );
            // A frame of FX-generated code names its graph node.
            if let Some(node) = f.get("fx_node_name") {
                let op = f.get("fx_node_op").unwrap_or("node");
                line.push_str(&format!(" (fx {} {})", head(op, 64), head(node, 64)));
            }
            if line.len() > MAX_LINE {
                line.truncate(head(&line, MAX_LINE).len());
                line.push('…');
            }
            line
        })
        .chain((more > 0).then(|| format!("… {more} more frames")))
}

impl TraceEntry {
    /// The lines that say what the entry's metadata says (none when it
    /// says nothing): `user metadata: …`, `compile context: …`, `internal
    /// metadata: …`, `pool (a, b)`, each at most [`MAX_LINE`] bytes.
    pub fn meta_lines(&self) -> Vec<String> {
        let Some(m) = &self.meta else {
            return Vec::new();
        };
        let texts = [
            ("user metadata", &m.user_metadata),
            ("compile context", &m.compile_context),
            ("internal metadata", &m.internal_metadata),
        ];
        let mut out: Vec<String> = (texts.iter())
            .filter_map(|(k, v)| v.as_deref().map(|v| format!("{k}: {}", line(v))))
            .collect();
        if let Some(PoolId(a, b)) = m.pool {
            out.push(format!("private pool ({a}, {b})"));
        }
        out
    }
}
