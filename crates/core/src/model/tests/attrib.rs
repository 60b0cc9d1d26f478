//! Attribution: tagged events and definitions give live bytes by module and
//! phase, each block's origin, and the step diff.

use super::*;
use crate::model::attrib::PhaseKey;
use crate::model::stepdiff::step_diff;
use crate::model::ViewOptions;
use vramscope_wire::event::{CtxTag, MarkSource, Phase};

fn string(ev: &mut Ev, id: u32, text: &str) -> Vec<Event> {
    (EventKind::string_chunks(id, text).into_iter())
        .map(|k| ev.at(k))
        .collect()
}

fn context(ev: &mut Ev, id: u32, module: u32, phase: Phase) -> Event {
    ev.at(EventKind::Context {
        id,
        module,
        phase,
        stack: 0,
        step: None,
    })
}

fn marker(ev: &mut Ev, value: u64) -> Event {
    ev.at(EventKind::Marker {
        value,
        source: MarkSource::User,
    })
}

/// Allocation of `size` at `addr` in context `ctx` during step `step`.
fn alloc_in(ev: &mut Ev, ctx: u32, step: u64, addr: u64, size: u64) -> Event {
    ev.place.ctx = CtxTag {
        context: ctx,
        step_tag: CtxTag::step_tag_of(step),
    };
    let e = ev.alloc(addr, size);
    ev.place.ctx = CtxTag::NONE;
    e
}

fn all() -> ViewOptions {
    ViewOptions {
        block_map: true,
        ..ViewOptions::default()
    }
}

#[test]
fn live_bytes_by_module_and_phase_add_up_to_allocated() {
    let mut m = model();
    let mut ev = Ev::new();
    let mut evs = vec![ev.seg_alloc(BASE, 64 * MIB)];
    evs.extend(string(&mut ev, 1, "transformer.h.0.attn"));
    evs.extend(string(
        &mut ev,
        2,
        "transformer.h.1.mlp.c_fc.a.very.long.path",
    ));
    evs.push(context(&mut ev, 1, 1, Phase::Forward));
    evs.push(context(&mut ev, 2, 2, Phase::Backward));
    evs.push(context(&mut ev, 3, 0, Phase::Optimizer));
    evs.push(marker(&mut ev, 300)); // past 255: tags wrap
    evs.push(alloc_in(&mut ev, 1, 300, BASE, 4 * MIB));
    evs.push(alloc_in(&mut ev, 1, 300, BASE + 4 * MIB, 4 * MIB));
    evs.push(marker(&mut ev, 301));
    evs.push(alloc_in(&mut ev, 2, 301, BASE + 8 * MIB, 8 * MIB));
    evs.push(alloc_in(&mut ev, 3, 301, BASE + 16 * MIB, 2 * MIB));
    evs.push(alloc_in(&mut ev, 9, 301, BASE + 18 * MIB, 2 * MIB)); // undefined
    evs.push(ev.alloc(BASE + 20 * MIB, 2 * MIB)); // untagged
                                                  // A freed block leaves the attribution.
    evs.push(alloc_in(&mut ev, 2, 301, BASE + 22 * MIB, 2 * MIB));
    evs.push(ev.free_req(BASE + 22 * MIB, 2 * MIB));
    evs.push(ev.free_done(BASE + 22 * MIB, 2 * MIB));
    feed(&mut m, &evs);
    let v = m.view(0, &all()).processes.remove(0);
    let a = &v.attribution;
    assert_eq!(a.step, Some(301));
    let rows: Vec<(&str, u64, u64)> = (a.by_module.iter())
        .map(|r| (r.module.as_str(), r.bytes, r.blocks))
        .collect();
    assert_eq!(
        rows,
        vec![
            ("transformer.h.0.attn", 8 * MIB, 2),
            ("transformer.h.1.mlp.c_fc.a.very.long.path", 8 * MIB, 1),
            ("", 4 * MIB, 2),
            ("context #9", 2 * MIB, 1),
        ]
    );
    let phases: Vec<(PhaseKey, u64)> = a.by_phase.iter().map(|p| (p.phase, p.bytes)).collect();
    assert_eq!(
        phases,
        vec![
            (PhaseKey::Forward, 8 * MIB),
            (PhaseKey::Backward, 8 * MIB),
            (PhaseKey::Optimizer, 2 * MIB),
            (PhaseKey::Unknown, 4 * MIB),
        ]
    );
    let sum: u64 = a.by_module.iter().map(|r| r.bytes).sum();
    assert_eq!(sum, v.figures.allocated);
    assert_eq!(sum, a.by_phase.iter().map(|p| p.bytes).sum::<u64>());
    // Each block knows its context and step born.
    let blocks: Vec<_> = v.devices[0].segments[0].blocks.iter().collect();
    assert_eq!(blocks[0].block.origin.context, 1);
    assert_eq!(blocks[0].block.origin.step, Some(300));
    assert_eq!(blocks[2].block.origin.step, Some(301));
    assert_eq!(a.context(2).unwrap().phase, PhaseKey::Backward);
    // The step diff: born in 300, alive in 301.
    let d = step_diff(&v, 300);
    assert_eq!(
        (d.born, d.at, d.bytes, d.blocks),
        (300, Some(301), 8 * MIB, 2)
    );
    assert_eq!(d.rows.len(), 1);
    assert_eq!(d.rows[0].module, "transformer.h.0.attn");
    assert_eq!(d.rows[0].size, 4 * MIB);
    assert_eq!(step_diff(&v, 301).bytes, 12 * MIB);
    assert_eq!(step_diff(&v, 299).rows, vec![]);
}

#[test]
fn a_snapshot_carries_the_tags_of_live_blocks() {
    let mut m = model();
    let mut ev = Ev::new();
    let mut evs = string(&mut ev, 1, "model.layers.3");
    evs.push(context(&mut ev, 4, 1, Phase::Forward));
    evs.push(marker(&mut ev, 7));
    let tag = |step| CtxTag {
        context: 4,
        step_tag: CtxTag::step_tag_of(step),
    };
    evs.push(ev.at(EventKind::SnapshotBegin {
        device: 0,
        id: 1,
        segments: 1,
        blocks: 3,
        at: None,
    }));
    evs.push(ev.at(EventKind::SnapshotSegment {
        id: 1,
        place: place(0, 0),
        addr: BASE,
        size: 4 * MIB,
        pool_kind: SegmentPool::Large,
        expandable: false,
    }));
    for (i, (state, ctx)) in [
        (BlockState::Allocated, tag(6)),
        (BlockState::Allocated, CtxTag::NONE),
        (BlockState::Inactive, tag(7)),
    ]
    .into_iter()
    .enumerate()
    {
        evs.push(ev.at(EventKind::SnapshotBlock {
            id: 1,
            device: 0,
            addr: BASE + i as u64 * MIB,
            size: MIB,
            requested: MIB,
            state,
            ctx,
        }));
    }
    evs.push(ev.at(EventKind::SnapshotEnd { device: 0, id: 1 }));
    feed(&mut m, &evs);
    let v = m.view(0, &all()).processes.remove(0);
    let b = &v.devices[0].segments[0].blocks;
    assert_eq!(b[0].block.origin.context, 4);
    assert_eq!(b[0].block.origin.step, Some(6));
    assert!(b[1].block.origin.is_none());
    assert!(b.iter().skip(2).all(|b| b.block.origin.is_none()));
    let mods: Vec<(&str, u64)> = (v.attribution.by_module.iter())
        .map(|r| (r.module.as_str(), r.bytes))
        .collect();
    // Equal bytes: by name.
    assert_eq!(mods, vec![("", MIB), ("model.layers.3", MIB)]);
    // JSON carries it; an untagged block's JSON is as before.
    let json = serde_json::to_value(&v).unwrap();
    assert_eq!(
        json["attribution"]["by_module"][1]["module"],
        "model.layers.3"
    );
    // Outside every module: null, never "" (issue 26, item 4); read back.
    let none = &json["attribution"]["by_module"][0];
    assert!(none["module"].is_null(), "{none}");
    let back: crate::model::ProcessView = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(back.attribution.by_module[0].module, "");
    let blocks = &json["devices"][0]["segments"][0]["blocks"];
    assert_eq!(blocks[0]["origin"]["step"], 6);
    assert!(blocks[1].get("origin").is_none());
}

/// The same module entered from two call sites (stacks captured) is two
/// rows of the step diff, each naming its location; the block's context
/// gives its module, phase and stack.
#[test]
fn step_diff_groups_by_code_location() {
    let mut m = model();
    let mut ev = Ev::new();
    let mut evs = vec![ev.seg_alloc(BASE, 64 * MIB)];
    evs.extend(string(&mut ev, 1, "model.head"));
    evs.extend(string(&mut ev, 2, "train.py"));
    evs.extend(string(&mut ev, 3, "training_step"));
    evs.extend(string(&mut ev, 4, "validate"));
    for (id, function, line) in [(1, 3, 57), (2, 4, 88)] {
        evs.push(ev.at(EventKind::Frame {
            id,
            file: 2,
            function,
            line,
        }));
        evs.push(ev.at(EventKind::Stack {
            id,
            frame: id,
            parent: 0,
        }));
        evs.push(ev.at(EventKind::Context {
            id,
            module: 1,
            phase: Phase::Forward,
            stack: id,
            step: None,
        }));
    }
    evs.push(marker(&mut ev, 4));
    evs.push(alloc_in(&mut ev, 1, 4, BASE, 2 * MIB));
    evs.push(alloc_in(&mut ev, 2, 4, BASE + 2 * MIB, 2 * MIB));
    evs.push(alloc_in(&mut ev, 2, 4, BASE + 4 * MIB, 2 * MIB));
    evs.push(marker(&mut ev, 5));
    feed(&mut m, &evs);
    let v = m.view(0, &all()).processes.remove(0);
    let d = step_diff(&v, 4);
    let rows: Vec<(&str, u64, Vec<String>)> = (d.rows.iter())
        .map(|r| (r.module.as_str(), r.blocks, r.stack.clone()))
        .collect();
    assert_eq!(
        rows,
        vec![
            ("model.head", 2, vec!["train.py:88 validate".to_string()]),
            (
                "model.head",
                1,
                vec!["train.py:57 training_step".to_string()]
            ),
        ]
    );
    let a = &v.attribution;
    assert_eq!(a.location_of(2), Some("train.py:88 validate"));
    assert_eq!(a.module_of(2), "model.head");
    assert_eq!(a.phase_of(2), PhaseKey::Forward);
    assert_eq!(a.module_of(0), "");
}

/// A role list of `(addr, bytes, held, module)` tensors, list number `n`.
fn role_list(
    ev: &mut Ev,
    n: u32,
    tensors: &[(u64, u64, vramscope_wire::event::Held, u32)],
) -> Vec<Event> {
    let count = tensors.len() as u64;
    let mut out = vec![ev.at(EventKind::Roles { list: n, count })];
    for &(addr, bytes, held, module) in tensors {
        out.push(ev.at(EventKind::Role {
            list: n,
            device: 0,
            addr,
            bytes,
            held,
            module,
        }));
    }
    out.push(ev.at(EventKind::RolesEnd { list: n, count }));
    out
}

#[test]
fn roles_exact_from_lists_and_by_lifetime_for_the_rest() {
    use crate::model::roles::Role;
    use vramscope_wire::event::Held;
    let mut m = model();
    let mut ev = Ev::new();
    let mut evs = vec![ev.seg_alloc(BASE, 64 * MIB)];
    evs.extend(string(&mut ev, 1, "encoder.layer.0.attn"));
    evs.extend(string(&mut ev, 2, "encoder.layer.0.mlp"));
    evs.extend(string(&mut ev, 3, "encoder.layer.1"));
    evs.push(context(&mut ev, 1, 3, Phase::Forward));
    evs.push(context(&mut ev, 2, 3, Phase::Backward));
    evs.push(context(&mut ev, 3, 0, Phase::Optimizer));
    evs.push(marker(&mut ev, 1));
    // Parameters made outside every module (FSDP2's shards are made so),
    // in one buffer of two modules' tensors, and one of its own.
    evs.push(ev.alloc(BASE, 4 * MIB));
    evs.push(ev.alloc(BASE + 4 * MIB, 2 * MIB));
    // A gradient made in backward, optimizer state, a leak born in step 1.
    evs.push(alloc_in(&mut ev, 2, 1, BASE + 6 * MIB, 2 * MIB));
    evs.push(alloc_in(&mut ev, 3, 1, BASE + 8 * MIB, 2 * MIB));
    evs.push(alloc_in(&mut ev, 1, 1, BASE + 10 * MIB, 2 * MIB));
    evs.extend(role_list(
        &mut ev,
        1,
        &[
            (BASE, 2 * MIB, Held::Parameter, 1),
            (BASE + 2 * MIB, 2 * MIB, Held::Parameter, 2),
            (BASE + 4 * MIB, 2 * MIB, Held::Buffer, 2),
            (BASE + 6 * MIB, 2 * MIB, Held::Gradient, 1),
            (BASE + 8 * MIB, MIB, Held::OptimizerState, 1),
            (BASE + 9 * MIB, MIB, Held::OptimizerState, 2),
        ],
    ));
    evs.push(marker(&mut ev, 2));
    // Step 2: zero_grad frees the gradient; backward makes it again in
    // place. An activation of this step, and a temporary of backward.
    evs.push(ev.free_req(BASE + 6 * MIB, 2 * MIB));
    evs.push(ev.free_done(BASE + 6 * MIB, 2 * MIB));
    evs.push(alloc_in(&mut ev, 1, 2, BASE + 12 * MIB, 2 * MIB));
    evs.push(alloc_in(&mut ev, 2, 2, BASE + 6 * MIB, 2 * MIB));
    evs.push(alloc_in(&mut ev, 2, 2, BASE + 14 * MIB, 2 * MIB));
    // A forward block born after the list at a parameter's old place is
    // not a parameter (the parameter block is still live, so use a freed
    // buffer's place: free the buffer, allocate again).
    evs.push(ev.free_req(BASE + 4 * MIB, 2 * MIB));
    evs.push(ev.free_done(BASE + 4 * MIB, 2 * MIB));
    evs.push(alloc_in(&mut ev, 1, 2, BASE + 4 * MIB, 2 * MIB));
    feed(&mut m, &evs);
    let v = m.view(0, &all()).processes.remove(0);
    let a = &v.attribution;
    let rows: Vec<(&str, Role, u64)> = (a.by_role.iter())
        .map(|r| (r.module.as_str(), r.role, r.bytes))
        .collect();
    assert_eq!(
        rows,
        vec![
            // Two modules' parameters in one block: the path they share.
            ("encoder.layer.0", Role::Parameter, 4 * MIB),
            ("encoder.layer.1", Role::Activation, 4 * MIB),
            // Optimizer state of both modules in one block.
            ("encoder.layer.0", Role::OptimizerState, 2 * MIB),
            ("encoder.layer.0.attn", Role::Gradient, 2 * MIB),
            ("encoder.layer.1", Role::Temporary, 2 * MIB),
            ("encoder.layer.1", Role::Other, 2 * MIB),
        ]
    );
    let totals: Vec<(Role, u64)> = a.roles.iter().map(|r| (r.role, r.bytes)).collect();
    assert_eq!(
        totals,
        vec![
            (Role::Parameter, 4 * MIB),
            (Role::Gradient, 2 * MIB),
            (Role::OptimizerState, 2 * MIB),
            (Role::Activation, 4 * MIB),
            (Role::Temporary, 2 * MIB),
            (Role::Other, 2 * MIB),
        ]
    );
    // By module: the parameters count under the module holding them.
    let sum: u64 = a.by_role.iter().map(|r| r.bytes).sum();
    assert_eq!(sum, v.figures.allocated);
    let layer0 = a.by_module.iter().find(|r| r.module == "encoder.layer.0");
    assert_eq!(layer0.map(|r| (r.bytes, r.blocks)), Some((6 * MIB, 2)));
    assert_eq!((a.role_lists.lists, a.role_lists.tensors), (1, 6));
    // Each block of the block map carries its role and holder.
    let b = &v.devices[0].segments[0].blocks[0];
    assert_eq!(b.role, Some(Role::Parameter));
    assert_eq!(b.held_by.as_deref(), Some("encoder.layer.0"));
    let json = serde_json::to_value(&v).unwrap();
    let block = &json["devices"][0]["segments"][0]["blocks"][0];
    assert_eq!(block["role"], "parameter");
    assert_eq!(json["attribution"]["roles"][0]["role"], "parameter");
}

/// Item 1 (issue 44): 65,536 orphan blocks of 2^50 bytes at 0x1000·i (no
/// segment: each overlaps all those above it) and one role list of 65,536
/// one-byte tensors above all of them. Every count is within its bound;
/// each view walked every entry inside each block (2^32 steps: 92.7 s
/// for one `snapshot`). A view now costs the blocks plus the entries: the
/// guard below only catches a hang, and an entry names one block at most.
#[test]
fn item1_role_lists_cannot_make_views_quadratic() {
    use crate::model::roles::Role;
    use vramscope_wire::event::Held;
    const N: u64 = 1 << 16;
    let mut m = model();
    let mut ev = Ev::new();
    for i in 0..N {
        let e = ev.alloc(0x1000 * i, 1 << 50);
        m.apply(KEY, &e);
    }
    let above = 0x1000 * N;
    let tensors: Vec<_> = (0..N).map(|i| (above + i, 1, Held::Parameter, 0)).collect();
    for e in role_list(&mut ev, 1, &tensors) {
        m.apply(KEY, &e);
    }
    assert_eq!(dev(&m).orphan_count(), N as usize);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(m.view(0, &all()).processes.remove(0));
    });
    let v = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("a view within 30 s (the attack's took 92.7 s in a release build)");
    let a = &v.attribution;
    // Every block counted once; the tensors name one block, the nearest
    // below them, and no other.
    let blocks: u64 = a.roles.iter().map(|r| r.blocks).sum();
    assert_eq!(blocks, N);
    let named: Vec<(Role, u64)> = (a.roles.iter())
        .filter(|r| r.role.exact())
        .map(|r| (r.role, r.blocks))
        .collect();
    assert_eq!(named, vec![(Role::Parameter, 1)]);
    let orphans = &v.devices[0].orphans;
    let roles: Vec<u64> = (orphans.iter())
        .filter(|b| b.role == Some(Role::Parameter))
        .map(|b| b.addr)
        .collect();
    assert_eq!(roles, vec![0x1000 * (N - 1)]);
}
