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
import stat
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
    """Where built trackers are cached: ``$XDG_CACHE_HOME/vramscope``, else
    ``$HOME/.cache/vramscope``, else ``$TMPDIR/vramscope-cache-<euid>`` (the
    vramscope binary's choice too). Used only when private to this user (see
    ``private_problem``)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "vramscope")
    home = os.environ.get("HOME", "")
    if os.path.isabs(home):
        return os.path.join(home, ".cache", "vramscope")
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", "vramscope-cache-%d" % os.geteuid())


def _ancestor_problem(path, st, uid):
    """A directory on the way to a private one: owned by root or `uid`, not
    writable by others unless sticky."""
    if not stat.S_ISDIR(st.st_mode):
        return "%s is not a directory" % path
    if st.st_uid not in (0, uid):
        return "%s is owned by uid %d" % (path, st.st_uid)
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return "%s is writable by other users (mode %o)" % (path, stat.S_IMODE(st.st_mode))
    return None


def _private_entry_problem(path, st, uid):
    """An entry (from lstat or fstat) that only `uid` can change."""
    if stat.S_ISLNK(st.st_mode):
        return "%s is a symbolic link" % path
    if st.st_uid != uid:
        return "%s is owned by uid %d, not %d" % (path, st.st_uid, uid)
    if st.st_mode & 0o022:
        return "%s is writable by group or others (mode %o)" % (path, stat.S_IMODE(st.st_mode))
    return None


def _chain_problem(path, uid):
    """Every directory from / to `path`, symbolic links followed one
    component at a time (each owned by root or `uid`): None when no other
    user can change where `path` leads, else why."""
    if not os.path.isabs(path):
        return "%s is not an absolute path" % path
    try:
        why = _ancestor_problem("/", os.stat("/"), uid)
        if why:
            return why
        todo = [c for c in reversed(path.split("/")) if c not in ("", ".")]
        cur, links = "/", 0
        while todo:
            c = todo.pop()
            if c == "..":
                cur = os.path.dirname(cur) or "/"
                continue
            nxt = os.path.join(cur, c)
            st = os.lstat(nxt)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > 40 or st.st_uid not in (0, uid):
                    return "%s is a symbolic link owned by uid %d" % (nxt, st.st_uid)
                target = os.readlink(nxt)
                if target.startswith("/"):
                    cur = "/"
                todo.extend(c2 for c2 in reversed(target.split("/")) if c2 not in ("", "."))
                continue
            why = _ancestor_problem(nxt, st, uid)
            if why:
                return why
            cur = nxt
    except OSError as e:
        return str(e)
    return None


def private_problem(root):
    """Makes `root` a directory private to this user if it can: created
    (0700) when missing, it must be ours, no symbolic link, writable by no
    one else, on a path no other user can change. None, or why not."""
    uid = os.geteuid()
    if not os.path.isabs(root):
        return "%s is not an absolute path" % root
    parent = os.path.dirname(root)
    try:
        if not os.path.lexists(parent):
            os.makedirs(parent, mode=0o700, exist_ok=True)
    except OSError as e:
        return "creating %s: %s" % (parent, e)
    why = _chain_problem(parent, uid)
    if why:
        return why
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        return "creating %s: %s" % (root, e)
    try:
        st = os.lstat(root)
    except OSError as e:
        return str(e)
    why = _private_entry_problem(root, st, uid)
    if why:
        return why
    if not stat.S_ISDIR(st.st_mode):
        return "%s is not a directory" % root
    return None


_fresh = []


def discard_fresh():
    """Removes the fresh private directories made by ``build`` (once what it
    built is loaded, or not wanted)."""
    while _fresh:
        shutil.rmtree(_fresh.pop(), ignore_errors=True)


def _fresh_private_dir():
    """A new directory (0700, made by mkdtemp: never one that existed) under
    the first of $TMPDIR, /tmp, /dev/shm whose path no other user can change."""
    uid = os.geteuid()
    whys = []
    for parent in (os.environ.get("TMPDIR") or "/tmp", "/tmp", "/dev/shm"):
        why = _chain_problem(parent, uid)
        if why:
            whys.append(why)
            continue
        try:
            d = tempfile.mkdtemp(prefix="vramscope-build-%d-" % uid, dir=parent)
            _fresh.append(d)
            return d
        except OSError as e:
            whys.append(str(e))
    raise BuildError("no private directory to build the tracker in: %s" % "; ".join(whys))


def build_dir():
    """(directory, note): the cache when private to this user; otherwise a
    fresh private directory and a one-line note saying so."""
    root = cache_dir()
    why = private_problem(root)
    if why is None:
        return root, None
    fresh = _fresh_private_dir()
    return fresh, "not using the build cache (%s is not private to this user: %s); building in %s" % (root, why, fresh)


def _digest_fd(fd):
    h = hashlib.sha256()
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return h.hexdigest()
        h.update(chunk)


def _read_private(path, uid, read):
    """`read(fd)` of `path` when it is a regular file of ours writable by no
    one else (never through a symlink); None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or _private_entry_problem(path, st, uid):
            return None
        return read(fd)
    finally:
        os.close(fd)


def verified_library(path):
    """Whether the cached library `path` may be loaded: a regular file of
    ours writable by no one else, whose SHA-256 is the one recorded beside
    it (``<path>.sha256``) when it was built."""
    uid = os.geteuid()
    digest = _read_private(path, uid, _digest_fd)
    if digest is None:
        return False
    recorded = _read_private(
        path + ".sha256",
        uid,
        lambda fd: os.read(fd, 256).decode("ascii", "replace").strip(),
    )
    return recorded == digest


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


def tracker_name(torch_file, torch_version, abi, variant=""):
    """The cached tracker's file name for this torch, compiler and headers,
    or None when one of them is missing (``build`` says which)."""
    try:
        return _tracker_spec(torch_file, torch_version, abi, variant)[0]
    except BuildError:
        return None


def _tracker_spec(torch_file, torch_version, abi, variant):
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
    key = _key((cpp, hdr), (cxx, torch_version, str(abi), variant) + tuple(cuda_inc))
    tv = "".join(c if c.isalnum() or c in ".-_" else "_" for c in torch_version)
    name = "tracker-torch%s-abi%d-%s-%s%s.so" % (tv, int(abi), AGENT_VERSION, key, "-" + variant if variant else "")
    return name, lambda out: build_command(cxx, cpp, torch_file, torch_version, abi, cuda_inc, out, variant)


def build(torch_file, torch_version, abi, variant="", warn=None, cached_only=False, force=False, lock_say=None):
    """Returns the path of the tracker library, building it if needed.

    Raises BuildError with a one-line reason (what is missing) otherwise.
    The library is cached only in a directory private to this user
    (``build_dir``); a cached one is reused only when ``verified_library``
    (ours, and its content the one recorded when it was built), and rebuilt
    otherwise (`cached_only`: returns None instead of building). When the
    cache is not private, the library is built in a
    fresh private directory and `warn` gets one line saying so.
    Concurrent processes (DDP ranks) build once: the others wait on the
    cache's build lock and then find the library (``_cached_build``)."""
    name, command = _tracker_spec(torch_file, torch_version, abi, variant)
    return _cached_build(
        name,
        command,
        "the tracker",
        warn,
        cached_only,
        force,
        lock_say,
    )


def fast_source():
    """fastcall.cpp (the native module call path), found like tracker.cpp."""
    for base in (_HERE, os.path.dirname(_HERE)):
        cpp = os.path.join(base, "fastcall.cpp")
        if os.path.isfile(cpp):
            return cpp
    return None


def python_include():
    """(directory holding this Python's Python.h, or None; why not)."""
    import sysconfig

    seen = []
    for key in ("include", "platinclude"):
        d = sysconfig.get_paths().get(key)
        if d and d not in seen:
            seen.append(d)
            if os.path.isfile(os.path.join(d, "Python.h")):
                return d, None
    return None, "no Python.h for Python %s (looked in %s); install the Python development headers (e.g. python%d.%d-dev)" % (
        sys.version.split()[0],
        ", ".join(seen) or "nothing",
        sys.version_info[0],
        sys.version_info[1],
    )


def fast_build_command(cxx, cpp, pyinc, out, torch_file=None, torch_version=None, abi=None):
    # (-fno-plt: a module call's calls into Python go through the GOT, one
    # cold line fewer than a PLT stub; -DNDEBUG as Python's own extensions.)
    cmd = [cxx, "-O2", "-shared", "-fPIC", "-fno-plt", "-DNDEBUG"]
    if torch_file is None:
        return cmd + ["-std=c++17", "-isystem", pyinc, cpp, "-o", out, "-pthread"]
    incs, lib = torch_dirs(torch_file)
    cmd += ["-std=" + cxx_std(torch_version), "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(abi), "-DVS_TORCH", "-isystem", pyinc]
    for i in incs:
        cmd += ["-isystem", i]
    return cmd + [cpp, "-o", out, "-L" + lib, "-Wl,-rpath," + lib, "-ltorch_python", "-ltorch", "-ltorch_cpu", "-lc10", "-pthread"]


def build_fast(torch_file=None, torch_version=None, abi=1, warn=None, cached_only=False, force=False, lock_say=None):
    """The path of the native module call path (vramscope._vsfast), built
    for this Python if needed and cached like the tracker. With torch's
    headers (`torch_file` given) it is built with them (C++ backward
    pre-hooks, see fastcall.cpp), else or when that fails once, without.
    Needs this Python's headers and a C++ compiler. Raises BuildError with
    a one-line reason; `cached_only`: None instead of building."""
    cpp = fast_source()
    if not cpp:
        raise BuildError("fastcall.cpp not found next to %s" % _HERE)
    pyinc, why = python_include()
    if not pyinc:
        raise BuildError(why)
    cxx, why = find_compiler()
    if not cxx:
        raise BuildError(why)
    py = "py%d%d" % sys.version_info[:2]
    if torch_file is not None:
        incs, _ = torch_dirs(torch_file)
        if os.path.isfile(os.path.join(incs[0], "torch", "csrc", "autograd", "python_variable.h")):
            key = _key((cpp,), (cxx, pyinc, torch_version, str(abi)))
            tv = "".join(c if c.isalnum() or c in ".-_" else "_" for c in torch_version)
            name = "fastcall-%s-torch%s-abi%d-%s-%s.so" % (py, tv, int(abi), AGENT_VERSION, key)
            # (Once it failed to compile, the variant without torch is used.)
            if force or failed_before(name) is None:
                try:
                    return _cached_build(
                        name,
                        lambda out: fast_build_command(cxx, cpp, pyinc, out, torch_file, torch_version, abi),
                        "the module call path with torch",
                        warn,
                        cached_only,
                        force,
                        lock_say,
                    )
                except BuildError as e:
                    if warn is not None:
                        warn("backward pre-hooks stay in Python: %s" % e)
    key = _key((cpp,), (cxx, pyinc))
    name = "fastcall-%s-%s-%s.so" % (py, AGENT_VERSION, key)
    return _cached_build(name, lambda out: fast_build_command(cxx, cpp, pyinc, out), "the module call path", warn, cached_only, force, lock_say)


def outside_source():
    """outside.cpp (accounting outside the caching allocator), found like
    tracker.cpp, with vramscope_ring.h beside it."""
    for base in (_HERE, os.path.dirname(_HERE)):
        cpp = os.path.join(base, "outside.cpp")
        if os.path.isfile(cpp) and os.path.isfile(os.path.join(base, "vramscope_ring.h")):
            return cpp
    return None


def find_cupti():
    """(cupti.h's directory, the libcupti torch loads) or (None, why).

    The library must be the one torch's profiler (Kineto) loads, or the
    process would hold two: the pip wheel's (nvidia/*/lib, CUDA 12 wheels:
    nvidia/cuda_cupti/lib) first, then a toolkit's extras/CUPTI."""
    libs, incs = [], []
    for sp in sys.path:
        if sp and os.path.isdir(os.path.join(sp, "nvidia")):
            for d in sorted(glob.glob(os.path.join(sp, "nvidia", "*"))):
                libs += sorted(glob.glob(os.path.join(d, "lib", "libcupti.so*")))
                incs.append(os.path.join(d, "include"))
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    for r in [r for r in roots if r]:
        libs += sorted(glob.glob(os.path.join(r, "extras", "CUPTI", "lib64", "libcupti.so*")))
        incs += [os.path.join(r, "extras", "CUPTI", "include"), os.path.join(r, "include")]
    inc = next((i for i in incs if os.path.isfile(os.path.join(i, "cupti.h"))), None)
    lib = next((l for l in libs if os.path.isfile(l)), None)
    if inc and lib:
        return inc, lib
    return None, "no CUPTI (cupti.h %s, libcupti %s; looked in the pip nvidia packages and CUDA_HOME/extras/CUPTI)" % (
        "found" if inc else "missing",
        "found" if lib else "missing",
    )


def build_outside(warn=None, cached_only=False, force=False, lock_say=None):
    """The path of the accounting outside the caching allocator
    (outside.cpp), built against the CUPTI torch loads and cached like the
    tracker. Raises BuildError with a one-line reason (no CUPTI, no
    compiler); `cached_only`: None instead of building."""
    cpp = outside_source()
    if not cpp:
        raise BuildError("outside.cpp not found next to %s" % _HERE)
    cxx, why = find_compiler()
    if not cxx:
        raise BuildError(why)
    inc, lib = find_cupti()
    if inc is None:
        raise BuildError(lib)
    # cupti.h includes cuda.h and what it includes (crt/host_defines.h: not
    # in the pip CUDA 13 wheel's include directory), found as the tracker's.
    cuda_inc, why = find_cuda_include()
    if cuda_inc is None:
        raise BuildError(why)
    hdr = os.path.join(os.path.dirname(cpp), "vramscope_ring.h")
    key = _key((cpp, hdr), (cxx, inc, lib) + tuple(cuda_inc))
    name = "outside-%s-%s.so" % (AGENT_VERSION, key)

    def command(out):
        cmd = [cxx, "-O2", "-shared", "-fPIC", "-std=c++17", "-I", os.path.dirname(cpp), "-isystem", inc]
        for i in cuda_inc:
            cmd += ["-isystem", i]
        return cmd + [cpp, "-o", out, lib, "-Wl,-rpath," + os.path.dirname(lib), "-ldl", "-pthread"]

    return _cached_build(name, command, "the accounting outside the allocator", warn, cached_only, force, lock_say)


def load_fast(path):
    """Imports the built module call path as vramscope._vsfast."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader("vramscope._vsfast", path)
    spec = importlib.util.spec_from_file_location("vramscope._vsfast", path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _key(files, parts):
    h = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            h.update(f.read())
    for part in tuple(parts) + (AGENT_VERSION, sys.version):
        h.update(b"\0" + str(part).encode())
    return h.hexdigest()[:16]


class BuildError(Exception):
    pass


# Every build in the cache runs under one lock (``build.lock``, flock):
# eight ranks started at once build once, the others wait and then find
# the library. Only the holder writes temporary files (``.building-…``),
# so whoever holds the lock may remove any it finds: what a killed build
# left. Temporary files of agents before the lock (``.tmp-tracker-…``,
# ``.tmp-fastcall-…``) are removed once an hour old.
LOCK_NAME = "build.lock"
_TMP_PREFIX = ".building-"
_LEGACY_TMP = (".tmp-tracker-", ".tmp-fastcall-")
_LEGACY_AGE = 3600.0
LOCK_WAIT = 900.0  # seconds a waiter waits for another process's build
_lock_depth = 0  # this process's holds of the lock (one flock, counted)


class _BuildLock:
    """The cache's build lock, held from ``acquire`` to ``release``.
    `say` gets one line when another process holds it (who, and that we
    wait). A lock not had within LOCK_WAIT raises BuildError."""

    def __init__(self, root, say=None):
        self.path = os.path.join(root, LOCK_NAME)
        self.say = say
        self.fd = None

    def acquire(self):
        import fcntl
        import time

        global _lock_depth
        if _lock_depth > 0:  # this process holds it already (ensure, then build)
            _lock_depth += 1
            self.fd = -1
            self.waited = False
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            st = os.fstat(fd)
            why = _private_entry_problem(self.path, st, os.geteuid())
            if why or not stat.S_ISREG(st.st_mode):
                raise BuildError("build lock refused: %s" % (why or "%s is not a regular file" % self.path))
            start = time.monotonic()
            said = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    pass
                if not said and self.say is not None:
                    holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
                    self.say("waiting for process %s, which is building the tracker for this torch (first run only)" % holder)
                    said = True
                if time.monotonic() - start > LOCK_WAIT:
                    raise BuildError("another process held the build lock %s for over %d s" % (self.path, LOCK_WAIT))
                time.sleep(0.1)
            os.ftruncate(fd, 0)
            os.pwrite(fd, b"%d\n" % os.getpid(), 0)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.waited = said
        _lock_depth = 1
        return self

    def release(self):
        global _lock_depth
        if self.fd == -1:
            _lock_depth -= 1
            self.fd = None
            return
        if self.fd is not None:
            _lock_depth = 0
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass
            os.close(self.fd)  # (closing releases the flock)
            self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def clean_stale(root):
    """With the build lock held: removes the temporary files of builds that
    did not finish (killed, or their job exited), and legacy ones an hour
    old. Returns how many were removed."""
    import time

    n = 0
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    now = time.time()
    for name in names:
        path = os.path.join(root, name)
        if name.startswith(_TMP_PREFIX):
            stale = True
        elif name.startswith(_LEGACY_TMP):
            try:
                stale = now - os.lstat(path).st_mtime > _LEGACY_AGE
            except OSError:
                stale = False
        else:
            continue
        if stale:
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
                n += 1
            except OSError:
                pass
    return n


def clean_if_idle():
    """Removes what killed builds left when no build is under way (the lock
    is free): cheap enough for every ``vramscope run``. Never raises."""
    import fcntl

    root = cache_dir()
    try:
        if private_problem(root) is not None:
            return 0
        if not any(n.startswith(_TMP_PREFIX) or n.startswith(_LEGACY_TMP) for n in os.listdir(root)):
            return 0
        fd = os.open(os.path.join(root, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return 0
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return 0
    try:
        return clean_stale(root)
    finally:
        os.close(fd)


def failed_before(name):
    """The one-line reason an earlier build of `name` failed to compile
    (``<name>.failed`` in the cache), or None. A failed build is not tried
    again by jobs; ``vramscope agent build`` (force) tries again."""
    root = cache_dir()
    if private_problem(root) is not None:
        return None
    text = _read_private(os.path.join(root, name + ".failed"), os.geteuid(), lambda fd: os.read(fd, 1024))
    if text is None:
        return None
    return text.decode("utf-8", "replace").strip() or "an earlier build failed"


def _cached_build(name, command, what, warn, cached_only, force=False, lock_say=None):
    """`name` in the private cache, built by `command(out)` when missing or
    not verified (see ``build``), under the cache's build lock."""
    if cached_only and private_problem(cache_dir()) is not None:
        return None  # only a private cache is ever reused
    out_dir, note = build_dir()
    if note and warn is not None:
        warn(note)
    out = os.path.join(out_dir, name)
    if verified_library(out):
        return out
    if cached_only:
        return None
    if note:  # a fresh private directory: ours alone, no lock needed
        return _compile(out_dir, out, name, command, what)
    if not force:
        why = failed_before(name)
        if why is not None:
            raise BuildError("%s (an earlier build failed; `vramscope agent build` tries again)" % why)
    with _BuildLock(out_dir, lock_say):
        clean_stale(out_dir)
        if verified_library(out):  # built while we waited
            return out
        return _compile(out_dir, out, name, command, what)


def _compile(out_dir, out, name, command, what):
    """Compiles into a temporary file beside `out`, renamed into place when
    complete. The temporary file never outlives this call, whatever ends it
    (a failed compiler, a timeout, an exception or a signal turned into
    one); SIGKILL leaves it to the next lock holder's ``clean_stale``."""
    fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX + name + "-", suffix=".so", dir=out_dir)
    os.close(fd)
    stmp = None
    try:
        cmd = command(tmp)
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, stdin=subprocess.DEVNULL)
        except Exception as e:
            raise BuildError("running %s failed: %s" % (cmd[0], e))
        if r.returncode != 0:
            log = out + ".log"
            try:
                _rm(log)
                lfd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                with os.fdopen(lfd, "wb") as f:
                    f.write((" ".join(cmd) + "\n\n").encode() + r.stdout)
            except OSError:
                log = "(log not written)"
            first = next((l for l in r.stdout.decode("utf-8", "replace").splitlines() if "error" in l), "")
            why = "compiling %s failed: %s (full log: %s)" % (what, first.strip()[:200], log)
            _write_private(out + ".failed", why + "\n")
            raise BuildError(why)
        os.chmod(tmp, 0o700)
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            digest = _digest_fd(fd)
        finally:
            os.close(fd)
        sfd, stmp = tempfile.mkstemp(prefix=_TMP_PREFIX + name + "-", suffix=".sha256", dir=out_dir)
        with os.fdopen(sfd, "w") as f:
            f.write(digest + "\n")
        os.replace(stmp, out + ".sha256")
        stmp = None
        os.replace(tmp, out)
        tmp = None
        _rm(out + ".failed")
        return out
    except OSError as e:
        raise BuildError("storing %s in %s failed: %s" % (what, out_dir, e))
    finally:
        for p in (tmp, stmp):
            if p is not None:
                _rm(p)


def _write_private(path, text):
    """`text` into `path` (mode 0600, replacing it; never through a link)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            _rm(tmp)
            raise
    except OSError:
        pass


def _rm(p):
    try:
        os.unlink(p)
    except OSError:
        pass
