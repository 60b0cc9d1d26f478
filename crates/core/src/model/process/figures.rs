//! A process's figures: per device and in all, the leak verdict with
//! where the leak comes from, and the out-of-memory forecast.

use std::collections::HashMap;

use crate::model::attrib;
use crate::model::device::DeviceState;
use crate::model::forecast::{self, Cause};
use crate::model::leak::LeakReport;
use crate::model::view::{DeviceFigures, FigureSource, Fragmentation, Implausible, ProcessFigures};

use super::Process;

impl Process {
    /// Figures of one device (Stats first, block map otherwise).
    pub(crate) fn device_figures(&self, d: &DeviceState) -> DeviceFigures {
        let summary = d.block_summary();
        let derived = d.derived();
        let peaks = d.derived_peaks();
        let stats = d.stats().map(|(_, s)| *s);
        let (source, allocated, reserved, active, inactive_split, requested, peak) = match stats {
            Some(s) => (
                FigureSource::Stats,
                s.allocated,
                s.reserved,
                s.active,
                s.inactive_split,
                Some(s.requested),
                (s.allocated_peak, s.reserved_peak, s.active_peak),
            ),
            None => (
                FigureSource::BlockMap,
                derived.allocated,
                derived.reserved,
                derived.active,
                summary.inactive_split,
                None,
                (peaks.allocated, peaks.reserved, peaks.active),
            ),
        };
        let implausible = Implausible {
            saturated: d.saturated(),
            peak_below_current: peak.0 < allocated || peak.1 < reserved || peak.2 < active,
            above_reserved: allocated > reserved || active > reserved,
            share_above_100: inactive_split > reserved,
        };
        DeviceFigures {
            device: d.device(),
            source,
            allocated,
            reserved,
            active,
            requested,
            peak_allocated: peak.0,
            peak_reserved: peak.1,
            peak_active: peak.2,
            fragmentation: Fragmentation {
                inactive_split,
                // A share above 100 % cannot be true: flagged, not shown.
                share_of_reserved: (reserved > 0 && inactive_split <= reserved)
                    .then(|| inactive_split as f64 / reserved as f64),
                largest_free_small: summary.largest_free_small,
                largest_free_large: summary.largest_free_large,
                free_blocks: summary.free_blocks,
            },
            // The segments the block map holds, once it is trusted: torch's
            // statistics count none under expandable segments (3 GiB
            // reserved in "0 segments", issue 46 item 9); torch's own count
            // stays in `stats`.
            segments: match stats {
                Some(s) if !d.synced() => s.segments,
                _ => summary.segments,
            },
            blocks: summary.blocks,
            stats,
            synced: d.synced(),
            implausible,
        }
    }

    /// Process-wide figures at `now_ns` (for events/s).
    pub(crate) fn figures(&self, now_ns: u64) -> ProcessFigures {
        let devs: Vec<DeviceFigures> = self
            .devices
            .iter()
            .map(|d| self.device_figures(d))
            .collect();
        self.figures_from(&devs, now_ns)
    }

    pub(super) fn figures_from(&self, devs: &[DeviceFigures], now_ns: u64) -> ProcessFigures {
        // Sums of figures from outside: one that does not fit is cut at
        // u64::MAX and flagged.
        let mut saturated = false;
        let mut sum = |f: fn(&DeviceFigures) -> u64| {
            let s = devs.iter().try_fold(0u64, |a, d| a.checked_add(f(d)));
            saturated |= s.is_none();
            s.unwrap_or(u64::MAX)
        };
        let reserved = sum(|d| d.reserved);
        let allocated = sum(|d| d.allocated);
        let active = sum(|d| d.active);
        let peak_allocated = sum(|d| d.peak_allocated);
        let peak_reserved = sum(|d| d.peak_reserved);
        let mut implausible =
            (devs.iter()).fold(Implausible::default(), |a, d| a.or(d.implausible));
        implausible.saturated |= saturated;
        let nvml_used = self.nvml.map(|(_, b, _)| b);
        let non_pytorch = self.nvml.and_then(|(_, used, reserved_then)| {
            // Negative only when the two readings still straddle a
            // change: not a figure to show as true.
            let d = i128::from(used) - i128::from(reserved_then);
            (d >= 0).then(|| d.min(i128::from(i64::MAX)) as i64)
        });
        // The device parts the producer named (pinned host memory is not
        // the device's, and NVML does not count it).
        let (outside_named, named_any) = self.outside.named_on_devices();
        ProcessFigures {
            allocated,
            reserved,
            active,
            peak_allocated,
            peak_reserved,
            nvml_used,
            nvml_peak: self.nvml_peak,
            non_pytorch,
            outside_named,
            unexplained: non_pytorch
                .filter(|_| named_any)
                .map(|o| o.saturating_sub(outside_named.min(i64::MAX as u64) as i64)),
            events_per_sec: self.rate.per_sec(now_ns),
            events_total: self.events,
            lost_events: self.lost_events,
            inconsistencies: self.inconsistencies,
            implausible,
        }
    }

    /// The leak verdict at `now_ns`.
    /// The out-of-memory forecast, while a leak is flagged or reserved
    /// memory keeps growing step after step, and the producer said its
    /// memory limit: for the device with the most reserved that has one.
    pub(super) fn forecast(
        &self,
        devs: &[DeviceFigures],
        figures: &ProcessFigures,
        leak: &LeakReport,
    ) -> Option<crate::model::forecast::Forecast> {
        let r: Vec<u64> = self.step_reserved.iter().copied().collect();
        let cause = if leak.flagged {
            Cause::Leak
        } else if forecast::keeps_growing(&r) {
            Cause::ReservedGrowth
        } else {
            return None;
        };
        let (reserved, limit) = devs
            .iter()
            .filter_map(|d| Some((d.reserved, *self.limits.get(&d.device)?)))
            .max_by_key(|(r, _)| *r)?;
        let largest = self.step_largest.0.max(self.step_largest.1);
        let request = (largest > 0).then_some(largest);
        // The floor's growth, or reserved memory's where it grows faster
        // (a leaked block's segment is more than the block).
        // Least squares over the boundaries kept: reserved rises in whole
        // segments, a staircase whose ends alone would swing the slope, and
        // whose latest stair would swing the start; the fitted line gives
        // both (from 16 boundaries on).
        let (reserved_slope, fitted) = if r.len() >= 16 {
            let n = r.len() as f64;
            let mx = (n - 1.0) / 2.0;
            let my = r.iter().map(|&y| y as f64).sum::<f64>() / n;
            let (sxy, sxx) = r
                .iter()
                .enumerate()
                .fold((0.0, 0.0), |(sxy, sxx), (x, &y)| {
                    let dx = x as f64 - mx;
                    (sxy + dx * (y as f64 - my), sxx + dx * dx)
                });
            let slope = sxy / sxx;
            (slope, Some((my + slope * (n - 1.0 - mx)).max(0.0) as u64))
        } else if cause == Cause::ReservedGrowth {
            // Fewer boundaries than a fit needs: the rise over the last
            // GROWING_STEPS of them.
            let n = forecast::GROWING_STEPS;
            let rise = r[r.len() - 1].saturating_sub(r[r.len() - 1 - n]);
            (rise as f64 / n as f64, None)
        } else {
            (0.0, None)
        };
        let reserved = fitted.unwrap_or(reserved);
        crate::model::forecast::forecast(&crate::model::forecast::Inputs {
            step: self.leak.steps(),
            growth_per_step: leak.floor_slope_bytes_per_step.max(reserved_slope),
            reserved,
            limit: Some(limit),
            non_pytorch: figures.non_pytorch.and_then(|b| u64::try_from(b).ok()),
            step_ns: self.leak.step_period_ns(),
            request,
            cause,
        })
    }

    pub fn leak_report(&self, now_ns: u64) -> LeakReport {
        let blocks = self.devices.iter().flat_map(|d| {
            d.blocks()
                .map(|(_, b)| b)
                .chain(d.orphans().map(|(_, b)| b))
        });
        let mut report = self.leak.report(now_ns, blocks);
        if report.flagged {
            // Steps from step tags where the producer's clock has steps
            // (markers, optimizer steps) and they name something; else the
            // leak detector's own steps (the allocation period, a producer
            // without tags), blocks dated by birth time.
            let tagged = self.clock.step().map(|now| self.leak_origins(now, false));
            (report.origins, report.more_origins) = match tagged {
                Some(found) if !found.0.is_empty() => found,
                _ => self.leak_origins(self.leak.step_now(), true),
            };
        }
        report
    }

    /// The modules and stacks whose live blocks outlive their step, step
    /// after step (see [`crate::model::leak::growing_origins`]); a block's step
    /// from its tag, or (`by_time`) from its birth time.
    fn leak_origins(&self, now: u64, by_time: bool) -> (Vec<crate::model::leak::LeakOrigin>, u64) {
        let mut contexts: HashMap<u32, attrib::ContextView> = HashMap::new();
        let mut live: Vec<(u32, u64, u64)> = Vec::new();
        for d in &self.devices {
            for (_, b) in d.blocks().chain(d.orphans()) {
                if b.state != vramscope_wire::event::BlockState::Allocated {
                    continue;
                }
                let c = contexts
                    .entry(b.origin.context)
                    .or_insert_with(|| self.defs.context_view(b.origin.context));
                let step = if by_time {
                    self.leak.step_at(b.since_ns)
                } else {
                    c.step.or(b.origin.step.map(u64::from))
                };
                if let Some(step) = step {
                    live.push((b.origin.context, step, b.size));
                }
            }
        }
        let cfg = self.leak.config();
        crate::model::leak::growing_origins(
            live.iter().map(|(c, step, size)| {
                let v = &contexts[c];
                (v.module.as_str(), v.stack.as_slice(), *step, *size)
            }),
            now,
            cfg.min_steps,
            cfg.top_sizes,
        )
    }
}
