"""Finding a compiler and headers, and building the tracker on first use.

This module is the one implementation of the search: the agent uses it to
build, and ``python3 -m vramscope.doctor`` (called by ``vramscope doctor``)
uses it to explain what is missing. It never imports torch itself: callers
pass what they know (the agent has torch imported; the doctor imports it).
"""

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

AGENT_VERSION = "0.1.0"

_HERE = os.path.dirname(os.path.abspath(__file__))


def source_files():
    """(tracker.cpp, vramscope_ring.h): next to the package when extracted by
    the vramscope binary, or in its parent directory in the repository."""
    for base in (_HERE, os.path.dirname(_HERE)):
        cpp = os.path.join(base, "tracker.cpp")
        hdr = os.path.join(base, "vramscope_ring.h")
        if os.path.isfile(cpp) and os.path.isfile(hdr):
            return cpp, hdr
    return None, None


def cache_dir():
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "vramscope")


def find_compiler():
    """(path or None, how it was chosen or why none)."""
    forced = os.environ.get("VRAMSCOPE_CXX")
    if forced:
        path = shutil.which(forced)
        if path:
            return path, "VRAMSCOPE_CXX=" + forced
        return None, "VRAMSCOPE_CXX=%s is not an executable" % forced
    env = os.environ.get("CXX")
    if env:
        path = shutil.which(env.split()[0]) if env.split() else None
        if path:
            return path, "CXX=" + env
    for name in ("c++", "g++", "clang++"):
        path = shutil.which(name)
        if path:
            return path, "found on PATH"
    return None, "no C++ compiler (c++, g++, clang++) on PATH and no CXX/VRAMSCOPE_CXX"


def torch_dirs(torch_file):
    """(include dirs, lib dir) of a torch installation given torch.__file__."""
    root = os.path.dirname(os.path.abspath(torch_file))
    inc = os.path.join(root, "include")
    return [inc, os.path.join(inc, "torch", "csrc", "api", "include")], os.path.join(root, "lib")


def torch_root_without_import():
    """torch's package directory, found without importing torch."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec and spec.submodule_search_locations:
            return list(spec.submodule_search_locations)[0]
    except Exception:
        pass
    return None


def _cuda_candidates():
    seen = []

    def add(p):
        if p and p not in seen:
            seen.append(p)

    for var in ("VRAMSCOPE_CUDA_INCLUDE",):
        add(os.environ.get(var))
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        v = os.environ.get(var)
        if v:
            add(os.path.join(v, "include"))
    add("/usr/local/cuda/include")
    for p in sorted(glob.glob("/usr/local/cuda-*/include"), reverse=True):
        add(p)
    for p in sorted(glob.glob("/opt/cuda*/include"), reverse=True):
        add(p)
    # pip's nvidia packages: nvidia/cu13/include (CUDA 13 wheels) or
    # nvidia/cuda_runtime/include, nvidia/cuda_nvcc/include, ... (CUDA 12).
    for sp in sys.path:
        if sp and os.path.isdir(os.path.join(sp, "nvidia")):
            for p in sorted(glob.glob(os.path.join(sp, "nvidia", "*", "include"))):
                add(p)
    add("/usr/include")
    return [p for p in seen if os.path.isdir(p)]


def find_cuda_include():
    """(list of include dirs or None, explanation).

    The tracker needs cuda_runtime_api.h and what it includes, notably
    crt/host_config.h (the pip CUDA 13 runtime wheel lacks it: it lives in
    the nvidia-cuda-crt wheel or a CUDA toolkit)."""
    cands = _cuda_candidates()
    runtime = [p for p in cands if os.path.isfile(os.path.join(p, "cuda_runtime_api.h"))]
    crt = [p for p in cands if os.path.isfile(os.path.join(p, "crt", "host_config.h"))]
    for r in runtime:
        if r in crt:
            return [r], "cuda_runtime_api.h and crt/host_config.h in " + r
    if runtime and crt:
        return [runtime[0], crt[0]], "cuda_runtime_api.h in %s, crt/host_config.h in %s" % (runtime[0], crt[0])
    if runtime:
        return None, (
            "cuda_runtime_api.h found in %s but crt/host_config.h is missing everywhere "
            "(searched: %s); install a CUDA toolkit or the nvidia-cuda-crt wheel matching "
            "your CUDA, or set CUDA_HOME" % (", ".join(runtime), ", ".join(cands) or "nothing")
        )
    return None, (
        "no CUDA headers (cuda_runtime_api.h) found (searched: %s); install a CUDA toolkit "
        "or set CUDA_HOME / VRAMSCOPE_CUDA_INCLUDE" % (", ".join(cands) or "nothing")
    )


def cxx_std(torch_version):
    """c++20 for torch >= 2.12 (its headers need it), c++17 before."""
    try:
        parts = torch_version.split("+")[0].split(".")
        major, minor = int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
        if (major, minor) >= (2, 12):
            return "c++20"
    except Exception:
        pass
    return "c++17"


def build_command(cxx, cpp, torch_file, torch_version, abi, cuda_inc, out, variant=""):
    incs, lib = torch_dirs(torch_file)
    cmd = [cxx, "-O2", "-shared", "-fPIC", "-std=" + cxx_std(torch_version), "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(abi)]
    if variant == "empty":
        cmd.append("-DVS_EMPTY_TRACKER")
    cmd += ["-I", os.path.dirname(cpp)]
    for i in incs + list(cuda_inc):
        cmd += ["-isystem", i]
    cmd += [cpp, "-o", out, "-L" + lib, "-Wl,-rpath," + lib, "-lc10_cuda", "-lc10", "-pthread"]
    return cmd


def _key(cpp, hdr, cxx, torch_version, abi, cuda_inc, variant):
    h = hashlib.sha256()
    for path in (cpp, hdr):
        with open(path, "rb") as f:
            h.update(f.read())
    for part in (cxx, torch_version, str(abi), AGENT_VERSION, variant, sys.version) + tuple(cuda_inc):
        h.update(b"\0" + str(part).encode())
    return h.hexdigest()[:16]


class BuildError(Exception):
    pass


def build(torch_file, torch_version, abi, variant=""):
    """Returns the path of the tracker library, building it if needed.

    Raises BuildError with a one-line reason (what is missing) otherwise.
    Concurrent processes (DDP ranks) each build into a temporary file and
    rename it into place; the rename is atomic, so every process loads a
    complete library."""
    cpp, hdr = source_files()
    if not cpp:
        raise BuildError("tracker source (tracker.cpp, vramscope_ring.h) not found next to %s" % _HERE)
    incs, _ = torch_dirs(torch_file)
    if not os.path.isfile(os.path.join(incs[0], "c10", "cuda", "CUDACachingAllocator.h")):
        raise BuildError("torch headers missing: %s has no c10/cuda/CUDACachingAllocator.h" % incs[0])
    cxx, why = find_compiler()
    if not cxx:
        raise BuildError(why)
    cuda_inc, why = find_cuda_include()
    if cuda_inc is None:
        raise BuildError(why)
    key = _key(cpp, hdr, cxx, torch_version, abi, cuda_inc, variant)
    tv = "".join(c if c.isalnum() or c in ".-_" else "_" for c in torch_version)
    name = "tracker-torch%s-abi%d-%s-%s%s.so" % (tv, int(abi), AGENT_VERSION, key, "-" + variant if variant else "")
    out_dir = cache_dir()
    out = os.path.join(out_dir, name)
    if os.path.isfile(out):
        return out
    try:
        os.makedirs(out_dir, mode=0o700, exist_ok=True)
    except OSError as e:
        raise BuildError("cannot create cache directory %s: %s" % (out_dir, e))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-%s-" % name, suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = build_command(cxx, cpp, torch_file, torch_version, abi, cuda_inc, tmp, variant)
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    except Exception as e:
        _rm(tmp)
        raise BuildError("running %s failed: %s" % (cxx, e))
    if r.returncode != 0:
        _rm(tmp)
        log = out + ".log"
        try:
            with open(log, "wb") as f:
                f.write((" ".join(cmd) + "\n\n").encode() + r.stdout)
        except OSError:
            log = "(log not written)"
        first = next((l for l in r.stdout.decode("utf-8", "replace").splitlines() if "error" in l), "")
        raise BuildError("compiling the tracker failed: %s (full log: %s)" % (first.strip()[:200], log))
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)
    return out


def _rm(p):
    try:
        os.unlink(p)
    except OSError:
        pass
