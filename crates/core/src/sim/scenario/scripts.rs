//! The scenarios' scripts: a generator of timed operations (and of the
//! stacks an agent would capture), the toy model trained with Adam, and
//! each scenario's script with its captions.

use vramscope_text::format::bytes;
use vramscope_wire::event::{Held, Phase};

use super::ops::{Op, SimContext, SimFrame, TimedOp};

const MIB: u64 = 1 << 20;
/// Simulated time between two operations.
pub(crate) const OP_DT_NS: u64 = 5_000_000;
/// Extra simulated time at each training-step boundary.
pub(crate) const STEP_GAP_NS: u64 = 50_000_000;

/// The function of the simulated `train.py` that calls the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Caller {
    /// `model = Model().cuda()`.
    #[default]
    Main,
    Train,
    Validate,
    Predict,
}

/// The stack captured when the job enters `module` in `phase` from
/// `caller` (the line of `train.py` that does it, and the module's own
/// `forward` for a forward pass).
fn sim_stack(module: &str, phase: Phase, caller: Caller) -> Vec<SimFrame> {
    let mut s = Vec::new();
    if phase == Phase::Forward && !module.is_empty() {
        s.push(if module == HEAD {
            ("model.py", 34, "forward")
        } else {
            ("model.py", 31, "forward")
        });
    }
    let (line, function, main_line) = match caller {
        Caller::Main => (41, "main", 0),
        Caller::Train => match phase {
            Phase::Backward => (59, "training_step", 102),
            Phase::Optimizer => (61, "training_step", 102),
            _ => (57, "training_step", 102),
        },
        Caller::Validate => (88, "validate", 104),
        Caller::Predict => (95, "predict", 108),
    };
    s.push(("train.py", line, function));
    if main_line > 0 {
        s.push(("train.py", main_line, "main"));
    }
    s
}

#[derive(Default)]
pub(super) struct Gen {
    pub(super) ops: Vec<TimedOp>,
    t: u64,
    next_id: u32,
    caption: Option<String>,
    pub(super) modules: Vec<String>,
    pub(super) contexts: Vec<SimContext>,
    /// Where the model is called from now.
    caller: Caller,
}

impl Gen {
    pub(super) fn say(&mut self, c: impl Into<String>) {
        self.caption = Some(c.into());
    }
    pub(super) fn push(&mut self, op: Op) {
        self.t += OP_DT_NS;
        let caption = self.caption.take();
        self.ops.push(TimedOp {
            time_ns: self.t,
            op,
            caption,
        });
    }
    fn alloc(&mut self, size: u64) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        self.push(Op::Alloc {
            tensor: id,
            size,
            stream: 0,
        });
        id
    }
    fn free(&mut self, id: u32) {
        self.push(Op::Free { tensor: id });
    }
    /// A role list of (tensor, bytes, role, module path).
    fn roles(&mut self, tensors: Vec<(u32, u64, Held, String)>) {
        let list = tensors
            .into_iter()
            .map(|(t, bytes, held, module)| {
                let m =
                    (self.modules.iter().position(|x| *x == module)).map_or(0, |i| i as u32 + 1);
                (t, bytes, held, m)
            })
            .collect();
        self.ops.push(TimedOp {
            time_ns: self.t,
            op: Op::Roles(list),
            caption: None,
        });
    }
    /// Enter module `module` (empty: none) in `phase`: takes no time, so
    /// the script's timing is that of the job without attribution.
    fn enter(&mut self, module: &str, phase: Phase) {
        let m = match module {
            "" => 0,
            _ => match self.modules.iter().position(|m| m == module) {
                Some(i) => i as u32 + 1,
                None => {
                    self.modules.push(module.to_string());
                    self.modules.len() as u32
                }
            },
        };
        let ctx = SimContext {
            module: m,
            phase,
            stack: sim_stack(module, phase, self.caller),
        };
        let c = match self.contexts.iter().position(|c| *c == ctx) {
            Some(i) => i as u32 + 1,
            None => {
                self.contexts.push(ctx);
                self.contexts.len() as u32
            }
        };
        self.leave_as(c);
    }
    /// Leave every module.
    fn leave(&mut self) {
        self.leave_as(0);
    }
    fn leave_as(&mut self, context: u32) {
        self.ops.push(TimedOp {
            time_ns: self.t,
            op: Op::Context(context),
            caption: None,
        });
    }
    fn step(&mut self, n: u64) {
        self.t += STEP_GAP_NS;
        self.push(Op::Step(n));
    }
}

/// The toy model: `layers` linear layers with a weight and a bias each.
struct Model {
    layers: usize,
    weight: u64,
    bias: u64,
    params: Vec<u32>,
    grads: Vec<u32>,
    adam: Vec<u32>,
}

impl Model {
    fn new(g: &mut Gen) -> Model {
        let mut m = Model {
            layers: 12,
            weight: 48 * MIB,
            bias: 12 * 1024,
            params: vec![],
            grads: vec![],
            adam: vec![],
        };
        g.say(format!(
            "model.cuda(): {} layers, {} weights + {} biases each",
            m.layers,
            bytes(m.weight),
            bytes(m.bias)
        ));
        for l in 0..m.layers {
            g.enter(&layer(l), Phase::Other(4));
            let w = g.alloc(m.weight);
            let b = g.alloc(m.bias);
            m.params.extend([w, b]);
        }
        g.leave();
        m
    }

    fn param_sizes(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.layers).flat_map(move |_| [self.weight, self.bias])
    }

    /// One training step with activations of `act` bytes per layer.
    /// Returns the `loss` tensor (the caller frees or keeps it).
    fn train_step(&mut self, g: &mut Gen, n: u64, total: u64, act: u64, label: &str) -> u32 {
        g.step(n);
        g.caller = Caller::Train;
        let at = format!("step {n}/{total}{label}");
        self.zero_grad(g, &at);
        g.say(format!("{at} · batch copied to the GPU"));
        let input = g.alloc(act / 4);
        let saved = self.forward(g, &at, act);
        g.say(format!("{at} · logits and loss"));
        g.enter(HEAD, Phase::Forward);
        let logits = g.alloc(act / 2);
        let loss = g.alloc(4);
        g.leave();
        self.backward(g, &at, act, logits, saved);
        g.free(input);
        self.optimizer_step(g, &at);
        // The agent's role list at the step boundary. The agent walks at
        // most once a second (a walk costs it Python time); the simulated
        // job's costs nothing, so it sends one every step, and the demo's
        // gradients are named even where a leak moves them.
        self.send_roles(g);
        loss
    }

    /// The role list: each layer's weight and bias, their gradients (made
    /// in backward, last layer first) and Adam's two states per parameter.
    fn send_roles(&self, g: &mut Gen) {
        let sizes: Vec<u64> = self.param_sizes().collect();
        let of_param = |i: usize| layer(i / 2);
        let mut list = Vec::new();
        for (i, &t) in self.params.iter().enumerate() {
            list.push((t, sizes[i], Held::Parameter, of_param(i)));
        }
        for (k, &t) in self.grads.iter().enumerate() {
            // Pushed weight, bias of the last layer first.
            let l = self.layers - 1 - k / 2;
            let i = 2 * l + k % 2;
            list.push((t, sizes[i], Held::Gradient, of_param(i)));
        }
        for (j, &t) in self.adam.iter().enumerate() {
            list.push((t, sizes[j / 2], Held::OptimizerState, of_param(j / 2)));
        }
        g.roles(list);
    }

    /// `optimizer.zero_grad()` (set_to_none): the gradients die.
    fn zero_grad(&mut self, g: &mut Gen, at: &str) {
        if !self.grads.is_empty() {
            g.say(format!(
                "{at} · optimizer.zero_grad(): gradients freed (set_to_none)"
            ));
            for id in std::mem::take(&mut self.grads) {
                g.free(id);
            }
        }
    }

    /// The forward pass: returns the activation each layer keeps for
    /// backward.
    fn forward(&self, g: &mut Gen, at: &str, act: u64) -> Vec<u32> {
        let mut saved = Vec::with_capacity(self.layers);
        for l in 0..self.layers {
            g.say(format!(
                "{at} · forward layer {}: {} activation kept for backward",
                l + 1,
                bytes(act)
            ));
            g.enter(&layer(l), Phase::Forward);
            saved.push(g.alloc(act));
            let tmp = g.alloc(act / 2);
            g.free(tmp);
        }
        g.leave();
        saved
    }

    /// `loss.backward()`: frees `logits` and the `saved` activations layer
    /// by layer, keeping a gradient per parameter.
    fn backward(&mut self, g: &mut Gen, at: &str, act: u64, logits: u32, saved: Vec<u32>) {
        g.say(format!(
            "{at} · loss.backward(): activations freed layer by layer"
        ));
        g.enter(HEAD, Phase::Backward);
        let mut gout = g.alloc(act / 2);
        g.free(logits);
        for l in (0..self.layers).rev() {
            g.enter(&layer(l), Phase::Backward);
            let gin = g.alloc(act);
            g.free(gout);
            gout = gin;
            self.grads.push(g.alloc(self.weight));
            self.grads.push(g.alloc(self.bias));
            g.say(format!(
                "{at} · backward layer {}: activation freed, gradient kept",
                l + 1
            ));
            g.free(saved[l]);
        }
        g.free(gout);
        g.leave();
    }

    /// `optimizer.step()`: Adam's state on the first step, then temporary
    /// buffers per parameter.
    fn optimizer_step(&mut self, g: &mut Gen, at: &str) {
        g.enter("", Phase::Optimizer);
        if self.adam.is_empty() {
            g.say(format!(
                "{at} · optimizer.step(): Adam creates exp_avg and exp_avg_sq (2x the weights)"
            ));
            let sizes: Vec<u64> = self.param_sizes().collect();
            for s in sizes {
                let a = g.alloc(s);
                let b = g.alloc(s);
                self.adam.extend([a, b]);
            }
        }
        g.say(format!(
            "{at} · optimizer.step(): temporary buffers per parameter"
        ));
        let sizes: Vec<u64> = self.param_sizes().collect();
        for s in sizes {
            let t = g.alloc(s);
            g.free(t);
        }
        g.leave();
    }

    /// A forward pass under `torch.no_grad()`: each activation dies as soon
    /// as the next layer has consumed it.
    fn no_grad_forward(&self, g: &mut Gen, n: u64, total: u64, act: u64) {
        g.step(n);
        g.caller = Caller::Predict;
        g.say(format!(
            "step {n}/{total} · inference · with torch.no_grad(): batch copied to the GPU"
        ));
        let mut x = g.alloc(act / 4);
        for l in 0..self.layers {
            g.say(format!(
                "step {n}/{total} · inference · layer {}: output computed, input freed at once (no graph)",
                l + 1
            ));
            g.enter(&layer(l), Phase::Forward);
            let y = g.alloc(act);
            g.free(x);
            x = y;
        }
        g.enter(HEAD, Phase::Forward);
        let logits = g.alloc(act / 2);
        g.leave();
        g.free(x);
        g.say(format!(
            "step {n}/{total} · inference · predictions read, logits freed"
        ));
        g.free(logits);
    }
}

const ACT: u64 = 64 * MIB;
/// The module that turns the last layer's output into logits and the loss.
const HEAD: &str = "model.head";

/// The module path of layer `l`.
fn layer(l: usize) -> String {
    format!("model.layers.{l}")
}

// The scripts: each fills `g` between the opening and closing snapshots
// that `Scenario::with_config` adds, and returns the closing caption.

pub(super) fn healthy(g: &mut Gen) -> &'static str {
    let mut m = Model::new(g);
    let total = 16;
    for n in 1..=total {
        let loss = m.train_step(g, n, total, ACT, "");
        g.say(format!("step {n}/{total} · loss.item() logged, loss freed: allocated returns to the same floor"));
        g.free(loss);
    }
    "done: a healthy loop has a flat allocated floor and a steady reserved level"
}

pub(super) fn leak(g: &mut Gen) -> &'static str {
    let mut m = Model::new(g);
    let total = 16;
    let val_act = 16 * MIB;
    for n in 1..=total {
        let loss = m.train_step(g, n, total, ACT, "");
        g.free(loss);
        g.say(format!(
            "step {n}/{total} · validation WITHOUT torch.no_grad(): val_losses.append(loss) keeps the graph"
        ));
        g.caller = Caller::Validate;
        let mut x = g.alloc(val_act / 4);
        for l in 0..m.layers {
            // Every saved activation of the graph stays referenced by the kept loss.
            g.enter(&layer(l), Phase::Forward);
            let y = g.alloc(val_act);
            let _ = std::mem::replace(&mut x, y);
        }
        g.enter(HEAD, Phase::Forward);
        let _val_loss = g.alloc(4);
        g.leave();
        g.say(format!(
            "step {n}/{total} · {} more stays allocated every step: the floor keeps rising (leak)",
            bytes(val_act * m.layers as u64 + val_act / 4 + 512)
        ));
    }
    "done: allocated never returns to its floor; fix: loss.item() and torch.no_grad() for validation"
}

/// Deterministic sequence lengths between 64 and 1024 (a fixed LCG).
fn seq_lengths(n: usize) -> Vec<u64> {
    let mut x: u64 = 0x2545_f491;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            64 + ((x >> 33) % 31) * 32
        })
        .collect()
}

pub(super) fn fragmentation(g: &mut Gen) -> &'static str {
    let mut m = Model::new(g);
    let total = 16;
    for (i, seq) in seq_lengths(total as usize).into_iter().enumerate() {
        let n = i as u64 + 1;
        // 48 MiB of activation per layer at sequence length 512.
        let act = (48 * MIB / 512 * seq).max(512);
        let loss = m.train_step(g, n, total, act, &format!(" · seq {seq}"));
        g.say(format!(
            "step {n}/{total} · seq {seq}: activations of {} reuse cached blocks of other sizes, leaving split slivers",
            bytes(act)
        ));
        g.free(loss);
    }
    FRAG_CLOSING
}

/// The fragmentation scenario's closing caption under the default settings
/// (under others, [`frag_closing`] says what they changed).
pub(super) const FRAG_CLOSING: &str = "done: compare with --conf expandable_segments:True (less reserved, no split) and max_split_size_mb:64 (no split, more reserved)";

/// The fragmentation scenario's closing caption for the settings it ran
/// under (issue 30, item 5: it suggested `expandable_segments:True` to a run
/// that had it).
pub(super) fn frag_closing(conf: &crate::sim::conf::AllocConf) -> String {
    let default = crate::sim::conf::AllocConf::default();
    if conf.expandable_segments {
        "done: with expandable_segments:True the segments grow in place: less reserved, no split slivers; compare with the default (no --conf) and max_split_size_mb:64".into()
    } else if conf.max_split_size != default.max_split_size {
        format!(
            "done: with max_split_size_mb:{} oversize blocks are not split: no slivers, more reserved; compare with the default (no --conf) and expandable_segments:True",
            conf.max_split_size >> 20
        )
    } else if *conf != default {
        "done: compare with the default (no --conf), expandable_segments:True and max_split_size_mb:64".into()
    } else {
        FRAG_CLOSING.into()
    }
}

pub(super) fn empty_cache(g: &mut Gen) -> &'static str {
    let mut m = Model::new(g);
    let total = 12;
    for n in 1..=total {
        let act = if n <= 4 { 96 * MIB } else { 24 * MIB };
        let label = if n <= 4 {
            " · batch 64"
        } else {
            " · batch 16"
        };
        let loss = m.train_step(g, n, total, act, label);
        g.free(loss);
        if n == 4 {
            g.say("batch size drops to 16: tensors are smaller, but reserved stays high (cached blocks)");
        }
        if n >= 6 && n % 2 == 0 {
            g.say(format!(
                "step {n}/{total} · torch.cuda.empty_cache(): whole free segments go back to the driver (nvidia-smi drops)"
            ));
            g.push(Op::EmptyCache);
            g.say("the next step must cudaMalloc again: empty_cache frees memory but costs time");
        }
    }
    "done: empty_cache lowers reserved, never allocated; it cannot fix a leak"
}

pub(super) fn oom(g: &mut Gen) -> &'static str {
    g.say("model.cuda(): 1 GiB of weights");
    let mut keep: Vec<u32> = (0..8).map(|_| g.alloc(128 * MIB)).collect();
    let n = 40;
    g.step(1);
    g.say("long-sequence batch: 40 activations of 150 MiB (6 GiB), each its own segment");
    let long: Vec<u32> = (0..n).map(|_| g.alloc(150 * MIB)).collect();
    g.say("backward done: the 150 MiB blocks are freed but stay cached (reserved)");
    for id in long {
        g.free(id);
    }
    g.step(2);
    g.say("short batch: 100 MiB activations reuse the cached 150 MiB blocks and split them");
    let short: Vec<u32> = (0..n).map(|_| g.alloc(100 * MIB)).collect();
    g.say("30 MiB tensors kept for logging land in the 50 MiB leftovers (best fit)");
    for _ in 0..n {
        keep.push(g.alloc(30 * MIB));
    }
    g.say("short batch done: every segment now holds one live 30 MiB tensor between free space");
    for id in short {
        g.free(id);
    }
    g.step(3);
    g.say("a 2 GiB logits tensor is requested: does any free block fit it, or can cudaMalloc still find 2 GiB?");
    let _big = g.alloc(2048 * MIB);
    OOM_CLOSING
}

/// The `oom` scenario's closing caption when it ran out of memory...
pub(super) const OOM_CLOSING: &str =
    "OOM: ~4.7 GiB reserved but unallocated, none of it in a free block over 100 MiB; expandable_segments:True avoids this";
/// ...and when the allocator settings let the request fit (no OOM).
pub(super) const OOM_AVOIDED: &str =
    "done: no OOM, the 2 GiB request fit with these allocator settings (without --conf it fails)";

pub(super) fn inference(g: &mut Gen) -> &'static str {
    let mut m = Model::new(g);
    let total = 16;
    for n in 1..=8 {
        let loss = m.train_step(g, n, total, ACT, " · training");
        g.free(loss);
    }
    g.say("model.eval(): gradients freed; activations no longer need to be kept");
    for id in std::mem::take(&mut m.grads) {
        g.free(id);
    }
    for n in 9..=total {
        m.no_grad_forward(g, n, total, ACT);
    }
    "done: under no_grad only one or two activations are alive at a time"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::conf::AllocConf;
    use crate::sim::scenario::{Scenario, ScenarioRunner};
    use vramscope_wire::event::{Event, EventKind};

    fn run(s: Scenario) -> (ScenarioRunner, Vec<Event>) {
        let mut r = ScenarioRunner::new(s);
        let mut ev = Vec::new();
        r.run_to_end(&mut ev);
        (r, ev)
    }

    #[test]
    fn deterministic() {
        for (name, _) in Scenario::list() {
            let (a, ea) = run(Scenario::by_name(name).unwrap());
            let (b, eb) = run(Scenario::by_name(name).unwrap());
            assert_eq!(ea, eb, "{name}");
            assert_eq!(a.step_stats(), b.step_stats());
            assert_eq!(a.allocator().stats(), b.allocator().stats());
        }
    }

    #[test]
    fn healthy_floor_is_flat() {
        let (r, _) = run(Scenario::by_name("healthy").unwrap());
        let steps = r.step_stats();
        assert_eq!(steps.len(), 16);
        let floors: Vec<u64> = steps[1..].iter().map(|s| s.allocated_min).collect();
        assert!(floors.windows(2).all(|w| w[0] == w[1]), "{floors:?}");
        // Weights + Adam state (grads are freed by zero_grad), no OOM.
        assert!(floors[0] >= 3 * 12 * 48 * MIB);
        assert_eq!(r.allocator().stats().ooms, 0);
        let reserved: Vec<u64> = steps[2..].iter().map(|s| s.reserved_end).collect();
        assert!(
            reserved.windows(2).all(|w| w[0] == w[1]),
            "steady reserved {reserved:?}"
        );
    }

    #[test]
    fn leak_floor_rises() {
        let (r, _) = run(Scenario::by_name("leak").unwrap());
        let steps = r.step_stats();
        assert_eq!(steps.len(), 16);
        for w in steps[1..].windows(2) {
            assert!(w[1].allocated_min > w[0].allocated_min, "{:?}", w);
            assert!(w[1].allocated_min - w[0].allocated_min >= 192 * MIB);
        }
        assert_eq!(r.allocator().stats().ooms, 0);
    }

    #[test]
    fn fragmentation_is_lower_with_expandable_segments_or_max_split() {
        let peak = |conf: &str| {
            let s = Scenario::with_conf("fragmentation", AllocConf::parse(conf).unwrap()).unwrap();
            let (r, _) = run(s);
            let steps = r.step_stats();
            let frag = steps.iter().map(|s| s.inactive_split_max).max().unwrap();
            (
                frag,
                r.allocator().stats().reserved_peak,
                r.allocator().stats().ooms,
            )
        };
        let (frag_plain, reserved_plain, ooms) = peak("");
        assert_eq!(ooms, 0);
        assert!(
            frag_plain > 100 * MIB,
            "the plain allocator fragments: {frag_plain}"
        );
        let (frag_es, reserved_es, _) = peak("expandable_segments:True");
        assert!(frag_es < frag_plain);
        assert!(
            reserved_es < reserved_plain,
            "{reserved_es} vs {reserved_plain}"
        );
        let (frag_ms, _, _) = peak("max_split_size_mb:64");
        assert!(frag_ms < frag_plain, "{frag_ms} vs {frag_plain}");
    }

    #[test]
    fn empty_cache_returns_memory() {
        let (r, ev) = run(Scenario::by_name("empty-cache").unwrap());
        assert!(ev
            .iter()
            .any(|e| matches!(e.kind, EventKind::SegmentFree { .. })));
        let steps = r.step_stats();
        // Reserved stays high after the batch shrinks, until empty_cache.
        assert_eq!(steps[4].reserved_end, steps[3].reserved_end);
        assert!(steps[5].reserved_end < steps[4].reserved_end);
        assert_eq!(steps[5].allocated_end, steps[4].allocated_end);
        assert_eq!(r.allocator().stats().ooms, 0);
    }

    #[test]
    fn oom_happens_with_free_cached_memory() {
        let (r, ev) = run(Scenario::by_name("oom").unwrap());
        let oom = r.last_oom().expect("the scenario runs out of memory");
        assert!(oom.reserved - oom.allocated > 4 << 30, "{oom}");
        assert!(oom.device_free < oom.alloc_size);
        assert_eq!(r.allocator().stats().ooms, 1);
        assert!(ev.iter().any(|e| matches!(e.kind, EventKind::Oom { .. })));
        // With expandable segments the same script fits.
        let s = Scenario::with_conf("oom", AllocConf::parse("expandable_segments:True").unwrap())
            .unwrap();
        let (r, _) = run(s);
        assert!(r.last_oom().is_none());
        // ...and its caption does not claim one.
        assert!(!r.caption().starts_with("OOM"), "{}", r.caption());
        assert!(r.caption().starts_with("done: no OOM"), "{}", r.caption());
        let (r, _) = run(Scenario::by_name("oom").unwrap());
        assert!(r.caption().starts_with("OOM:"), "{}", r.caption());
    }

    #[test]
    fn inference_footprint_is_smaller() {
        let (r, _) = run(Scenario::by_name("inference").unwrap());
        let steps = r.step_stats();
        let train_peak = steps[..8].iter().map(|s| s.allocated_max).max().unwrap();
        let infer_peak = steps[8..].iter().map(|s| s.allocated_max).max().unwrap();
        let infer_floor = steps[8..].iter().map(|s| s.allocated_min).min().unwrap();
        // Training keeps 12 activations of 64 MiB (plus grads); no_grad keeps ~2.
        assert!(
            train_peak - infer_peak > 12 * ACT,
            "{train_peak} vs {infer_peak}"
        );
        assert!(infer_peak - infer_floor <= 3 * ACT);
    }
}
