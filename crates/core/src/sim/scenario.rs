//! Named workshop scenarios: deterministic scripts of timed allocator
//! operations with captions, and a runner that applies them to a
//! [`SimAllocator`] and yields the events a real process would produce.
//!
//! Sizes are realistic but modest: an 8 GiB device and a 12-layer model of
//! 48 MiB weight matrices trained with Adam (about 2.3 GiB of weights,
//! gradients and optimizer state) plus batch-dependent activations.
//!
//! ```ignore (crate-private)
//! use vramscope::sim::scenario::{Scenario, ScenarioRunner};
//! let mut run = ScenarioRunner::new(Scenario::by_name("leak").unwrap());
//! let mut events = Vec::new();
//! while !run.is_finished() {
//!     let t = run.now() + 100_000_000; // 100 ms of simulated time
//!     run.advance_to(t, &mut events);
//!     println!("{}", run.caption());
//! }
//! ```

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::allocator::{EventSink, OomError, SimAllocator, SimConfig};
#[cfg(test)]
use super::conf::AllocConf;
use vramscope_text::format::bytes;
use vramscope_wire::event::{CtxTag, Event, EventKind, Held, Phase};

const MIB: u64 = 1 << 20;
/// Simulated time between two operations.
pub(crate) const OP_DT_NS: u64 = 5_000_000;
/// Extra simulated time at each training-step boundary.
pub(crate) const STEP_GAP_NS: u64 = 50_000_000;
/// Minimum simulated time between two `Stats` events from the runner.
pub(crate) const STATS_INTERVAL_NS: u64 = 10_000_000;

/// One operation of a scenario script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Op {
    /// A tensor is created (`tensor` is the script's name for it).
    Alloc { tensor: u32, size: u64, stream: u64 },
    /// The tensor dies.
    Free { tensor: u32 },
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
    /// A training step begins (emits a `Marker` event with the step number).
    Step(u64),
    /// A full state snapshot is emitted.
    Snapshot,
    /// The job enters context `n` of [`Scenario::contexts`] (1-based; 0:
    /// outside every module), as an agent's module hooks would: the
    /// definitions are written on first use, and the allocations that
    /// follow carry it.
    Context(u32),
    /// A role list (FORMAT 1.2), as the agent writes at a step boundary:
    /// the tensors PyTorch holds, each (tensor, its bytes, its role, the
    /// module path's 1-based index in [`Scenario::modules`]).
    Roles(Vec<(u32, u64, Held, u32)>),
}

/// An operation at a simulated time, with the caption to show from then on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TimedOp {
    pub(crate) time_ns: u64,
    pub(crate) op: Op,
    pub(crate) caption: Option<String>,
}

/// A named, fully generated scenario.
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

/// A simulated Python frame: file, line, function.
pub(crate) type SimFrame = (&'static str, u32, &'static str);

/// A context of the simulated job: a module (`modules` index + 1, 0 none),
/// a phase, and the Python stack (innermost first) an agent capturing
/// stacks would see when the job enters it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SimContext {
    pub(crate) module: u32,
    pub(crate) phase: Phase,
    pub(crate) stack: Vec<SimFrame>,
}

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

// ----- script generation -------------------------------------------------

#[derive(Default)]
struct Gen {
    ops: Vec<TimedOp>,
    t: u64,
    next_id: u32,
    caption: Option<String>,
    modules: Vec<String>,
    contexts: Vec<SimContext>,
    /// Where the model is called from now.
    caller: Caller,
}

impl Gen {
    fn say(&mut self, c: impl Into<String>) {
        self.caption = Some(c.into());
    }
    fn push(&mut self, op: Op) {
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

fn healthy(g: &mut Gen) -> &'static str {
    let mut m = Model::new(g);
    let total = 16;
    for n in 1..=total {
        let loss = m.train_step(g, n, total, ACT, "");
        g.say(format!("step {n}/{total} · loss.item() logged, loss freed: allocated returns to the same floor"));
        g.free(loss);
    }
    "done: a healthy loop has a flat allocated floor and a steady reserved level"
}

fn leak(g: &mut Gen) -> &'static str {
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

fn fragmentation(g: &mut Gen) -> &'static str {
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
const FRAG_CLOSING: &str = "done: compare with --conf expandable_segments:True (less reserved, no split) and max_split_size_mb:64 (no split, more reserved)";

/// The fragmentation scenario's closing caption for the settings it ran
/// under (issue 30, item 5: it suggested `expandable_segments:True` to a run
/// that had it).
fn frag_closing(conf: &super::conf::AllocConf) -> String {
    let default = super::conf::AllocConf::default();
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

fn empty_cache(g: &mut Gen) -> &'static str {
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

fn oom(g: &mut Gen) -> &'static str {
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
const OOM_CLOSING: &str =
    "OOM: ~4.7 GiB reserved but unallocated, none of it in a free block over 100 MiB; expandable_segments:True avoids this";
/// ...and when the allocator settings let the request fit (no OOM).
const OOM_AVOIDED: &str =
    "done: no OOM, the 2 GiB request fit with these allocator settings (without --conf it fails)";

fn inference(g: &mut Gen) -> &'static str {
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

// ----- running -----------------------------------------------------------

/// Statistics of one training step (from its `Step` marker to the next).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StepStats {
    pub(crate) step: u64,
    /// The lowest `allocated` seen during the step (its floor).
    pub(crate) allocated_min: u64,
    pub(crate) allocated_max: u64,
    pub(crate) reserved_max: u64,
    pub(crate) inactive_split_max: u64,
    pub(crate) allocated_end: u64,
    pub(crate) reserved_end: u64,
    pub(crate) inactive_split_end: u64,
    pub(crate) segments_end: u64,
    /// OOMs during this step.
    pub(crate) ooms: u64,
}

/// What applying one operation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Applied {
    pub(crate) op: Op,
    pub(crate) time_ns: u64,
    pub(crate) oom: Option<OomError>,
}

/// Applies a scenario's operations to a [`SimAllocator`] as simulated time
/// advances, emitting trace events (plus `Stats` samples and step
/// `Marker`s) and keeping the current caption.
#[derive(Debug, Clone)]
pub struct ScenarioRunner {
    scenario: Scenario,
    alloc: SimAllocator,
    cursor: usize,
    live: HashMap<u32, u64>,
    caption: String,
    last_oom: Option<OomError>,
    last_stats_ns: Option<u64>,
    steps: Vec<StepStats>,
    current: Option<StepStats>,
    /// Contexts defined so far (in the segment: ids are never reused, and
    /// a new run's definitions repeat the same ones).
    defined: Vec<bool>,
    context: u32,
    step_tag: u8,
    /// The current step (0 before the first).
    step_now: u64,
    /// Stack capture asked for (command 5), while it lasts.
    capture: Option<Capture>,
    /// The definitions stack capture made (kept across runs: ids are
    /// never reused within a segment).
    stack_defs: StackDefs,
    /// The last role list (sent again with every snapshot), and the lists
    /// written so far.
    roles: Vec<(u32, u64, Held, u32)>,
    roles_sent: u32,
}

/// Stack capture under way: step boundaries left, frames kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Capture {
    boundaries_left: u64,
    depth: usize,
}

/// Frames kept per stack when the asker leaves the depth to the producer.
pub(crate) const DEFAULT_STACK_DEPTH: usize = 16;

/// The strings, frames, stacks and contexts with stacks that capture
/// defined, and their records (sent again before every snapshot).
#[derive(Debug, Clone, Default)]
struct StackDefs {
    strings: HashMap<&'static str, u32>,
    frames: HashMap<SimFrame, u32>,
    stacks: HashMap<(u32, u32), u32>,
    /// (scenario context, frames kept) → context id.
    contexts: HashMap<(u32, usize), u32>,
    records: Vec<EventKind>,
}

impl StackDefs {
    fn emit(&mut self, kind: EventKind, time_ns: u64, sink: &mut dyn EventSink) {
        sink.emit(Event { time_ns, kind });
        self.records.push(kind);
    }

    /// The id of string `text`, defined first if new (ids after the
    /// scenario's module paths).
    fn string(
        &mut self,
        s: &Scenario,
        text: &'static str,
        t: u64,
        sink: &mut dyn EventSink,
    ) -> u32 {
        if let Some(&id) = self.strings.get(text) {
            return id;
        }
        let id = (s.modules.len() + self.strings.len() + 1) as u32;
        for kind in EventKind::string_chunks(id, text) {
            self.emit(kind, t, sink);
        }
        self.strings.insert(text, id);
        id
    }

    /// The id of the stack `frames` (innermost first), defining what is new
    /// (parents before children, strings before frames).
    fn stack(
        &mut self,
        s: &Scenario,
        frames: &[SimFrame],
        t: u64,
        sink: &mut dyn EventSink,
    ) -> u32 {
        let mut parent = 0;
        for &f in frames.iter().rev() {
            let frame = match self.frames.get(&f) {
                Some(&id) => id,
                None => {
                    let file = self.string(s, f.0, t, sink);
                    let function = self.string(s, f.2, t, sink);
                    let id = self.frames.len() as u32 + 1;
                    self.emit(
                        EventKind::Frame {
                            id,
                            file,
                            function,
                            line: f.1,
                        },
                        t,
                        sink,
                    );
                    self.frames.insert(f, id);
                    id
                }
            };
            parent = match self.stacks.get(&(frame, parent)) {
                Some(&id) => id,
                None => {
                    let id = self.stacks.len() as u32 + 1;
                    self.emit(EventKind::Stack { id, frame, parent }, t, sink);
                    self.stacks.insert((frame, parent), id);
                    id
                }
            };
        }
        parent
    }
}

impl ScenarioRunner {
    pub fn new(scenario: Scenario) -> ScenarioRunner {
        let alloc = SimAllocator::new(scenario.config.clone());
        let caption = scenario.description.to_string();
        ScenarioRunner {
            scenario,
            alloc,
            cursor: 0,
            live: HashMap::new(),
            roles: Vec::new(),
            roles_sent: 0,
            caption,
            last_oom: None,
            last_stats_ns: None,
            steps: Vec::new(),
            current: None,
            defined: Vec::new(),
            context: 0,
            step_tag: 0,
            step_now: 0,
            capture: None,
            stack_defs: StackDefs::default(),
        }
    }

    /// The scenario again from its start (the demo's loop), in the same
    /// segment: the stack definitions made so far and a capture under way
    /// carry over.
    pub fn next_run(self) -> ScenarioRunner {
        let mut r = ScenarioRunner::new(self.scenario);
        r.stack_defs = self.stack_defs;
        r.capture = self.capture;
        r
    }

    /// Command 5: capture stacks from now until `steps` step boundaries
    /// have passed (0 stops a capture), at most `depth` frames each (0: the
    /// default). Returns the steps granted and the step it began in.
    pub fn capture_stacks(
        &mut self,
        steps: u32,
        depth: u16,
        sink: &mut dyn EventSink,
    ) -> (u64, u64) {
        self.capture = (steps > 0).then(|| Capture {
            boundaries_left: u64::from(steps),
            depth: match depth {
                0 => DEFAULT_STACK_DEPTH,
                d => usize::from(d),
            },
        });
        let t = self.alloc.now();
        self.tag(t, sink);
        (u64::from(steps), self.step_now)
    }

    /// Whether stacks are being captured.
    pub fn capturing(&self) -> bool {
        self.capture.is_some()
    }

    #[cfg(test)]
    pub(crate) fn scenario(&self) -> &Scenario {
        &self.scenario
    }
    pub fn allocator(&self) -> &SimAllocator {
        &self.alloc
    }
    /// The allocator, for commands from outside the script (`empty_cache`,
    /// peak reset, snapshots requested by a dashboard).
    pub fn allocator_mut(&mut self) -> &mut SimAllocator {
        &mut self.alloc
    }
    /// The caption of the most recent operation that had one.
    pub fn caption(&self) -> &str {
        &self.caption
    }
    pub fn is_finished(&self) -> bool {
        self.cursor >= self.scenario.ops.len()
    }
    /// Simulated time of the last applied operation.
    pub fn now(&self) -> u64 {
        self.alloc.now()
    }
    #[cfg(test)]
    /// The most recent OOM, if any.
    pub(crate) fn last_oom(&self) -> Option<&OomError> {
        self.last_oom.as_ref()
    }
    #[cfg(test)]
    /// Completed training steps so far.
    pub(crate) fn step_stats(&self) -> &[StepStats] {
        &self.steps
    }
    /// Fraction of the script applied, 0.0 to 1.0.
    pub fn progress(&self) -> f64 {
        if self.scenario.ops.is_empty() {
            1.0
        } else {
            self.cursor as f64 / self.scenario.ops.len() as f64
        }
    }

    /// Applies every operation due at or before `time_ns`; returns how many.
    pub fn advance_to(&mut self, time_ns: u64, sink: &mut dyn EventSink) -> usize {
        let mut n = 0;
        while self
            .scenario
            .ops
            .get(self.cursor)
            .is_some_and(|o| o.time_ns <= time_ns)
        {
            self.step(sink);
            n += 1;
        }
        n
    }

    /// Applies the next operation (None when finished).
    pub(crate) fn step(&mut self, sink: &mut dyn EventSink) -> Option<Applied> {
        let TimedOp {
            time_ns,
            op,
            caption,
        } = self.scenario.ops.get(self.cursor)?.clone();
        self.cursor += 1;
        self.alloc.set_time(time_ns);
        if let Some(c) = caption {
            // A caption about an OOM is only shown when there was one.
            self.caption = if c == OOM_CLOSING && self.alloc.stats().ooms == 0 {
                OOM_AVOIDED.to_string()
            } else if c == FRAG_CLOSING {
                frag_closing(&self.alloc.config().alloc)
            } else {
                c
            };
        }
        let oom = self.apply(&op, time_ns, sink);
        self.observe();
        let due = self
            .last_stats_ns
            .is_none_or(|t| time_ns >= t + STATS_INTERVAL_NS);
        if due || matches!(op, Op::Step(_)) || oom.is_some() || self.is_finished() {
            self.alloc.emit_stats(sink);
            self.last_stats_ns = Some(time_ns);
        }
        if self.is_finished() {
            self.finish_step();
        }
        Some(Applied { op, time_ns, oom })
    }

    /// Applies `op` to the allocator; returns its OOM, if any.
    fn apply(&mut self, op: &Op, time_ns: u64, sink: &mut dyn EventSink) -> Option<OomError> {
        match *op {
            Op::Alloc {
                tensor,
                size,
                stream,
            } => match self.alloc.malloc(size, stream, sink) {
                Ok(p) => {
                    self.live.insert(tensor, p);
                }
                Err(e) => {
                    self.caption = format!("OOM: {e}");
                    self.last_oom = Some(e.clone());
                    return Some(e);
                }
            },
            Op::Free { tensor } => {
                if let Some(p) = self.live.remove(&tensor) {
                    self.alloc.free(p, sink).expect("live tensor");
                }
            }
            Op::EmptyCache => self.alloc.empty_cache(sink),
            Op::Step(n) => {
                self.finish_step();
                self.current = Some(StepStats {
                    step: n,
                    allocated_min: u64::MAX,
                    ..StepStats::default()
                });
                sink.emit(Event {
                    time_ns,
                    kind: EventKind::Marker {
                        value: n,
                        source: Default::default(),
                    },
                });
                // The step hook stores the tag after writing the marker.
                self.step_tag = CtxTag::step_tag_of(n);
                self.step_now = n;
                if let Some(c) = self.capture.as_mut() {
                    c.boundaries_left -= 1;
                    if c.boundaries_left == 0 {
                        self.capture = None;
                    }
                }
                self.tag(time_ns, sink);
            }
            Op::Snapshot => {
                self.snapshot(sink);
            }
            Op::Roles(ref tensors) => {
                self.roles = tensors.clone();
                self.write_roles(time_ns, sink);
            }
            Op::Context(c) => {
                let i = c as usize;
                if (1..=self.scenario.contexts.len()).contains(&i)
                    && !self.defined.get(i - 1).copied().unwrap_or(false)
                {
                    self.define(i - 1, time_ns, sink);
                }
                self.context = c;
                self.tag(time_ns, sink);
            }
        }
        None
    }

    /// Tags the allocations that follow with the current context: while
    /// stacks are captured, its twin with a stack (defined on first use).
    fn tag(&mut self, time_ns: u64, sink: &mut dyn EventSink) {
        let context = match self.capture {
            Some(c) if self.context > 0 => self.stacked(self.context, c.depth, time_ns, sink),
            _ => self.context,
        };
        self.alloc.set_context(CtxTag {
            context,
            step_tag: self.step_tag,
        });
    }

    /// The id of scenario context `c` with its stack cut at `depth` frames:
    /// ids after the scenario's own contexts, defined on first use.
    fn stacked(&mut self, c: u32, depth: usize, time_ns: u64, sink: &mut dyn EventSink) -> u32 {
        let Some(ctx) = self.scenario.contexts.get(c as usize - 1) else {
            return c;
        };
        let depth = depth.min(ctx.stack.len());
        if let Some(&id) = self.stack_defs.contexts.get(&(c, depth)) {
            return id;
        }
        let (module, phase) = (ctx.module, ctx.phase);
        let frames = ctx.stack[..depth].to_vec();
        if !self.defined.get(c as usize - 1).copied().unwrap_or(false) {
            // Its module path's string.
            self.define(c as usize - 1, time_ns, sink);
        }
        let defs = &mut self.stack_defs;
        let stack = defs.stack(&self.scenario, &frames, time_ns, sink);
        let id = (self.scenario.contexts.len() + defs.contexts.len() + 1) as u32;
        defs.emit(
            EventKind::Context {
                id,
                module,
                phase,
                stack,
                step: None,
            },
            time_ns,
            sink,
        );
        defs.contexts.insert((c, depth), id);
        id
    }

    /// Writes the definitions of context `i` (its module's string first).
    fn define(&mut self, i: usize, time_ns: u64, sink: &mut dyn EventSink) {
        let SimContext { module, phase, .. } = self.scenario.contexts[i];
        if let Some(path) = (module as usize)
            .checked_sub(1)
            .and_then(|m| self.scenario.modules.get(m))
        {
            for kind in EventKind::string_chunks(module, path) {
                sink.emit(Event { time_ns, kind });
            }
        }
        sink.emit(Event {
            time_ns,
            kind: EventKind::Context {
                id: i as u32 + 1,
                module,
                phase,
                stack: 0,
                step: None,
            },
        });
        if self.defined.len() <= i {
            self.defined.resize(i + 1, false);
        }
        self.defined[i] = true;
    }

    /// Runs the rest of the script.
    pub fn run_to_end(&mut self, sink: &mut dyn EventSink) {
        while self.step(sink).is_some() {}
    }

    /// Emits a full state snapshot now, after the definitions made so far
    /// (a reader that attached late may have missed them; FORMAT.md,
    /// "Attaching mid-run").
    pub fn snapshot(&mut self, sink: &mut dyn EventSink) -> u32 {
        let t = self.alloc.now();
        for i in 0..self.defined.len() {
            if self.defined[i] {
                self.define(i, t, sink);
            }
        }
        for kind in &self.stack_defs.records {
            sink.emit(Event {
                time_ns: t,
                kind: *kind,
            });
        }
        let id = self.alloc.snapshot(sink);
        // The role list again, after the snapshot's blocks (as the agent).
        self.write_roles(t, sink);
        id
    }

    /// Writes the last role list (the tensors still alive) as list
    /// `self.roles_sent + 1`.
    fn write_roles(&mut self, time_ns: u64, sink: &mut dyn EventSink) {
        if self.roles.is_empty() {
            return;
        }
        self.roles_sent += 1;
        let list = self.roles_sent;
        let live: Vec<(u64, u64, Held, u32)> = (self.roles.iter())
            .filter_map(|&(t, bytes, held, module)| {
                self.live.get(&t).map(|&addr| (addr, bytes, held, module))
            })
            .collect();
        let count = live.len() as u64;
        let mut emit = |kind| sink.emit(Event { time_ns, kind });
        emit(EventKind::Roles { list, count });
        for (addr, bytes, held, module) in live {
            emit(EventKind::Role {
                list,
                device: 0,
                addr,
                bytes,
                held,
                module,
            });
        }
        emit(EventKind::RolesEnd { list, count });
    }

    fn observe(&mut self) {
        let st = self.alloc.stats();
        if let Some(c) = self.current.as_mut() {
            c.allocated_min = c.allocated_min.min(st.allocated);
            c.allocated_max = c.allocated_max.max(st.allocated);
            c.reserved_max = c.reserved_max.max(st.reserved);
            c.inactive_split_max = c.inactive_split_max.max(st.inactive_split);
            c.allocated_end = st.allocated;
            c.reserved_end = st.reserved;
            c.inactive_split_end = st.inactive_split;
            c.segments_end = st.segments;
        }
    }

    fn finish_step(&mut self) {
        if let Some(mut c) = self.current.take() {
            let ooms_before: u64 = self.steps.iter().map(|s| s.ooms).sum();
            c.ooms = self.alloc.stats().ooms - ooms_before;
            self.steps.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::allocator::NullSink;

    fn run(s: Scenario) -> (ScenarioRunner, Vec<Event>) {
        let mut r = ScenarioRunner::new(s);
        let mut ev = Vec::new();
        r.run_to_end(&mut ev);
        (r, ev)
    }

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

    #[test]
    fn runner_emits_markers_stats_and_captions() {
        let mut r = ScenarioRunner::new(Scenario::by_name("healthy").unwrap());
        let mut ev = Vec::new();
        let t0 = r.scenario().ops[0].time_ns;
        let first = r.advance_to(t0, &mut ev);
        // The opening snapshot, and entering the first layer's module.
        assert_eq!(first, 2);
        assert_eq!(r.scenario().ops[1].op, Op::Context(1));
        assert!(matches!(ev[0].kind, EventKind::SnapshotBegin { .. }));
        let n = r.advance_to(2_000_000_000, &mut ev);
        assert!(n > 10 && !r.is_finished());
        assert!(r.now() <= 2_000_000_000);
        assert!(r.caption().starts_with("step "), "{}", r.caption());
        assert!(ev
            .iter()
            .any(|e| matches!(e.kind, EventKind::Marker { value: 1, .. })));
        assert!(ev.iter().any(|e| matches!(e.kind, EventKind::Stats { .. })));
        assert!(ev.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
        r.run_to_end(&mut NullSink);
        assert!(r.is_finished());
        assert!((r.progress() - 1.0).abs() < 1e-12);
    }

    /// Command 5: the contexts of the next steps carry stacks (defined
    /// string, frame, stack, context in that order), then capture ends by
    /// itself and the plain contexts come back; a new run keeps the ids.
    #[test]
    fn captured_stacks_last_the_steps_asked_for() {
        let s = Scenario::by_name("leak").unwrap();
        let plain = s.contexts.len() as u32;
        let mut r = ScenarioRunner::new(s);
        let mut ev: Vec<Event> = Vec::new();
        // Into step 2, then capture for 2 step boundaries.
        while r.step_now < 2 {
            r.step(&mut ev);
        }
        assert_eq!(r.capture_stacks(2, 0, &mut ev), (2, 2));
        let from = ev.len();
        while r.step_now < 5 {
            r.step(&mut ev);
        }
        let tagged: Vec<(u64, u32)> = {
            let mut step = 2;
            let mut out = Vec::new();
            for e in &ev[from..] {
                match e.kind {
                    EventKind::Marker { value, .. } => step = value,
                    EventKind::Alloc { place, .. } if place.ctx.context != 0 => {
                        out.push((step, place.ctx.context))
                    }
                    _ => {}
                }
            }
            out
        };
        // Steps 2 and 3 (until step 4 began): contexts with stacks.
        assert!(tagged
            .iter()
            .filter(|(s, _)| *s < 4)
            .all(|(_, c)| *c > plain));
        assert!(tagged.iter().any(|(s, _)| *s == 3));
        assert!(tagged
            .iter()
            .filter(|(s, _)| *s >= 4)
            .all(|(_, c)| *c <= plain));
        assert!(!r.capturing());
        // Every stacked context's stack resolves through records written
        // before it: frames name train.py / model.py.
        let mut defs = crate::model::attrib::Definitions::default();
        let b = crate::model::Bounds::default();
        for e in &ev {
            defs.apply(&b, &e.kind);
        }
        let (_, c) = tagged[0];
        let v = defs.context_view(c);
        assert_eq!(v.module, "model.layers.0");
        assert_eq!(
            v.stack,
            [
                "model.py:31 forward",
                "train.py:57 training_step",
                "train.py:102 main"
            ]
        );
        // Depth 1: the innermost frame only, under a new id.
        let mut r2 = r.next_run();
        let ids = r2.stack_defs.contexts.len();
        r2.capture_stacks(1, 1, &mut ev);
        r2.run_to_end(&mut ev);
        assert!(r2.stack_defs.contexts.len() > ids);
        assert!(r2.stack_defs.contexts.keys().any(|(_, d)| *d == 1));
    }
}
