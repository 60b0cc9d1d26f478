//! The out-of-memory forecast: when a leak is flagged, or reserved memory
//! grew at every one of the last [`GROWING_STEPS`] step boundaries (a
//! cache that keeps growing: fragmentation, growing shapes), the step at
//! which the job's allocator would run out, projected from its measured
//! growth.
//!
//! Each step leaves `growth` more bytes live (the leak detector's floor
//! slope); a leaked block outlives the step, so the cache cannot reuse its
//! room, and reserved memory rises by that much too. The allocator fails
//! when reserved memory plus the next new segment would pass the limit:
//! the producer's memory limit (the device's memory times the process's
//! memory fraction), less, when no fraction is set, what NVML counts on
//! the process beyond PyTorch's reserved bytes (the CUDA context and
//! libraries). So the job runs out in `(limit − reserved) / growth` steps,
//! about that many step periods from now. Pure: figures in, a
//! [`Forecast`] out; refreshed at every view as steps pass.

use serde::{Deserialize, Serialize};

/// Step boundaries in a row at each of which reserved memory must have
/// grown for a forecast without a flagged leak.
pub const GROWING_STEPS: usize = 8;

/// Why a forecast is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// A leak is flagged.
    #[default]
    Leak,
    /// Reserved memory grew at each of the last [`GROWING_STEPS`] steps.
    ReservedGrowth,
}

/// How the forecast was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// Reserved memory projected at the measured growth (the fallback).
    #[default]
    Projection,
    /// The job's last step replayed forward through the simulator until
    /// the allocator failed (`sim::ahead`, in the live advisor).
    Simulation,
}

/// When the job would run out of memory.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Forecast {
    /// The step whose allocation would fail.
    pub oom_step: u64,
    /// Steps from the current one.
    pub steps_left: u64,
    /// Nanoseconds from now at the measured step period (None before two
    /// steps are timed).
    pub in_ns: Option<u64>,
    /// The most the allocator may reserve, and what it reserves now.
    pub limit: u64,
    pub reserved: u64,
    /// Bytes left live per step.
    pub growth_per_step: u64,
    /// The limit is the memory fraction's (else the device's, less what
    /// is not PyTorch's).
    pub fraction: bool,
    /// The request most likely to fail: the step's largest (None when
    /// not known).
    pub request: Option<u64>,
    /// Why the forecast is made.
    #[serde(default)]
    pub cause: Cause,
    /// How it was made.
    #[serde(default)]
    pub method: Method,
}

/// What the forecast is made from.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Inputs {
    /// The step now (the leak detector's count).
    pub(crate) step: u64,
    /// Bytes the floor rises per step (≤ 0: no forecast).
    pub(crate) growth_per_step: f64,
    pub(crate) reserved: u64,
    /// The producer's memory limit and whether it is the whole device's.
    pub(crate) limit: Option<(u64, bool)>,
    /// NVML's bytes on the process beyond PyTorch's reserved.
    pub(crate) non_pytorch: Option<u64>,
    /// Nanoseconds per step.
    pub(crate) step_ns: Option<f64>,
    pub(crate) request: Option<u64>,
    pub(crate) cause: Cause,
}

/// The forecast, when there is growth and a limit above reserved.
pub(crate) fn forecast(i: &Inputs) -> Option<Forecast> {
    let (limit, whole) = i.limit?;
    if i.growth_per_step.is_nan() || i.growth_per_step < 1.0 || i.growth_per_step.is_infinite() {
        return None;
    }
    let limit = if whole {
        limit.saturating_sub(i.non_pytorch.unwrap_or(0))
    } else {
        limit
    };
    let room = limit
        .saturating_sub(i.reserved)
        .saturating_sub(i.request.unwrap_or(0)) as f64;
    let steps_left = (room / i.growth_per_step).floor() as u64;
    Some(Forecast {
        oom_step: i.step.saturating_add(steps_left).saturating_add(1),
        steps_left,
        in_ns: i
            .step_ns
            .filter(|p| p.is_finite() && *p > 0.0)
            .map(|p| (p * steps_left as f64).min(u64::MAX as f64) as u64),
        limit,
        reserved: i.reserved,
        growth_per_step: i.growth_per_step as u64,
        fraction: !whole,
        request: i.request,
        cause: i.cause,
        method: Method::Projection,
    })
}

/// The forecast the simulator made (`sim::ahead`, from the job's step
/// `at_step`): the step `oom_step` whose `request` fails, each step
/// leaving `growth_per_step`; in place of `projected` (whose limit and
/// step period it keeps), or on its own when the projection made none.
#[allow(clippy::too_many_arguments)]
pub fn simulated(
    projected: Option<&Forecast>,
    at_step: u64,
    oom_step: u64,
    request: u64,
    growth_per_step: u64,
    limit: u64,
    reserved: u64,
    fraction: bool,
) -> Forecast {
    let steps_left = oom_step.saturating_sub(at_step).saturating_sub(1);
    let period = projected
        .and_then(|p| Some((p.in_ns? as f64 / p.steps_left as f64, p.steps_left)))
        .filter(|(_, n)| *n > 0)
        .map(|(p, _)| p);
    Forecast {
        oom_step,
        steps_left,
        in_ns: period.map(|p| (p * steps_left as f64).min(u64::MAX as f64) as u64),
        limit,
        reserved,
        growth_per_step,
        fraction,
        request: Some(request),
        cause: projected.map_or(Cause::Leak, |p| p.cause),
        method: Method::Simulation,
    }
}

/// Whether the last [`GROWING_STEPS`] boundaries of `reserved` (bytes at
/// each step boundary, oldest first) each rose above the one before.
pub(crate) fn keeps_growing(reserved: &[u64]) -> bool {
    reserved.len() > GROWING_STEPS
        && reserved[reserved.len() - GROWING_STEPS - 1..]
            .windows(2)
            .all(|w| w[1] > w[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_room_left_over_the_growth_is_the_steps_left() {
        let f = forecast(&Inputs {
            step: 8,
            growth_per_step: (32 * MIB) as f64,
            reserved: 1000 * MIB,
            limit: Some((2000 * MIB, false)),
            non_pytorch: Some(500 * MIB),
            step_ns: Some(50e6),
            request: Some(32 * MIB),
            cause: Cause::Leak,
        })
        .unwrap();
        // 1000 MiB of room, less the 32 MiB request's segment, 32 MiB a
        // step: 30 steps fit, the 31st fails.
        assert_eq!(f.steps_left, 30);
        assert_eq!(f.oom_step, 39);
        assert_eq!(f.in_ns, Some(30 * 50_000_000));
        // A fraction's limit is PyTorch's own: NVML's extra is not taken off.
        assert_eq!(f.limit, 2000 * MIB);
        assert!(f.fraction);
    }

    #[test]
    fn the_whole_device_less_what_is_not_pytorchs() {
        let f = forecast(&Inputs {
            step: 0,
            growth_per_step: (100 * MIB) as f64,
            reserved: 1000 * MIB,
            limit: Some((2000 * MIB, true)),
            non_pytorch: Some(500 * MIB),
            ..Inputs::default()
        })
        .unwrap();
        assert_eq!((f.limit, f.steps_left, f.in_ns), (1500 * MIB, 5, None));
    }

    #[test]
    fn no_growth_or_no_limit_no_forecast() {
        let base = Inputs {
            growth_per_step: 0.0,
            limit: Some((1 << 30, true)),
            ..Inputs::default()
        };
        assert!(forecast(&base).is_none());
        assert!(forecast(&Inputs {
            growth_per_step: f64::NAN,
            ..base
        })
        .is_none());
        assert!(forecast(&Inputs {
            growth_per_step: 1e6,
            limit: None,
            ..base
        })
        .is_none());
        // Already past the limit: it fails at the next step.
        let over = forecast(&Inputs {
            growth_per_step: 1e6,
            reserved: 2 << 30,
            ..base
        })
        .unwrap();
        assert_eq!((over.steps_left, over.oom_step), (0, 1));
    }

    #[test]
    fn reserved_keeps_growing_only_when_every_one_of_the_last_steps_rose() {
        let rising: Vec<u64> = (0..12).map(|i| 100 + i * 10).collect();
        assert!(keeps_growing(&rising));
        // Too few boundaries.
        assert!(!keeps_growing(&rising[..GROWING_STEPS]));
        // One flat step among the last ones.
        let mut flat = rising.clone();
        flat[10] = flat[9];
        assert!(!keeps_growing(&flat));
        // A plateau after growth (a cache that warmed up): none.
        let plateau: Vec<u64> = (0..20).map(|i| 100 + i.min(10) * 10).collect();
        assert!(!keeps_growing(&plateau));
    }
}
