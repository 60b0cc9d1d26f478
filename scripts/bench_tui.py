#!/usr/bin/env python3
"""Measure terminal GPU dashboards side by side, each in a real pty.

    scripts/bench_tui.py vramscope nvitop nvtop
    scripts/bench_tui.py 'vramscope=target/release/vramscope demo --no-nvml'   # no GPU
    scripts/bench_tui.py --rounds 3 --warmup 5 --window 30 --out DIR vramscope nvitop nvtop

Each TOOL is NAME or NAME=COMMAND. Known names and their default commands:

    vramscope  $VRAMSCOPE, else target/release/vramscope, else `vramscope` on PATH
               (NVML polled every second: its default --interval 1000)
    nvitop     `nvitop -m full --interval 1`, or `python3 -m nvitop ...` when only
               the module is importable (its default interval is 2 s)
    nvtop      $NVTOP or `nvtop`, with `-d 10` (tenths of a second: 1 s)

A known tool that is not installed is skipped with a SKIP line (and recorded
as skipped in the JSON); the others still run.

For every round (--rounds, default 3; the tools alternate, and the order
rotates each round) and every tool:

 1. The tool is started in a fresh pty of --cols x --rows (default 200x60):
    the size is set on the pty with TIOCSWINSZ before the start, the pty is
    the tool's controlling terminal, and TERM=xterm-256color, COLUMNS and
    LINES are set. The harness answers cursor-position (ESC[6n) and device
    attribute (ESC[c) queries, as a terminal would.
 2. Time to first frame, from the spawn to the first full frame:
      vramscope*  the first end of a synchronized update (ESC[?2026l): it
                  wraps every frame in one, so this is the exact end of the
                  first frame;
      nvitop      the end of the first output burst that contains
                  "Processes:" (the heading of its process panel, drawn after
                  the device panel);
      nvtop       the end of the first output burst that contains "PID"
                  (its process list header, drawn after the device meters);
      others      the end of the first burst that contains --marker's text.
    A burst ends at the last byte before --settle ms (default 50) of
    silence; in every case at least --min-bytes (default 2000) must have
    arrived. The time reported is that of the last byte of the burst.
 3. Warm-up: --warmup s (default 5) after the first frame, no input.
    With --data-marker TEXT (e.g. "H100"), the time from the spawn to the
    first read in which TEXT appears is reported too, when it appears before
    the warm-up ends: a first frame may be drawn before the tool has any GPU
    data (vramscope paints before its first NVML poll), so this is the
    like-for-like "time to data".
 4. Steady state, no input, over --window s (default 30): CPU is
    utime+stime from /proc/PID/stat (all its threads) over the window,
    divided by clock ticks and wall time: % of one core. Bytes written to
    the terminal per second over the window (and frames per second where
    frames are marked by synchronized updates).
 5. RSS: VmRSS and VmHWM from /proc/PID/status at the end of the window.
 6. Quit: `q` is sent; SIGTERM after 3 s, SIGKILL after 2 s more. How it
    ended is recorded.

The report gives the medians over rounds of every figure and the ratios
vramscope/other, as a Markdown table (stdout, and OUT/bench_tui.md with
--out) and JSON (OUT/bench_tui.json: every run and the medians; rewritten
after every run, so a run cut short still leaves its figures).

Python 3 standard library only; Linux only (/proc, pty).
"""

import argparse
import errno
import fcntl
import json
import os
import platform
import pty
import re
import select
import shlex
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import termios
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYNC_END = b"\x1b[?2026l"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# --- tools -----------------------------------------------------------------


def default_command(name):
    """(argv, None) or (None, why it is skipped)."""
    if name.startswith("vramscope"):
        exe = os.environ.get("VRAMSCOPE")
        if not exe:
            local = os.path.join(ROOT, "target", "release", "vramscope")
            exe = local if os.access(local, os.X_OK) else shutil.which("vramscope")
        if not exe:
            return None, "vramscope not found (set $VRAMSCOPE or run cargo build --release)"
        return [exe], None
    if name == "nvitop":
        args = ["-m", "full", "--interval", "1"]
        exe = shutil.which("nvitop")
        if exe:
            return [exe] + args, None
        py = sys.executable or "python3"
        ok = subprocess.run([py, "-c", "import nvitop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if ok.returncode == 0:
            return [py, "-m", "nvitop"] + args, None
        return None, "nvitop not found (neither on PATH nor importable by %s)" % py
    if name == "nvtop":
        exe = os.environ.get("NVTOP") or shutil.which("nvtop")
        if not exe:
            return None, "nvtop not found (set $NVTOP or put it on PATH)"
        return [exe, "-d", "10"], None
    return None, "unknown tool %r: give it as NAME=COMMAND" % name


def frame_rule(name, markers):
    """(marker bytes, exact): exact markers end a frame where they are seen."""
    if name in markers:
        return markers[name].encode(), False
    if name.startswith("vramscope"):
        return SYNC_END, True
    if name == "nvitop":
        return b"Processes:", False
    if name == "nvtop":
        return b"PID", False
    return None, False


# --- /proc -------------------------------------------------------------------


def cpu_ticks(pid):
    """utime + stime of the whole process (all threads), in clock ticks."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(")") + 2 :].split()
    return int(rest[11]) + int(rest[12])  # fields 14 and 15


def mem_status(pid):
    out = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM", "Threads"):
                    v = v.split()
                    out[k] = int(v[0]) * (1024 if len(v) > 1 and v[1] == "kB" else 1)
    except OSError:
        pass
    return out


# --- one run -------------------------------------------------------------------


class Pty:
    """A child in a pty, its output drained into memory with timestamps."""

    def __init__(self, argv, cols, rows, env_extra=None, data_marker=None):
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = dict(os.environ)
        env.update({"TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)})
        env.pop("NO_COLOR", None)
        if env_extra:
            env.update(env_extra)

        def child_setup():
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.t_spawn = time.monotonic()
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, preexec_fn=child_setup, close_fds=True
        )
        os.close(slave)
        self.pid = self.proc.pid
        self.buf = bytearray()
        self.total = 0
        self.last_byte = None
        self.eof = False
        self.data_marker = data_marker
        self.data_at = None  # when data_marker first appeared in the output

    def pump(self, timeout):
        """Reads whatever arrives within `timeout` s; returns bytes read."""
        if self.eof:
            time.sleep(max(0.0, timeout))
            return 0
        r, _, _ = select.select([self.master], [], [], max(0.0, timeout))
        if not r:
            return 0
        try:
            data = os.read(self.master, 1 << 16)
        except OSError as e:
            if e.errno == errno.EIO:
                self.eof = True
                return 0
            raise
        if not data:
            self.eof = True
            return 0
        now = time.monotonic()
        self.last_byte = now
        self.total += len(data)
        self.buf += data
        if self.data_marker and self.data_at is None:
            if self.data_marker in self.buf[-(len(data) + len(self.data_marker)) :]:
                self.data_at = now
        self._answer(data)
        return len(data)

    def _answer(self, data):
        # Answer the queries a terminal answers, so no tool waits on them.
        if b"\x1b[6n" in data:
            self.write(b"\x1b[1;1R")
        if b"\x1b[c" in data or b"\x1b[0c" in data:
            self.write(b"\x1b[?62;22c")

    def trim(self, keep=1 << 16):
        if len(self.buf) > 4 * keep:
            del self.buf[: len(self.buf) - keep]

    def write(self, b):
        try:
            os.write(self.master, b)
        except OSError:
            pass

    def pump_until(self, t_end):
        while True:
            left = t_end - time.monotonic()
            if left <= 0:
                return
            self.pump(min(left, 0.2))
            self.trim()

    def alive(self):
        return self.proc.poll() is None

    def close(self):
        try:
            os.close(self.master)
        except OSError:
            pass


def visible_tail(b, n=600):
    s = re.sub(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>78]|\x1b\][^\x07]*\x07", b" ", bytes(b))
    s = s.decode("utf-8", "replace")
    s = re.sub(r"\s+", " ", s).strip()
    return s[-n:]


def wait_first_frame(p, marker, exact, min_bytes, settle, timeout):
    """Seconds from spawn to the end of the first full frame, or None."""
    deadline = p.t_spawn + timeout
    found = False
    while time.monotonic() < deadline:
        n = p.pump(min(settle, max(0.0, deadline - time.monotonic())))
        if p.eof and not found:
            return None
        if not found and p.total >= min_bytes:
            if marker is None or marker in p.buf:
                found = True
                if exact and marker is not None:
                    return p.last_byte - p.t_spawn
        if found and n == 0 and time.monotonic() - p.last_byte >= settle:
            return p.last_byte - p.t_spawn
    return None


def quit_tool(p):
    t0 = time.monotonic()
    p.write(b"q")
    how = None
    for sig, wait in ((None, 3.0), (signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
        if sig is not None:
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass
        t_end = time.monotonic() + wait
        while time.monotonic() < t_end and p.alive():
            p.pump(0.05)
        if not p.alive():
            how = "q" if sig is None else signal.Signals(sig).name
            break
    # Drain what is left, then reap.
    t_end = time.monotonic() + 0.5
    while time.monotonic() < t_end and not p.eof:
        p.pump(0.05)
    rc = p.proc.wait()
    p.close()
    return {"quit_by": how, "exit_status": rc, "quit_s": round(time.monotonic() - t0, 3)}


def one_run(name, argv, args, markers):
    marker, exact = frame_rule(name, markers)
    p = Pty(argv, args.cols, args.rows, data_marker=args.data_marker.encode() if args.data_marker else None)
    res = {"tool": name, "command": " ".join(shlex.quote(a) for a in argv), "pid": p.pid}
    ttff = wait_first_frame(p, marker, exact, args.min_bytes, args.settle / 1000.0, args.first_timeout)
    if ttff is None:
        res["error"] = "no first frame within %.0f s (%d bytes; %s)" % (
            args.first_timeout,
            p.total,
            "exited %s" % p.proc.poll() if not p.alive() else "still running",
        )
        res["output_tail"] = visible_tail(p.buf)
        res.update(quit_tool(p))
        return res
    res["first_frame_s"] = round(ttff, 4)
    p.pump_until(p.t_spawn + ttff + args.warmup)
    if p.data_at is not None:
        res["first_data_s"] = round(p.data_at - p.t_spawn, 4)
    if not p.alive():
        res["error"] = "exited during warm-up (status %s)" % p.proc.poll()
        res["output_tail"] = visible_tail(p.buf)
        res.update(quit_tool(p))
        return res
    # The window.
    c0, b0, t0 = cpu_ticks(p.pid), p.total, time.monotonic()
    frames = 0
    tail = b""
    t_end = t0 + args.window
    while time.monotonic() < t_end:
        before = len(p.buf)
        p.pump(min(0.2, max(0.0, t_end - time.monotonic())))
        if len(p.buf) > before:
            chunk = tail + bytes(p.buf[before:])
            frames += chunk.count(SYNC_END)
            tail = chunk[-(len(SYNC_END) - 1) :]
        p.trim()
    c1, b1, t1 = cpu_ticks(p.pid), p.total, time.monotonic()
    mem = mem_status(p.pid)
    if c0 is None or c1 is None or not p.alive():
        res["error"] = "exited during the window (status %s)" % p.proc.poll()
        res["output_tail"] = visible_tail(p.buf)
        res.update(quit_tool(p))
        return res
    wall = t1 - t0
    res.update(
        {
            "window_s": round(wall, 3),
            "cpu_pct": round(100.0 * (c1 - c0) / CLK_TCK / wall, 3),
            "cpu_ticks": c1 - c0,
            "bytes_per_s": round((b1 - b0) / wall, 1),
            "frames_per_s": round(frames / wall, 3) if frames else None,
            "rss_mib": round(mem.get("VmRSS", 0) / 2**20, 2),
            "hwm_mib": round(mem.get("VmHWM", 0) / 2**20, 2),
            "threads": mem.get("Threads"),
        }
    )
    res.update(quit_tool(p))
    return res


# --- report --------------------------------------------------------------------

FIELDS = [
    ("first_frame_s", "time to first frame", lambda v: "%.0f ms" % (v * 1000)),
    ("first_data_s", "time to first GPU data (--data-marker)", lambda v: "%.0f ms" % (v * 1000)),
    ("cpu_pct", "steady CPU (% of one core)", lambda v: "%.2f %%" % v),
    ("rss_mib", "RSS (VmRSS)", lambda v: "%.1f MiB" % v),
    ("hwm_mib", "peak RSS (VmHWM)", lambda v: "%.1f MiB" % v),
    ("bytes_per_s", "terminal output", lambda v: "%.0f B/s" % v),
    ("frames_per_s", "frames/s (sync updates)", lambda v: "%.2f" % v),
]


def medians(runs):
    out = {}
    for key, _, _ in FIELDS:
        vals = [r[key] for r in runs if r.get(key) is not None]
        if vals:
            out[key] = statistics.median(vals)
            out[key + "_range"] = [min(vals), max(vals)]
    out["rounds_ok"] = sum(1 for r in runs if "error" not in r)
    out["rounds"] = len(runs)
    return out


def markdown(names, med, skipped):
    ran = [n for n in names if n in med and med[n]["rounds_ok"]]
    base = next((n for n in ran if n.startswith("vramscope")), None)
    others = [n for n in ran if n != base]
    head = ["figure (median over rounds)"] + ran + ["%s / %s" % (base, o) for o in others if base]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for key, label, fmt in FIELDS:
        if not any(key in med[n] for n in ran):
            continue
        row = [label]
        for n in ran:
            v = med[n].get(key)
            if v is None:
                row.append("–")
            else:
                lo, hi = (fmt(x).split()[0] for x in med[n][key + "_range"])
                cell = fmt(v)
                if lo != hi:
                    cell += " (%s – %s)" % (lo, hi)
                row.append(cell)
        if base:
            for o in others:
                a, b = med[base].get(key), med[o].get(key)
                row.append("%.2f×" % (a / b) if a is not None and b not in (None, 0) else "–")
        lines.append("| " + " | ".join(row) + " |")
    row = ["rounds ok"] + ["%d/%d" % (med[n]["rounds_ok"], med[n]["rounds"]) for n in ran]
    row += [""] * (len(head) - len(row))
    lines.append("| " + " | ".join(row) + " |")
    for n in names:
        if n in skipped:
            lines.append("")
            lines.append("SKIP %s: %s" % (n, skipped[n]))
        elif n in med and not med[n]["rounds_ok"]:
            lines.append("")
            lines.append("FAILED %s: no round completed" % n)
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tools", nargs="+", metavar="TOOL", help="NAME or NAME=COMMAND")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds after the first frame (default 5)")
    ap.add_argument("--window", type=float, default=30.0, help="steady-state window in seconds (default 30)")
    ap.add_argument("--cols", type=int, default=200)
    ap.add_argument("--rows", type=int, default=60)
    ap.add_argument("--settle", type=float, default=50.0, help="ms of silence that ends a burst (default 50)")
    ap.add_argument("--min-bytes", type=int, default=2000, help="bytes a first frame has at least (default 2000)")
    ap.add_argument("--first-timeout", type=float, default=20.0, help="seconds to wait for a first frame")
    ap.add_argument(
        "--data-marker",
        metavar="TEXT",
        help="also time the first appearance of TEXT (e.g. the GPU's name) in each tool's output, "
        "within the first frame's wait plus the warm-up",
    )
    ap.add_argument("--marker", action="append", default=[], metavar="NAME=TEXT", help="first-frame marker text for NAME")
    ap.add_argument("--out", metavar="DIR", help="write bench_tui.json and bench_tui.md here")
    args = ap.parse_args()

    markers = {}
    for m in args.marker:
        k, _, v = m.partition("=")
        markers[k] = v

    tools, skipped, names = {}, {}, []
    for t in args.tools:
        name, eq, cmd = t.partition("=")
        if name in names:
            sys.exit("bench_tui: tool %r given twice" % name)
        names.append(name)
        if eq:
            argv = shlex.split(cmd)
            exe = argv[0] if argv else ""
            if not argv or not (os.access(exe, os.X_OK) if os.sep in exe else shutil.which(exe)):
                skipped[name] = "%r not found" % exe
            else:
                tools[name] = argv
        else:
            argv, why = default_command(name)
            if argv is None:
                skipped[name] = why
            else:
                tools[name] = argv
    for n in names:
        if n in skipped:
            print("SKIP %s: %s" % (n, skipped[n]), flush=True)
        else:
            print("tool %s: %s" % (n, " ".join(shlex.quote(a) for a in tools[n])), flush=True)

    meta = {
        "host": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pty": "%dx%d" % (args.cols, args.rows),
        "rounds": args.rounds,
        "warmup_s": args.warmup,
        "window_s": args.window,
        "settle_ms": args.settle,
        "min_bytes": args.min_bytes,
        "data_marker": args.data_marker,
        "clk_tck": CLK_TCK,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    runs = []
    order = [n for n in names if n in tools]

    def save():
        med = {n: medians([r for r in runs if r["tool"] == n]) for n in order}
        ratios = {}
        base = next((n for n in order if n.startswith("vramscope")), None)
        if base:
            for o in order:
                if o == base:
                    continue
                ratios[o] = {
                    k: (med[base][k] / med[o][k])
                    for k, _, _ in FIELDS
                    if med[base].get(k) is not None and med[o].get(k) not in (None, 0)
                }
        doc = {"meta": meta, "tools": {n: tools[n] for n in order}, "skipped": skipped, "runs": runs, "medians": med, "ratios_vramscope_over": ratios}
        md = markdown(names, med, skipped)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "bench_tui.json"), "w") as f:
                json.dump(doc, f, indent=1)
            with open(os.path.join(args.out, "bench_tui.md"), "w") as f:
                f.write(md)
        return md

    for rnd in range(args.rounds):
        k = rnd % len(order) if order else 0
        for name in order[k:] + order[:k]:
            r = one_run(name, tools[name], args, markers)
            r["round"] = rnd + 1
            runs.append(r)
            if "error" in r:
                print("round %d %s: ERROR %s | %s" % (rnd + 1, name, r["error"], r.get("output_tail", "")), flush=True)
            else:
                print(
                    "round %d %s: first frame %.0f ms%s, CPU %.2f %%, RSS %.1f MiB (peak %.1f), %.0f B/s%s, quit by %s"
                    % (
                        rnd + 1,
                        name,
                        r["first_frame_s"] * 1000,
                        ", data %.0f ms" % (r["first_data_s"] * 1000) if "first_data_s" in r else "",
                        r["cpu_pct"],
                        r["rss_mib"],
                        r["hwm_mib"],
                        r["bytes_per_s"],
                        ", %.2f frames/s" % r["frames_per_s"] if r["frames_per_s"] else "",
                        r["quit_by"],
                    ),
                    flush=True,
                )
            save()
    md = save()
    print()
    print(md, end="")
    return 0 if all(medians([r for r in runs if r["tool"] == n])["rounds_ok"] for n in order) else 1


if __name__ == "__main__":
    sys.exit(main())
