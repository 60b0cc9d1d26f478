//! `vramscope export`: a recording written as a PyTorch snapshot pickle,
//! read back by `vramscope open` and by Python's own `pickle` (the checks
//! `torch.cuda.memory._memory_viz.segsum` asserts: blocks tile their
//! segment, allocated bytes add up). On a GPU machine,
//! tests/gpu/snapshot_fixtures.py runs `_memory_viz` itself on an export.
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use vramscope_core::snapfile::{self, write};

fn recording(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings")
        .join(name)
}

fn export(rec: &Path, out: &Path) -> String {
    let o = common::succeeded(
        common::vramscope()
            .arg("export")
            .arg(rec)
            .arg("-o")
            .arg(out)
            .output()
            .expect("runs"),
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The block map of the recording's process at its end, from `replay`.
fn replayed(rec: &Path) -> Value {
    let o = common::succeeded(
        common::vramscope()
            .arg("replay")
            .arg(rec)
            .arg("--json")
            .output()
            .expect("runs"),
    );
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    v["processes"][0]["view"]["devices"][0]["figures"].clone()
}

#[test]
fn an_exported_recording_opens_with_the_recordings_state() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rec = recording("v1.0-demo-leak.vsrec");
    let out = tmp.path().join("demo.pickle");
    let said = export(&rec, &out);
    assert!(said.contains("77 segments, 184 blocks"), "{said}");
    let file = snapfile::read(&out).expect("the export reads");
    let t = file.totals()[0];
    let want = replayed(&rec);
    assert_eq!(t.segments, want["segments"].as_u64().expect("segments"));
    assert_eq!(t.blocks, want["blocks"].as_u64().expect("blocks"));
    assert_eq!(t.reserved, want["reserved"].as_u64().expect("reserved"));
    // Every allocator event of the recording is in the trace, oldest first.
    let trace = &file.traces[0];
    assert_eq!(trace.len(), 1696);
    assert!(trace.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    // Opened, the model rebuilds the state through the trace and ends at
    // the file's own figures.
    let o = common::succeeded(
        common::vramscope()
            .arg("open")
            .arg(&out)
            .arg("--json")
            .output()
            .expect("runs"),
    );
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let m = &v["state"]["processes"][0]["view"]["figures"];
    assert_eq!(m["reserved"].as_u64(), Some(t.reserved));
    assert_eq!(m["allocated"].as_u64(), Some(t.allocated));
}

#[test]
fn python_reads_an_export_as_pytorch_does() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("demo.pickle");
    export(&recording("v1.0-demo-leak.vsrec"), &out);
    // What _memory_viz.segsum asserts, the keys its plots read, and an
    // annotation's keys as torch writes them (`record_function`'s).
    let check = "import pickle,sys\n\
        d=pickle.load(open(sys.argv[1],'rb'))\n\
        assert set(d)>={'segments','device_traces'}\n\
        for s in d['segments']:\n\
        \x20   assert sum(b['size'] for b in s['blocks'])==s['total_size']\n\
        \x20   assert sum(b['size'] for b in s['blocks'] if b['state']=='active_allocated')==s['allocated_size']\n\
        \x20   assert s['segment_type'] in ('small','large') and len(s['segment_pool_id'])==2\n\
        for e in d['device_traces'][0]:\n\
        \x20   assert e['action'] in ('alloc','free_requested','free_completed','segment_alloc','segment_free','segment_map','segment_unmap','oom')\n\
        \x20   assert isinstance(e['frames'], list)\n\
        \x20   assert e['user_metadata']=='' and e['compile_context']=='N/A', e\n\
        for a in d['external_annotations']:\n\
        \x20   assert a['stage']=='START' and isinstance(a['name'],str) and a['vramscope']=='mark', a\n\
        \x20   assert isinstance(a['device'],int) and isinstance(a['time_us'],int), a\n\
        print(len(d['segments']), len(d['device_traces'][0]), len(d['external_annotations']))";
    let o = match Command::new("python3")
        .args(["-c", check])
        .arg(&out)
        .output()
    {
        Ok(o) => o,
        Err(_) => {
            println!("SKIPPED: python reading an export (no python3)");
            return;
        }
    };
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // 77 segments, 1696 trace events, and the 6 step boundaries of the
    // run as annotations (what `open` reads back as markers).
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "77 1696 6");
}

#[test]
fn a_snapshot_written_and_read_back_is_the_same() {
    for name in [
        "releases/torch-2.11-all",
        "releases/torch-2.1-streams",
        "releases/torch-2.11-expandable",
        "newer/metadata",
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/snapshots")
            .join(format!("{name}.pickle"));
        let file = snapfile::read(&path).expect("reads");
        let mut out = Vec::new();
        write::write(&file, &mut out).expect("writes");
        let again = snapfile::read_slice(&out).expect("reads back");
        assert_eq!(again.segments, file.segments, "{name}");
        assert_eq!(again.traces, file.traces, "{name}");
        assert_eq!(again.stacks, file.stacks, "{name}");
        assert_eq!(again.frames, file.frames, "{name}");
        assert_eq!(again.annotations, file.annotations, "{name}");
    }
}

#[test]
fn exporting_a_missing_process_names_the_ones_there() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let o = common::vramscope()
        .arg("export")
        .arg(recording("v1.0-demo-leak.vsrec"))
        .arg("-o")
        .arg(tmp.path().join("x.pickle"))
        .args(["--pid", "1"])
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no process 1 in this recording; it holds events of 9032"),
        "{err}"
    );
}

/// A real job (a small transformer trained for 4 s with AdamW on an H100,
/// torch 2.11) recorded with `vramscope record` while it ran under
/// `vramscope run`: its export holds exactly the segments, blocks, reserved
/// and allocated bytes torch reported at the job's end
/// (tests/gpu/snapshot_fixtures.py `job`; `_memory_viz` read the same export
/// there: tests/gpu/RESULTS.md).
#[test]
fn a_real_jobs_export_has_the_figures_torch_reported() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshots/torch-2.11-job");
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("job_stats.json")).expect("stats"))
            .expect("JSON");
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("job.pickle");
    export(&dir.join("job.vsrec"), &out);
    let t = snapfile::read(&out).expect("reads").totals()[0];
    assert_eq!(Some(t.segments), want["segments"].as_u64());
    assert_eq!(Some(t.blocks), want["blocks"].as_u64());
    assert_eq!(Some(t.reserved), want["reserved"].as_u64());
    assert_eq!(Some(t.allocated), want["allocated"].as_u64());
}

/// A job recorded through the real ring with attribution (a module with a
/// captured stack, one without, a step marker), exported: each block and
/// each event carries the frames of its context, the module frame last,
/// every distinct frame written once (the memo), as `open` and Python's
/// `pickle` read them.
#[test]
fn an_export_carries_each_blocks_module_and_stack_as_frames() {
    use std::time::Duration;
    use vramscope_wire::event::{CtxTag, EventKind, MarkSource, Phase, Place};
    use vramscope_wire::ring::{Producer, SegmentConfig, SegmentWriter};

    let dir = tempfile::tempdir().expect("tempdir");
    let (rec, shm) = (dir.path().join("job.vsrec"), dir.path().join("shm"));
    std::fs::create_dir(&shm).expect("shm dir");
    let seg = SegmentWriter::create(&SegmentConfig::new(&shm, Producer::TorchExact, 1, 4096))
        .expect("segment");
    let mut child = common::vramscope()
        .args(["record", "--no-nvml", "--duration", "3", "-o"])
        .arg(&rec)
        .arg("--shm-dir")
        .arg(&shm)
        .spawn()
        .expect("record");
    std::thread::sleep(Duration::from_millis(600));
    // The agent ring: names, a frame and its stack, two contexts, step 3.
    let strings = [
        (1, "transformer.h.3.attn"),
        (2, "/src/model.py"),
        (3, "attn"),
        (4, "lm_head"),
    ];
    for (id, text) in strings {
        for chunk in EventKind::string_chunks(id, text) {
            common::write(&seg, 0, chunk);
        }
    }
    let defs = [
        EventKind::Frame {
            id: 1,
            file: 2,
            function: 3,
            line: 42,
        },
        EventKind::Stack {
            id: 1,
            frame: 1,
            parent: 0,
        },
        EventKind::Context {
            id: 1,
            module: 1,
            phase: Phase::Forward,
            stack: 1,
            step: None,
        },
        EventKind::Context {
            id: 2,
            module: 4,
            phase: Phase::Backward,
            stack: 0,
            step: None,
        },
        EventKind::Marker {
            value: 3,
            source: MarkSource::User,
        },
    ];
    for d in defs {
        common::write(&seg, 0, d);
    }
    std::thread::sleep(Duration::from_millis(50));
    // Device 0: a 20 MiB segment, a 3 MiB tensor in context 1 and a 5 MiB
    // one in context 2, both in step 3.
    let base = 0x7f00_0000_0000u64;
    let tagged = |context| Place {
        ctx: CtxTag {
            context,
            step_tag: CtxTag::step_tag_of(3),
        },
        ..Place::default()
    };
    let events = [
        EventKind::SegmentAlloc {
            place: Place::default(),
            addr: base,
            size: 20 << 20,
        },
        EventKind::Alloc {
            place: tagged(1),
            addr: base,
            size: 3 << 20,
        },
        EventKind::Alloc {
            place: tagged(2),
            addr: base + (3 << 20),
            size: 5 << 20,
        },
    ];
    for e in events {
        common::write(&seg, 1, e);
    }
    // A role list (FORMAT 1.2): the lm_head block is its weight.
    std::thread::sleep(Duration::from_millis(20));
    let roles = [
        EventKind::Roles { list: 1, count: 1 },
        EventKind::Role {
            list: 1,
            device: 0,
            addr: base + (3 << 20),
            bytes: 5 << 20,
            held: vramscope_wire::event::Held::Parameter,
            module: 4,
        },
        EventKind::RolesEnd { list: 1, count: 1 },
    ];
    for r in roles {
        common::write(&seg, 0, r);
    }
    assert!(child.wait().expect("record ends").success());

    let out = dir.path().join("job.pickle");
    let said = export(&rec, &out);
    assert!(said.contains("5 frames"), "{said}");
    // Read back by `open`, the reader of every torch file.
    let file = snapfile::read(&out).expect("the export reads");
    let blocks: Vec<_> = file.segments.iter().flat_map(|s| &s.blocks).collect();
    let frames_of = |addr: u64| -> Vec<String> {
        let b = blocks.iter().find(|b| b.address == addr).expect("block");
        file.stack_frames(b.stack.expect("a stack"))
            .map(|f| format!("{}:{}:{}", f.filename, f.line, f.name))
            .collect()
    };
    // Each live block's last frame names its role: an activation (alive
    // in the step it was made in, made in forward), and the parameter the
    // role list names.
    assert_eq!(
        frames_of(base),
        [
            "/src/model.py:42:attn",
            "transformer.h.3.attn:3:forward",
            "transformer.h.3.attn:0:role:activation"
        ]
    );
    assert_eq!(
        frames_of(base + (3 << 20)),
        ["lm_head:3:backward", "lm_head:0:role:parameter"]
    );
    // The free block has none; the alloc events have their block's stack.
    assert!(blocks.iter().any(|b| b.stack.is_none()));
    let allocs: Vec<_> = (file.traces.iter().flatten())
        .filter(|e| e.action == snapfile::Action::Alloc)
        .collect();
    assert_eq!(allocs.len(), 2);
    let block0 = blocks.iter().find(|b| b.address == base).expect("block");
    let frames = |s: Option<u32>| file.stacks.get(s.expect("a stack")).unwrap().to_vec();
    let (alloc_frames, block_frames) = (frames(allocs[0].stack), frames(block0.stack));
    assert_eq!(
        alloc_frames,
        block_frames[..block_frames.len() - 1],
        "the block's frames are the allocation's, and its role"
    );
    // `open --json --trace` lists the frames once each.
    let o = common::succeeded(
        common::vramscope()
            .args(["open", "--json", "--trace"])
            .arg(&out)
            .output()
            .expect("runs"),
    );
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let names: Vec<&str> = v["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|f| f["filename"].as_str().expect("filename"))
        .collect();
    assert_eq!(names.len(), 5, "{names:?}");
    assert!(names.contains(&"transformer.h.3.attn"), "{names:?}");
    // Python's own pickle: the block's frames name its module, and the
    // alloc event's frames are the very same objects (memo references).
    let code = r#"
import pickle, sys
s = pickle.load(open(sys.argv[1], 'rb'))
blocks = [b for seg in s['segments'] for b in seg['blocks']]
b = next(b for b in blocks if b['address'] == int(sys.argv[2]))
assert [f['filename'] for f in b['frames']] == ['/src/model.py', 'transformer.h.3.attn', 'transformer.h.3.attn'], b
assert (b['frames'][1]['name'], b['frames'][1]['line']) == ('forward', 3)
assert b['frames'][-1]['name'] == 'role:activation', b
a = next(e for e in s['device_traces'][0] if e['action'] == 'alloc' and e['addr'] == b['address'])
assert a['frames'][0] is b['frames'][0] and a['frames'][1] is b['frames'][1]
print('ok')
"#;
    match Command::new("python3")
        .args(["-c", code])
        .arg(&out)
        .arg(base.to_string())
        .output()
    {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(
                o.status.success() && text.contains("ok"),
                "{text}{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Err(_) => println!("SKIPPED: Python's pickle check (no python3)"),
    }
}
