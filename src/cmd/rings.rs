//! `vramscope rings`: what is in the segment directory.
use anyhow::Result;
use serde::Serialize;

use vramscope_wire::ring::discover::{self, Liveness, Located};
use vramscope_wire::ring::{Producer, SegmentReader};

use super::common::ShmFlag;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Remove segments whose process is gone.
    #[arg(long)]
    clean: bool,
    /// One JSON object per segment instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    shm: ShmFlag,
}

#[derive(Serialize)]
struct Row {
    path: String,
    pid: Option<u32>,
    producer: Option<Producer>,
    label: Option<String>,
    framework: Option<String>,
    liveness: Option<Liveness>,
    /// Why the liveness cannot be told, when it cannot.
    why: Option<String>,
    /// Records written so far, all rings.
    written: Option<u64>,
    /// Records abandoned by writers (slot held), all rings.
    writer_dropped: Option<u64>,
    error: Option<String>,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let dir = args.shm.dir();
    if args.clean {
        for p in discover::remove_stale(&dir)? {
            vramscope_text::stderr_line(format_args!("removed stale {}", p.display()));
        }
    }
    let (found, others) = discover::list(&dir)?;
    let rows: Vec<Row> = found
        .iter()
        .map(|f| match SegmentReader::open(&f.path) {
            Ok(r) => {
                let h = r.header();
                let n = h.rings.len();
                let located = if r.state() == vramscope_wire::ring::layout::STATE_CLOSED {
                    Located::Dead
                } else {
                    discover::locate(h.pid, h.start_time)
                };
                Row {
                    path: f.path.display().to_string(),
                    pid: Some(h.pid),
                    producer: Some(h.producer),
                    label: Some(h.label.clone()),
                    framework: Some(h.framework.clone()),
                    liveness: Some(located.liveness()),
                    why: match located {
                        Located::CannotTell(why) => Some(why),
                        _ => None,
                    },
                    written: Some((0..n).map(|i| r.head(i)).sum()),
                    writer_dropped: Some((0..n).map(|i| r.writer_dropped(i)).sum()),
                    error: None,
                }
            }
            Err(e) => Row {
                path: f.path.display().to_string(),
                pid: Some(f.name.pid),
                producer: None,
                label: None,
                framework: None,
                liveness: None,
                why: None,
                written: None,
                writer_dropped: None,
                error: Some(e.to_string()),
            },
        })
        .collect();
    super::out::print(&if args.json {
        json_lines(&rows)?
    } else {
        table(&rows, &dir, others, args.clean)
    })
}

/// One JSON object per segment.
fn json_lines(rows: &[Row]) -> anyhow::Result<String> {
    let mut o = String::new();
    for r in rows {
        o.push_str(&serde_json::to_string(r)?);
        o.push('\n');
    }
    Ok(o)
}

/// The segments as a table, with what to do about stale ones.
fn table(rows: &[Row], dir: &std::path::Path, others: usize, cleaned: bool) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "{} segment(s) in {}", rows.len(), dir.display());
    if others > 0 {
        let _ = writeln!(o, "({others} other users' segments not shown)");
    }
    let mut stale = false;
    for r in rows {
        stale |= matches!(r.liveness, Some(Liveness::Dead | Liveness::Reused));
        let _ = match &r.error {
            Some(e) => writeln!(o, "  ! {e}"),
            None => writeln!(
                o,
                "  pid {:>7}  {:<12} {:<8} written {:>12}  dropped {:>6}  {}  {}",
                r.pid.unwrap_or(0),
                format!("{:?}", r.producer.unwrap_or(Producer::Other(0))),
                format!("{:?}", r.liveness.unwrap_or(Liveness::Dead)),
                r.written.unwrap_or(0),
                r.writer_dropped.unwrap_or(0),
                r.label.as_deref().unwrap_or(""),
                r.framework.as_deref().unwrap_or(""),
            ),
        };
        if let Some(why) = &r.why {
            let _ = writeln!(o, "      cannot tell whether it runs: {why}; left alone");
        }
    }
    if stale && !cleaned {
        let _ = writeln!(o, "`vramscope rings --clean` removes stale segments");
    }
    o
}
