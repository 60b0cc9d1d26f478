"""Run inside a job by ``vramscope attach PID`` (crates/collect/src/attach/): instruments a
process that is already running, then says what became of it in a small
JSON file the command waits for.

The command's injected text loads this file by its path and calls
``run(result_path, shm_dir, settle, agent_dir)`` on the job's main thread, between two
bytecodes, with the GIL held (a pending call, or ``sys.remote_exec`` on
Python 3.14+). So nothing here may block the job: the mode is settled by a
daemon thread, and nothing here raises (an exception would be printed into
the job's stderr, or worse, returned into its code).

The result: ``{"status": ..., "mode": ..., "reason": ..., "path": ...,
"cuda_initialized": ..., "final": ...}`` where status is

attached  the agent is attached now (mode: exact, sampled, pending, ...)
already   it was attached before (``vramscope run``, ``vramscope.attach()``
          or an earlier ``vramscope attach``); nothing was changed
no torch  the process has not imported torch (or is still importing it)
off       VRAMSCOPE_MODE=off in the job's environment
failed    the agent could not start (reason says why)

``final`` is false while the agent is still settling (building or starting
its tracker); the file is then written again when it has settled, or once
`settle` seconds have passed.
"""

import json
import os
import sys
import threading
import time

_ATTACHED = ("pending", "exact", "sampled")


def run(result_path, shm_dir=None, settle=30.0, agent_dir=None):
    """Instruments this process and writes the result. Never raises.
    `agent_dir`: the extracted agent, put at the front of sys.path when
    the job has not imported a vramscope of its own."""
    try:
        _run(result_path, shm_dir, settle, agent_dir)
    except BaseException as e:  # never into the job
        _write(result_path, {"status": "failed", "reason": "%s: %s" % (type(e).__name__, e), "final": True})


def _run(result_path, shm_dir, settle, agent_dir):
    torch = sys.modules.get("torch")
    if torch is None:
        _write(result_path, {"status": "no torch", "reason": "the process has not imported torch", "final": True})
        return
    if not hasattr(torch, "cuda"):
        _write(
            result_path,
            {"status": "no torch", "reason": "the process is still importing torch: attach again in a moment", "final": True},
        )
        return
    if agent_dir and "vramscope" not in sys.modules and agent_dir not in sys.path:
        sys.path.insert(0, agent_dir)
    import vramscope

    before = vramscope.status()
    if before.get("mode") in _ATTACHED:
        _write(result_path, _result("already", vramscope, torch, True))
        return
    if shm_dir:
        # As `vramscope run --shm-dir` does: the job's children use it too.
        os.environ["VRAMSCOPE_SHM_DIR"] = shm_dir
    ok = vramscope.attach(shm_dir=shm_dir or None, wait=False)
    mode = vramscope.status().get("mode")
    if not ok:
        _write(result_path, _result("off" if mode == "off" else "failed", vramscope, torch, True))
        return
    if mode != "pending" or not _cuda_initialized(torch):
        # Settled, or waiting for the job to initialise CUDA (which may be
        # much later): either way, nothing more to wait for now.
        _write(result_path, _result("attached", vramscope, torch, True))
        return
    _write(result_path, _result("attached", vramscope, torch, False))
    t = threading.Thread(
        target=_settle, args=(result_path, vramscope, torch, float(settle)), name="vramscope-attach", daemon=True
    )
    t.start()


def _settle(result_path, vramscope, torch, settle):
    """Waits (off the job's thread) for the mode to leave "pending", then
    writes the result again."""
    try:
        deadline = time.monotonic() + max(0.0, settle)
        while time.monotonic() < deadline:
            if vramscope.status().get("mode") != "pending":
                break
            time.sleep(0.05)
        _write(result_path, _result("attached", vramscope, torch, True))
    except BaseException:
        pass


def _cuda_initialized(torch):
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return None


def _result(status, vramscope, torch, final):
    st = dict(vramscope.status())
    out = {
        "status": status,
        "mode": st.get("mode"),
        "reason": st.get("reason") or "",
        "path": st.get("path"),
        "cuda_initialized": _cuda_initialized(torch),
        "final": final,
    }
    if st.get("mode") == "off" and os.environ.get("VRAMSCOPE_MODE"):
        out["reason"] = "VRAMSCOPE_MODE=%s in the job's environment" % os.environ["VRAMSCOPE_MODE"]
    return out


def _write(path, result):
    """Writes the result atomically (a reader sees the old file or the new
    one). Never raises."""
    try:
        tmp = "%s.%d.tmp" % (path, threading.get_ident())
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, path)
    except BaseException:
        pass
