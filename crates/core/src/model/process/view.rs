//! What views read of a process: its view, the roles of its blocks and
//! who holds the live memory (attribution).

use std::collections::HashMap;

use crate::model::attrib;
use crate::model::device::Block;
use crate::model::device::DeviceState;
use crate::model::roles::{self, Role, RoleMatches};
use crate::model::view::{
    BlockView, DeviceFigures, DeviceTimeline, DeviceView, ProcessView, SegmentView, ViewOptions,
    WatchView,
};
use vramscope_wire::event::BlockState;

use super::Process;

/// Two address-ordered block sequences as one, in address order.
fn merged<'a>(
    a: impl Iterator<Item = (u64, &'a Block)>,
    b: impl Iterator<Item = (u64, &'a Block)>,
) -> impl Iterator<Item = (u64, &'a Block)> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if y.0 < x.0 => b.next(),
        (Some(_), _) => a.next(),
        (None, _) => b.next(),
    })
}

impl Process {
    /// What the role lists say about every allocated block: one pass over
    /// each device's blocks (orphans included) and its entries, so a view
    /// costs the blocks plus the entries, never their product
    /// ([`RoleTable::match_blocks`]).
    ///
    /// [`RoleTable::match_blocks`]: crate::model::roles::RoleTable::match_blocks
    pub(crate) fn role_matches(&self) -> RoleMatches {
        let mut out = RoleMatches::default();
        if self.roles.status().tensors == 0 {
            return out;
        }
        let phase = |b: &Block| self.defs.phase_step(b.origin.context).0;
        for d in &self.devices {
            let blocks = merged(d.blocks(), d.orphans());
            self.roles.match_blocks(d.device(), blocks, phase, &mut out);
        }
        out.name_holders(|ids| {
            let paths: Vec<std::borrow::Cow<'_, str>> =
                ids.iter().map(|&m| self.defs.string_cow(m)).collect();
            roles::shared_path(paths.iter().map(|p| p.as_ref()))
        });
        out
    }

    /// The role of the allocated block at `addr` on `device`
    /// (`matches`: the view's [`Self::role_matches`]), and the role list
    /// entries naming it, if any.
    fn block_role<'m>(
        &self,
        matches: &'m RoleMatches,
        device: u16,
        addr: u64,
        b: &Block,
    ) -> (Role, Option<&'m roles::Match>) {
        if let Some(m) = matches.get(device, addr) {
            return (m.role, Some(m));
        }
        let (phase, step) = self.defs.phase_step(b.origin.context);
        let born = step.or(b.origin.step.map(u64::from));
        (Role::by_lifetime(phase, born, self.clock.step()), None)
    }

    /// A block as views show it: its role, and the module holding it when
    /// a role list named it (`matches`: the view's [`Self::role_matches`]).
    pub(crate) fn block_view(
        &self,
        matches: &RoleMatches,
        device: u16,
        addr: u64,
        b: &Block,
    ) -> BlockView {
        let allocated = b.state == BlockState::Allocated;
        let (role, held) = if allocated {
            self.block_role(matches, device, addr, b)
        } else {
            (Role::Other, None)
        };
        BlockView {
            addr,
            block: *b,
            role: allocated.then_some(role),
            held_by: held.and_then(|m| m.held_by.clone()),
        }
    }

    /// Who holds the live memory: bytes by module, phase and role
    /// (`matches`: the view's [`Self::role_matches`]).
    pub(crate) fn attribution(&self, matches: &RoleMatches) -> attrib::Attribution {
        // Sums by group; consecutive blocks mostly share their context and
        // role, so the last context's phase and the last plain group are
        // kept at hand (a view of 5,052 blocks: 585 us with a lookup of
        // each, see `model/view` in benches/model.rs).
        let now = self.clock.step();
        let mut index: HashMap<attrib::GroupKey, usize> = HashMap::new();
        let mut sums: Vec<(u64, u64)> = Vec::new();
        fn group(
            index: &mut HashMap<attrib::GroupKey, usize>,
            sums: &mut Vec<(u64, u64)>,
            key: attrib::GroupKey,
        ) -> usize {
            *index.entry(key).or_insert_with(|| {
                sums.push((0, 0));
                sums.len() - 1
            })
        }
        let mut ctx_memo: Option<(u32, attrib::PhaseKey, Option<u64>)> = None;
        let mut last: Option<((u32, Role), usize)> = None;
        for d in &self.devices {
            let dev = d.device();
            for (addr, b) in d.blocks().chain(d.orphans()) {
                if b.state != BlockState::Allocated {
                    continue;
                }
                let ctx = b.origin.context;
                let i = match matches.get(dev, addr) {
                    Some(m) => group(&mut index, &mut sums, (ctx, m.role, m.modules.clone())),
                    None => {
                        let (phase, cstep) = match ctx_memo {
                            Some((c, p, s)) if c == ctx => (p, s),
                            _ => {
                                let (p, s) = self.defs.phase_step(ctx);
                                ctx_memo = Some((ctx, p, s));
                                (p, s)
                            }
                        };
                        let born = cstep.or(b.origin.step.map(u64::from));
                        let role = Role::by_lifetime(phase, born, now);
                        match last {
                            Some((k, i)) if k == (ctx, role) => i,
                            _ => {
                                let i = group(&mut index, &mut sums, (ctx, role, Vec::new()));
                                last = Some(((ctx, role), i));
                                i
                            }
                        }
                    }
                };
                let e = &mut sums[i];
                e.0 = e.0.saturating_add(b.size);
                e.1 += 1;
            }
        }
        let groups: HashMap<attrib::GroupKey, (u64, u64)> =
            index.into_iter().map(|(k, i)| (k, sums[i])).collect();
        attrib::attribution(
            &self.defs,
            self.clock.step(),
            &groups,
            &self.producer_drops,
            self.roles.status(),
        )
    }

    /// Whether the process ever used `d`: a segment or a stray block, an
    /// allocation seen, or statistics other than all zero. A process lists
    /// the devices it uses, not every device its agent can see (a DDP rank
    /// on GPU 1 reports all-zero statistics for GPU 0).
    fn device_used(&self, d: &DeviceState) -> bool {
        d.segments().next().is_some()
            || d.orphans().next().is_some()
            || d.stats().is_none_or(|(_, s)| {
                s.reserved_peak > 0 || s.allocated_peak > 0 || s.reserved > 0 || s.ooms > 0
            })
    }

    /// A view for renderers and `snapshot --json`.
    pub fn view(&self, now_ns: u64, opts: &ViewOptions) -> ProcessView {
        let matches = self.role_matches();
        let devices: Vec<DeviceView> = self
            .devices
            .iter()
            .filter(|d| self.device_used(d))
            .map(|d| DeviceView {
                figures: self.device_figures(d),
                segments: if opts.block_map {
                    d.segments()
                        .map(|s| SegmentView {
                            segment: *s,
                            blocks: d
                                .blocks_of(s)
                                .map(|(addr, b)| self.block_view(&matches, d.device(), addr, b))
                                .collect(),
                        })
                        .collect()
                } else {
                    Vec::new()
                },
                orphans: if opts.block_map {
                    d.orphans()
                        .map(|(addr, b)| self.block_view(&matches, d.device(), addr, b))
                        .collect()
                } else {
                    Vec::new()
                },
                timeline: opts.timeline.map(|r| {
                    let [allocated, reserved, active] =
                        d.series.query(r.from_ns, r.to_ns, r.columns);
                    DeviceTimeline {
                        allocated,
                        reserved,
                        active,
                    }
                }),
            })
            .collect();
        let figs: Vec<DeviceFigures> = devices.iter().map(|d| d.figures).collect();
        let figures = self.figures_from(&figs, now_ns);
        let leak = self.leak_report(now_ns);
        let forecast = self.forecast(&figs, &figures, &leak);
        ProcessView {
            key: self.key,
            mode: self.mode,
            needs_resync: self.needs_resync(),
            figures,
            devices,
            recent_events: (self.log).newest(opts.recent_events.min(self.cfg.recent_events)),
            ooms: self.ooms.iter().cloned().collect(),
            ooms_total: self.ooms_total,
            leak,
            forecast,
            snapshots_installed: self.snapshots_installed,
            snapshots_discarded: self.snapshots_discarded,
            last_problem: self.last_problem,
            nvml_timeline: opts.timeline.map(|r| {
                let [nvml] = self.nvml_series.query(r.from_ns, r.to_ns, r.columns);
                nvml
            }),
            memory_bytes: self.memory_bytes(),
            dropped: self.dropped(),
            bounds: self.cfg.bounds,
            leak_criterion: self.leak.config().clone(),
            watch: WatchView {
                began_ns: self.watch.began_ns,
                mid_run: self.watch.mid_run,
                waiting_for_anchor: self.waiting_for_anchor(),
                reflected_events: (self.devices.iter())
                    .map(DeviceState::reflected_events)
                    .sum(),
            },
            attribution: self.attribution(&matches),
            outside: self.outside.view(),
            samples: (self.devices.iter().map(|d| d.series.extent()))
                .chain([self.nvml_series.extent()])
                .flatten()
                .reduce(|(a0, a1), (b0, b1)| (a0.min(b0), a1.max(b1))),
        }
    }
}
