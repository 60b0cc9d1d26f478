#!/usr/bin/env bash
# Issue 28 on a GPU: N real training processes (transformers Llama and GPT-2,
# built from configs, batch 4) on one GPU, each under `vramscope run`,
# watched at once by `vramscope serve` (never scraped during the window)
# and by the dashboard in a tmux pty (the process view of the first job
# open). After WARM seconds, for SECS seconds, both watchers' CPU time and
# RSS are sampled every second from /proc; serve is scraped once at each
# end of the window for the events delivered and lost. Results:
# $D/live8.json and a line per watcher in $D/summary.txt.
#
#   N=8 WARM=40 SECS=120 tests/gpu/live8.sh   (needs target/release/vramscope, tmux)
set -u
. "$(dirname "$0")/common.sh" live8
N=${N:-8}; WARM=${WARM:-40}; SECS=${SECS:-120}; PORT=${PORT:-9431}
SHM=$(mktemp -d /dev/shm/vs-live8-XXXXXX)
export VRAMSCOPE_SHM_DIR=$SHM
JOBS=()
cleanup() {
    tmux kill-session -t live8 2>/dev/null
    [ -n "${SERVE:-}" ] && kill "$SERVE" 2>/dev/null
    for j in "${JOBS[@]}"; do kill "$j" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$SHM"
}
trap cleanup EXIT
LIFE=$((WARM + SECS + 30))
for i in $(seq 1 "$N"); do
    m=llama; [ $((i % 2)) -eq 0 ] && m=gpt2
    "$B" run -- python3 tests/gpu/live_train.py --model $m --seconds $LIFE \
        > "$D/job$i.log" 2>&1 &
    JOBS+=($!)
done
"$B" serve --listen 127.0.0.1:$PORT --shm-dir "$SHM" > "$D/serve.log" 2>&1 &
SERVE=$!
# The dashboard, the first job's process view open (its pid: the job's
# python, which `vramscope run` execs into), once every job's segment is
# there (the view opens only for a process already seen).
for _ in $(seq 1 90); do
    [ "$(ls "$SHM" | grep -c "^vramscope-")" -ge "$N" ] && break
    sleep 1
done
sleep 2
tmux new-session -d -s live8 -x 200 -y 60 "exec $B --shm-dir $SHM --pid ${JOBS[0]} 2> $D/dash.err"
sleep 1
DASH=$(tmux display -p -t live8 '#{pane_pid}')
sleep "$WARM"
python3 - "$SERVE" "$DASH" "$SECS" "$PORT" "$N" > "$D/live8.json" <<'PY'
import json, os, sys, time, urllib.request
serve, dash, secs, port, n = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
tck = os.sysconf("SC_CLK_TCK")
def cpu(pid):
    s = open(f"/proc/{pid}/stat").read()
    f = s[s.rfind(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / tck
def rss(pid, what="VmRSS:"):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith(what):
            return int(l.split()[1]) * 1024
def scrape():
    t = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    ev = lost = 0.0; procs = 0
    for l in t.splitlines():
        if l.startswith("vramscope_process_events_total{"):
            ev += float(l.rsplit(" ", 1)[1]); procs += 1
        elif l.startswith("vramscope_process_lost_events_total{"):
            lost += float(l.rsplit(" ", 1)[1])
    return ev, lost, procs
pids = {"serve": serve, "dash": dash}
e0, l0, p0 = scrape()
c0 = {k: cpu(p) for k, p in (("serve", serve), ("dash", dash))}
t0 = time.monotonic()
rs = {"serve": [], "dash": []}
while time.monotonic() - t0 < secs:
    time.sleep(1)
    for k, p in (("serve", serve), ("dash", dash)):
        rs[k].append(rss(p))
dt = time.monotonic() - t0
c1 = {k: cpu(p) for k, p in (("serve", serve), ("dash", dash))}
e1, l1, p1 = scrape()
rate = (e1 - e0) / dt
out = {"jobs": n, "processes_seen": p1, "window_s": round(dt, 1), "events_per_s": round(rate),
       "lost_in_window": l1 - l0, "lost_total": l1}
for k in ("serve", "dash"):
    c = c1[k] - c0[k]
    out[k] = {"cpu_pct": round(100 * c / dt, 2), "ns_per_event": round(1e9 * c / max(1, e1 - e0), 1),
              "rss_first_mib": round(rs[k][min(len(rs[k]) - 1, 59)] / 2**20, 1),
              "rss_end_mib": round(rs[k][-1] / 2**20, 1), "rss_max_mib": round(max(rs[k]) / 2**20, 1),
              # Of the RSS at the end: private memory, and the producers'
              # ring pages mapped (shared with them, not the watcher's own).
              "rss_anon_end_mib": round(rss(pids[k], "RssAnon:") / 2**20, 1),
              "rss_shmem_end_mib": round(rss(pids[k], "RssShmem:") / 2**20, 1)}
print(json.dumps(out, indent=1))
PY
rc=$?
tmux capture-pane -p -t live8 > "$D/dash_screen.txt" 2>/dev/null
python3 -c "
import json; o=json.load(open('$D/live8.json'))
print(f\"{o['jobs']} jobs, {o['processes_seen']} seen, {o['events_per_s']} events/s delivered, lost in window {o['lost_in_window']:.0f}\")
for k in ('serve','dash'):
    w=o[k]; print(f\"{k}: {w['cpu_pct']} % of a core, {w['ns_per_event']} ns/event, RSS {w['rss_first_mib']} MiB at 1 min, {w['rss_end_mib']} MiB at end (max {w['rss_max_mib']}; anon {w['rss_anon_end_mib']}, rings {w['rss_shmem_end_mib']})\")
" | tee "$D/summary.txt"
for j in "${JOBS[@]}"; do wait "$j"; done
grep -h "^live_train" "$D"/job*.log | tee -a "$D/summary.txt"
exit $rc
