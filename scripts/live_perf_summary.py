#!/usr/bin/env python3
"""Summarise a `perf record --call-graph dwarf` profile of a vramscope
watcher (see examples/live_bench.rs --perf, benches/LIVE_RESULTS.md).

    perf script -i serve.perf.data > serve.script
    scripts/live_perf_summary.py serve.script [--thread COMM] [--tree FUNC]
        [--callers FUNC]

Prints the share of samples whose stack holds each stage of the live path
(inclusive, inlined frames included), the top functions by self time, and
with --tree FUNC the callees directly below FUNC (inclusive), with
--callers FUNC where the self time of FUNC is spent from.
"""
import re
import sys
from collections import Counter

# Stages of the live path: label, regex on a frame's function name.
STAGES = [
    ("collector step (RingSet::step)", r"RingSet::step$"),
    ("  drain: read slots + decode (SegmentReader::drain_at)", r"SegmentReader::drain_at$"),
    ("    decode (codec::Decoder::decode)", r"Decoder::decode$"),
    ("    push into the batch Vec (drain_at closure)", r"RingSet::drain::\{\{closure\}\}$"),
    ("  merge by time (merge_by_time)", r"rings::merge_by_time$"),
    ("  liveness / intact checks (/proc, fstat)", r"SegmentReader::liveness$|SegmentReader::still_intact$|Shared::intact$"),
    ("  Hub::apply", r"Hub::apply$"),
    ("    recording hook (Hub::record)", r"Hub::record$"),
    ("    model (Model::apply_records)", r"Model::apply_(all_at|records)$"),
    ("      event history (Process::remember)", r"Process::remember$"),
    ("      ring positions (Placement::keep / placed::apply_at)", r"Placement::keep$"),
    ("      block map (DeviceState::apply_unbuffered)", r"DeviceState>::apply_unbuffered$"),
    ("        merge_free", r"DeviceState>::merge_free$"),
    ("        series + totals (DeviceState::after_change)", r"DeviceState::after_change$"),
    ("        snapshot replay buffer (buffer_for_replay)", r"buffer_for_replay$"),
    ("      leak analysis (LeakDetector::*)", r"LeakDetector::on_\w+$"),
    ("        period finder (PeriodFinder::on_alloc)", r"PeriodFinder::on_alloc$"),
    ("      leak signal (Process::leak_signal)", r"Process::leak_signal$"),
    ("      attribution (attrib::*)", r"model::attrib::"),
    ("    drop of the Input (Vec<Event> free)", r"drop_in_place<vramscope::input::Input>$"),
    ("resync requests (ask_resyncs)", r"Collector::ask_resyncs$"),
    ("NVML + host sampling (apply_machine / poll)", r"Collector::apply_machine$|NvmlSource::poll$|HostSampler::sample$"),
    ("snapshot for views (Hub::snapshot_at)", r"Hub::snapshot_at$"),
    ("  Model::view", r"Model::view$"),
    ("    Process::view", r"Process::view$"),
    ("      leak_report", r"Process::leak_report$"),
    ("      attribution()", r"Process::attribution$"),
    ("      block map copy (segments/blocks)", r"DeviceState::blocks_of$|SegmentView"),
    ("      timeline queries (Series::query)", r"Series::query$"),
    ("      recent events copy", r"Process::view::\{\{closure\}\}"),
    ("  drop of the previous Snapshot", r"drop_in_place<vramscope::collect::state::Snapshot>$"),
    ("render (ui::draw)", r"vramscope::ui::draw$"),
    ("terminal output (ratatui flush / write)", r"Terminal<.*>::flush$|Terminal<.*>::draw$"),
    ("malloc/free/realloc (any)", r"^(malloc|_int_malloc|cfree|free|realloc|_int_free.*|__rdl_alloc|__rust_alloc|__rust_dealloc|__libc_malloc|__libc_free)(@.*)?$"),
    ("memcpy/memmove (any)", r"__memmove|__memcpy|memcpy"),
    ("kernel", r"^\[k\]"),
]


def parse(path, thread=None):
    samples = []
    cur = None
    head = re.compile(r"^(\S.*?)\s+(\d+)(?:/(\d+))?\s+[\d.]+:\s+\d+\s+\S+")
    frame = re.compile(r"^\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)$")
    for line in open(path, errors="replace"):
        if not line.strip():
            if cur is not None:
                samples.append(cur)
            cur = None
            continue
        if not line.startswith(("\t", " ")):
            m = head.match(line)
            comm = m.group(1) if m else line.split()[0]
            cur = None if thread and comm != thread else (comm, [])
            continue
        if cur is None:
            continue
        m = frame.match(line)
        if not m:
            continue
        sym, dso = m.group(2), m.group(3)
        sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
        if dso.startswith("[kernel") or sym.startswith("[k]"):
            sym = "[k] " + sym
        cur[1].append(sym)
    if cur is not None:
        samples.append(cur)
    return samples


def main():
    args = sys.argv[1:]
    thread = None
    tree = []
    if "--thread" in args:
        i = args.index("--thread")
        thread = args[i + 1]
        del args[i : i + 2]
    callers = []
    while "--callers" in args:
        i = args.index("--callers")
        callers.append(args[i + 1])
        del args[i : i + 2]
    while "--tree" in args:
        i = args.index("--tree")
        tree.append(args[i + 1])
        del args[i : i + 2]
    samples = parse(args[0], thread)
    n = len(samples)
    threads = Counter(c for c, _ in samples)
    print(f"{args[0]}: {n} samples; by thread: " + ", ".join(f"{t} {c * 100 / n:.1f}%" for t, c in threads.most_common()))
    print("\nstage (inclusive share of the process's samples)")
    for label, rx in STAGES:
        r = re.compile(rx)
        hit = sum(1 for _, fr in samples if any(r.search(f) for f in fr))
        if hit:
            print(f"  {hit * 100 / n:5.1f}%  {label}")
    print("\ntop functions by self time (innermost frame, inlined included)")
    selfc = Counter(fr[0] if fr else "?" for _, fr in samples)
    for s, c in selfc.most_common(30):
        print(f"  {c * 100 / n:5.1f}%  {s[:150]}")
    for t in callers:
        r = re.compile(t)
        above = Counter()
        for _, fr in samples:
            if fr and r.search(fr[0]):
                # The first frame above it that is not itself or a generic helper.
                outer = next((f for f in fr[1:] if not r.search(f) and not f.startswith(("core::", "alloc::", "<core::", "<alloc::"))), "?")
                above[outer] += 1
        print(f"\nself time of {t}, by nearest vramscope/std caller")
        for s, c in above.most_common(15):
            print(f"  {c * 100 / n:5.1f}%  {s[:150]}")
    for t in tree:
        r = re.compile(t)
        below = Counter()
        total = 0
        for _, fr in samples:
            idx = [i for i, f in enumerate(fr) if r.search(f)]
            if not idx:
                continue
            total += 1
            i = idx[-1]  # outermost occurrence
            below[fr[i - 1] if i > 0 else "(self)"] += 1
        print(f"\nbelow {t}: {total * 100 / max(n, 1):.1f}% of samples")
        for s, c in below.most_common(25):
            print(f"  {c * 100 / n:5.1f}%  {s[:150]}")


if __name__ == "__main__":
    main()
