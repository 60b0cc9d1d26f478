"""``python -m vramscope._ensure``: builds what the agent needs before a job
needs it (the tracker, the module call path and, where CUPTI is found,
the accounting outside the allocator), once per torch, Python and
compiler, under the cache's build lock (``_build._BuildLock``).

Who runs it:

- ``vramscope run`` before it starts the command (with the command's own
  Python), so that the job finds the build cached and is exact from its
  first allocation;
- ``vramscope agent build`` (``--force``: try again what failed before);
- the agent itself, detached (``--detached``: a new session, so it
  outlives the job), when a job imported it without ``run`` and the build
  is missing; the job runs in sampled mode meanwhile.

The common case must be cheap (``run`` adds it to every start): a stamp
file ``ready-<key>.json`` in the cache says what was built for a key made
without importing torch (this Python, torch's files, the compiler and
headers found, the environment that changes the build, the agent's
sources). Only when the stamp is missing or a library it names no longer
verifies is torch imported and the lock taken.

Exit status: 0 ready (cached or built), 1 a build failed (one line on
stderr), 3 nothing to build here (no torch, a CPU-only torch, an allocator
that refuses trackers, VRAMSCOPE_MODE sampled or off). With ``--json`` one
JSON object on stdout says what was found.
"""

import hashlib
import json
import os
import sys
import threading
import time

from . import _build

NOTHING = 3
_ENV_KEYS = (
    "CXX",
    "VRAMSCOPE_CXX",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_ROOT",
    "VRAMSCOPE_CUDA_INCLUDE",
    "VRAMSCOPE_VARIANT",
    "VRAMSCOPE_ATTRIBUTION_NATIVE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "VRAMSCOPE_MODE",
    "VRAMSCOPE_OUTSIDE",
)


def _say(msg):
    try:
        sys.stderr.write("vramscope: %s\n" % msg)
        sys.stderr.flush()
    except Exception:
        pass


def _stat_word(path):
    try:
        st = os.stat(path)
        return "%d:%d:%d" % (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        return "-"


def stamp_key():
    """The key of this environment's build, made without importing torch;
    None when torch is not installed here."""
    root = _build.torch_root_without_import()
    if not root:
        return None
    h = hashlib.sha256()
    parts = [
        _build.AGENT_VERSION,
        os.path.realpath(sys.executable),
        sys.version,
        root,
        _stat_word(os.path.join(root, "version.py")),
        _stat_word(os.path.join(root, "lib", "libc10.so")),
        _stat_word(os.path.join(root, "lib", "libc10_cuda.so")),
        repr(_build.find_compiler()),
        repr(_build.find_cuda_include()[0]),
        repr(_build.python_include()[0]),
    ]
    parts += ["%s=%s" % (k, os.environ.get(k, "")) for k in _ENV_KEYS]
    sources = _build.source_files() + (_build.fast_source(), _build.outside_source())
    for f in sources + (os.path.join(_build._HERE, "_build.py"),):
        parts.append(_stat_word(f) if f else "-")
        if f:
            try:
                with open(f, "rb") as fh:
                    h.update(fh.read())
            except OSError:
                pass
    for p in parts:
        h.update(b"\0" + str(p).encode("utf-8", "replace"))
    return h.hexdigest()[:20]


def _stamp_path(key):
    return os.path.join(_build.cache_dir(), "ready-%s.json" % key)


def read_stamp(key):
    """What the stamp for `key` says, when every library it names still
    verifies; else None."""
    if key is None or _build.private_problem(_build.cache_dir()) is not None:
        return None
    raw = _build._read_private(_stamp_path(key), os.geteuid(), lambda fd: os.read(fd, 1 << 16))
    if raw is None:
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    for what in ("tracker", "fastcall", "outside"):
        p = doc.get(what)
        if p is not None and (not isinstance(p, str) or not _build.verified_library(p)):
            return None
    return doc


def _write_stamp(key, doc):
    if key is None or _build.private_problem(_build.cache_dir()) is not None:
        return
    _build._write_private(_stamp_path(key), json.dumps(doc) + "\n")


def _nothing_reason():
    """Why no build is wanted here, from the environment alone (no torch
    import), or None."""
    mode = (os.environ.get("VRAMSCOPE_MODE") or "auto").strip().lower()
    if mode in ("off", "0", "none", "disabled", "sampled"):
        return "VRAMSCOPE_MODE=%s" % mode
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
    if "cudaMallocAsync" in conf:
        return "the allocator (cudaMallocAsync) refuses trackers"
    return None


class _Progress:
    """One progress line on stderr: what is built, "first run only", the
    time it took (rewritten each second on a terminal)."""

    def __init__(self, what, quiet):
        self.what = what
        self.quiet = quiet
        self.start = time.monotonic()
        self.done = threading.Event()
        self.tty = False
        try:
            self.tty = sys.stderr.isatty()
        except Exception:
            pass

    def begin(self):
        self.start = time.monotonic()
        if self.quiet:
            return
        self._write("\rvramscope: building %s (first run only) ..." % self.what)
        if self.tty:
            threading.Thread(target=self._tick, daemon=True).start()

    def _tick(self):
        while not self.done.wait(1.0):
            self._write("\rvramscope: building %s (first run only) ... %d s" % (self.what, time.monotonic() - self.start))

    def end(self, ok, detail):
        self.done.set()
        if self.quiet:
            return
        took = time.monotonic() - self.start
        if self.tty:
            self._write("\r\033[K")
            head = "vramscope: built %s (first run only)" % self.what if ok else "vramscope: building %s failed" % self.what
            self._write("%s in %.1f s%s\n" % (head, took, detail))
        else:
            self._write(" %s in %.1f s%s\n" % ("done" if ok else "failed", took, detail))

    def _write(self, text):
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except Exception:
            pass


def _outside_cached():
    """(wanted, path): whether the accounting outside the allocator can be
    built here (on, a compiler and CUPTI found), and its cached library
    (None: not built yet)."""
    if os.environ.get("VRAMSCOPE_OUTSIDE", "1") == "0":
        return False, None
    try:
        return True, _build.build_outside(cached_only=True)
    except _build.BuildError:
        return False, None


def ensure(force=False, quiet=False):
    """Builds what is missing. Returns (exit status, a dict saying what was
    found: status, tracker, fastcall, reason, seconds)."""
    _build.clean_if_idle()
    key = stamp_key()
    if key is None:
        return NOTHING, {"status": "nothing", "reason": "torch is not installed for %s" % sys.executable}
    why = _nothing_reason()
    if why is not None:
        return NOTHING, {"status": "nothing", "reason": why}
    if not force:
        doc = read_stamp(key)
        if doc is not None:
            doc["status"] = "cached"
            return (0 if doc.get("tracker") else 1), doc
    try:
        import torch
    except Exception as e:
        return NOTHING, {"status": "nothing", "reason": "cannot import torch: %s: %s" % (type(e).__name__, str(e).split("\n")[0])}
    if not getattr(getattr(torch, "version", None), "cuda", None):
        return NOTHING, {"status": "nothing", "reason": "torch %s is a CPU-only build" % torch.__version__}
    tf, tv = torch.__file__, str(torch.__version__)
    try:
        abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    except Exception:
        abi = 1
    variant = os.environ.get("VRAMSCOPE_VARIANT", "")
    native = os.environ.get("VRAMSCOPE_ATTRIBUTION_NATIVE", "1") != "0"
    # Both cached already (another process built them): nothing to say.
    # (cached_only: None unless the cache is private and holds it.)
    have_t = _build.build(tf, tv, abi, variant, cached_only=True)
    have_f = _build.build_fast(tf, tv, abi, cached_only=True) if native else None
    outside, have_o = _outside_cached()
    doc = {"status": "cached", "torch": tv, "tracker": have_t, "fastcall": have_f, "outside": have_o}
    if have_t and (have_f or not native) and (have_o or not outside) and not force:
        _write_stamp(key, doc)
        return 0, doc
    parts = ["the tracker"] + (["the module call path"] if native else [])
    parts += ["the accounting outside the allocator"] if outside else []
    what = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    prog = _Progress("%s for torch %s" % (what, tv), quiet)
    notes = []
    status, reason = 0, ""
    root = _build.cache_dir()
    lock = None
    if _build.private_problem(root) is None:
        # Eight ranks at once: one builds, the others say they wait, then
        # find what it built.
        try:
            lock = _build._BuildLock(root, None if quiet else _say).acquire()
        except _build.BuildError as e:
            return 1, dict(doc, status="failed", reason=str(e))
        _build.clean_stale(root)
    try:
        if lock is not None and lock.waited and not force:
            have_t = _build.build(tf, tv, abi, variant, cached_only=True)
            have_f = _build.build_fast(tf, tv, abi, cached_only=True) if native else None
            have_o = _outside_cached()[1]
            if have_t and (have_f or not native) and (have_o or not outside):
                doc.update(status="cached", tracker=have_t, fastcall=have_f, outside=have_o)
                if not quiet:
                    _say("built by the other process: %s" % have_t)
                _write_stamp(key, doc)
                return 0, doc
        prog.begin()
        try:
            doc["tracker"] = _build.build(tf, tv, abi, variant, warn=notes.append, force=force)
        except _build.BuildError as e:
            status, reason = 1, str(e)
        if native:
            try:
                doc["fastcall"] = _build.build_fast(tf, tv, abi, warn=notes.append, force=force)
            except _build.BuildError as e:
                notes.append("module calls stay in Python: %s" % e)
        if outside:
            # Built before the job, so that the agent subscribes as CUDA
            # starts and what it measures then is the context alone.
            try:
                doc["outside"] = _build.build_outside(warn=notes.append, force=force)
            except _build.BuildError as e:
                notes.append("memory outside the allocator will not be named: %s" % e)
    finally:
        if lock is not None:
            lock.release()
    _build.discard_fresh()
    doc["seconds"] = round(time.monotonic() - prog.start, 2)
    if status == 0:
        doc["status"] = "built"
        prog.end(True, " (cached in %s)" % os.path.dirname(doc["tracker"]))
        _write_stamp(key, doc)
    else:
        doc["status"] = "failed"
        doc["reason"] = reason
        prog.end(False, ": %s" % reason)
        if "earlier build failed" in reason:
            _write_stamp(key, doc)  # (not tried again until forced or changed)
    for n in notes:
        if not quiet:
            _say(n)
    return status, doc


def spawn_detached():
    """Starts ``python -m vramscope._ensure --detached`` in a new session
    (it outlives the job; terminal signals to the job's group never reach
    it). Returns the Popen, or None when it could not start."""
    import subprocess

    env = dict(os.environ)
    here = os.path.dirname(_build._HERE)
    pp = env.get("PYTHONPATH", "")
    if here not in pp.split(os.pathsep):
        env["PYTHONPATH"] = here + (os.pathsep + pp if pp else "")
    env.pop("VRAMSCOPE_AUTO", None)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "vramscope._ensure", "--detached", "--quiet"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
            start_new_session=True,
        )
    except Exception:
        return None


def _signals(detached):
    """SIGTERM (and SIGHUP, Ctrl-C) end a build cleanly: the temporary
    file is removed on the way out. Detached, the job's terminal is not
    ours: SIGHUP and SIGINT are ignored. Not detached, SIGINT ends it even
    where it was inherited ignored (a build started from a script's
    background job): Python keeps an ignored SIGINT ignored otherwise."""
    import signal

    def term(signum, frame):
        raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, term)
        if detached:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGHUP, term)
            signal.signal(signal.SIGINT, term)
    except Exception:
        pass


def _delay_for_tests():
    """VRAMSCOPE_TEST_BUILD_DELAY: seconds the build waits before it starts
    (the tests' way to force a late start)."""
    try:
        d = float(os.environ.get("VRAMSCOPE_TEST_BUILD_DELAY", "") or 0)
    except ValueError:
        d = 0
    if d > 0:
        time.sleep(min(d, 600))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    _signals("--detached" in argv)
    if "--detached" in argv:
        _delay_for_tests()
    status, doc = ensure(force="--force" in argv, quiet="--quiet" in argv)
    if "--json" in argv:
        print(json.dumps(doc))
    return status


if __name__ == "__main__":
    sys.exit(main())
