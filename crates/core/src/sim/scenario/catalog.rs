//! The scenarios by name: each one's description, its script and the
//! allocator configuration it runs under.

use super::ops::{Op, SimContext, TimedOp};
use super::scripts::{empty_cache, fragmentation, healthy, inference, leak, oom, Gen};
use crate::sim::allocator::SimConfig;
#[cfg(test)]
use crate::sim::conf::AllocConf;

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    pub description: &'static str,
    pub(crate) config: SimConfig,
    pub(crate) ops: Vec<TimedOp>,
    /// The module paths the job names (string `i + 1` is `modules[i]`).
    pub modules: Vec<String>,
    /// Its contexts (context `i + 1`).
    pub(crate) contexts: Vec<SimContext>,
}

const LIST: &[(&str, &str)] = &[
    (
        "healthy",
        "steady training loop: weights, activations freed in backward, grads, Adam state",
    ),
    (
        "leak",
        "validation losses kept in a list without no_grad: each step's graph stays alive",
    ),
    (
        "fragmentation",
        "varying sequence lengths split cached blocks (try expandable_segments:True)",
    ),
    (
        "empty-cache",
        "batch size drops, then periodic empty_cache returns cached memory to the driver",
    ),
    (
        "oom",
        "out of memory while gigabytes are reserved but free, split into unusable pieces",
    ),
    (
        "inference",
        "training, then the same model under no_grad: a much smaller activation footprint",
    ),
];

impl Scenario {
    /// The same job watched through a producer that sends no role lists
    /// (format 1.1): Adam's state is then the optimizer's (made outside
    /// every module), not its layer's.
    pub fn without_roles(mut self) -> Scenario {
        self.ops.retain(|o| !matches!(o.op, Op::Roles(_)));
        self
    }

    /// Every scenario name with a one-line description.
    pub fn list() -> &'static [(&'static str, &'static str)] {
        LIST
    }

    /// The scenario `name` on the default 8 GiB device and allocator settings.
    pub fn by_name(name: &str) -> Option<Scenario> {
        Scenario::with_config(name, SimConfig::default())
    }

    /// The scenario `name` on a given device / allocator configuration (for
    /// example `fragmentation` with `expandable_segments:True`).
    pub fn with_config(name: &str, config: SimConfig) -> Option<Scenario> {
        let (name, description) = *LIST.iter().find(|(n, _)| *n == name)?;
        let script: fn(&mut Gen) -> &'static str = match name {
            "healthy" => healthy,
            "leak" => leak,
            "fragmentation" => fragmentation,
            "empty-cache" => empty_cache,
            "oom" => oom,
            "inference" => inference,
            _ => return None,
        };
        // Every script opens and closes with a snapshot; it returns the
        // closing caption.
        let mut g = Gen::default();
        g.push(Op::Snapshot);
        let closing = script(&mut g);
        g.say(closing);
        g.push(Op::Snapshot);
        Some(Scenario {
            name,
            description,
            config,
            ops: g.ops,
            modules: g.modules,
            contexts: g.contexts,
        })
    }

    #[cfg(test)]
    /// [`Scenario::with_config`] with a `PYTORCH_CUDA_ALLOC_CONF` on the
    /// default device.
    pub(crate) fn with_conf(name: &str, conf: AllocConf) -> Option<Scenario> {
        Scenario::with_config(name, SimConfig::with_conf(conf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn list_and_lookup() {
        assert_eq!(Scenario::list().len(), 6);
        for (name, desc) in Scenario::list() {
            let s = Scenario::by_name(name).unwrap();
            assert_eq!(s.name, *name);
            assert!(!desc.is_empty());
            assert!(!s.ops.is_empty());
            // Entering a module and a role list take no time; every other
            // op does.
            let timed: Vec<&TimedOp> = (s.ops.iter())
                .filter(|o| !matches!(o.op, Op::Context(_) | Op::Roles(_)))
                .collect();
            assert!(
                timed.windows(2).all(|w| w[0].time_ns < w[1].time_ns),
                "{name}: time increases"
            );
            assert!(s.ops.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
            assert!(s.ops[1..].iter().any(|o| o.caption.is_some()));
        }
        assert!(Scenario::by_name("nope").is_none());
    }
}
