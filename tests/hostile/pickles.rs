//! Hostile inputs: snapshot pickles (`vramscope open`). Values the pickle's
//! memo shares many times must cost per reference, within the bound of
//! 4 × the file + 64 MiB, whatever reads them (the reading taking values
//! while parsing, the plain reading it falls back to, the JSON report,
//! `--frames`, the dashboard's stepping); and reading and stepping must cost
//! about linear time in the file. Each file is written here opcode by
//! opcode; the real binary reads it while its peak resident set is watched
//! (and the process killed past the bound or a generous time limit).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::common::vramscope;

const MIB: u64 = 1 << 20;

/// A pickle (protocol 4) written opcode by opcode. Dict keys are written
/// once and then taken from the memo, as Python's pickler does.
struct Pickle {
    b: Vec<u8>,
    memo: u32,
    keys: HashMap<&'static str, u32>,
}

impl Pickle {
    fn new() -> Pickle {
        Pickle {
            b: vec![0x80, 4],
            memo: 0,
            keys: HashMap::new(),
        }
    }

    fn op(&mut self, bytes: &[u8]) -> &mut Self {
        self.b.extend_from_slice(bytes);
        self
    }

    /// MEMOIZE: the value on top gets the next memo index, answered.
    fn memoize(&mut self) -> u32 {
        self.b.push(0x94);
        self.memo += 1;
        self.memo - 1
    }

    /// BINGET or LONG_BINGET.
    fn get(&mut self, i: u32) -> &mut Self {
        match u8::try_from(i) {
            Ok(i) => self.op(&[b'h', i]),
            Err(_) => {
                self.b.push(b'j');
                self.op(&i.to_le_bytes())
            }
        }
    }

    /// `n` more references to memo entry `i` (in the APPENDS being written).
    fn again(&mut self, i: u32, n: usize) -> &mut Self {
        for _ in 0..n {
            self.get(i);
        }
        self
    }

    fn str(&mut self, s: &str) -> &mut Self {
        match u8::try_from(s.len()) {
            Ok(n) => self.op(&[0x8c, n]),
            Err(_) => {
                self.b.push(b'X');
                self.op(&(s.len() as u32).to_le_bytes())
            }
        };
        self.op(s.as_bytes())
    }

    fn int(&mut self, v: u64) -> &mut Self {
        if v < 1 << 8 {
            self.op(&[b'K', v as u8])
        } else if v < 1 << 16 {
            self.b.push(b'M');
            self.op(&(v as u16).to_le_bytes())
        } else {
            // LONG1 of 8 bytes (positive below 2^63).
            self.op(&[0x8a, 8]).op(&v.to_le_bytes())
        }
    }

    fn key(&mut self, k: &'static str) -> &mut Self {
        match self.keys.get(k) {
            Some(&i) => self.get(i),
            None => {
                self.str(k);
                let i = self.memoize();
                self.keys.insert(k, i);
                self
            }
        }
    }

    /// EMPTY_DICT, MEMOIZE, MARK: a dict to fill (`end_dict`); its index.
    fn dict(&mut self) -> u32 {
        self.b.push(b'}');
        let i = self.memoize();
        self.b.push(b'(');
        i
    }

    fn end_dict(&mut self) -> &mut Self {
        self.op(b"u")
    }

    /// EMPTY_LIST, MEMOIZE, MARK: a list to fill (`end_list`); its index.
    fn list(&mut self) -> u32 {
        self.b.push(b']');
        let i = self.memoize();
        self.b.push(b'(');
        i
    }

    fn end_list(&mut self) -> &mut Self {
        self.op(b"e")
    }

    fn stop(mut self) -> Vec<u8> {
        self.b.push(b'.');
        self.b
    }
}

/// `{'segments': [], 'device_traces': [[E] * n]}`, E written by `entry`.
fn shared_trace(n: usize, entry: impl FnOnce(&mut Pickle)) -> Vec<u8> {
    let mut p = Pickle::new();
    p.dict();
    p.key("segments").list();
    p.end_list();
    p.key("device_traces").list();
    p.list();
    let e = p.dict();
    entry(&mut p);
    p.end_dict();
    p.again(e, n - 1).end_list().end_list().end_dict();
    p.stop()
}

/// A stack of `depth` references to one frame whose filename is `len`
/// bytes, as the value of the key `frames` being written.
fn shared_stack(p: &mut Pickle, depth: usize, len: usize) {
    p.key("frames").list();
    let f = p.dict();
    p.key("filename").str(&"x".repeat(len));
    p.key("line").int(1).key("name").str("f").end_dict();
    p.again(f, depth - 1).end_list();
}

/// How `vramscope open` did with a file.
struct Outcome {
    /// `None`: killed (past the memory bound, or the time limit).
    code: Option<i32>,
    stderr: String,
    /// Peak resident set (VmHWM), bytes.
    peak: u64,
    secs: f64,
    killed: Option<String>,
}

/// VmHWM of a running process, bytes (`None` once it has exited).
fn vm_hwm(pid: u32) -> Option<u64> {
    crate::common::proc_status::status_bytes(pid, "VmHWM:")
}

/// Runs `vramscope open FILE ARGS…`, its peak resident set read every
/// millisecond while it runs; killed once past `max_rss` bytes or `limit`.
/// (A peak in its very last millisecond could be missed; growing by the
/// 64 MiB of the bound's margin takes far longer than that.)
fn open(file: &Path, args: &[&str], max_rss: u64, limit: Duration) -> Outcome {
    let mut child = vramscope()
        .arg("open")
        .arg(file)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    let mut stderr = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let pid = child.id();
    let start = Instant::now();
    let mut peak = 0;
    let mut killed = None;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if let Some(p) = vm_hwm(pid) {
            peak = peak.max(p);
        }
        if peak > max_rss && killed.is_none() {
            killed = Some(format!(
                "killed at {} MiB of resident memory, past the bound of {} MiB",
                peak / MIB,
                max_rss / MIB
            ));
            let _ = child.kill();
        } else if start.elapsed() > limit && killed.is_none() {
            killed = Some(format!("killed after {limit:?}, still running"));
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    Outcome {
        code: status.code(),
        stderr: reader.join().expect("stderr"),
        peak,
        secs: start.elapsed().as_secs_f64(),
        killed,
    }
}

/// The peak resident set of `open --json` on a small real file: what the
/// binary takes before any file's values. Read exactly, not by polling: a
/// run of a few milliseconds can end before a poll sees its peak (a loaded
/// CI machine once measured 10.7 MiB of a debug binary's 18.5 and so
/// lowered every bound below by 8 MiB). [`peak_of_one_open`] runs it in a
/// process with no other child and reads the kernel's figure.
fn baseline() -> u64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    *BASE.get_or_init(|| {
        let out = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "peak_of_one_open",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(PEAK_OF, baseline_fixture())
            .output()
            .expect("runs the test binary");
        let text = String::from_utf8_lossy(&out.stdout);
        // The harness prints the test's name on the same line first.
        let peak = (text.lines())
            .find_map(|l| l.split_once("peak bytes: "))
            .and_then(|(_, n)| n.trim().parse().ok());
        peak.unwrap_or_else(|| {
            panic!(
                "no peak from the helper: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    })
}

/// The variable naming the file [`peak_of_one_open`] opens.
const PEAK_OF: &str = "VRAMSCOPE_TEST_PEAK_OF";

/// A small real snapshot, every release's features in 6.5 KB.
fn baseline_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/snapshots/releases/torch-2.11-all.pickle")
}

/// Runs `vramscope open $VRAMSCOPE_TEST_PEAK_OF --json`, asserts it read the
/// file, and prints its peak resident set as the kernel kept it for the
/// children this process waited for: this one alone.
pub(crate) fn peak_of_one_open() {
    let Some(file) = std::env::var_os(PEAK_OF) else {
        println!("SKIPPED: a helper of `pickles`, run by it with {PEAK_OF} set");
        return;
    };
    let status = vramscope()
        .arg("open")
        .arg(&file)
        .arg("--json")
        .stdout(Stdio::null())
        .status()
        .expect("runs");
    assert!(status.success(), "{status}");
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage");
    // Linux gives ru_maxrss in KiB.
    println!("peak bytes: {}", usage.max_rss() as u64 * 1024);
}

/// The documented bound for a file of `len` bytes, over the baseline.
fn bound(len: usize) -> u64 {
    4 * len as u64 + 64 * MIB + baseline()
}

/// Writes `bytes` as NAME in a temporary directory and opens it with
/// `args`, within the bound and `limit`; asserts it either read or was
/// refused with one line naming the file. Returns the outcome.
fn check(name: &str, bytes: &[u8], args: &[&str], limit: Duration) -> Outcome {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).expect("write");
    let max = bound(bytes.len());
    let o = open(&path, args, max, limit);
    println!(
        "{name} ({} bytes) {args:?}: exit {:?} in {:.2} s, peak {:.1} MiB (bound {:.1} MiB): {}",
        bytes.len(),
        o.code,
        o.secs,
        o.peak as f64 / MIB as f64,
        max as f64 / MIB as f64,
        o.stderr.trim()
    );
    assert!(
        o.killed.is_none(),
        "{name}: {}",
        o.killed.as_deref().unwrap_or("")
    );
    assert!(o.peak <= max, "{name}: peak {} > bound {max}", o.peak);
    match o.code {
        Some(0) => {}
        Some(1) => {
            assert_eq!(
                o.stderr.lines().count(),
                1,
                "{name}: one line: {}",
                o.stderr
            );
            assert!(
                o.stderr.contains(&path.display().to_string()),
                "{}",
                o.stderr
            );
        }
        c => panic!("{name}: exit {c:?}: {}", o.stderr),
    }
    o
}

/// A refusal for memory: names the bound.
fn refused_for_memory(o: &Outcome) {
    assert_eq!(o.code, Some(1), "refused: {}", o.stderr);
    assert!(
        o.stderr.contains("4 × its size + 64 MiB") || o.stderr.contains("blocks"),
        "names the bound: {}",
        o.stderr
    );
}

/// `{'segments': [S] * segments}`, S one segment of `blocks` references to
/// one block; with a string of `padding` bytes under a key nothing reads.
fn shared_blocks(blocks: usize, segments: usize, padding: usize) -> Vec<u8> {
    let mut p = Pickle::new();
    p.dict();
    if padding > 0 {
        p.key("padding").str(&"p".repeat(padding));
    }
    p.key("segments").list();
    let s = p.dict();
    p.key("address").int(1 << 20);
    p.key("total_size").int(1 << 40);
    p.key("blocks").list();
    let b = p.dict();
    p.key("size")
        .int(512)
        .key("state")
        .str("inactive")
        .end_dict();
    p.again(b, blocks - 1).end_list().end_dict();
    p.again(s, segments - 1).end_list().end_dict();
    p.stop()
}

#[test]
fn item4_shared_blocks_65536_times() {
    // 2.1 MB: one segment of 1 M references to one block, listed 65,536
    // times (it was 8 GB and growing).
    let bytes = shared_blocks(1 << 20, 1 << 16, 0);
    let o = check(
        "blocks.pickle",
        &bytes,
        &["--json"],
        Duration::from_secs(120),
    );
    refused_for_memory(&o);
}

#[test]
fn item4_block_cap_holds_across_shared_segments() {
    // 200 KB: 100,000 shared blocks in a segment listed 100 times: ten
    // million blocks, past the cap of 2^20 (it built them all). The bound
    // on memory refuses it first.
    let bytes = shared_blocks(100_000, 100, 0);
    let o = check("cap.pickle", &bytes, &["--json"], Duration::from_secs(120));
    refused_for_memory(&o);
    // Padded to 64 MiB, the bound leaves room for a million blocks: the
    // cap, counted per reference, refuses it.
    let bytes = shared_blocks(100_000, 100, 64 << 20);
    let o = check(
        "padded.pickle",
        &bytes,
        &["--json"],
        Duration::from_secs(120),
    );
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(
        o.stderr.contains("more than 1048576 blocks"),
        "{}",
        o.stderr
    );
}

#[test]
fn item4_frames_share_one_4mb_filename() {
    // 4.5 MB: 20,000 frames whose filename is one 4 MiB string (80 GB
    // asked for).
    let mut p = Pickle::new();
    p.dict();
    p.key("segments").list();
    p.dict();
    p.key("address").int(0).key("total_size").int(2 << 20);
    p.key("frames").list();
    p.dict();
    p.key("filename").str(&"x".repeat(4 << 20));
    let name = p.memoize();
    p.key("line").int(0).key("name").str("f").end_dict();
    for i in 1..20_000 {
        p.op(b"}(");
        p.key("filename").get(name).key("line").int(i).end_dict();
    }
    p.end_list().end_dict().end_list().end_dict();
    let bytes = p.stop();
    let o = check(
        "names.pickle",
        &bytes,
        &["--json"],
        Duration::from_secs(120),
    );
    refused_for_memory(&o);
}

#[test]
fn item4_allocator_settings_share_a_1mb_string() {
    // 1 MB: 16 settings, each 16 lists of 16 references to one 1 MiB
    // string (4 GB reached).
    let mut p = Pickle::new();
    p.dict();
    p.key("segments").list();
    p.end_list();
    p.key("allocator_settings").dict();
    p.str("k0");
    let outer = p.list();
    let inner = p.list();
    p.str(&"s".repeat(1 << 20));
    let s = p.memoize();
    p.again(s, 15).end_list();
    p.again(inner, 15).end_list();
    for k in 1..16 {
        p.str(&format!("k{k}")).get(outer);
    }
    p.end_dict().end_dict();
    let bytes = p.stop();
    let o = check(
        "settings.pickle",
        &bytes,
        &["--json"],
        Duration::from_secs(120),
    );
    refused_for_memory(&o);
}

#[test]
fn item4_oom_events_share_a_1000_frame_stack() {
    // 8 KB: 1,500 OOMs sharing one stack of 1,000 references to a frame
    // of a 3,000-byte filename (6 GB under `open --json`).
    let bytes = shared_trace(1500, |p| {
        p.key("action").str("oom").key("device_free").int(0);
        p.key("size").int(1 << 30);
        shared_stack(p, 1000, 3000);
    });
    let o = check("ooms.pickle", &bytes, &["--json"], Duration::from_secs(120));
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    // Every OOM names the stack; its lines are given once, cut at 128.
    let out = printed("ooms.pickle", &bytes, &["--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let ooms = v["trace"]["ooms"].as_array().expect("ooms");
    assert_eq!(ooms.len(), 1500);
    assert!(ooms.iter().all(|o| o["stack"] == ooms[0]["stack"]));
    let stacks = v["trace"]["oom_stacks"].as_object().expect("oom_stacks");
    assert_eq!(stacks.len(), 1);
    let lines = stacks
        .values()
        .next()
        .and_then(|l| l.as_array())
        .expect("lines");
    assert_eq!(lines.len(), 129);
    assert!(lines[0]
        .as_str()
        .is_some_and(|l| l.len() <= 515 && l.ends_with('…')));
    assert_eq!(lines[128], "… 872 more frames");
}

/// What `vramscope open FILE ARGS…` prints (it must succeed).
fn printed(name: &str, bytes: &[u8], args: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).expect("write");
    let out = crate::common::succeeded(
        vramscope()
            .arg("open")
            .arg(&path)
            .args(args)
            .output()
            .expect("runs"),
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn item4_events_share_a_1000_frame_stack_under_frames() {
    // 8 KB: 1,500 allocations at one address sharing such a stack (3 GB
    // under `--frames`).
    let bytes = shared_trace(1500, |p| {
        p.key("action").str("alloc").key("addr").int(0x10000);
        p.key("size").int(512);
        shared_stack(p, 1000, 3000);
    });
    let o = check(
        "frames.pickle",
        &bytes,
        &["--frames", "0x10000"],
        Duration::from_secs(120),
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    // The stack once (cut at 128 frames), then named for each event.
    let out = printed("frames.pickle", &bytes, &["--frames", "0x10000"]);
    assert_eq!(
        out.lines().filter(|l| l.starts_with("event ")).count(),
        1500
    );
    assert_eq!(out.matches("(the same stack as event 0)").count(), 1499);
    let frames = out.lines().filter(|l| l.starts_with("    xxx"));
    assert_eq!(frames.count(), 128);
    assert!(out.contains("    … 872 more frames\n"), "{out}");
}

#[test]
fn item4_shared_trace_entries_32mb() {
    // 32 MB: sixteen million references to one trace entry (2.9 GB).
    let bytes = shared_trace(16_000_000, |p| {
        p.key("action").str("alloc").key("addr").int(0x10000);
        p.key("size").int(512);
    });
    let o = check(
        "trace.pickle",
        &bytes,
        &["--json"],
        Duration::from_secs(300),
    );
    refused_for_memory(&o);
}

/// `segments` expandable segments of 2 MiB, then a trace of `events`
/// alternating references to a `segment_map` and a `segment_unmap` above
/// them all.
fn maps_over_many_segments(segments: u64, events: usize) -> Vec<u8> {
    let mut p = Pickle::new();
    p.dict();
    p.key("segments").list();
    for i in 0..segments {
        p.op(b"}(");
        p.key("address")
            .int((i + 1) << 21)
            .key("total_size")
            .int(2 << 20);
        p.key("is_expandable").op(&[0x88]).end_dict();
    }
    p.end_list();
    p.key("device_traces").list();
    p.list();
    let top = (segments + 2) << 21;
    let map = p.dict();
    p.key("action").str("segment_map").key("addr").int(top);
    p.key("size").int(2 << 20).end_dict();
    let unmap = p.dict();
    p.key("action").str("segment_unmap").key("addr").int(top);
    p.key("size").int(2 << 20).end_dict();
    for _ in 1..events / 2 {
        p.get(map).get(unmap);
    }
    p.end_list().end_list().end_dict();
    p.stop()
}

#[test]
fn item5_segment_map_undo_is_linear() {
    // 0.9 MB: 16,384 segments and 200,000 maps and unmaps to undo; each
    // undo walked every segment (84 s for a file of 4.3 MB).
    let bytes = maps_over_many_segments(1 << 14, 200_000);
    let o = check("maps.pickle", &bytes, &["--json"], Duration::from_secs(60));
    assert_eq!(o.code, Some(0), "{}", o.stderr);
}

#[test]
fn item5_stepping_does_not_undo_the_trace_again() {
    // Each step in the dashboard undid the whole trace again. Five steps,
    // in a thread so that a quadratic version fails at the limit.
    let bytes = maps_over_many_segments(1 << 14, 200_000);
    let file = vramscope_core::snapfile::read_slice(&bytes).expect("reads");
    let (done, steps) = std::sync::mpsc::channel();
    let start = Instant::now();
    std::thread::spawn(move || {
        let hub = vramscope_collect::Hub::default();
        let mut stepper = vramscope_collect::trace::Stepper::new(file, "maps.pickle");
        for at in [100_000, 100_001, 99_999, 0, usize::MAX] {
            let status = stepper.seek(&hub, at, 1 << 40);
            let _ = done.send(status.at);
        }
    });
    for want in [100_000, 100_001, 99_999, 0, 200_000] {
        let left = Duration::from_secs(60).saturating_sub(start.elapsed());
        let at = steps.recv_timeout(left).expect("five steps within 60 s");
        assert_eq!(at, want);
    }
    println!(
        "maps.pickle: five steps in {:.2} s",
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn item5_nested_marks_cost_linear_time() {
    // 7 MB: 1,023 nested MARKs, then a million APPENDs to a list older
    // than them all and a million BINPUTs overwriting an older entry: each
    // walked every mark (18.7 s, against 0.28 s without the marks).
    let mut b = vec![0x80, 4, b']', 0x94, b'N', 0x94, b'0'];
    b.extend([b'('; 1023]);
    b.extend(b"h\x00");
    for _ in 0..1_000_000 {
        b.extend(b"NaNq\x010");
    }
    b.push(b'.');
    let o = check("marks.pickle", &b, &["--json"], Duration::from_secs(30));
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(
        o.stderr.contains("STOP with other than one value"),
        "{}",
        o.stderr
    );
}
