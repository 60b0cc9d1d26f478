//! `vramscope doctor`: every requirement checked and explained, with what to
//! do about each that is missing; exits non-zero when a check failed.
use std::fmt::Write as _;

use anyhow::Result;

use vramscope_collect::agent::Level;

use super::common::ShmFlag;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// One JSON document: `checks` (each with its name, level, detail and
    /// fix) and `failed`, as `snapshot --json` is one document.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    shm: ShmFlag,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let checks = vramscope_collect::agent::doctor(args.shm.shm_dir.as_deref());
    let mut o = String::new();
    let failed = checks.iter().filter(|c| c.level == Level::Fail).count();
    if args.json {
        let doc = serde_json::json!({ "checks": &checks, "failed": failed });
        let _ = writeln!(o, "{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for c in &checks {
            let mark = match c.level {
                Level::Ok => "ok  ",
                Level::Warn => "warn",
                Level::Fail => "FAIL",
            };
            let _ = writeln!(o, "[{mark}] {}: {}", c.name, c.detail);
            if !c.fix.is_empty() {
                let _ = writeln!(o, "       -> {}", c.fix);
            }
        }
    }
    super::out::print(&o)?;
    if failed > 0 {
        anyhow::bail!("{failed} check(s) failed");
    }
    Ok(())
}
