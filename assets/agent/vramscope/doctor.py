"""`python3 -m vramscope.doctor [--json] [--build]`: what the agent will find
in this Python environment (torch, compiler, headers) and what to do about
anything missing. `vramscope doctor` runs this and merges it with its own
checks (NVML, segment directory). Uses the same search as the agent build.
"""

import json
import os
import subprocess
import sys

from . import _build


def _check(name, level, detail, fix=""):
    return {"name": name, "level": level, "detail": detail, "fix": fix}


def checks(build=False):
    out = []
    out.append(_check("python", "ok", "%s %s" % (sys.executable, sys.version.split()[0])))

    torch = None
    try:
        import torch  # noqa: F401

        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
        if cuda:
            out.append(_check("torch", "ok", "torch %s (CUDA %s, C++11 ABI %d) at %s" % (torch.__version__, cuda, abi, os.path.dirname(torch.__file__))))
        else:
            out.append(
                _check(
                    "torch",
                    "warn",
                    "torch %s is a CPU-only build: there is no CUDA allocator to watch" % torch.__version__,
                    "install a CUDA build of PyTorch in this environment",
                )
            )
    except Exception as e:
        root = _build.torch_root_without_import()
        out.append(
            _check(
                "torch",
                "fail",
                "cannot import torch with %s: %s: %s%s"
                % (sys.executable, type(e).__name__, str(e).splitlines()[0] if str(e) else "", " (found at %s)" % root if root else ""),
                "run doctor with your training environment's Python (VRAMSCOPE_PYTHON=/path/to/python), or pip install torch",
            )
        )
        torch = None

    root = os.path.dirname(torch.__file__) if torch is not None else _build.torch_root_without_import()
    if root:
        incs, _ = _build.torch_dirs(os.path.join(root, "__init__.py"))
        hdr = os.path.join(incs[0], "c10", "cuda", "CUDACachingAllocator.h")
        if os.path.isfile(hdr):
            out.append(_check("torch headers", "ok", incs[0]))
        else:
            out.append(
                _check(
                    "torch headers",
                    "fail",
                    "%s is missing: the exact tracker cannot be built (sampled mode only)" % hdr,
                    "use a PyTorch wheel that ships its C++ headers (all official wheels do)",
                )
            )
    else:
        out.append(_check("torch headers", "fail", "torch not found on sys.path", "pip install torch"))

    cxx, why = _build.find_compiler()
    if cxx:
        try:
            ver = subprocess.run([cxx, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20).stdout.decode("utf-8", "replace").splitlines()[0]
        except Exception as e:
            ver = "(--version failed: %s)" % e
        out.append(_check("C++ compiler", "ok", "%s: %s (%s)" % (cxx, ver, why)))
    else:
        out.append(
            _check(
                "C++ compiler",
                "warn",
                why + ": the agent falls back to sampled mode (statistics and snapshots, no per-event timeline)",
                "install g++ (e.g. apt-get install g++), or set VRAMSCOPE_CXX",
            )
        )

    inc, why = _build.find_cuda_include()
    if inc:
        out.append(_check("CUDA headers", "ok", why))
    else:
        out.append(_check("CUDA headers", "warn", why + "; the agent falls back to sampled mode", "install the CUDA toolkit headers matching torch.version.cuda, or set CUDA_HOME"))

    pyinc, why = _build.python_include()
    if pyinc:
        out.append(_check("Python headers", "ok", "%s/Python.h: module calls take the native attribution path" % pyinc))
    else:
        out.append(
            _check(
                "Python headers",
                "warn",
                why + ": module attribution runs in Python (about 2-3 us more per module call; see the README's Troubleshooting, what attribution costs)",
                "install them, or set VRAMSCOPE_ATTRIBUTION=0 on small-batch loops that cannot spare it",
            )
        )

    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
    if "cudaMallocAsync" in conf:
        out.append(_check("allocator", "warn", "backend:cudaMallocAsync refuses trace trackers: sampled mode", "use the native allocator for exact events"))
    else:
        out.append(_check("allocator", "ok", "native caching allocator (PYTORCH_CUDA_ALLOC_CONF=%r)" % conf.strip(",")))

    mode = os.environ.get("VRAMSCOPE_MODE", "auto")
    out.append(_check("mode", "ok" if mode in ("auto", "exact", "sampled") else "warn", "VRAMSCOPE_MODE=%s" % mode))

    cache = _build.cache_dir()
    why = _build.private_problem(cache)
    if why is None:
        out.append(_check("build cache", "ok", cache + " is private to this user"))
    else:
        out.append(
            _check(
                "build cache",
                "warn",
                "%s is not private to this user (%s): the tracker is built in a fresh private directory every time" % (cache, why),
                "set XDG_CACHE_HOME to a directory of yours that only you can write",
            )
        )

    out.extend(_built(torch, build))
    return out


def _built(torch, build):
    """What is built for this torch and Python ("tracker build", "native
    calls"): with `build`, what is missing is built first (under the build
    lock, as `vramscope agent build`)."""
    if torch is None or not getattr(getattr(torch, "version", None), "cuda", None):
        return []
    out = []
    took = ""
    if build:
        from . import _ensure

        status, doc = _ensure.ensure(quiet=True)
        if doc.get("status") == "built":
            took = " (built now in %.1f s)" % doc.get("seconds", 0)
        elif status == _ensure.NOTHING:
            return [_check("tracker build", "warn", "nothing built: %s" % doc.get("reason", "?"))]
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    variant = os.environ.get("VRAMSCOPE_VARIANT", "")
    try:
        path = _build.build(torch.__file__, torch.__version__, abi, variant, cached_only=True)
    except _build.BuildError as e:
        return [_check("tracker build", "warn", "cannot be built: %s" % e, "sampled mode only; see the checks above")]
    name = _build.tracker_name(torch.__file__, torch.__version__, abi, variant)
    failed = _build.failed_before(name) if name else None
    if path:
        out.append(_check("tracker build", "ok", "built for torch %s: %s%s" % (torch.__version__, path, took)))
    elif failed:
        out.append(_check("tracker build", "fail", failed, "fix what the log says, then `vramscope agent build` tries again; sampled mode meanwhile"))
    else:
        out.append(
            _check(
                "tracker build",
                "warn",
                "not built yet for torch %s: a job started now would run sampled until it is" % torch.__version__,
                "`vramscope agent build` builds it now (about 20 s, once); `vramscope run` builds it before the job",
            )
        )
    try:
        fast = _build.build_fast(torch.__file__, torch.__version__, abi, cached_only=True)
    except _build.BuildError as e:
        out.append(_check("native calls", "warn", str(e), "module attribution runs in Python, slower"))
        return out
    if fast:
        with_torch = "-torch" in os.path.basename(fast)
        out.append(
            _check(
                "native calls",
                "ok" if with_torch else "warn",
                "built: %s (%s)" % (fast, "module calls and backward pre-hooks" if with_torch else "module calls only"),
                "" if with_torch else "backward pre-hooks run in Python, slower",
            )
        )
    else:
        out.append(_check("native calls", "warn", "not built yet", "`vramscope agent build` builds it with the tracker"))
    out.append(_outside_check())
    return out


def _outside_check():
    """Whether memory outside the caching allocator (the CUDA context,
    NCCL, cuBLAS, ...) will be named: off, impossible here (no CUPTI),
    built, or to be built."""
    name = "outside memory"
    if os.environ.get("VRAMSCOPE_OUTSIDE", "1") == "0":
        return _check(name, "ok", "off (VRAMSCOPE_OUTSIDE=0): NVML − reserved is shown as one figure")
    try:
        path = _build.build_outside(cached_only=True)
    except _build.BuildError as e:
        return _check(name, "warn", "not named: %s" % e, "install the CUPTI matching torch's CUDA (pip nvidia-cuda-cupti, or the toolkit's extras/CUPTI)")
    if path:
        return _check(name, "ok", "named by CUPTI: %s" % path)
    return _check(
        name,
        "warn",
        "not built yet: a job started now names it only once built, and calls what it finds then \"context and earlier\"",
        "`vramscope agent build` builds it; `vramscope run` builds it before the job",
    )


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    res = checks(build="--build" in argv)
    if "--json" in argv:
        print(json.dumps(res))
    else:
        for c in res:
            print("%-4s %-14s %s%s" % (c["level"].upper(), c["name"], c["detail"], ("\n     -> " + c["fix"]) if c["fix"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
