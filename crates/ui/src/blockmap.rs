//! The block map: one row per segment, its blocks drawn to scale across the
//! row and coloured by state. A row starts with its pool (`L` large, `S`
//! small, `?` when only guessed from the size), `x` for an expandable
//! segment, and its stream; it ends with the segment's size.
//!
//! `c` colours allocated blocks by the module or the phase that made them
//! instead (one letter per module or phase, so the map reads the same in
//! monochrome and ASCII; coloured backgrounds where there is colour); `v`
//! shows only the blocks of one module or phase, the others dimmed;
//! `n`/`N` (or a click) select a block, whose details (module, phase, step born, age,
//! stack) show at the pane's foot.
//!
//! ```text
//!  cuda:0 · 14 segments · 2.1G reserved · largest free S 1.2M L 18M
//!  L  s0 ████▇▇▇▇░░░░░░████████▒▒░░░░░░░░░░░░░░░░░░░░░░░░   20M
//!  S  s0 ██▇█▇░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░  2.0M
//! ```

use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::letters::{self, ModuleLetters, LETTERS};
use super::scroll::Scroll;
use super::theme::Theme;
use vramscope_collect::ProcessEntry;
use vramscope_core::model::attrib::{Attribution, PhaseKey};
use vramscope_core::model::roles::Role;
use vramscope_core::model::view::{BlockView, DeviceView, SegmentView};
use vramscope_core::model::Mode;
use vramscope_text::format;
use vramscope_wire::event::{BlockState, SegmentPool};

/// What the allocated blocks' colours say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Colouring {
    /// Allocated, pending-free or inactive (the allocator's view).
    #[default]
    State,
    /// The module whose code allocated the block.
    Module,
    /// The phase (forward, backward, optimizer, other) it was allocated in.
    Phase,
    /// What the block is to PyTorch (parameter, gradient, ...: `model::roles`).
    Role,
}

impl Colouring {
    pub(crate) fn next(self) -> Colouring {
        match self {
            Colouring::State => Colouring::Module,
            Colouring::Module => Colouring::Phase,
            Colouring::Phase => Colouring::Role,
            Colouring::Role => Colouring::State,
        }
    }
    pub(crate) fn name(self) -> &'static str {
        match self {
            Colouring::State => "state",
            Colouring::Module => "module",
            Colouring::Phase => "phase",
            Colouring::Role => "role",
        }
    }
}

/// Show only the blocks of one module or phase (the others dimmed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Only {
    Module(String),
    Phase(PhaseKey),
    Role(Role),
}

impl Only {
    /// Whether block `b` (allocated) belongs.
    pub(crate) fn matches(&self, a: &Attribution, b: &BlockView) -> bool {
        b.block.state == BlockState::Allocated
            && match self {
                Only::Module(m) => block_module(a, b) == m,
                Only::Phase(p) => a.phase_of(b.block.origin.context) == *p,
                Only::Role(r) => b.role == Some(*r),
            }
    }
    /// How it reads in a title ("model.head", "backward").
    pub(crate) fn label(&self) -> String {
        match self {
            Only::Module(m) => module_label(m).to_string(),
            Only::Phase(p) => p.name().to_string(),
            Only::Role(r) => r.label().to_string(),
        }
    }
}

/// The module a block counts under: the one holding its tensor when a role
/// list names it (FSDP2's shards are made outside their module's code),
/// else the one whose code allocated it.
pub(crate) fn block_module<'a>(a: &'a Attribution, b: &'a BlockView) -> &'a str {
    b.held_by
        .as_deref()
        .unwrap_or_else(|| a.module_of(b.block.origin.context))
}

/// The letter of each role in the map (capitals: the phases' and modules'
/// are small letters).
pub(crate) fn role_letter(r: Role) -> &'static str {
    match r {
        Role::Parameter => "P",
        Role::Buffer => "B",
        Role::Gradient => "G",
        Role::OptimizerState => "O",
        Role::Activation => "A",
        Role::Temporary => "T",
        Role::Other => "~",
    }
}

/// A module path as shown ("(no module)" for the empty one).
pub(crate) fn module_label(m: &str) -> &str {
    if m.is_empty() {
        "(no module)"
    } else {
        m
    }
}

/// How the map is drawn: scroll, colouring, filter, selected block.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MapView<'a> {
    pub(crate) scroll: Scroll,
    pub(crate) colouring: Colouring,
    pub(crate) only: Option<&'a Only>,
    /// The selected block's address.
    pub(crate) selected: Option<u64>,
    /// The collector clock of the snapshot (for the selected block's age).
    pub(crate) taken_ns: u64,
    /// The process's module letters (none yet: given by live bytes).
    pub(crate) letters: Option<&'a ModuleLetters>,
}

/// The letter of each phase in the map.
pub(crate) fn phase_letter(p: PhaseKey) -> &'static str {
    match p {
        PhaseKey::Forward => "f",
        PhaseKey::Backward => "b",
        PhaseKey::Optimizer => "o",
        // Not `x`: that is an expandable segment's mark.
        PhaseKey::Other => "~",
        PhaseKey::Unknown => "?",
    }
}

const PALETTE: [ratatui::style::Color; 8] = {
    use ratatui::style::Color::*;
    [
        Green,
        Cyan,
        Magenta,
        Yellow,
        LightBlue,
        LightRed,
        LightGreen,
        LightMagenta,
    ]
};

/// The style of the `i`-th module or phase: a coloured background where
/// there is colour (the letter says it where there is none).
fn class_style(t: &Theme, i: usize) -> Style {
    if t.color {
        Style::new()
            .bg(PALETTE[i % PALETTE.len()])
            .fg(ratatui::style::Color::Black)
    } else {
        Style::new()
    }
}

/// The glyph and style of an allocated block under `colouring`.
fn class_of(
    a: &Attribution,
    keys: &[&str],
    colouring: Colouring,
    b: &BlockView,
    t: &Theme,
) -> Option<(&'static str, Style)> {
    let ctx = b.block.origin.context;
    match colouring {
        Colouring::State => None,
        Colouring::Module => {
            let m = block_module(a, b);
            Some(match keys.iter().position(|k| *k == m) {
                Some(i) => (LETTERS[i], class_style(t, i)),
                None => ("+", t.dim()),
            })
        }
        Colouring::Phase => {
            let p = a.phase_of(ctx);
            let i = PhaseKey::ALL.iter().position(|x| *x == p).unwrap_or(0);
            Some((phase_letter(p), class_style(t, i)))
        }
        Colouring::Role => {
            let r = b.role.unwrap_or(Role::Other);
            let i = Role::ALL.iter().position(|x| *x == r).unwrap_or(0);
            Some((role_letter(r), class_style(t, i)))
        }
    }
}

/// A row of the map.
enum MapRow<'a> {
    Device(&'a DeviceView),
    Segment(&'a SegmentView),
    Orphans(&'a DeviceView),
}

fn map_rows(e: &ProcessEntry) -> Vec<MapRow<'_>> {
    let mut out = Vec::new();
    for d in &e.view.devices {
        out.push(MapRow::Device(d));
        let mut segs: Vec<&SegmentView> = d.segments.iter().collect();
        segs.sort_by_key(|s| {
            (
                s.segment.stream,
                s.segment.pool_kind == SegmentPool::Small,
                s.segment.addr,
            )
        });
        out.extend(segs.into_iter().map(MapRow::Segment));
        if !d.orphans.is_empty() {
            out.push(MapRow::Orphans(d));
        }
    }
    out
}

/// Rows the map has for `e` (for scrolling).
pub fn row_count(e: &ProcessEntry) -> usize {
    e.view
        .devices
        .iter()
        .map(|d| 1 + d.segments.len() + usize::from(!d.orphans.is_empty()))
        .sum()
}

/// `s0`, `s7`, or the low bits of a real stream pointer (`s#b0c0`).
pub(crate) fn stream_label(stream: u64) -> String {
    if stream < 0x1_0000 {
        format!("s{stream}")
    } else {
        format!("s#{:04x}", stream & 0xffff)
    }
}

/// The legend of `colouring` on the pane's bottom border, `width` wide
/// at most: modules that do not fit are left to the By module table.
fn legend(e: &ProcessEntry, v: &MapView, width: usize, t: &Theme) -> Line<'static> {
    let g = t.glyphs();
    let a = &e.view.attribution;
    let mut spans = vec![Span::raw(" ")];
    let mut used = 1;
    let mut cut = false;
    // Room kept for the free-block item and the pointer to M (the
    // colourings by class only: by state, free is one of the items).
    let kept = if v.colouring == Colouring::State {
        0
    } else {
        16
    };
    let mut item = |mark: &'static str, style: Style, label: String| {
        let w = mark.chars().count() + label.chars().count() + 2;
        if cut || used + w + kept > width {
            cut = true;
            return;
        }
        used += w;
        spans.push(Span::styled(mark, style));
        spans.push(Span::raw(format!(" {label} ")));
    };
    match v.colouring {
        Colouring::State => {
            item(g.allocated, t.allocated(), "allocated".into());
            item(g.pending, t.pending(), "pending-free".into());
            item(g.inactive, t.inactive(), "inactive".into());
            // `x` only when an expandable segment is in the map, before
            // the pool letters, which every map has (issue 46, item 9).
            let expandable =
                (e.view.devices.iter()).any(|d| d.segments.iter().any(|s| s.segment.expandable));
            if expandable {
                item("x", t.key(), "expandable".into());
            }
            item("L/S", t.key(), "pool".into());
        }
        Colouring::Module => {
            // The modules that hold memory now, in letter order; the
            // others (beyond the letters) share `+`.
            let keys = letters::keys(v.letters, a);
            for (i, m) in keys.iter().enumerate() {
                if letters::holds(a, m) {
                    item(LETTERS[i], class_style(t, i), module_label(m).to_string());
                }
            }
            if (a.by_module.iter()).any(|m| !keys.contains(&m.module.as_str())) {
                item("+", t.dim(), "other modules".into());
            }
        }
        Colouring::Phase => {
            for (i, p) in PhaseKey::ALL.iter().enumerate() {
                if a.by_phase.iter().any(|x| x.phase == *p) {
                    item(phase_letter(*p), class_style(t, i), p.name().to_string());
                }
            }
        }
        Colouring::Role => {
            for (i, r) in Role::ALL.iter().enumerate() {
                if a.roles.iter().any(|x| x.role == *r) {
                    item(role_letter(*r), class_style(t, i), r.label().to_string());
                }
            }
        }
    }
    if v.colouring != Colouring::State {
        if cut {
            spans.push(Span::styled(format!("{} M: all ", g.ellipsis), t.key()));
        }
        spans.push(Span::styled(g.inactive, t.inactive()));
        spans.push(Span::raw(" free "));
    }
    Line::from(spans)
}

/// Where block `addr` is: its row in the map and the block.
pub fn find_block(e: &ProcessEntry, addr: u64) -> Option<(usize, &BlockView)> {
    blocks_in_order(e).into_iter().find(|(_, b)| b.addr == addr)
}

/// Every block of the map in map order, with its row.
pub(crate) fn blocks_in_order(e: &ProcessEntry) -> Vec<(usize, &BlockView)> {
    let mut out = Vec::new();
    for (i, r) in map_rows(e).into_iter().enumerate() {
        match r {
            MapRow::Segment(s) => out.extend(s.blocks.iter().map(|b| (i, b))),
            MapRow::Orphans(d) => out.extend(d.orphans.iter().map(|b| (i, b))),
            MapRow::Device(_) => {}
        }
    }
    out
}

/// Lines the selected block's details take at the pane's foot.
fn details(
    e: &ProcessEntry,
    b: &BlockView,
    v: &MapView,
    room: usize,
    t: &Theme,
) -> Vec<Line<'static>> {
    let g = t.glyphs();
    let a = &e.view.attribution;
    let blk = &b.block;
    let state = match blk.state {
        BlockState::Allocated => "allocated",
        BlockState::PendingFree => "pending-free",
        BlockState::Inactive => "inactive (free)",
    };
    let mut head = vec![
        Span::styled("selected ", t.dim()),
        Span::styled(format!("{:#x}", b.addr), t.header()),
        Span::raw(format!(
            " {} {} {state}",
            format::bytes_short(blk.size),
            g.dot
        )),
    ];
    if blk.requested > 0 && blk.requested != blk.size {
        head.push(Span::styled(
            format!(" ({} requested)", format::bytes(blk.requested)),
            t.dim(),
        ));
    }
    let mut lines = vec![Line::from(head)];
    if blk.state == BlockState::Allocated {
        let ctx = blk.origin.context;
        let c = a.context(ctx);
        let step = c.and_then(|c| c.step).or(blk.origin.step.map(u64::from));
        let mut l = vec![
            Span::styled("module ", t.dim()),
            Span::raw(module_label(block_module(a, b)).to_string()),
            Span::styled(format!(" {} phase ", g.dot), t.dim()),
            Span::raw(a.phase_of(ctx).name()),
            Span::styled(format!(" {} role ", g.dot), t.dim()),
            Span::raw(b.role.map_or(g.absent, Role::label)),
            Span::styled(format!(" {} born step ", g.dot), t.dim()),
            Span::raw(format::opt(step, g.absent, |s| s.to_string())),
            Span::styled(format!(" {} age ", g.dot), t.dim()),
        ];
        let mut age = Vec::new();
        if let (Some(s), Some(now)) = (step, a.step) {
            let n = now.saturating_sub(s);
            age.push(format!("{n} step{}", if n == 1 { "" } else { "s" }));
        }
        if blk.since_ns > 0 && blk.since_ns <= v.taken_ns {
            age.push(format::span(v.taken_ns - blk.since_ns));
        }
        l.push(Span::raw(if age.is_empty() {
            g.absent.to_string()
        } else {
            age.join(", ")
        }));
        lines.push(Line::from(l));
        let stack = c.map(|c| c.stack.as_slice()).unwrap_or_default();
        if stack.is_empty() {
            lines.push(Line::styled(
                "no stack captured (C captures code locations for 10 steps)",
                t.dim(),
            ));
        } else {
            let shown = room.saturating_sub(lines.len()).max(1);
            for (i, f) in stack.iter().enumerate().take(shown) {
                let more = stack.len() - i - 1;
                let text = if i + 1 == shown && more > 0 {
                    format!("  {f}  (+{more} frames)")
                } else {
                    format!("  {f}")
                };
                lines.push(Line::raw(text));
            }
        }
    }
    lines.truncate(room);
    lines
}

/// The selected block's details at the foot: at most a third of the pane.
fn foot(e: &ProcessEntry, area: Rect, v: &MapView, t: &Theme) -> Vec<Line<'static>> {
    match v.selected.and_then(|addr| find_block(e, addr)) {
        Some((_, b)) => {
            let room = (area.height.saturating_sub(2) / 3).clamp(2, 8) as usize;
            details(e, b, v, room, t)
        }
        None => Vec::new(),
    }
}

/// Map rows shown at once in `area` (the pane, its border included), as
/// `v` draws the map of `e`: under them, the selected block's lines.
pub(crate) fn rows_shown(e: &ProcessEntry, area: Rect, v: &MapView) -> usize {
    let foot = foot(e, area, v, &Theme::default()).len();
    (area.height.saturating_sub(2) as usize).saturating_sub(foot)
}

/// Where the rows go: map lines shown, first row, the prefix before the
/// bars and the bars' width.
fn geometry(
    rows: &[MapRow],
    inner: Rect,
    foot: usize,
    scroll: Scroll,
) -> (usize, usize, usize, usize) {
    let inner_h = (inner.height as usize).saturating_sub(foot);
    // Never past the last full page (a scroll kept from a smaller terminal).
    let offset = scroll.fit(rows.len(), inner_h).offset();
    let prefix_w = rows
        .iter()
        .filter_map(|r| match r {
            MapRow::Segment(s) => Some(stream_label(s.segment.stream).len()),
            _ => None,
        })
        .max()
        .unwrap_or(2)
        + 4;
    let size_w = 7usize;
    let bar_w = (inner.width as usize)
        .saturating_sub(prefix_w + size_w)
        .max(1);
    (inner_h, offset, prefix_w, bar_w)
}

/// The block drawn at column `x`, row `y` of the map drawn in `area` as `v`
/// asks (a click), if any.
pub(crate) fn block_at(e: &ProcessEntry, area: Rect, v: &MapView, x: u16, y: u16) -> Option<u64> {
    let inner = Rect {
        x: area.x + 1,
        y: area.y + 1,
        width: area.width.saturating_sub(2),
        height: area.height.saturating_sub(2),
    };
    if !(inner.x..inner.x + inner.width).contains(&x)
        || !(inner.y..inner.y + inner.height).contains(&y)
    {
        return None;
    }
    let rows = map_rows(e);
    let foot = foot(e, area, v, &Theme::default()).len();
    let (inner_h, offset, prefix_w, bar_w) = geometry(&rows, inner, foot, v.scroll);
    let line = (y - inner.y) as usize;
    if line >= inner_h {
        return None;
    }
    let MapRow::Segment(s) = rows.get(offset + line)? else {
        return None;
    };
    let c = ((x - inner.x) as usize).checked_sub(prefix_w)?;
    if c >= bar_w {
        return None;
    }
    // The address in the middle of the cell.
    let size = u128::from(s.segment.size.max(1));
    let at = s.segment.addr + ((2 * c as u128 + 1) * size / (2 * bar_w as u128)) as u64;
    s.blocks
        .iter()
        .find(|b| b.addr <= at && at < b.addr.saturating_add(b.block.size))
        .map(|b| b.addr)
}

/// The map of `e`, as `v` asks.
pub(crate) fn render(frame: &mut Frame, area: Rect, e: &ProcessEntry, v: &MapView, t: &Theme) {
    let g = t.glyphs();
    let rows = map_rows(e);
    let segs: usize = e.view.devices.iter().map(|d| d.segments.len()).sum();
    let foot = foot(e, area, v, t);
    let inner_h = (area.height.saturating_sub(2) as usize).saturating_sub(foot.len());
    let scroll = v.scroll.fit(rows.len(), inner_h);
    let mut title = vec![
        Span::styled(" Block map ", t.title()),
        Span::styled(format!("{} {segs} segments ", g.dot), t.dim()),
    ];
    if v.colouring != Colouring::State {
        title.push(Span::styled(
            format!("{} by {} ", g.dot, v.colouring.name()),
            t.key(),
        ));
    }
    if let Some(o) = v.only {
        title.push(Span::styled(
            format!("{} only {} ", g.dot, o.label()),
            t.key(),
        ));
    }
    title.extend(scroll.hint("rows", t));
    let block = t.block(Line::from(title)).title_bottom(legend(
        e,
        v,
        area.width.saturating_sub(2) as usize,
        t,
    ));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if inner.height == 0 || inner.width < 10 {
        return;
    }
    if rows.is_empty() {
        let msg = if e.view.mode == Mode::NvmlOnly {
            "No block map: this process has no vramscope agent (NVML figures only)."
        } else {
            "No segments known yet (waiting for a state snapshot; s asks for one)."
        };
        frame.render_widget(
            Paragraph::new(Line::styled(msg, t.dim())).wrap(ratatui::widgets::Wrap { trim: true }),
            inner,
        );
        return;
    }
    let (_, _, prefix_w, bar_w) = geometry(&rows, inner, foot.len(), v.scroll);
    let keys = letters::keys(v.letters, &e.view.attribution);
    let paint = Paint {
        a: &e.view.attribution,
        keys: &keys,
        v,
        t,
    };
    let width = inner.width as usize;
    let mut lines = Vec::with_capacity(inner.height as usize);
    for row in rows.iter().skip(scroll.offset()).take(inner_h) {
        lines.push(match row {
            MapRow::Device(d) => crate::fit::fit_line(device_line(d, t), width, g.ellipsis),
            MapRow::Segment(s) => segment_line(s, prefix_w, bar_w, &paint),
            MapRow::Orphans(d) => Line::styled(
                format!(
                    "  {} blocks outside any known segment (resync pending)",
                    d.orphans.len()
                ),
                t.warn(),
            ),
        });
    }
    while lines.len() < inner_h {
        lines.push(Line::raw(""));
    }
    lines.extend(
        foot.into_iter()
            .map(|l| crate::fit::fit_line(l, width, g.ellipsis)),
    );
    frame.render_widget(Paragraph::new(lines), inner);
}

/// How a block's cells are drawn.
struct Paint<'a> {
    a: &'a Attribution,
    keys: &'a [&'a str],
    v: &'a MapView<'a>,
    t: &'a Theme,
}

impl Paint<'_> {
    /// The glyph and style of block `b`; `alt`: every other allocated block.
    fn cell(&self, b: &BlockView, alt: bool) -> (&'static str, Style) {
        let (g, t) = (self.t.glyphs(), self.t);
        let by_state = match (b.block.state, alt) {
            (BlockState::Allocated, false) => (g.allocated, t.allocated()),
            (BlockState::Allocated, true) => (g.allocated_alt, t.allocated_alt()),
            (BlockState::PendingFree, _) => (g.pending, t.pending()),
            (BlockState::Inactive, _) => (g.inactive, t.inactive()),
        };
        let out = if self.v.only.is_some_and(|o| !o.matches(self.a, b)) {
            // Filtered out: its state, dimmed.
            (by_state.0, t.dim())
        } else if b.block.state == BlockState::Allocated {
            class_of(self.a, self.keys, self.v.colouring, b, t).unwrap_or(by_state)
        } else {
            by_state
        };
        if self.v.selected == Some(b.addr) {
            (out.0, out.1.patch(t.selected()))
        } else {
            out
        }
    }
}

fn device_line(d: &DeviceView, t: &Theme) -> Line<'static> {
    let g = t.glyphs();
    let f = &d.figures;
    let fr = &f.fragmentation;
    // Worded as the process header ("resv 5.96G alloc 5.31G"): the line
    // fits the map's pane at 120 columns (issue 46, item 16: "largest
    // free S 1.44M L…").
    let mut spans = vec![
        Span::styled(format!("cuda:{}", f.device), t.header()),
        Span::styled(format!(" {} ", g.dot), t.dim()),
        Span::raw(format!(
            "resv {} alloc {}",
            format::bytes_short(f.reserved),
            format::bytes_short(f.allocated)
        )),
    ];
    // The warning before the figures a narrow pane may cut.
    if !f.synced {
        spans.push(Span::styled(" (not synced)", t.warn()));
    }
    spans.push(Span::styled(format!(" {} ", g.dot), t.dim()));
    spans.push(Span::raw(format!(
        "largest free S {} L {}",
        format::opt(fr.largest_free_small, g.absent, format::bytes_short),
        format::opt(fr.largest_free_large, g.absent, format::bytes_short)
    )));
    Line::from(spans)
}

fn segment_line(s: &SegmentView, prefix_w: usize, bar_w: usize, p: &Paint) -> Line<'static> {
    let t = p.t;
    let seg = &s.segment;
    let pool = match (seg.pool_kind, seg.pool_kind_known) {
        (SegmentPool::Large, true) => "L",
        (SegmentPool::Small, true) => "S",
        _ => "?",
    };
    let exp = if seg.expandable { "x" } else { " " };
    let prefix = format!(
        "{pool}{exp} {:<w$} ",
        stream_label(seg.stream),
        w = prefix_w - 4
    );
    let pool_style = if seg.pool_kind == SegmentPool::Small {
        t.key()
    } else {
        t.header()
    };
    let mut spans = vec![Span::styled(prefix, pool_style)];
    // For each cell, the block covering most of it (the selected block
    // wins a cell it touches, so it is never lost between larger ones).
    let size = seg.size.max(1);
    let mut best: Vec<(u64, Option<(&'static str, Style)>)> = vec![(0, None); bar_w];
    let mut alloc_index = 0usize;
    for b in &s.blocks {
        let alt = if b.block.state == BlockState::Allocated {
            alloc_index += 1;
            alloc_index % 2 == 0
        } else {
            false
        };
        let start = b.addr.saturating_sub(seg.addr).min(size);
        let end = (start + b.block.size).min(size);
        if end <= start {
            continue;
        }
        let cell = p.cell(b, alt);
        let chosen = p.v.selected == Some(b.addr);
        let c0 = (start as u128 * bar_w as u128 / size as u128) as usize;
        let c1 = ((end as u128 * bar_w as u128).div_ceil(size as u128) as usize).min(bar_w);
        for (c, slot) in best.iter_mut().enumerate().take(c1).skip(c0) {
            let cs = (c as u128 * size as u128 / bar_w as u128) as u64;
            let ce = ((c as u128 + 1) * size as u128 / bar_w as u128) as u64;
            let overlap = end.min(ce).saturating_sub(start.max(cs));
            if chosen && overlap > 0 {
                *slot = (u64::MAX, Some(cell));
            } else if overlap > slot.0 {
                *slot = (overlap, Some(cell));
            }
        }
    }
    // Runs of equal cells become one span.
    let mut run = String::new();
    let mut run_style: Option<Style> = None;
    for (_, cell) in &best {
        let (sym, style) = cell.unwrap_or((" ", Style::new()));
        if run_style != Some(style) && !run.is_empty() {
            spans.push(Span::styled(
                std::mem::take(&mut run),
                run_style.unwrap_or_default(),
            ));
        }
        run_style = Some(style);
        run.push_str(sym);
    }
    if !run.is_empty() {
        spans.push(Span::styled(run, run_style.unwrap_or_default()));
    }
    spans.push(Span::styled(
        format!("{:>7}", format::bytes_short(seg.size)),
        t.dim(),
    ));
    Line::from(spans)
}
