//! `PYTORCH_CUDA_ALLOC_CONF` parsing, following `AllocatorConfig::parseArgs`
//! (`c10/core/AllocatorConfig.cpp`).
//!
//! The string is a comma-separated list of `key:value` options; spaces are
//! ignored. Supported keys and what the simulator does with them:
//!
//! | key | value | effect in the simulator |
//! |---|---|---|
//! | `max_split_size_mb` | integer MiB, `>= 20` | oversize blocks are not split |
//! | `max_non_split_rounding_mb` | integer MiB, `>= 20` | how much larger than an oversize request a cached oversize block may be |
//! | `roundup_power2_divisions` | power of two, or `[256:1,512:2,>:4]` (MiB interval starts) | power-of-two rounding of request sizes |
//! | `garbage_collection_threshold` | number in (0, 1) | reclaim of old cached blocks (only with a memory fraction, as in PyTorch) |
//! | `expandable_segments` | `True` / `False` | one growing segment per stream and pool |
//! | `backend` | `native` | (`cudaMallocAsync` is refused: not simulated) |
//! | `release_lock_on_cudamalloc`, `pinned_use_cuda_host_register`, `pinned_use_background_threads` | `True` / `False` | accepted, no effect |
//! | `pinned_num_register_threads` | power of two | accepted, no effect |
//!
//! Any other key, or a bad value, is an error naming the key and the value.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::pytorch::{
    self as rules, RoundupDivisions, K_LARGE_BUFFER, NO_ROUNDUP_DIVISIONS,
    ROUNDUP_POWER2_INTERVALS, UNLIMITED_SPLIT_SIZE,
};

const MIB: u64 = 1 << 20;

/// A parsed allocator configuration (the native-allocator part of
/// `PYTORCH_CUDA_ALLOC_CONF`). `Default` is PyTorch's default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocConf {
    /// `max_split_size` in bytes; [`UNLIMITED_SPLIT_SIZE`] when unset.
    pub max_split_size: u64,
    /// `max_non_split_rounding_size` in bytes (default 20 MiB).
    pub max_non_split_rounding_size: u64,
    /// `roundup_power2_divisions` per 1 MiB..64 GiB power-of-two interval.
    pub roundup_power2_divisions: RoundupDivisions,
    /// `garbage_collection_threshold` (0 = off).
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`.
    pub expandable_segments: bool,
}

impl Default for AllocConf {
    fn default() -> Self {
        AllocConf {
            max_split_size: UNLIMITED_SPLIT_SIZE,
            max_non_split_rounding_size: K_LARGE_BUFFER,
            roundup_power2_divisions: NO_ROUNDUP_DIVISIONS,
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
        }
    }
}

/// Why a configuration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfError {
    #[error("unknown allocator option `{key}` (known: max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, garbage_collection_threshold, expandable_segments, backend, release_lock_on_cudamalloc, pinned_*)")]
    UnknownKey { key: String },
    #[error("allocator option `{key}` needs a value (`{key}:VALUE`)")]
    MissingValue { key: String },
    #[error("bad value `{value}` for allocator option `{key}`: {reason}")]
    BadValue {
        key: String,
        value: String,
        reason: String,
    },
    #[error("malformed allocator configuration near `{near}`: expected {expected}")]
    Syntax { near: String, expected: String },
}

fn bad(key: &str, value: &str, reason: impl Into<String>) -> ConfError {
    ConfError::BadValue {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

fn missing(key: &str) -> ConfError {
    ConfError::MissingValue {
        key: key.to_string(),
    }
}

/// Splits like `AllocatorConfig::lexArgs`: `, : [ ]` are tokens of their
/// own, spaces vanish, everything else accumulates.
fn lex(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = String::new();
    for c in s.chars() {
        match c {
            ',' | ':' | '[' | ']' => {
                if !buf.is_empty() {
                    out.push(std::mem::take(&mut buf));
                }
                out.push(c.to_string());
            }
            c if c.is_whitespace() => {}
            c => buf.push(c),
        }
    }
    if !buf.is_empty() {
        out.push(buf);
    }
    out
}

struct Tokens {
    toks: Vec<String>,
    i: usize,
}

impl Tokens {
    fn peek(&self) -> Option<&str> {
        self.toks.get(self.i).map(String::as_str)
    }
    fn next(&mut self) -> Option<String> {
        let t = self.toks.get(self.i).cloned();
        if t.is_some() {
            self.i += 1;
        }
        t
    }
    fn near(&self) -> String {
        let lo = self.i.saturating_sub(2);
        let hi = (self.i + 2).min(self.toks.len());
        self.toks[lo..hi].concat()
    }
    /// A syntax error here: `expected` was not found.
    fn syntax(&self, expected: &str) -> ConfError {
        ConfError::Syntax {
            near: self.near(),
            expected: expected.into(),
        }
    }
    /// The `:` after `key`.
    fn colon(&mut self, key: &str) -> Result<(), ConfError> {
        if self.peek() != Some(":") {
            return Err(missing(key));
        }
        self.i += 1;
        Ok(())
    }
    /// `:` then a plain value token.
    fn value(&mut self, key: &str) -> Result<String, ConfError> {
        self.colon(key)?;
        match self.next() {
            Some(v) if !matches!(v.as_str(), "," | ":" | "[" | "]") => Ok(v),
            _ => Err(missing(key)),
        }
    }
}

fn parse_u64(key: &str, v: &str) -> Result<u64, ConfError> {
    v.parse::<u64>()
        .map_err(|_| bad(key, v, "expected a non-negative integer"))
}

fn parse_bool(key: &str, v: &str) -> Result<bool, ConfError> {
    match v {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(bad(key, v, "expected True or False")),
    }
}

fn parse_mb_at_least_20(key: &str, v: &str) -> Result<u64, ConfError> {
    let mb = parse_u64(key, v)?;
    let min = K_LARGE_BUFFER / MIB;
    if mb < min {
        return Err(bad(key, v, format!("must be >= {min} (MiB)")));
    }
    Ok(mb.min(u64::MAX / MIB) * MIB)
}

/// `parseRoundUpPower2Divisions`: one power of two for every interval, or
/// a list (see [`parse_roundup_list`]).
fn parse_roundup(t: &mut Tokens, key: &str) -> Result<RoundupDivisions, ConfError> {
    t.colon(key)?;
    match t.peek() {
        None => Err(missing(key)),
        Some("[") => {
            t.i += 1;
            parse_roundup_list(t, key)
        }
        Some(_) => {
            let v = t.next().unwrap_or_default();
            let d = parse_u64(key, &v)?;
            if !d.is_power_of_two() {
                return Err(bad(key, &v, "divisions must be a power of 2"));
            }
            Ok([d; ROUNDUP_POWER2_INTERVALS])
        }
    }
}

/// The list form after `[`, with its semantics: the first `size:div` entry
/// also fills every interval below it, `>:div` fills from the last named
/// interval (inclusive) to the end.
fn parse_roundup_list(t: &mut Tokens, key: &str) -> Result<RoundupDivisions, ConfError> {
    let mut div = NO_ROUNDUP_DIVISIONS;
    let mut first = true;
    let mut last_index = 0usize;
    loop {
        let Some(interval) = t.next() else {
            return Err(t.syntax("`]`"));
        };
        if interval == "]" {
            return Ok(div);
        }
        let dv = t.value(key)?;
        let d = parse_u64(key, &dv)?;
        if d != 0 && !d.is_power_of_two() {
            return Err(bad(
                key,
                &dv,
                "divisions must be a power of 2, or 0 to disable",
            ));
        }
        if interval == ">" {
            div[last_index..].fill(d);
        } else {
            let mb = parse_u64(key, &interval)?;
            if !mb.is_power_of_two() {
                return Err(bad(
                    key,
                    &interval,
                    "interval sizes (MiB) must be powers of 2",
                ));
            }
            let index = (63 - mb.leading_zeros() as usize).min(ROUNDUP_POWER2_INTERVALS - 1);
            if first {
                div[..index].fill(d);
                first = false;
            }
            div[index] = d;
            last_index = index;
        }
        match t.peek() {
            Some(",") => t.i += 1,
            Some("]") => {}
            _ => return Err(t.syntax("`,` or `]`")),
        }
    }
}

impl AllocConf {
    /// A job's `PYTORCH_CUDA_ALLOC_CONF` as the parser reads it: without
    /// the whitespace it skips (every kind: a CR, a line feed, a page
    /// break, a line separator), the rest as it was. It parses as the text
    /// does; what it still holds of control characters makes it a setting
    /// the parser refuses.
    pub fn as_read(s: &str) -> String {
        lex(s).concat()
    }

    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` string. An empty string gives the
    /// defaults.
    pub fn parse(s: &str) -> Result<AllocConf, ConfError> {
        let mut conf = AllocConf::default();
        let mut t = Tokens { toks: lex(s), i: 0 };
        while let Some(key) = t.next() {
            match key.as_str() {
                "max_split_size_mb" => {
                    let v = t.value(&key)?;
                    conf.max_split_size = parse_mb_at_least_20(&key, &v)?;
                }
                "max_non_split_rounding_mb" => {
                    let v = t.value(&key)?;
                    conf.max_non_split_rounding_size = parse_mb_at_least_20(&key, &v)?;
                }
                "garbage_collection_threshold" => {
                    let v = t.value(&key)?;
                    let x: f64 = v.parse().map_err(|_| bad(&key, &v, "expected a number"))?;
                    if !(x > 0.0 && x < 1.0) {
                        return Err(bad(&key, &v, "must be in (0.0, 1.0)"));
                    }
                    conf.garbage_collection_threshold = x;
                }
                "roundup_power2_divisions" => {
                    conf.roundup_power2_divisions = parse_roundup(&mut t, &key)?;
                }
                "expandable_segments" => {
                    let v = t.value(&key)?;
                    conf.expandable_segments = parse_bool(&key, &v)?;
                }
                "backend" => {
                    let v = t.value(&key)?;
                    match v.as_str() {
                        "native" => {}
                        "cudaMallocAsync" => {
                            return Err(bad(
                                &key,
                                &v,
                                "the cudaMallocAsync backend is not simulated",
                            ))
                        }
                        _ => return Err(bad(&key, &v, "options are native and cudaMallocAsync")),
                    }
                }
                "release_lock_on_cudamalloc"
                | "pinned_use_cuda_host_register"
                | "pinned_use_background_threads" => {
                    let v = t.value(&key)?;
                    parse_bool(&key, &v)?;
                }
                "pinned_num_register_threads" => {
                    let v = t.value(&key)?;
                    let n = parse_u64(&key, &v)?;
                    if !n.is_power_of_two() {
                        return Err(bad(&key, &v, "must be a power of 2"));
                    }
                }
                "," | ":" | "[" | "]" => return Err(t.syntax("an option name")),
                _ => return Err(ConfError::UnknownKey { key }),
            }
            match t.next().as_deref() {
                None | Some(",") => {}
                Some(_) => {
                    t.i -= 1;
                    return Err(t.syntax("`,`"));
                }
            }
        }
        Ok(conf)
    }

    /// [`rules::round_size`] under this configuration.
    pub(crate) fn round_size(&self, size: u64) -> u64 {
        rules::round_size(size, &self.roundup_power2_divisions)
    }
}

impl std::str::FromStr for AllocConf {
    type Err = ConfError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AllocConf::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_default() {
        assert_eq!(AllocConf::parse("").unwrap(), AllocConf::default());
        assert_eq!(AllocConf::parse("  ").unwrap(), AllocConf::default());
    }

    #[test]
    fn all_scalar_keys() {
        let c = AllocConf::parse(
            "max_split_size_mb:128, garbage_collection_threshold:0.6,expandable_segments:True",
        )
        .unwrap();
        assert_eq!(c.max_split_size, 128 * MIB);
        assert!((c.garbage_collection_threshold - 0.6).abs() < 1e-12);
        assert!(c.expandable_segments);
        assert_eq!(c.max_non_split_rounding_size, 20 * MIB);
        let c = AllocConf::parse("max_non_split_rounding_mb:64,backend:native").unwrap();
        assert_eq!(c.max_non_split_rounding_size, 64 * MIB);
    }

    #[test]
    fn roundup_single_value_fills_all() {
        let c = AllocConf::parse("roundup_power2_divisions:4").unwrap();
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
        assert_eq!(c.round_size(5 * MIB + 1), 6 * MIB);
    }

    #[test]
    fn roundup_list_semantics() {
        // First entry fills everything below it; `>` fills from the last
        // named interval (inclusive, as in PyTorch) to the end.
        let c = AllocConf::parse("roundup_power2_divisions:[256:1,512:2,>:4]").unwrap();
        let d = c.roundup_power2_divisions;
        assert_eq!(&d[..9], &[1; 9]);
        assert_eq!(&d[9..], &[4; 7]);
        let c = AllocConf::parse("roundup_power2_divisions:[64:8,256:2]").unwrap();
        let d = c.roundup_power2_divisions;
        assert_eq!(&d[..7], &[8; 7]);
        assert_eq!(d[7], 0);
        assert_eq!(d[8], 2);
        assert_eq!(d[9], 0);
    }

    #[test]
    fn errors_name_key_and_value() {
        let e = AllocConf::parse("max_split_size_mb:10").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("max_split_size_mb") && msg.contains("`10`"),
            "{msg}"
        );
        let e = AllocConf::parse("expandable_segments:true").unwrap_err();
        assert!(e.to_string().contains("expandable_segments") && e.to_string().contains("true"));
        let e = AllocConf::parse("garbage_collection_threshold:1.5").unwrap_err();
        assert!(matches!(e, ConfError::BadValue { ref value, .. } if value == "1.5"));
        let e = AllocConf::parse("max_split_size_mb:abc").unwrap_err();
        assert!(matches!(e, ConfError::BadValue { ref key, .. } if key == "max_split_size_mb"));
        let e = AllocConf::parse("roundup_power2_divisions:[256:3]").unwrap_err();
        assert!(e.to_string().contains('3'));
        let e = AllocConf::parse("roundup_power2_divisions:3").unwrap_err();
        assert!(e.to_string().contains("roundup_power2_divisions"));
    }

    #[test]
    fn unknown_and_malformed() {
        assert_eq!(
            AllocConf::parse("max_split_size:64").unwrap_err(),
            ConfError::UnknownKey {
                key: "max_split_size".into()
            }
        );
        assert!(matches!(
            AllocConf::parse("expandable_segments").unwrap_err(),
            ConfError::MissingValue { .. }
        ));
        assert!(matches!(
            AllocConf::parse("expandable_segments:True max_split_size_mb:64").unwrap_err(),
            ConfError::Syntax { .. } | ConfError::BadValue { .. }
        ));
        assert!(AllocConf::parse("backend:cudaMallocAsync").is_err());
        assert!(AllocConf::parse("roundup_power2_divisions:[256:1").is_err());
    }
}
