//! Every number a flag takes — a duration, a speed, a size, a count — is
//! parsed by one of these types, never as a bare `f64`/`u64`:
//!
//! | type        | written as          | accepted                                   |
//! |-------------|---------------------|--------------------------------------------|
//! | [`Seconds`] | seconds, decimals   | more than 0, at most [`Seconds::MAX`]       |
//! | [`Millis`]  | whole milliseconds  | `MIN` (default 0) to [`Millis::MAX`]        |
//! | [`Speed`]   | a factor, decimals  | [`Speed::MIN`] to [`Speed::MAX`]            |
//! | [`Gib`]     | GiB, decimals       | more than 0, at most [`Gib::MAX`]           |
//! | [`Count`]   | a whole number      | 1 to [`Count::MAX`]                         |
//! | [`Index`]   | a whole number      | 0 to [`Index::MAX`]                         |
//! | [`Runs`]    | a whole number      | 1 to 1000                                   |
//! | [`Fraction`]| a share, decimals   | more than 0, at most 1                      |
//! | [`TermSize`]| `COLSxROWS`         | 20x8 to 1000x500                            |
//! | [`StepRange`]| `K..N`             | steps 0 to 2^32, K ≤ N                      |
//! | [`Batch`]   | a whole number      | 1 to [`MAX_BATCH`]                          |
//! | [`Bytes`]   | bytes, or a decimal with B, KiB, MiB, GiB or TiB | 1 byte to 1 PiB |
//! | [`RunAt`]   | `RECORDING:BATCH`   | a path, then a [`Batch`]                    |
//!
//! NaN, infinities, negative numbers, zero where it means nothing, and
//! values that would overflow a `Duration`, an `Instant` or a byte count are
//! refused while the command line is parsed: clap names the flag and the
//! value, the type says what is accepted, all on one line, exit 2
//! (`invalid value '-1' for '--duration <SECS>': seconds must be more than 0
//! and at most 100000000`). A value that passes can be turned into a
//! `Duration`, an `Instant` offset or a byte count without checks.
//!
//! A new flag that takes a number uses one of these (or a new type here
//! with the same shape): `#[arg(long)] timeout: Seconds` — clap finds the
//! parser through `FromStr`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use vramscope_core::sim::fit::MAX_BATCH;

/// A finite decimal in `lo..=hi` (`lo` excluded when `open_lo`).
fn decimal(s: &str, what: &str, lo: f64, open_lo: bool, hi: f64) -> Result<f64, String> {
    let range = if open_lo {
        format!("more than {lo} and at most {hi}")
    } else {
        format!("at least {lo} and at most {hi}")
    };
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{what} must be a number, {range}"))?;
    let below = if open_lo { v <= lo } else { v < lo };
    if !v.is_finite() || below || v > hi {
        return Err(format!("{what} must be {range}"));
    }
    Ok(v)
}

/// A whole number in `lo..=hi`.
fn whole(s: &str, what: &str, lo: u64, hi: u64) -> Result<u64, String> {
    let range = format!("a whole number, at least {lo} and at most {hi}");
    match s.trim().parse::<u64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(format!("{what} must be {range}")),
    }
}

/// A terminal size for drawing without a terminal (`--size 120x40`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TermSize {
    pub cols: u16,
    pub rows: u16,
}

impl TermSize {
    pub(crate) const MIN: (u64, u64) = (20, 8);
    pub(crate) const MAX: (u64, u64) = (1000, 500);
}

impl FromStr for TermSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "a size is COLSxROWS, {}x{} to {}x{} (e.g. 120x40)",
                Self::MIN.0,
                Self::MIN.1,
                Self::MAX.0,
                Self::MAX.1
            )
        };
        let (c, r) = s.trim().split_once(['x', 'X']).ok_or_else(bad)?;
        let cols = whole(c, "columns", Self::MIN.0, Self::MAX.0).map_err(|_| bad())?;
        let rows = whole(r, "rows", Self::MIN.1, Self::MAX.1).map_err(|_| bad())?;
        Ok(TermSize {
            cols: cols as u16,
            rows: rows as u16,
        })
    }
}

impl fmt::Display for TermSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.cols, self.rows)
    }
}

/// A length of time in seconds (`--duration 2.5`, `--timeout 10`).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub(crate) struct Seconds(f64);

impl Seconds {
    /// About three years: any `Instant` this far ahead exists.
    pub(crate) const MAX: f64 = 1e8;

    pub(crate) fn secs(self) -> f64 {
        self.0
    }

    pub(crate) fn duration(self) -> Duration {
        Duration::from_secs_f64(self.0)
    }
}

impl FromStr for Seconds {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        decimal(s, "seconds", 0.0, true, Self::MAX).map(Seconds)
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A length of time in whole milliseconds (`--refresh 250`), at least
/// `MIN` (`Millis<100>`: a poll period that must not spin).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Millis<const MIN: u64 = 0>(u64);

impl<const MIN: u64> Millis<MIN> {
    /// One day.
    pub(crate) const MAX: u64 = 86_400_000;

    pub(crate) fn duration(self) -> Duration {
        Duration::from_millis(self.0)
    }
}

impl<const MIN: u64> FromStr for Millis<MIN> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        whole(s, "milliseconds", MIN, Self::MAX).map(Millis)
    }
}

impl<const MIN: u64> fmt::Display for Millis<MIN> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A playback or simulation speed: recorded (or simulated) seconds per
/// second (`--speed 2`).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub(crate) struct Speed(f64);

impl Speed {
    /// A second lasts at most 1000 s (a day of recording plays in at most
    /// about 3 years: every pacing `Instant` exists).
    pub(crate) const MIN: f64 = 0.001;
    pub(crate) const MAX: f64 = 1_000_000.0;

    pub(crate) fn factor(self) -> f64 {
        self.0
    }
}

impl FromStr for Speed {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        decimal(s, "the speed", Self::MIN, false, Self::MAX).map(Speed)
    }
}

impl fmt::Display for Speed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A memory size in GiB (`--capacity-gib 80`).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub(crate) struct Gib(f64);

impl Gib {
    /// 1 PiB.
    pub(crate) const MAX: f64 = 1_048_576.0;

    pub(crate) fn bytes(self) -> u64 {
        (self.0 * (1u64 << 30) as f64) as u64
    }
}

impl FromStr for Gib {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        decimal(s, "GiB", 0.0, true, Self::MAX).map(Gib)
    }
}

impl fmt::Display for Gib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// How many of something (`export --max-entries`): at least one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Count(u64);

impl Count {
    pub(crate) const MAX: u64 = 1 << 32;

    pub(crate) fn get(self) -> u64 {
        self.0
    }
}

impl FromStr for Count {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        whole(s, "the count", 1, Self::MAX).map(Count)
    }
}

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A percentage (`diff --fail-over 10`): 0 to 1,000,000.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Percent(f64);

impl Percent {
    pub(crate) fn get(self) -> f64 {
        self.0
    }
}

impl FromStr for Percent {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        decimal(s, "the percentage", 0.0, false, 1_000_000.0).map(Percent)
    }
}

/// A share of the device (`sim --fraction`, as
/// `torch.cuda.set_per_process_memory_fraction`): more than 0, at most 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fraction(f64);

impl Fraction {
    pub(crate) fn get(self) -> f64 {
        self.0
    }
}

impl FromStr for Fraction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        decimal(s, "the fraction", 0.0, true, 1.0).map(Fraction)
    }
}

/// How many times to run a demo scenario (`--runs`): 1 to 1000.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Runs(u32);

impl Runs {
    pub(crate) fn get(self) -> u32 {
        self.0
    }
}

impl FromStr for Runs {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        whole(s, "the number of runs", 1, 1000).map(|n| Runs(n as u32))
    }
}

/// Steps to capture stacks for (`stacks --steps`): 0 (stop) to 2^32 - 1,
/// as command 5 carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CaptureSteps(u32);

impl CaptureSteps {
    pub(crate) fn get(self) -> u32 {
        self.0
    }
}

impl FromStr for CaptureSteps {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        whole(s, "the number of steps", 0, u64::from(u32::MAX)).map(|n| CaptureSteps(n as u32))
    }
}

/// Frames per captured stack (`stacks --depth`): 0 (the producer's
/// default) to 65535, as command 5 carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StackDepth(u16);

impl StackDepth {
    pub(crate) fn get(self) -> u16 {
        self.0
    }
}

impl FromStr for StackDepth {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        whole(s, "the stack depth", 0, u64::from(u16::MAX)).map(|n| StackDepth(n as u16))
    }
}

/// A position in a sequence (`open --at 0`): zero or more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Index(u64);

impl Index {
    pub(crate) const MAX: u64 = 1 << 32;

    pub(crate) fn get(self) -> u64 {
        self.0
    }
}

impl FromStr for Index {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        whole(s, "the index", 0, Self::MAX).map(Index)
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Two training steps, the first not after the second (`replay --diff 3..8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepRange {
    pub from: u64,
    pub to: u64,
}

impl StepRange {
    pub(crate) const MAX: u64 = 1 << 32;
}

impl FromStr for StepRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "steps are K..N, whole numbers 0 to {} with K at most N (e.g. 3..8)",
                Self::MAX
            )
        };
        let (k, n) = s.trim().split_once("..").ok_or_else(bad)?;
        let from = whole(k, "K", 0, Self::MAX).map_err(|_| bad())?;
        let to = whole(n, "N", 0, Self::MAX).map_err(|_| bad())?;
        if from > to {
            return Err(bad());
        }
        Ok(StepRange { from, to })
    }
}

impl fmt::Display for StepRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.from, self.to)
    }
}

/// A batch size (`fit --at 32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Batch(u64);

impl Batch {
    pub(crate) fn get(self) -> u64 {
        self.0
    }
}

impl FromStr for Batch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        whole(s, "the batch size", 1, MAX_BATCH).map(Batch)
    }
}

/// A byte count (`fit --limit 40GiB`): whole bytes, or a decimal with a
/// binary unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bytes(u64);

impl Bytes {
    /// 1 PiB.
    pub(crate) const MAX: u64 = 1 << 50;

    pub(crate) fn get(self) -> u64 {
        self.0
    }
}

impl FromStr for Bytes {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let range = "bytes must be at least 1 byte and at most 1 PiB, as a whole number or a decimal with B, KiB, MiB, GiB or TiB (e.g. 40GiB)";
        let s = s.trim();
        let split = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
        let (number, unit) = (s[..split].trim(), s[split..].trim());
        let shift = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "kib" => 10,
            "mib" => 20,
            "gib" => 30,
            "tib" => 40,
            _ => return Err(range.to_string()),
        };
        let v: f64 = number.parse().map_err(|_| range.to_string())?;
        let b = v * (1u64 << shift) as f64;
        if !b.is_finite() || b < 1.0 || b > Self::MAX as f64 || (shift == 0 && v.fract() != 0.0) {
            return Err(range.to_string());
        }
        Ok(Bytes(b as u64))
    }
}

/// A recording and the batch size it ran at (`fit run-b8.vsrec:8`); the
/// batch follows the last colon, so a path may hold colons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunAt {
    pub(crate) path: std::path::PathBuf,
    pub(crate) batch: u64,
}

impl FromStr for RunAt {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let Some((path, batch)) = s.rsplit_once(':').filter(|(p, _)| !p.is_empty()) else {
            return Err("expected RECORDING:BATCH, the recording and the batch size it ran at (e.g. run-b8.vsrec:8)".into());
        };
        let batch = batch.parse::<Batch>()?.get();
        Ok(RunAt {
            path: path.into(),
            batch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_steps_and_depth_fit_command_5() {
        assert_eq!("0".parse::<CaptureSteps>().map(CaptureSteps::get), Ok(0));
        assert_eq!(
            "4294967295".parse::<CaptureSteps>().map(CaptureSteps::get),
            Ok(u32::MAX)
        );
        assert!("4294967296".parse::<CaptureSteps>().is_err());
        assert!("-1".parse::<CaptureSteps>().is_err());
        assert_eq!(
            "65535".parse::<StackDepth>().map(StackDepth::get),
            Ok(65535)
        );
        let e = "65536".parse::<StackDepth>().unwrap_err();
        assert!(e.contains("the stack depth") && e.contains("65535"), "{e}");
    }

    #[test]
    fn step_ranges() {
        assert_eq!("3..8".parse(), Ok(StepRange { from: 3, to: 8 }));
        assert_eq!("5..5".parse(), Ok(StepRange { from: 5, to: 5 }));
        for bad in [
            "8..3",
            "3",
            "..8",
            "3..",
            "-1..2",
            "1..4294967297",
            "a..b",
            "1...3",
        ] {
            assert!(bad.parse::<StepRange>().is_err(), "{bad}");
        }
    }

    #[test]
    fn refuses_what_overflows_or_means_nothing() {
        for bad in ["-1", "nan", "NaN", "inf", "-inf", "0", "1e20", "x", ""] {
            assert!(bad.parse::<Seconds>().is_err(), "{bad}");
            assert!(bad.parse::<Gib>().is_err(), "{bad}");
            assert!(bad.parse::<Speed>().is_err(), "{bad}");
        }
        for bad in ["1e-300", "1e-9", "-0"] {
            assert!(bad.parse::<Speed>().is_err(), "{bad}");
        }
        for bad in ["-1", "1.5", "nan", "99999999999999999999"] {
            assert!(bad.parse::<Millis>().is_err(), "{bad}");
            assert!(bad.parse::<Count>().is_err(), "{bad}");
        }
        assert!("0".parse::<Count>().is_err());
        assert_eq!("0".parse::<Millis>().unwrap().duration(), Duration::ZERO);
        assert!("99".parse::<Millis<100>>().is_err());
        assert!("100".parse::<Millis<100>>().is_ok());
        assert_eq!(
            "2.5".parse::<Seconds>().unwrap().duration().as_millis(),
            2500
        );
        assert_eq!("1".parse::<Gib>().unwrap().bytes(), 1 << 30);
        let e = "-1".parse::<Seconds>().unwrap_err();
        assert!(e.contains("more than 0") && !e.contains('\n'), "{e}");
        // The largest of each still fits a Duration and an Instant.
        let far = Seconds(Seconds::MAX).duration();
        assert!(std::time::Instant::now().checked_add(far).is_some());
    }

    /// Batches, byte counts and RECORDING:BATCH: what is accepted, and one
    /// line naming what is wrong for the rest (0, negative, huge, NaN, a
    /// fraction of a byte, a unit that is not one).
    #[test]
    fn batches_bytes_and_runs() {
        assert_eq!("32".parse::<Batch>().unwrap().get(), 32);
        for bad in ["0", "-4", "1048577", "1e3", "nan", ""] {
            let e = bad.parse::<Batch>().unwrap_err();
            assert!(e.contains("batch size") && !e.contains('\n'), "{bad}: {e}");
        }
        assert_eq!("1000".parse::<Bytes>().unwrap().get(), 1000);
        assert_eq!("1.5GiB".parse::<Bytes>().unwrap().get(), 3 << 29);
        assert_eq!("40 gib".parse::<Bytes>().unwrap().get(), 40 << 30);
        for bad in [
            "0", "-1", "0.5", "1.5", "2PiB", "inf", "NaNGiB", "1 GB", "2048TiB",
        ] {
            assert!(bad.parse::<Bytes>().is_err(), "{bad}");
        }
        let r: RunAt = "a:b/run-b8.vsrec:8".parse().unwrap();
        assert_eq!((r.path.to_str(), r.batch), (Some("a:b/run-b8.vsrec"), 8));
        for bad in [
            "run.vsrec",
            ":8",
            "run.vsrec:",
            "run.vsrec:0",
            "run.vsrec:x",
        ] {
            let e = bad.parse::<RunAt>().unwrap_err();
            assert!(!e.contains('\n'), "{bad}: {e}");
        }
    }
}
