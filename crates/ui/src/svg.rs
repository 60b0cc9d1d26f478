//! A frame as an SVG picture: background rectangles for runs of one
//! background colour, and one `<text>` per line with a `<tspan>` per run of
//! one style. Monospace, so columns line up as on the terminal.

use std::fmt::Write as _;

use std::path::Path;

use anyhow::{Context, Result};
use ratatui::buffer::Buffer;
use ratatui::style::{Color, Modifier};

/// Cell size in SVG units (font size 14, a monospace advance of 0.6 em).
const CW: f64 = 8.4;
const CH: f64 = 17.0;
const FONT: f64 = 14.0;
const DEFAULT_FG: &str = "#d4d4d4";
const DEFAULT_BG: &str = "#1e1e1e";

/// The 16 ANSI colours (VS Code's dark palette).
const ANSI: [&str; 16] = [
    "#000000", "#cd3131", "#0dbc79", "#e5e510", "#2472c8", "#bc3fbc", "#11a8cd", "#e5e5e5",
    "#666666", "#f14c4c", "#23d18b", "#f5f543", "#3b8eea", "#d670d6", "#29b8db", "#ffffff",
];

/// `color` as an SVG colour; `None` for the terminal's default.
pub(crate) fn color(c: Color) -> Option<String> {
    let idx = |i: usize| Some(ANSI[i].to_string());
    match c {
        Color::Reset => None,
        Color::Black => idx(0),
        Color::Red => idx(1),
        Color::Green => idx(2),
        Color::Yellow => idx(3),
        Color::Blue => idx(4),
        Color::Magenta => idx(5),
        Color::Cyan => idx(6),
        Color::Gray => idx(7),
        Color::DarkGray => idx(8),
        Color::LightRed => idx(9),
        Color::LightGreen => idx(10),
        Color::LightYellow => idx(11),
        Color::LightBlue => idx(12),
        Color::LightMagenta => idx(13),
        Color::LightCyan => idx(14),
        Color::White => idx(15),
        Color::Rgb(r, g, b) => Some(format!("#{r:02x}{g:02x}{b:02x}")),
        Color::Indexed(i) => Some(indexed(i)),
    }
}

/// The xterm 256-colour palette.
fn indexed(i: u8) -> String {
    match i {
        0..=15 => ANSI[i as usize].to_string(),
        16..=231 => {
            let i = i - 16;
            let level = |v: u8| if v == 0 { 0 } else { 55 + v * 40 };
            format!(
                "#{:02x}{:02x}{:02x}",
                level(i / 36),
                level((i / 6) % 6),
                level(i % 6)
            )
        }
        _ => {
            let v = 8 + (i - 232) * 10;
            format!("#{v:02x}{v:02x}{v:02x}")
        }
    }
}

fn escape(s: &str, out: &mut String) {
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c if (c as u32) < 0x20 => out.push(' '),
            c => out.push(c),
        }
    }
}

/// The style of one run of text.
#[derive(Debug, Clone, PartialEq)]
struct RunStyle {
    fg: String,
    bold: bool,
    italic: bool,
    underline: bool,
    dim: bool,
}

impl RunStyle {
    fn of(cell: &ratatui::buffer::Cell) -> RunStyle {
        let (fg, _) = cell_colors(cell);
        let m = cell.modifier;
        RunStyle {
            fg: fg.unwrap_or_else(|| DEFAULT_FG.to_string()),
            bold: m.contains(Modifier::BOLD),
            italic: m.contains(Modifier::ITALIC),
            underline: m.contains(Modifier::UNDERLINED),
            dim: m.contains(Modifier::DIM),
        }
    }
}

/// Text in one style from column `col` on.
struct Run {
    col: usize,
    style: RunStyle,
    text: String,
}

impl Run {
    /// Appends the run to `line` as a `<tspan>`; a blank run is left out.
    fn write(self, line: &mut String) {
        if self.text.trim().is_empty() {
            return;
        }
        let st = &self.style;
        let _ = write!(
            line,
            r#"<tspan x="{:.1}" fill="{}""#,
            self.col as f64 * CW,
            st.fg
        );
        if st.bold {
            line.push_str(r#" font-weight="bold""#);
        }
        if st.italic {
            line.push_str(r#" font-style="italic""#);
        }
        if st.underline {
            line.push_str(r#" text-decoration="underline""#);
        }
        if st.dim {
            line.push_str(r#" opacity="0.6""#);
        }
        line.push('>');
        escape(&self.text, line);
        line.push_str("</tspan>");
    }
}

/// Renders `buf` as an SVG document.
pub(crate) fn render(buf: &Buffer) -> String {
    let area = buf.area;
    let (w, h) = (area.width as usize, area.height as usize);
    let mut out = String::with_capacity(w * h * 4 + 1024);
    write_head(&mut out, w, h);
    for y in 0..h {
        write_backgrounds(buf, y, &mut out);
    }
    // Text: one <text> per line, one <tspan> per run.
    for y in 0..h {
        let baseline = y as f64 * CH + CH * 0.78;
        let line = text_runs(buf, y);
        if !line.is_empty() {
            let _ = writeln!(
                out,
                r#"<text y="{baseline:.1}" xml:space="preserve">{line}</text>"#
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

/// The `<svg>` element for `w` × `h` cells, the font, the default background.
fn write_head(out: &mut String, w: usize, h: usize) {
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{:.0}" height="{:.0}" viewBox="0 0 {:.1} {:.1}">"#,
        w as f64 * CW,
        h as f64 * CH,
        w as f64 * CW,
        h as f64 * CH
    );
    let _ = writeln!(
        out,
        r#"<style>text{{font-family:"DejaVu Sans Mono","Menlo","Consolas",monospace;font-size:{FONT}px;white-space:pre}}</style>"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="{DEFAULT_BG}"/>"#
    );
}

/// A `<rect>` for each run of one background colour in row `y` (none for
/// the default background).
fn write_backgrounds(buf: &Buffer, y: usize, out: &mut String) {
    let area = buf.area;
    let w = area.width as usize;
    let bg_at = |x: usize| cell_colors(&buf[(area.x + x as u16, area.y + y as u16)]).1;
    let mut x = 0;
    while x < w {
        let bg = bg_at(x);
        let start = x;
        x += 1;
        while x < w && bg_at(x) == bg {
            x += 1;
        }
        if let Some(bg) = bg {
            let _ = writeln!(
                out,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{bg}"/>"#,
                start as f64 * CW,
                y as f64 * CH,
                (x - start) as f64 * CW,
                CH
            );
        }
    }
}

/// Row `y`'s `<tspan>`s: one per run of one style, each placed at its
/// column so wide or missing glyphs cannot shift what follows (a wide glyph
/// is a run of its own).
fn text_runs(buf: &Buffer, y: usize) -> String {
    let area = buf.area;
    let mut line = String::new();
    let mut skip = 0usize;
    let mut run: Option<Run> = None;
    let flush = |run: &mut Option<Run>, line: &mut String| {
        if let Some(r) = run.take() {
            r.write(line);
        }
    };
    for x in 0..area.width as usize {
        if skip > 0 {
            skip -= 1;
            continue;
        }
        let cell = &buf[(area.x + x as u16, area.y + y as u16)];
        let sym = cell.symbol();
        let cw = unicode_width::UnicodeWidthStr::width(sym).max(1);
        skip = cw - 1;
        let style = RunStyle::of(cell);
        let same = matches!(&run, Some(r) if r.style == style) && cw == 1;
        if !same {
            flush(&mut run, &mut line);
            run = Some(Run {
                col: x,
                style,
                text: String::new(),
            });
        }
        if let Some(r) = &mut run {
            r.text.push_str(if sym.is_empty() { " " } else { sym });
        }
        if cw > 1 {
            flush(&mut run, &mut line);
        }
    }
    flush(&mut run, &mut line);
    line
}

/// (foreground, background) after REVERSED; `None` is the default colour.
fn cell_colors(cell: &ratatui::buffer::Cell) -> (Option<String>, Option<String>) {
    let fg = color(cell.fg);
    let bg = color(cell.bg);
    if cell.modifier.contains(Modifier::REVERSED) {
        (
            Some(bg.unwrap_or_else(|| DEFAULT_BG.to_string())),
            Some(fg.unwrap_or_else(|| DEFAULT_FG.to_string())),
        )
    } else {
        (fg, bg)
    }
}

/// Writes `buf` as SVG to `path`.
/// What the footer says of a screenshot: the file's name first (a footer
/// cut at its right end keeps it), then its directory; or why it failed.
pub(crate) fn written_said(result: &Result<std::path::PathBuf, String>) -> String {
    match result {
        Ok(path) => match (path.file_name(), path.parent()) {
            (Some(name), Some(dir)) if !dir.as_os_str().is_empty() => format!(
                "screenshot {} written in {}",
                name.to_string_lossy(),
                dir.display()
            ),
            _ => format!("screenshot {} written", path.display()),
        },
        Err(e) => format!("screenshot failed: {e}"),
    }
}

pub(crate) fn write_svg(buf: &Buffer, path: &Path) -> Result<()> {
    std::fs::write(path, render(buf)).with_context(|| format!("writing {}", path.display()))
}

/// Writes `buf` as SVG into `file`, just made at `path`.
pub(crate) fn write_svg_into(buf: &Buffer, mut file: std::fs::File, path: &Path) -> Result<()> {
    use std::io::Write;
    file.write_all(render(buf).as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::layout::Rect;
    use ratatui::style::Style;

    #[test]
    fn cells_become_text_and_rects() {
        let mut buf = Buffer::empty(Rect::new(0, 0, 12, 2));
        buf.set_string(0, 0, "a<b&c", Style::new().red().bold());
        buf.set_string(6, 0, "ok", Style::new().on_blue());
        buf.set_string(0, 1, "rev", Style::new().reversed());
        buf.set_string(4, 1, "█░", Style::new().fg(Color::Rgb(1, 2, 3)));
        let svg = render(&buf);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a&lt;b&amp;c"));
        assert!(svg.contains(r##"fill="#cd3131" font-weight="bold""##));
        // the blue background of "ok": two cells from x = 6
        assert!(
            svg.contains(r##"<rect x="50.4" y="0.0" width="16.8" height="17.0" fill="#2472c8"/>"##)
        );
        // reversed: default fg as background, default bg as text colour
        assert!(svg.contains(&format!(r#"fill="{DEFAULT_FG}""#)));
        assert!(svg.contains(r##"fill="#010203">█░</tspan>"##));
        assert_eq!(svg.matches("<text").count(), 2);
    }

    #[test]
    fn palette() {
        assert_eq!(color(Color::Reset), None);
        assert_eq!(indexed(16), "#000000");
        assert_eq!(indexed(231), "#ffffff");
        assert_eq!(indexed(232), "#080808");
        assert_eq!(color(Color::Indexed(196)).as_deref(), Some("#ff0000"));
    }
}
