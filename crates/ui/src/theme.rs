//! Colours, modifiers and glyphs. Three independent switches: colour (off
//! for `NO_COLOR` / `--monochrome`: only bold, dim and reverse remain),
//! ASCII (no braille, box drawing or block glyphs), and nothing else — every
//! pane asks the theme instead of naming a colour or a glyph itself.

use ratatui::buffer::Buffer;
use ratatui::style::{Color, Modifier, Style};
use ratatui::symbols::border;
use ratatui::text::{Line, Span};

/// How the dashboard draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Theme {
    pub color: bool,
    pub(crate) ascii: bool,
}

/// The block-map and chart glyphs of one theme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Glyphs {
    pub(crate) allocated: &'static str,
    /// Allocated, every other block (so neighbours stay apart).
    pub(crate) allocated_alt: &'static str,
    pub(crate) pending: &'static str,
    pub(crate) inactive: &'static str,
    /// Chart: allocated range within a column (min..max).
    pub(crate) swing: &'static str,
    /// Chart: reserved above allocated.
    pub(crate) reserved: &'static str,
    /// Chart: NVML used line.
    pub(crate) nvml: &'static str,
    pub(crate) bar_full: &'static str,
    pub(crate) bar_empty: &'static str,
    pub(crate) absent: &'static str,
    pub(crate) up: &'static str,
    pub(crate) down: &'static str,
    pub(crate) dot: &'static str,
    pub(crate) ellipsis: &'static str,
}

const UNICODE: Glyphs = Glyphs {
    allocated: "█",
    allocated_alt: "▇",
    pending: "▒",
    inactive: "░",
    swing: "▒",
    reserved: "░",
    nvml: "─",
    bar_full: "█",
    bar_empty: "░",
    absent: "—",
    up: "▲",
    down: "▼",
    dot: "·",
    ellipsis: "…",
};

const ASCII: Glyphs = Glyphs {
    allocated: "#",
    allocated_alt: "=",
    pending: "%",
    inactive: ".",
    swing: "+",
    reserved: ":",
    nvml: "-",
    bar_full: "#",
    bar_empty: ".",
    absent: "-",
    up: "^",
    down: "v",
    dot: "|",
    ellipsis: "~",
};

/// Borders drawn with `+`, `-` and `|`.
pub(crate) const ASCII_BORDER: border::Set = border::Set {
    top_left: "+",
    top_right: "+",
    bottom_left: "+",
    bottom_right: "+",
    vertical_left: "|",
    vertical_right: "|",
    horizontal_top: "-",
    horizontal_bottom: "-",
};

impl Theme {
    pub fn new(color: bool, ascii: bool) -> Self {
        Theme { color, ascii }
    }

    pub(crate) fn glyphs(&self) -> &'static Glyphs {
        if self.ascii {
            &ASCII
        } else {
            &UNICODE
        }
    }

    pub(crate) fn border(&self) -> border::Set<'static> {
        if self.ascii {
            ASCII_BORDER
        } else {
            border::PLAIN
        }
    }

    /// A titled, bordered block in this theme.
    pub(crate) fn block<'a>(
        &self,
        title: impl Into<ratatui::text::Line<'a>>,
    ) -> ratatui::widgets::Block<'a> {
        ratatui::widgets::Block::bordered()
            .border_set(self.border())
            .border_style(self.border_style())
            .title(title)
    }

    /// A legend for a block's bottom edge: ` █ allocated ░ inactive `, each
    /// mark (a glyph or a key) in its style, each label plain.
    pub(crate) fn legend(&self, items: &[(&'static str, Style, &'static str)]) -> Line<'static> {
        let mut spans = vec![Span::raw(" ")];
        for &(mark, style, label) in items {
            spans.push(Span::styled(mark, style));
            spans.push(Span::raw(format!(" {label} ")));
        }
        Line::from(spans)
    }

    fn fg(&self, c: Color) -> Style {
        if self.color {
            Style::new().fg(c)
        } else {
            Style::new()
        }
    }

    pub(crate) fn border_style(&self) -> Style {
        self.fg(Color::DarkGray)
    }
    /// The border of the pane in focus.
    pub fn focus(&self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }
    pub(crate) fn title(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }
    pub(crate) fn header(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }
    pub(crate) fn dim(&self) -> Style {
        if self.color {
            Style::new().fg(Color::DarkGray)
        } else {
            Style::new().add_modifier(Modifier::DIM)
        }
    }
    pub(crate) fn key(&self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }
    pub(crate) fn selected(&self) -> Style {
        Style::new().add_modifier(Modifier::REVERSED)
    }
    pub(crate) fn warn(&self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }
    pub(crate) fn alert(&self) -> Style {
        if self.color {
            Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
        } else {
            Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED)
        }
    }
    pub(crate) fn good(&self) -> Style {
        self.fg(Color::Green)
    }
    pub(crate) fn allocated(&self) -> Style {
        self.fg(Color::Green)
    }
    pub(crate) fn allocated_alt(&self) -> Style {
        self.fg(Color::LightGreen)
    }
    pub(crate) fn pending(&self) -> Style {
        self.fg(Color::Yellow)
    }
    pub(crate) fn inactive(&self) -> Style {
        self.fg(Color::Blue)
    }
    pub(crate) fn reserved(&self) -> Style {
        self.fg(Color::Blue)
    }
    pub(crate) fn nvml(&self) -> Style {
        self.fg(Color::Magenta).add_modifier(Modifier::BOLD)
    }
    pub(crate) fn bar(&self) -> Style {
        self.fg(Color::Green)
    }
    pub(crate) fn paused(&self) -> Style {
        if self.color {
            Style::new()
                .fg(Color::Black)
                .bg(Color::Yellow)
                .add_modifier(Modifier::BOLD)
        } else {
            Style::new().add_modifier(Modifier::REVERSED | Modifier::BOLD)
        }
    }
}

/// Replaces every non-ASCII symbol left in `buf` (from widgets that do not
/// ask the theme) by an ASCII look-alike: the `--ascii` safety net.
pub(crate) fn asciify(buf: &mut Buffer) {
    for cell in buf.content.iter_mut() {
        let s = cell.symbol();
        if s.is_ascii() {
            continue;
        }
        let r = ascii_for(s);
        cell.set_symbol(r);
    }
}

fn ascii_for(s: &str) -> &'static str {
    let c = s.chars().next().unwrap_or(' ');
    match c {
        '─' | '━' | '═' | '—' | '–' | '▔' | '▁' => "-",
        '│' | '┃' | '║' | '▏' | '▕' => "|",
        '┌' | '┐' | '└' | '┘' | '├' | '┤' | '┬' | '┴' | '┼' | '╭' | '╮' | '╰' | '╯' => {
            "+"
        }
        '█' | '▇' | '▆' | '▅' | '▄' | '▃' | '▂' => "#",
        '▓' | '▒' => "%",
        '░' => ".",
        '·' | '•' => ".",
        '…' => "~",
        '▲' | '↑' => "^",
        '▼' | '↓' => "v",
        '◀' | '←' => "<",
        '▶' | '→' => ">",
        '×' => "x",
        '\u{2800}'..='\u{28FF}' => "*",
        _ => "?",
    }
}
