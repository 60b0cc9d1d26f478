//! A recording played back into a hub, at any speed: the one pacing loop
//! behind `replay` and `replay --ui`.

use std::time::Duration;

use tokio::time::Instant;

use crate::recording::{retime, RecordingError, Replayer};
use crate::ring::monotonic_ns;

use super::Hub;

/// How a recording is played.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// As fast as it can be read, times as recorded.
    Fast,
    /// At this many recorded seconds per second, times as recorded.
    Recorded(f64),
    /// At this many recorded seconds per second, times moved onto this
    /// machine's clock (the recording's start is now; `speed` shrinks or
    /// stretches it), so a live view reads it as it would a live process.
    Live(f64),
}

/// What a playback got through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Played {
    /// Inputs applied.
    pub inputs: u64,
    /// The last input's time, as recorded (or as moved, with `Pace::Live`).
    pub last_ns: u64,
}

/// Applies every input of `reader` to `hub`, paced by `pace`.
pub async fn play(mut reader: Replayer, hub: &Hub, pace: Pace) -> Result<Played, RecordingError> {
    let speed = match pace {
        Pace::Fast => None,
        Pace::Recorded(s) | Pace::Live(s) => Some(s).filter(|s| *s > 0.0 && s.is_finite()),
    };
    let wall0 = Instant::now();
    let base = monotonic_ns();
    let mut first: Option<u64> = None;
    let mut played = Played::default();
    while let Some((t, mut input)) = reader.next_input()? {
        let t0 = *first.get_or_insert(t);
        let since = t.saturating_sub(t0);
        if let Some(speed) = speed {
            let after =
                Duration::try_from_secs_f64(since as f64 / 1e9 / speed).unwrap_or(Duration::MAX);
            if let Some(due) = wall0.checked_add(after) {
                tokio::time::sleep_until(due).await;
            } else {
                // Further away than this machine's clock can say: never.
                std::future::pending::<()>().await;
            }
        }
        played.last_ns = t;
        if let (Pace::Live(_), Some(speed)) = (pace, speed) {
            let map = |x: u64| base.saturating_add((x.saturating_sub(t0) as f64 / speed) as u64);
            retime(&mut input, &map);
            played.last_ns = map(t);
        }
        hub.apply(input);
        played.inputs += 1;
    }
    Ok(played)
}
