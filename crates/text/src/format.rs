//! Numbers as text. A figure that is absent renders as the theme's absent
//! glyph (`—`, or `-` in ASCII mode), never as 0.
//!
//! The one public formatter of the crate for bytes and for durations: use
//! [`bytes`] (`1.50 GiB`, binary units, three significant digits) and
//! [`duration`] (`850ms`, `12.5s`, `3m05s`, `2h10m`) everywhere, the CLI's
//! reports included; [`bytes_short`] and [`span`] are their compact forms
//! for tables and axes.

/// How a byte count names its unit: `1.23 GiB` or `1.23G`.
struct Units {
    names: [&'static str; 6],
    /// Between the number and the unit.
    gap: &'static str,
}

const LONG: Units = Units {
    names: ["B", "KiB", "MiB", "GiB", "TiB", "PiB"],
    gap: " ",
};
const SHORT: Units = Units {
    names: ["B", "K", "M", "G", "T", "P"],
    gap: "",
};

/// Bytes in binary units with three significant digits: `1.23 GiB`,
/// `20.0 MiB`, `512 B`. The crate's byte formatter.
pub fn bytes(b: u64) -> String {
    bytes_in(b, &LONG)
}

/// Compact: `1.23G`, `512M`, `0B`.
pub fn bytes_short(b: u64) -> String {
    bytes_in(b, &SHORT)
}

/// `b` in `units`: whole bytes below 1 KiB, else three significant digits.
fn bytes_in(b: u64, units: &Units) -> String {
    let Units { names, gap } = units;
    if b < 1024 {
        return format!("{b}{gap}{}", names[0]);
    }
    let mut v = b as f64;
    let mut u = 0;
    // 1023.5 and up would print as `1024`: the next unit says it as `1.00`.
    while v >= 1023.5 && u < names.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{}{gap}{}", sig3(v), names[u])
}

/// Bytes that may be negative, no sign when not: `-12.0 MiB`, `3.00 GiB`.
pub fn bytes_i64(b: i64) -> String {
    minus(b, bytes)
}

/// Signed compact bytes (`-12M`).
pub fn bytes_signed_short(b: i64) -> String {
    minus(b, bytes_short)
}

/// `b` through `f`, with a `-` before it when negative.
fn minus(b: i64, f: fn(u64) -> String) -> String {
    if b < 0 {
        format!("-{}", f(b.unsigned_abs()))
    } else {
        f(b as u64)
    }
}

/// Signed bytes (`+1.5 MiB`).
pub fn bytes_signed(b: f64) -> String {
    let s = bytes(b.abs().round() as u64);
    if b < 0.0 {
        format!("-{s}")
    } else {
        format!("+{s}")
    }
}

/// Three significant digits: `1.23`, `12.3`, `123`.
fn sig3(v: f64) -> String {
    // Decided on the value as it will be rounded: 9.996 is `10.0`, never
    // `10.00` (issue 30, item 6: one column printed "10.00G" beside "11.1G").
    if v < 9.995 {
        format!("{v:.2}")
    } else if v < 99.95 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// `Some(x)` through `f`, `None` as `absent`.
pub fn opt<T>(v: Option<T>, absent: &str, f: impl FnOnce(T) -> String) -> String {
    v.map_or_else(|| absent.to_string(), f)
}

/// A duration in ns, short: `850ms`, `12.5s`, `3m05s`, `2h10m`. The
/// crate's duration formatter.
pub fn duration(ns: u64) -> String {
    let ms = ns / 1_000_000;
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60)
    } else {
        format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60)
    }
}

/// A time span for axis labels: `500ms`, `30s`, `2m`, `1h`.
pub fn span(ns: u64) -> String {
    let ms = ns / 1_000_000;
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 && ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        if ms % 60_000 == 0 {
            format!("{}m", ms / 60_000)
        } else {
            format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60)
        }
    } else {
        format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60)
    }
}

/// Percentage with one decimal below 10 %.
pub fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p < 9.95 {
        format!("{p:.1}%")
    } else {
        format!("{p:.0}%")
    }
}

/// A rate: `12`, `1.2k`, `34k`.
pub fn rate(r: f64) -> String {
    if r < 10.0 {
        format!("{r:.1}")
    } else if r < 1000.0 {
        format!("{r:.0}")
    } else if r < 10_000.0 {
        format!("{:.1}k", r / 1000.0)
    } else if r < 1_000_000.0 {
        format!("{:.0}k", r / 1000.0)
    } else {
        format!("{:.1}M", r / 1_000_000.0)
    }
}

/// `n` with thousands separators: `65,536`.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Exact bytes, for a difference that rounding would hide: `6,903,824,896 B`.
pub fn bytes_exact(b: u64) -> String {
    format!("{} B", grouped(b))
}

/// A count: `12`, `1.2k`, `3.4M`.
pub fn count(n: u64) -> String {
    if n < 10_000 {
        n.to_string()
    } else {
        rate(n as f64)
    }
}

/// Cuts `s` to `width` display columns, ending in `ellipsis` when cut.
pub fn truncate(s: &str, width: usize, ellipsis: &str) -> String {
    use unicode_width::UnicodeWidthStr;
    if s.width() <= width {
        return s.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let mut out = String::new();
    let mut w = 0;
    let limit = width.saturating_sub(ellipsis.width());
    for ch in s.chars() {
        let cw = unicode_width::UnicodeWidthChar::width(ch).unwrap_or(0);
        if w + cw > limit {
            break;
        }
        out.push(ch);
        w += cw;
    }
    out.push_str(ellipsis);
    out
}

/// Cuts `s` to `width` display columns at a word boundary (a space, or
/// after `/`, `,` or `:`), ending in `ellipsis` when cut; a first word
/// longer than `width` is cut inside it.
pub fn fit_words(s: &str, width: usize, ellipsis: &str) -> String {
    use unicode_width::UnicodeWidthStr;
    if s.width() <= width {
        return s.to_string();
    }
    let cut = truncate(s, width, ellipsis);
    let body = cut.strip_suffix(ellipsis).unwrap_or(&cut);
    // The last boundary inside what fits, past the first word.
    let at = body
        .char_indices()
        .filter(|(_, c)| matches!(c, ' ' | '/' | ',' | ':'))
        .map(|(i, c)| if c == ' ' { i } else { i + c.len_utf8() })
        .rfind(|i| *i > 0);
    match at {
        Some(i) => format!("{}{ellipsis}", body[..i].trim_end()),
        None => cut,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(20 << 20), "20.0 MiB");
        assert_eq!(bytes(3 << 30), "3.00 GiB");
        assert_eq!(bytes((1 << 20) - 1), "1.00 MiB");
        assert_eq!(bytes(1 << 20), "1.00 MiB");
        assert_eq!(bytes(1023 << 10), "1023 KiB");
        assert_eq!(bytes_short(512 << 20), "512M");
        assert_eq!(bytes_signed_short(-(2 << 20)), "-2.00M");
        assert_eq!(bytes_i64(-(12 << 20)), "-12.0 MiB");
        assert_eq!(bytes_i64(3 << 30), "3.00 GiB");
        assert_eq!(opt(None::<u64>, "—", bytes), "—");
    }

    /// Issue 30, item 6: three significant digits whatever the rounding:
    /// just under 10 and 100 of a unit print as `10.0` and `100`, never
    /// `10.00` or `100.0`.
    #[test]
    fn three_digits_across_a_rounding_edge() {
        let gib = 1u64 << 30;
        assert_eq!(bytes_short(10 * gib - (1 << 20)), "10.0G");
        assert_eq!(bytes_short(100 * gib - (1 << 20)), "100G");
        assert_eq!(bytes_short(11 * gib + gib / 10), "11.1G");
        assert_eq!(bytes(10 * gib - (1 << 20)), "10.0 GiB");
        for b in (1u64..4000).map(|i| i * 7_777_777) {
            let s = bytes_short(b);
            let digits = s.chars().filter(char::is_ascii_digit).count();
            // 1000 to 1023 of a unit are whole numbers of four digits.
            assert!(digits == 3 || (digits == 4 && !s.contains('.')), "{b}: {s}");
        }
    }

    #[test]
    fn times() {
        assert_eq!(duration(850_000_000), "850ms");
        assert_eq!(duration(12_500_000_000), "12.5s");
        assert_eq!(duration(185_000_000_000), "3m05s");
        assert_eq!(span(30_000_000_000), "30s");
        assert_eq!(span(120_000_000_000), "2m");
    }

    #[test]
    fn cut() {
        assert_eq!(truncate("train.py", 20, "…"), "train.py");
        assert_eq!(truncate("a_very_long_name.py", 8, "…"), "a_very_…");
        assert_eq!(truncate("abcdef", 4, "~"), "abc~");
        assert_eq!(
            fit_words("NVML unavailable: driver not loaded (a", 24, "…"),
            "NVML unavailable:…"
        );
        assert_eq!(
            fit_words("largest free S 1.44M L 64.0M", 20, "…"),
            "largest free S…"
        );
        assert_eq!(fit_words("short", 20, "…"), "short");
        assert_eq!(fit_words("averyveryverylongword", 8, "…"), "averyve…");
    }
}
