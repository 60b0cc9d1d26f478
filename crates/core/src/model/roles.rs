//! Roles: what each live block is to PyTorch.
//!
//! Parameters, buffers, gradients and optimizer state are *exact*: the
//! producer sends role lists (FORMAT.md "Roles"), the addresses and sizes
//! of the tensors PyTorch itself holds (the model's parameters and buffers,
//! their `.grad`, each optimizer's `state`, FSDP2's local shards), and a
//! block holds a role when it contains one of those tensors.
//!
//! The other blocks get a role by their lifetime, from the phase and step
//! they were born in (their context and step tag):
//!
//! | born in | still alive in the step it was born in | alive in a later step |
//! |---|---|---|
//! | forward | activation (a tensor saved for backward, or the step's output) | other |
//! | backward, optimizer | temporary | other |
//! | no phase, other | other | other |
//!
//! With no step known (no boundary yet, or untagged), the first column
//! applies. A block that outlives its step and no list names is neither an
//! activation nor a temporary: a cache of the job's, or a leak ("other").
//!
//! Matching rules:
//! - a list entry names the allocated block that contains all its bytes
//!   and was allocated before the list was written (a block born later at
//!   a freed tensor's address is a new tensor); except gradients: the
//!   optimizer's `zero_grad` frees them and the next backward makes them
//!   again in the same places, so a gradient entry also names a block born
//!   in backward after the list that was allocated for exactly it (its
//!   address, its bytes requested);
//! - several entries in one block (views into one buffer: FSDP2's
//!   all-gather output, DDP's buckets): the role with the most bytes, and
//!   the module path the entries' paths share;
//! - an entry is weighed against one block only: the allocated block that
//!   starts nearest below it (or at it). The allocator's blocks never
//!   overlap, so that is the only one that can contain it; blocks that do
//!   (a hostile producer's orphans) cannot make an entry count for many.
//!
//! Cost: a view matches every block at once, in one pass over each
//! device's blocks and entries together ([`RoleTable::match_blocks`]): the
//! blocks plus the entries, never their product (issue 44: 65,536
//! overlapping orphans and 65,536 entries inside all of them made one
//! view walk 2^32 entries).
//!
//! Memory: the current list and the one being received, each at most
//! [`Bounds::roles`] entries of 24 bytes.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::config::Bounds;
use super::device::Block;
use super::origin::PhaseKey;
use vramscope_wire::event::{BlockState, EventKind, Held};

/// What a live block is to PyTorch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Parameter,
    Buffer,
    Gradient,
    OptimizerState,
    Activation,
    Temporary,
    Other,
}

impl Role {
    pub const ALL: [Role; 7] = [
        Role::Parameter,
        Role::Buffer,
        Role::Gradient,
        Role::OptimizerState,
        Role::Activation,
        Role::Temporary,
        Role::Other,
    ];

    /// The role of a block nothing else says anything about.
    pub(crate) fn other() -> Role {
        Role::Other
    }

    /// Whether the role comes from a role list (exact) rather than from
    /// the lifetime rule (for tests).
    #[cfg(test)]
    pub(crate) fn exact(self) -> bool {
        matches!(
            self,
            Role::Parameter | Role::Buffer | Role::Gradient | Role::OptimizerState
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Parameter => "parameter",
            Role::Buffer => "buffer",
            Role::Gradient => "gradient",
            Role::OptimizerState => "optimizer_state",
            Role::Activation => "activation",
            Role::Temporary => "temporary",
            Role::Other => "other",
        }
    }

    /// The role as tables show it (at most 11 characters).
    pub fn label(self) -> &'static str {
        match self {
            Role::OptimizerState => "optim state",
            r => r.name(),
        }
    }

    fn of_held(h: Held) -> Role {
        match h {
            Held::Parameter => Role::Parameter,
            Held::Buffer => Role::Buffer,
            Held::Gradient => Role::Gradient,
            Held::OptimizerState => Role::OptimizerState,
            Held::Other(_) => Role::Other,
        }
    }

    /// The role by the lifetime rule (module doc) of a block born in
    /// `phase` at step `born` while the current step is `now`.
    pub(crate) fn by_lifetime(phase: PhaseKey, born: Option<u64>, now: Option<u64>) -> Role {
        let same_step = match (born, now) {
            (Some(b), Some(n)) => b >= n,
            _ => true,
        };
        match phase {
            _ if !same_step => Role::Other,
            PhaseKey::Forward => Role::Activation,
            PhaseKey::Backward | PhaseKey::Optimizer => Role::Temporary,
            PhaseKey::Other | PhaseKey::Unknown => Role::Other,
        }
    }
}

/// One tensor of a role list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    device: u16,
    held: Held,
    /// Module path string id (0: none).
    module: u32,
    addr: u64,
    bytes: u64,
}

impl Entry {
    fn end(&self) -> u64 {
        self.addr.saturating_add(self.bytes)
    }
}

/// What the role lists say about one block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Match {
    pub(crate) role: Role,
    /// The module path string ids of the entries of that role (sorted,
    /// distinct; empty when none was given).
    pub(crate) modules: Vec<u32>,
    /// The path those modules share, once named
    /// ([`RoleMatches::name_holders`]).
    pub(crate) held_by: Option<Arc<str>>,
}

/// The role lists a process sent, the newest complete one in use.
#[derive(Debug, Clone, Default)]
pub(crate) struct RoleTable {
    /// The list in use, sorted by (device, address).
    current: Vec<Entry>,
    /// When the list in use was written (producer clock).
    current_ns: u64,
    /// The list being received: (number, time, entries).
    open: Option<(u32, u64, Vec<Entry>)>,
    /// Complete lists received.
    lists: u64,
    /// Lists given up (no ROLES_END before the next ROLES).
    abandoned: u64,
    /// Lists whose ROLE records fell short of their ROLES_END count.
    short: u64,
    /// Entries beyond [`Bounds::roles`], not kept.
    dropped: u64,
}

/// How the role lists stand, for views.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RoleLists {
    /// Complete lists received.
    pub lists: u64,
    /// Tensors in the list in use.
    pub tensors: u64,
    /// When the list in use was written (producer clock, ns).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) at_ns: Option<u64>,
    /// Lists given up or short of records, and entries over the bound.
    pub(crate) abandoned: u64,
    pub(crate) short: u64,
    pub(crate) dropped: u64,
}

impl RoleTable {
    /// Apply a ROLES, ROLE or ROLES_END event written at `time_ns`;
    /// other events are ignored.
    pub(crate) fn apply(&mut self, b: &Bounds, time_ns: u64, kind: &EventKind) {
        match *kind {
            EventKind::Roles { list, .. } => {
                if self.open.is_some() {
                    self.abandoned += 1;
                }
                self.open = Some((list, time_ns, Vec::new()));
            }
            EventKind::Role {
                list,
                device,
                addr,
                bytes,
                held,
                module,
            } => {
                let Some((open, _, entries)) = &mut self.open else {
                    return;
                };
                if *open != list || bytes == 0 {
                    return;
                }
                if entries.len() >= b.roles {
                    self.dropped = self.dropped.saturating_add(1);
                    return;
                }
                entries.push(Entry {
                    device,
                    held,
                    module,
                    addr,
                    bytes,
                });
            }
            EventKind::RolesEnd { list, count } => {
                let Some((open, at, mut entries)) = self.open.take() else {
                    return;
                };
                if open != list {
                    self.open = Some((open, at, entries));
                    return;
                }
                if (entries.len() as u64) < count {
                    self.short += 1;
                }
                entries.sort_unstable_by_key(|e| (e.device, e.addr, e.bytes));
                entries.dedup();
                self.current = entries;
                self.current_ns = at;
                self.lists += 1;
            }
            _ => {}
        }
    }

    pub(crate) fn status(&self) -> RoleLists {
        RoleLists {
            lists: self.lists,
            tensors: self.current.len() as u64,
            at_ns: (self.lists > 0).then_some(self.current_ns),
            abandoned: self.abandoned,
            short: self.short,
            dropped: self.dropped,
        }
    }

    /// Heap bytes held.
    pub(crate) fn memory_bytes(&self) -> usize {
        let open = self.open.as_ref().map_or(0, |(_, _, e)| e.capacity());
        (self.current.capacity() + open) * std::mem::size_of::<Entry>()
    }

    /// What the lists say about the allocated blocks of `device`, given
    /// in address order (`phase` tells each one's phase, asked only of a
    /// block an entry falls in): each match goes to `out`.
    ///
    /// One pass over the blocks and the device's entries together: an
    /// entry is weighed against one block only, the allocated block that
    /// starts nearest below it (or at it). The allocator's blocks never
    /// overlap, so no other could contain it; blocks that do overlap (a
    /// hostile producer's orphans) cannot make one entry count for many,
    /// nor a view walk the entries once per block.
    pub(crate) fn match_blocks<'a>(
        &self,
        device: u16,
        blocks: impl Iterator<Item = (u64, &'a Block)>,
        phase: impl Fn(&Block) -> PhaseKey,
        out: &mut RoleMatches,
    ) {
        if self.current.is_empty() {
            return;
        }
        let from = self.current.partition_point(|e| e.device < device);
        let to = self.current.partition_point(|e| e.device <= device);
        let entries = &self.current[from..to];
        if entries.is_empty() {
            return;
        }
        let mut next = 0usize;
        let mut blocks = blocks
            .filter(|(_, b)| b.state == BlockState::Allocated)
            .peekable();
        while let Some((addr, block)) = blocks.next() {
            out.steps += 1;
            // This block's entries: from its start to the next one's.
            while next < entries.len() && entries[next].addr < addr {
                next += 1;
                out.steps += 1;
            }
            let stop = blocks.peek().map_or(u64::MAX, |(a, _)| *a);
            let first = next;
            while next < entries.len() && entries[next].addr < stop {
                next += 1;
                out.steps += 1;
            }
            if next == first {
                continue;
            }
            if let Some(m) = self.tally(&entries[first..next], addr, block, phase(block)) {
                out.by_block.insert((device, addr), m);
            }
            if next == entries.len() {
                break;
            }
        }
    }

    /// What `entries` (all starting in the block at `addr`, sorted) say
    /// about that block, born in `phase` (None: none names it).
    fn tally(&self, entries: &[Entry], addr: u64, block: &Block, phase: PhaseKey) -> Option<Match> {
        let end = addr.saturating_add(block.size);
        let born_before = block.since_ns <= self.current_ns;
        let reborn_gradient = phase == PhaseKey::Backward;
        let mut best: [u64; 7] = [0; 7];
        let mut modules: Vec<(Role, u32)> = Vec::new();
        for e in entries.iter().take_while(|e| e.addr < end) {
            if e.end() > end {
                continue;
            }
            // Made again in its place: an allocation of exactly the
            // gradient, at its address.
            let again = reborn_gradient
                && e.held == Held::Gradient
                && e.addr == addr
                && e.bytes == block.requested;
            let fits = born_before || again;
            if !fits {
                continue;
            }
            let role = Role::of_held(e.held);
            let i = Role::ALL.iter().position(|r| *r == role).unwrap_or(6);
            best[i] = best[i].saturating_add(e.bytes);
            if e.module != 0 {
                modules.push((role, e.module));
            }
        }
        let (i, bytes) = best
            .iter()
            .enumerate()
            .max_by_key(|(i, b)| (**b, std::cmp::Reverse(*i)))?;
        if *bytes == 0 {
            return None;
        }
        let role = Role::ALL[i];
        let mut modules: Vec<u32> = modules
            .into_iter()
            .filter(|(r, _)| *r == role)
            .map(|(_, m)| m)
            .collect();
        modules.sort_unstable();
        modules.dedup();
        Some(Match {
            role,
            modules,
            held_by: None,
        })
    }

    #[cfg(test)]
    /// What the lists say about the allocated block at `addr` on `device`
    /// born in `phase`, the only block there is (None: no entry names it).
    pub(crate) fn lookup(
        &self,
        device: u16,
        addr: u64,
        block: &Block,
        phase: PhaseKey,
    ) -> Option<Match> {
        let mut out = RoleMatches::default();
        self.match_blocks(device, std::iter::once((addr, block)), |_| phase, &mut out);
        out.by_block.remove(&(device, addr))
    }
}

/// What the role lists say about the allocated blocks of a process, found
/// once for a view ([`RoleTable::match_blocks`]), by (device, address).
#[derive(Debug, Default)]
pub(crate) struct RoleMatches {
    by_block: HashMap<(u16, u64), Match>,
    /// Blocks and entries stepped over: at most the blocks plus the
    /// entries of each device.
    pub(crate) steps: u64,
}

impl RoleMatches {
    /// Names the module holding each matched block: `path` of its
    /// entries' module ids, once per distinct set (a view's blocks share
    /// one text each, however many name it).
    pub(crate) fn name_holders(&mut self, path: impl Fn(&[u32]) -> String) {
        let mut memo: HashMap<Vec<u32>, Arc<str>> = HashMap::new();
        for m in self.by_block.values_mut() {
            if m.modules.is_empty() {
                continue;
            }
            let named = match memo.get(&m.modules) {
                Some(s) => s.clone(),
                None => {
                    let s: Arc<str> = Arc::from(path(&m.modules));
                    memo.insert(m.modules.clone(), s.clone());
                    s
                }
            };
            m.held_by = Some(named);
        }
    }

    /// The match of the allocated block at `addr` on `device`.
    pub(crate) fn get(&self, device: u16, addr: u64) -> Option<&Match> {
        if self.by_block.is_empty() {
            return None;
        }
        self.by_block.get(&(device, addr))
    }
}

/// The dotted module path that all `paths` share ("" when they share
/// none): `a.b.c` and `a.b.d` share `a.b`.
pub(crate) fn shared_path<'a>(mut paths: impl Iterator<Item = &'a str>) -> String {
    let Some(first) = paths.next() else {
        return String::new();
    };
    let mut keep: Vec<&str> = first.split('.').collect();
    for p in paths {
        let n = keep
            .iter()
            .zip(p.split('.'))
            .take_while(|(a, b)| *a == b)
            .count();
        keep.truncate(n);
    }
    keep.join(".")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attrib::Origin;
    use vramscope_wire::event::PoolId;

    fn block(size: u64, since_ns: u64) -> Block {
        Block {
            size,
            requested: size,
            stream: 0,
            pool: PoolId(0, 0),
            segment: 0,
            since_ns,
            state: BlockState::Allocated,
            expandable: false,
            origin: Origin::default(),
        }
    }

    fn list(t: &mut RoleTable, b: &Bounds, n: u32, at: u64, entries: &[(u64, u64, Held, u32)]) {
        t.apply(
            b,
            at,
            &EventKind::Roles {
                list: n,
                count: entries.len() as u64,
            },
        );
        for &(addr, bytes, held, module) in entries {
            let role = EventKind::Role {
                list: n,
                device: 0,
                addr,
                bytes,
                held,
                module,
            };
            t.apply(b, at, &role);
        }
        let end = EventKind::RolesEnd {
            list: n,
            count: entries.len() as u64,
        };
        t.apply(b, at, &end);
    }

    proptest::proptest! {
        /// Hostile role records (any list numbers, addresses and sizes up
        /// to the top of the address space, lists never ended, counts that
        /// lie, unknown role codes): no panic, the bound holds, and a
        /// block born after every list is never named by one (unless a
        /// gradient made again, which needs backward).
        #[test]
        fn hostile_role_records(
            records in proptest::collection::vec(
                (0u8..3, 0u32..4, proptest::num::u64::ANY, proptest::num::u64::ANY, 0u8..8, 0u64..100),
                0..300,
            ),
            blocks in proptest::collection::vec((proptest::num::u64::ANY, 1u64..1 << 40, 0u64..2000), 1..20),
        ) {
            let b = Bounds { roles: 64, ..Bounds::default() };
            let mut t = RoleTable::default();
            for (i, (kind, list, addr, bytes, held, count)) in records.into_iter().enumerate() {
                let held = vramscope_wire::ring::codec::held_of(u64::from(held));
                let ev = match kind {
                    0 => EventKind::Roles { list, count },
                    1 => EventKind::Role { list, device: 0, addr, bytes, held, module: list },
                    _ => EventKind::RolesEnd { list, count },
                };
                t.apply(&b, i as u64, &ev);
                proptest::prop_assert!(t.memory_bytes() <= 2 * 64 * 24 + 4096);
            }
            for (addr, size, since) in blocks {
                let _ = t.lookup(0, addr, &block(size, since), PhaseKey::Backward);
                let late = block(size, u64::MAX);
                proptest::prop_assert_eq!(t.lookup(0, addr, &late, PhaseKey::Forward), None);
            }
        }
    }

    /// The rule before item 1 of issue 44, kept as the reference: every
    /// entry inside the block, whatever other block holds it.
    fn every_entry_inside(
        t: &RoleTable,
        addr: u64,
        block: &Block,
        phase: PhaseKey,
    ) -> Option<Match> {
        let end = addr.saturating_add(block.size);
        let from = t
            .current
            .partition_point(|e| (e.device, e.addr) < (0, addr));
        let inside: Vec<Entry> = (t.current[from..].iter())
            .take_while(|e| e.device == 0 && e.addr < end)
            .copied()
            .collect();
        t.tally(&inside, addr, block, phase)
    }

    proptest::proptest! {
        /// Over blocks that do not overlap (the allocator's), one pass
        /// says what asking each block for every entry inside it says.
        #[test]
        fn one_pass_matches_each_block_asked_alone(
            sizes in proptest::collection::vec((1u64..5000, 0u64..3, 0u64..200, proptest::bool::ANY), 1..40),
            entries in proptest::collection::vec((0u64..100_000, 1u64..3000, 0u8..5, 0u32..4), 0..80),
        ) {
            let b = Bounds::default();
            let mut t = RoleTable::default();
            let held = |h: u8| vramscope_wire::ring::codec::held_of(u64::from(h));
            let list_entries: Vec<(u64, u64, Held, u32)> =
                entries.iter().map(|&(a, n, h, m)| (a, n, held(h), m)).collect();
            list(&mut t, &b, 1, 100, &list_entries);
            let mut at = 0u64;
            let mut blocks = Vec::new();
            for (size, gap, since, allocated) in sizes {
                at += gap * 512;
                let mut bl = block(size, since);
                if !allocated {
                    bl.state = BlockState::Inactive;
                }
                blocks.push((at, bl));
                at += size;
            }
            let mut out = RoleMatches::default();
            let phase = |bl: &Block| if bl.since_ns % 2 == 0 { PhaseKey::Backward } else { PhaseKey::Forward };
            t.match_blocks(0, blocks.iter().map(|(a, bl)| (*a, bl)), phase, &mut out);
            for (a, bl) in &blocks {
                let want = if bl.state == BlockState::Allocated {
                    every_entry_inside(&t, *a, bl, phase(bl))
                } else {
                    None
                };
                proptest::prop_assert_eq!(out.get(0, *a).cloned(), want);
            }
            proptest::prop_assert!(out.steps <= (blocks.len() + t.current.len()) as u64);
        }
    }

    /// Item 1 of issue 44: blocks that all overlap (a hostile producer's
    /// orphans) and entries above all of them: each entry is weighed
    /// against one block, and the pass steps over each block and each
    /// entry once (it walked every entry inside each block: n² steps).
    #[test]
    fn item1_one_pass_over_overlapping_blocks_is_linear() {
        const N: u64 = 4096;
        let b = Bounds::default();
        let mut t = RoleTable::default();
        let entries: Vec<_> = (0..N)
            .map(|i| (0x1000 * N + i, 1, Held::Parameter, 0))
            .collect();
        list(&mut t, &b, 1, 100, &entries);
        let blocks: Vec<(u64, Block)> = (0..N).map(|i| (0x1000 * i, block(1 << 50, 0))).collect();
        let mut out = RoleMatches::default();
        let iter = blocks.iter().map(|(a, bl)| (*a, bl));
        t.match_blocks(0, iter, |_| PhaseKey::Forward, &mut out);
        assert!(out.steps <= 2 * N, "{} steps", out.steps);
        assert_eq!(out.by_block.len(), 1);
        let m = out.get(0, 0x1000 * (N - 1)).unwrap();
        assert_eq!(m.role, Role::Parameter);
    }

    #[test]
    fn an_entry_is_24_bytes() {
        // (The model's memory table counts role lists at 24 B a tensor.)
        assert_eq!(std::mem::size_of::<Entry>(), 24);
    }

    #[test]
    fn lifetime_rule() {
        use PhaseKey as P;
        assert_eq!(
            Role::by_lifetime(P::Forward, Some(4), Some(4)),
            Role::Activation
        );
        assert_eq!(Role::by_lifetime(P::Forward, None, None), Role::Activation);
        assert_eq!(
            Role::by_lifetime(P::Backward, Some(4), Some(4)),
            Role::Temporary
        );
        assert_eq!(
            Role::by_lifetime(P::Optimizer, Some(4), Some(4)),
            Role::Temporary
        );
        // Outlived its step: a cache or a leak, not an activation.
        assert_eq!(Role::by_lifetime(P::Forward, Some(3), Some(4)), Role::Other);
        assert_eq!(
            Role::by_lifetime(P::Backward, Some(1), Some(4)),
            Role::Other
        );
        assert_eq!(Role::by_lifetime(P::Unknown, Some(4), Some(4)), Role::Other);
        // Born in the step after the current one (its boundary not read yet).
        assert_eq!(
            Role::by_lifetime(P::Forward, Some(5), Some(4)),
            Role::Activation
        );
    }

    #[test]
    fn exact_match_by_containment_and_birth() {
        let b = Bounds::default();
        let mut t = RoleTable::default();
        list(
            &mut t,
            &b,
            1,
            100,
            &[
                (0x1000, 512, Held::Parameter, 7),
                (0x2000, 256, Held::Gradient, 7),
                (0x3000, 64, Held::OptimizerState, 7),
            ],
        );
        let fwd = PhaseKey::Forward;
        let m = t.lookup(0, 0x1000, &block(512, 50), fwd).unwrap();
        assert_eq!(m.role, Role::Parameter);
        assert_eq!(m.modules, vec![7]);
        // A block born after the list at a parameter's old address is new.
        assert_eq!(t.lookup(0, 0x1000, &block(512, 150), fwd), None);
        // ...but a gradient made again by backward in its place is one.
        let mut again = block(512, 150);
        again.requested = 256;
        let g = t.lookup(0, 0x2000, &again, PhaseKey::Backward);
        assert_eq!(g.unwrap().role, Role::Gradient);
        // A larger allocation of backward over its place is not.
        let g = t.lookup(0, 0x2000, &block(512, 150), PhaseKey::Backward);
        assert_eq!(g, None);
        // A block too small to hold the tensor does not match it.
        assert_eq!(t.lookup(0, 0x3000, &block(32, 50), fwd), None);
        // Another device's block at the same address does not match.
        assert_eq!(t.lookup(1, 0x1000, &block(512, 50), fwd), None);
        assert_eq!(t.status().tensors, 3);
    }

    #[test]
    fn several_tensors_in_one_block() {
        let b = Bounds::default();
        let mut t = RoleTable::default();
        // An FSDP2-style all-gather output: parameters of one unit as views.
        list(
            &mut t,
            &b,
            1,
            100,
            &[
                (0x1000, 300, Held::Parameter, 1),
                (0x1000 + 300, 300, Held::Parameter, 2),
                (0x1000 + 600, 100, Held::Buffer, 3),
            ],
        );
        let m = t.lookup(0, 0x1000, &block(1024, 0), PhaseKey::Forward);
        assert_eq!(
            m,
            Some(Match {
                role: Role::Parameter,
                modules: vec![1, 2],
                held_by: None,
            })
        );
        let paths = ["layers.3.attn.q", "layers.3.attn.k", "layers.3.mlp"];
        assert_eq!(shared_path(paths.into_iter()), "layers.3");
        assert_eq!(shared_path(["a.b"].into_iter()), "a.b");
        assert_eq!(shared_path(["a", "b"].into_iter()), "");
    }

    #[test]
    fn lists_replace_and_are_bounded() {
        let b = Bounds {
            roles: 2,
            ..Bounds::default()
        };
        let mut t = RoleTable::default();
        list(&mut t, &b, 1, 100, &[(0x1000, 8, Held::Parameter, 0)]);
        // A list that never ends is given up; the one in use stays.
        t.apply(&b, 200, &EventKind::Roles { list: 2, count: 1 });
        let stray = EventKind::Role {
            list: 9,
            device: 0,
            addr: 0x5000,
            bytes: 8,
            held: Held::Buffer,
            module: 0,
        };
        t.apply(&b, 200, &stray);
        list(
            &mut t,
            &b,
            3,
            300,
            &[
                (0x2000, 8, Held::Buffer, 0),
                (0x3000, 8, Held::Buffer, 0),
                (0x4000, 8, Held::Buffer, 0),
            ],
        );
        let s = t.status();
        assert_eq!((s.lists, s.tensors, s.abandoned, s.dropped), (2, 2, 1, 1));
        assert_eq!(s.at_ns, Some(300));
        // The newest list replaced the first.
        let fwd = PhaseKey::Forward;
        assert_eq!(t.lookup(0, 0x1000, &block(8, 0), fwd), None);
        assert_eq!(
            t.lookup(0, 0x2000, &block(8, 0), fwd).map(|m| m.role),
            Some(Role::Buffer)
        );
        // A ROLES_END counting more records than came: used, and counted.
        let mut t = RoleTable::default();
        t.apply(&b, 1, &EventKind::Roles { list: 1, count: 5 });
        t.apply(&b, 1, &EventKind::RolesEnd { list: 1, count: 5 });
        assert_eq!((t.status().lists, t.status().short), (1, 1));
    }
}
