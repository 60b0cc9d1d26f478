//! Events per second over a sliding window.

/// Events per second over a sliding window of event timestamps, in O(1)
/// per event: counts in fixed slots of `window / SLOTS`.
#[derive(Debug, Clone)]
pub(crate) struct EventRate {
    slot_ns: u64,
    counts: [u32; Self::SLOTS],
    /// Absolute index of the newest slot, and its time range.
    head: u64,
    head_start: u64,
    head_end: u64,
    first_ns: Option<u64>,
}

impl EventRate {
    const SLOTS: usize = 20;

    pub(crate) fn new(window_ns: u64) -> Self {
        let slot_ns = (window_ns / Self::SLOTS as u64).max(1);
        Self {
            slot_ns,
            counts: [0; Self::SLOTS],
            head: 0,
            head_start: 0,
            head_end: 0,
            first_ns: None,
        }
    }

    #[inline]
    pub(crate) fn note(&mut self, t: u64) {
        if t >= self.head_start && t < self.head_end {
            let c = &mut self.counts[(self.head % Self::SLOTS as u64) as usize];
            *c = c.saturating_add(1);
            return;
        }
        self.note_slow(t);
    }

    #[cold]
    fn note_slow(&mut self, t: u64) {
        let s = t / self.slot_ns;
        if self.first_ns.is_none() {
            self.first_ns = Some(t);
            self.head = s;
            self.counts = [0; Self::SLOTS];
        }
        if s > self.head {
            let gap = (s - self.head).min(Self::SLOTS as u64);
            for i in 1..=gap {
                self.counts[((self.head + i) % Self::SLOTS as u64) as usize] = 0;
            }
            self.head = s;
        } else if s.saturating_add(Self::SLOTS as u64) <= self.head {
            return; // older than the window
        }
        self.head_start = self.head * self.slot_ns;
        self.head_end = self.head_start.saturating_add(self.slot_ns);
        let c = &mut self.counts[(s % Self::SLOTS as u64) as usize];
        *c = c.saturating_add(1);
    }

    /// Events per second over the window ending at `now_ns` (absent before
    /// the first event).
    pub(crate) fn per_sec(&self, now_ns: u64) -> Option<f64> {
        let first = self.first_ns?;
        let now_slot = now_ns / self.slot_ns;
        let n = Self::SLOTS as u64;
        let mut sum = 0u64;
        for back in 0..n {
            let Some(s) = now_slot.checked_sub(back) else {
                break;
            };
            if s <= self.head && s.saturating_add(n) > self.head {
                sum += u64::from(self.counts[(s % n) as usize]);
            }
        }
        let window = self.slot_ns * n;
        // A young process is measured over its life, not the whole window.
        let span = now_ns.saturating_sub(first).clamp(self.slot_ns, window);
        Some(sum as f64 * 1e9 / span as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_rate_window() {
        let mut r = EventRate::new(5_000_000_000);
        assert_eq!(r.per_sec(0), None);
        // 1000 events/s for 10 s.
        for i in 0..10_000u64 {
            r.note(i * 1_000_000);
        }
        let now = 10_000_000_000;
        let rate = r.per_sec(now).unwrap();
        assert!((rate - 1000.0).abs() < 60.0, "{rate}");
        // Idle for a minute: the rate decays to zero.
        assert_eq!(r.per_sec(now + 60_000_000_000), Some(0.0));
    }
}
