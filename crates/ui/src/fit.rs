//! A styled line cut to a width, at a word boundary, each span keeping
//! its style: the panes' one way to shorten a line.

/// `line` cut to `width` columns at a word boundary ([`fit_words`](vramscope_text::format::fit_words)), each
/// span keeping its style; spans past the cut are left out.
pub(crate) fn fit_line(
    line: ratatui::text::Line<'static>,
    width: usize,
    ellipsis: &str,
) -> ratatui::text::Line<'static> {
    if line.width() <= width {
        return line;
    }
    let mut out = Vec::new();
    let mut used = 0;
    for span in line.spans {
        let w = span.width();
        if used + w <= width {
            used += w;
            out.push(span);
            continue;
        }
        let room = width - used;
        if room > ellipsis.len() {
            let text = vramscope_text::format::fit_words(&span.content, room, ellipsis);
            out.push(ratatui::text::Span::styled(text, span.style));
        } else if let Some(last) = out.last_mut() {
            let text =
                vramscope_text::format::fit_words(last.content.trim_end(), last.width(), ellipsis);
            last.content = text.into();
        }
        break;
    }
    ratatui::text::Line::from(out).style(line.style)
}
