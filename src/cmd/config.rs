//! The settings file: TOML, `$VRAMSCOPE_CONFIG`, else
//! `$XDG_CONFIG_HOME/vramscope/config.toml`, else
//! `~/.config/vramscope/config.toml`; absent is fine. Layered under the
//! command line: defaults < this file < the environment (`NO_COLOR`) <
//! flags. Every key is in `assets/config/vramscope.toml` (each sample there
//! is loaded by a test). A malformed file, an unknown key or a bad value is
//! one line naming the file, the line and the key, exit 1.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use serde::Deserialize;

use vramscope_ui::rows::Col;

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    #[serde(default)]
    pub dashboard: Dashboard,
}

/// `[dashboard]`: every key optional (absent: the default, or the flag).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Dashboard {
    pub refresh_ms: Option<u32>,
    pub sort: Option<String>,
    pub descending: Option<bool>,
    pub color: Option<bool>,
    pub ascii: Option<bool>,
    pub mouse: Option<bool>,
    pub readonly: Option<bool>,
    pub keep_exited_s: Option<u32>,
    pub screenshot_dir: Option<PathBuf>,
}

impl Dashboard {
    /// The sort column named by `sort` (a column title, any case).
    pub(crate) fn sort_col(&self) -> Option<Col> {
        let want = self.sort.as_deref()?;
        Col::ALL
            .into_iter()
            .find(|c| c.title().eq_ignore_ascii_case(want))
    }
}

/// Where the settings file is looked for.
pub(crate) fn path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VRAMSCOPE_CONFIG").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("vramscope").join("config.toml"))
}

/// The settings in force: the file when there is one, else the defaults.
/// `VRAMSCOPE_CONFIG` naming a file that is not there is an error.
pub(crate) fn load() -> Result<Config> {
    let Some(p) = path() else {
        return Ok(Config::default());
    };
    match read_bounded(&p) {
        Ok(text) => parse(&text, &p),
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && std::env::var_os("VRAMSCOPE_CONFIG").is_none() =>
        {
            Ok(Config::default())
        }
        Err(e) => Err(anyhow!("{}: {e}", p.display())),
    }
}

/// The most a settings file may hold (every key of the sample fits in a
/// tenth of it).
pub(crate) const MAX_SIZE: u64 = 64 * 1024;

/// Reads the settings file: a regular file (a FIFO, a device or a
/// directory is refused before a byte is read, and opening never waits on
/// one) of at most [`MAX_SIZE`] bytes.
fn read_bounded(p: &Path) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind, Read};
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(p)?;
    if !file.metadata()?.is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "not a regular file (a settings file must be one)",
        ));
    }
    let mut text = String::new();
    file.take(MAX_SIZE + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_SIZE {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("larger than {} KiB: not a settings file", MAX_SIZE / 1024),
        ));
    }
    Ok(text)
}

/// `text` (read from `path`) as settings; an error is one line: `FILE:LINE:
/// key `KEY`: what is wrong`.
pub(crate) fn parse(text: &str, path: &Path) -> Result<Config> {
    let cfg: Config = toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(0, |s| {
            text[..s.start.min(text.len())].matches('\n').count() + 1
        });
        let key = e
            .span()
            .and_then(|s| key_at(text, s.start))
            .map(|k| format!("key `{k}`: "))
            .unwrap_or_default();
        let msg = e.message().lines().next().unwrap_or("").trim().to_string();
        anyhow!("{}:{line}: {key}{msg}", path.display())
    })?;
    if let (Some(s), None) = (&cfg.dashboard.sort, cfg.dashboard.sort_col()) {
        let line = line_of(text, "sort").unwrap_or(0);
        let titles: Vec<&str> = Col::ALL.iter().map(|c| c.title()).collect();
        return Err(anyhow!(
            "{}:{line}: key `dashboard.sort`: no column {s:?} (one of {})",
            path.display(),
            titles.join(" ")
        ));
    }
    Ok(cfg)
}

/// The key of the `key = value` line holding byte `at`, with its table.
fn key_at(text: &str, at: usize) -> Option<String> {
    let before = &text[..at.min(text.len())];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next()?;
    let key = line.split('=').next()?.trim();
    if key.is_empty() || key.starts_with('[') || key.starts_with('#') {
        // A table header, or the error is not on a key's line.
        return key
            .strip_prefix('[')
            .map(|k| k.trim_end_matches(']').trim().to_string());
    }
    let table = before[..line_start].lines().rev().find_map(|l| {
        l.trim()
            .strip_prefix('[')
            .map(|t| t.trim_end_matches(']').trim())
    });
    Some(match table {
        Some(t) => format!("{t}.{key}"),
        None => key.to_string(),
    })
}

/// The 1-based line where `key` is set.
fn line_of(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| l.split('=').next().is_some_and(|k| k.trim() == key))
        .map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(text, Path::new("/home/u/.config/vramscope/config.toml"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn every_sample_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/config");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            if p.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&p).unwrap();
                parse(&text, &p).unwrap_or_else(|e| panic!("{e}"));
                n += 1;
            }
        }
        assert!(n >= 3, "{n} samples");
        // The documented file sets every key to its default.
        let full = dir.join("vramscope.toml");
        let c = parse(&std::fs::read_to_string(&full).unwrap(), &full).unwrap();
        let d = &c.dashboard;
        assert_eq!(d.refresh_ms, Some(250));
        assert_eq!(d.sort_col(), Some(Col::Reserved));
        assert_eq!(
            (d.descending, d.color, d.ascii, d.mouse, d.readonly),
            (Some(true), Some(true), Some(false), Some(true), Some(false))
        );
    }

    #[test]
    fn errors_are_one_line_naming_file_line_and_key() {
        let e = err("[dashboard]\nrefresh_ms = 250\nfrobnicate = 1\n");
        assert!(e.starts_with("/home/u/.config/vramscope/config.toml:3: key `dashboard.frobnicate`: unknown field `frobnicate`"), "{e}");
        assert_eq!(e.lines().count(), 1);
        let e = err("[dashboard]\n\nrefresh_ms = \"fast\"\n");
        assert!(
            e.contains("config.toml:3: key `dashboard.refresh_ms`:"),
            "{e}"
        );
        assert!(e.contains("invalid type"), "{e}");
        let e = err("[dashboard\nsort = 1\n");
        assert!(e.contains("config.toml:1:"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        let e = err("[dashbord]\nsort = \"pid\"\n");
        assert!(
            e.contains(":1: key `dashbord`: unknown field `dashbord`"),
            "{e}"
        );
        let e = err("[dashboard]\nsort = \"size\"\n");
        assert!(
            e.contains(":2: key `dashboard.sort`: no column \"size\""),
            "{e}"
        );
        let e = err("[dashboard]\nrefresh_ms = -5\n");
        assert!(e.contains(":2: key `dashboard.refresh_ms`:"), "{e}");
    }
}
