//! `vramscope attach PID`: instruments a Python process that is already
//! running, with no restart and no change to the job (issue 43, item 4).
//! From then on the job runs the agent as under `vramscope run`.
//!
//! # What runs in the job
//!
//! A short Python text, run on the job's main thread between two
//! bytecodes with the GIL held: it loads `vramscope/_remote.py` of the
//! extracted agent ([`crate::agent::extract`]) by its path (so a job that
//! imported a `vramscope` of its own still gets this one's entry point)
//! and calls `run(result, shm_dir, settle, agent_dir)`: it checks that
//! torch is imported and the agent not attached yet, puts the agent's
//! directory at the front of `sys.path` (unless the job imported a
//! `vramscope` already), sets `VRAMSCOPE_SHM_DIR` when `--shm-dir` was
//! given, calls `vramscope.attach(wait=False)` (which never blocks the
//! job: nothing is built on its thread) and writes a small JSON result
//! into a private directory this command made (mode 0700), which the
//! command waits for. A no-op attach changes nothing in the job. The text
//! is wrapped so that nothing escapes into the job: a `SystemExit` or any
//! exception is swallowed, and a failure is a result.
//!
//! # How it gets there
//!
//! - Python 3.14 and later: `sys.remote_exec(pid, script)` run by the
//!   target's own interpreter ([`remote_exec`]), CPython's supported way.
//! - Earlier ones (users' GPU machines run 3.12 and have no gdb): our own
//!   ptrace injector ([`ptrace`]), Linux x86-64 and aarch64 (glibc
//!   builds). It maps one page in the target with an injected `mmap`
//!   system call, writes the text there, and calls
//!   `Py_AddPendingCall(PyRun_SimpleString, page)` on the main thread:
//!   `PyRun_SimpleString(const char *)` has the signature of a pending
//!   call (`int (*)(void *)`), and `Py_AddPendingCall` may be called from
//!   any thread without the GIL. Then the registers go back exactly and
//!   the process is detached. The symbols come from the ELF files the
//!   process maps ([`elf`]: the python executable, which often holds
//!   libpython itself, or `libpython3.X.so`), placed by the load bias read
//!   from `/proc/PID/maps` ([`procfs`]); their bytes in the process are
//!   checked against the file before anything is touched.
//!
//! Why not the alternatives: gdb (or lldb) is not installed where users
//! run; pyinjector-style injectors `dlopen` a library, which calls into
//! the dynamic linker and malloc from a thread that may hold their locks
//! (and leaves a library in the job); calling `PyRun_SimpleString`
//! directly from the hijacked thread would need the GIL, which that
//! thread may hold or another may, and would run Python at an arbitrary
//! point of the C code. The pending call makes CPython itself pick a safe
//! point. Only two C functions of CPython run on the hijacked thread, and
//! nothing of libc.
//!
//! # Before anything is touched
//!
//! One line and exit 1 for: no such process (a dead pid, or one out of
//! range); a thread id instead of a process; another user's process (even
//! as root: the job's owner attaches); a process stopped or traced (a
//! debugger); one that has not imported torch (no `libc10`/`libtorch`
//! mapped); one that is not CPython (no `Py_AddPendingCall` and
//! `PyRun_SimpleString` in its executable or a libpython); another
//! architecture; ptrace refused (Yama's `ptrace_scope`, a missing
//! CAP_SYS_PTRACE, an undumpable process: which one, and what to do).
//! A process with a live segment of its own in the segment directory is
//! already instrumented: one line saying so (and its mode), exit 0,
//! without touching it. Attaching twice is therefore a no-op; the agent
//! checks again inside the job (a job instrumented with another segment
//! directory answers "already").
//!
//! # Then
//!
//! The agent's native parts are built with the job's own Python (its
//! virtual environment's, see [`job_python`]) as `vramscope run` does,
//! through [`crate::agent::prebuild_for`], before the job is touched: the
//! agent inside finds them cached and starts exact at once. A build that
//! fails is said on stderr, and the agent runs sampled.
//!
//! # After
//!
//! The command waits (`--timeout`, 30 s by default) for the result and
//! prints the mode the process is in: exact, sampled and why, waiting for
//! CUDA to be initialised, or already instrumented. The pending call runs
//! only when the main thread runs Python bytecode: a job blocked in a
//! long C call (or in `input()`) runs it afterwards; when no result came
//! in time, the line says so (the call stays queued).
//!
//! No `unsafe` here: `nix` wraps ptrace and waitpid, memory goes through
//! `/proc/PID/mem`, ELF files through `object`.

pub(crate) mod elf;
pub(crate) mod procfs;
#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub(crate) mod ptrace;
pub(crate) mod remote_exec;

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use vramscope_wire::ring::discover::{self, Located};

/// How `attach` was asked to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The segment directory (`--shm-dir`); the job is told it too.
    pub shm_dir: Option<PathBuf>,
    /// How long to wait for the job to answer.
    pub timeout: Duration,
}

/// What became of the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It was instrumented before (a live segment, or the agent said so):
    /// nothing was changed.
    Already { mode: String },
    /// The agent is attached now.
    Attached {
        /// exact, sampled, pending, ...
        mode: String,
        /// Why sampled (or what it waits for).
        reason: String,
        /// Whether the mode had settled when the command stopped waiting.
        settled: bool,
        /// Whether the job has initialised CUDA (None: unknown).
        cuda_initialized: Option<bool>,
    },
}

impl Outcome {
    /// The one line the command prints, for process `who` ("process 42 (python3)").
    pub fn line(&self, who: &str) -> String {
        match self {
            Outcome::Already { mode } => format!("{who}: already instrumented (mode {mode})"),
            Outcome::Attached {
                mode,
                reason,
                settled,
                cuda_initialized,
            } => match mode.as_str() {
                "exact" => format!("{who}: instrumented, exact mode (every allocator event)"),
                "sampled" if reason.is_empty() => format!("{who}: instrumented, sampled mode"),
                "sampled" => format!("{who}: instrumented, sampled mode: {reason}"),
                "pending" if *cuda_initialized == Some(false) => {
                    format!("{who}: instrumented; the agent starts when the job initialises CUDA")
                }
                "pending" if !settled => format!(
                    "{who}: instrumented; the agent is still starting (building its tracker?): \
                     `vramscope rings` shows its mode once it runs"
                ),
                m => format!(
                    "{who}: instrumented, mode {m}{}",
                    if reason.is_empty() {
                        String::new()
                    } else {
                        format!(": {reason}")
                    }
                ),
            },
        }
    }
}

/// A process as `/proc` shows it, before it is touched.
struct Target {
    pid: u32,
    status: procfs::Status,
    maps: Vec<procfs::Mapping>,
}

impl Target {
    /// "process 42 (python3)".
    fn who(&self) -> String {
        who(self.pid, &self.status.name)
    }
}

fn who(pid: u32, name: &str) -> String {
    if name.is_empty() {
        format!("process {pid}")
    } else {
        format!("process {pid} ({})", vramscope_text::printable(name))
    }
}

/// Instruments process `pid`; see the module's documentation.
pub fn attach(pid: u32, opts: &Options) -> Result<(String, Outcome)> {
    let status = read_status(pid)?;
    let me = discover::current_uid();
    let who_ = who(pid, &status.name);
    if status.uids.iter().any(|&u| u != me) {
        bail!(
            "{who_} belongs to another user (uid {}): vramscope attaches only to the processes of the user it runs as (uid {me}); run it as that user",
            status.uids[1]
        );
    }
    match status.state {
        'Z' | 'X' => bail!("{who_} has exited (it is a zombie waiting for its parent)"),
        'T' => bail!("{who_} is stopped (Ctrl-Z or SIGSTOP): resume it (`kill -CONT {pid}`) and attach again"),
        _ => {}
    }
    if status.tracer != 0 {
        bail!(
            "{who_} is being traced by process {} (a debugger or strace): detach it first",
            status.tracer
        );
    }
    if let Some(mode) = live_segment(pid, opts.shm_dir.as_deref()) {
        return Ok((who_, Outcome::Already { mode }));
    }
    let maps = match std::fs::read(format!("/proc/{pid}/maps")) {
        Ok(m) => procfs::parse_maps(&m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!("no such process: {pid}"),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            bail!(
                "{who_}: its memory map cannot be read: {}",
                refusal(pid, &status)
            )
        }
        Err(e) => return Err(anyhow!(e).context(format!("reading /proc/{pid}/maps"))),
    };
    let target = Target { pid, status, maps };
    let python = find_python(&target)?;
    if !target
        .maps
        .iter()
        .any(|m| m.file_name().is_some_and(procfs::is_torch_library))
    {
        bail!(
            "{} has no torch: no libc10 or libtorch library is mapped (attach once the job has imported torch)",
            target.who()
        );
    }
    let interpreter = remote_exec::interpreter(pid);
    let use_remote_exec =
        remote_exec::has_remote_exec(python.version) && remote_exec::runnable(&interpreter);

    // The tracker is built with the job's own Python and torch before the
    // job is touched, so that `attach(wait=False)` in the job finds it
    // cached and starts exact at once (the builder's progress line goes to
    // stderr; a failure is said, not fatal: the agent then runs sampled and
    // says why).
    let build_python = job_python(&target.maps, &interpreter);
    if let Err(e) = crate::agent::prebuild_for(&build_python) {
        vramscope_text::stderr_line(format_args!(
            "vramscope: building the tracker with {}: {e:#}; attaching anyway",
            build_python.display()
        ));
    }
    let agent_dir = crate::agent::extract()?;
    let work = PrivateDir::new()?;
    let result = work.path().join("result.json");
    let shm = opts.shm_dir.as_deref();
    let text = script(&agent_dir, &result, shm, opts.timeout.as_secs_f64())?;
    let queued_at = Instant::now();
    if use_remote_exec {
        let script_path = work.path().join("attach.py");
        std::fs::write(&script_path, &text).context("writing the attach script")?;
        remote_exec::remote_exec(&interpreter, pid, &script_path)
            .map_err(|e| anyhow!("{}: {e}", target.who()))?;
    } else {
        inject(&target, &python, &text)?;
    }
    let outcome = wait_result(&target, &result, queued_at, opts.timeout);
    if outcome.is_err() && use_remote_exec {
        // The script must still be there when the job gets to it.
        work.keep();
    }
    Ok((target.who(), outcome?))
}

/// The Python to build the job's agent with: the one whose environment
/// holds the job's torch. A virtual environment's `bin/python` is a link
/// to the base interpreter, so `/proc/PID/exe` names the base one, which
/// does not see the environment's packages: when the torch library the
/// job maps lies inside a virtual environment (a `pyvenv.cfg` above it),
/// that environment's `bin/python3`; else `interpreter` (the running
/// file: a conda environment's own, or the system's).
pub(crate) fn job_python(maps: &[procfs::Mapping], interpreter: &Path) -> PathBuf {
    let torch = maps.iter().find_map(|m| {
        m.file_name()
            .is_some_and(procfs::is_torch_library)
            .then(|| m.path.clone())?
    });
    let venv = torch.as_deref().and_then(|lib| {
        lib.ancestors()
            .skip(1)
            .find(|d| d.join("pyvenv.cfg").is_file())
            .map(Path::to_path_buf)
    });
    venv.and_then(|v| {
        ["python3", "python"]
            .iter()
            .map(|n| v.join("bin").join(n))
            .find(|p| p.exists())
    })
    .unwrap_or_else(|| interpreter.to_path_buf())
}

fn read_status(pid: u32) -> Result<procfs::Status> {
    if pid == 0 {
        bail!("no such process: 0");
    }
    let text = match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(t) => t,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => {
            bail!("no such process: {pid}")
        }
        Err(e) => return Err(anyhow!(e).context(format!("reading /proc/{pid}/status"))),
    };
    let status = procfs::parse_status(&text)
        .ok_or_else(|| anyhow!("/proc/{pid}/status is not in the kernel's format"))?;
    let tgid = text
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse::<u32>().ok());
    if let Some(tgid) = tgid.filter(|&t| t != pid) {
        bail!("{pid} is a thread of process {tgid}, not a process: attach to {tgid}");
    }
    Ok(status)
}

/// The mode of a live segment of process `pid` in the segment directory,
/// if it has one (its producer still runs, with that pid and start time).
fn live_segment(pid: u32, shm_dir: Option<&Path>) -> Option<String> {
    let dir = discover::segment_dir(shm_dir);
    let (found, _) = discover::list(&dir).ok()?;
    found.iter().filter(|f| f.name.pid == pid).find_map(|f| {
        let r = vramscope_wire::ring::SegmentReader::open(&f.path).ok()?;
        if r.state() == vramscope_wire::ring::layout::STATE_CLOSED {
            return None;
        }
        let h = r.header();
        if discover::locate(h.pid, h.start_time) != Located::Here(pid) {
            return None;
        }
        Some(match h.producer {
            vramscope_wire::ring::Producer::TorchExact => "exact".to_string(),
            vramscope_wire::ring::Producer::TorchSampled => "sampled".to_string(),
            vramscope_wire::ring::Producer::Simulator => "simulator".to_string(),
            vramscope_wire::ring::Producer::Test => "test".to_string(),
            vramscope_wire::ring::Producer::Other(v) => format!("producer {v}"),
        })
    })
}

/// The CPython a process runs: where its two entry points are.
struct Python {
    pending_call: u64,
    run_string: u64,
    version: Option<(u32, u32)>,
}

/// Finds `Py_AddPendingCall` and `PyRun_SimpleString` in a libpython the
/// process maps, or else in its executable; checks that the process's
/// bytes there are the file's.
fn find_python(t: &Target) -> Result<Python> {
    let exe = std::fs::read_link(format!("/proc/{}/exe", t.pid)).ok();
    let files = procfs::files(&t.maps);
    let mut candidates: Vec<&Path> = files
        .iter()
        .copied()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(procfs::is_libpython)
        })
        .collect();
    if let Some(e) = files.iter().copied().find(|p| Some(*p) == exe.as_deref()) {
        candidates.push(e);
    }
    let names: Vec<&str> = candidates
        .iter()
        .filter_map(|p| p.file_name()?.to_str())
        .collect();
    // Reading its memory needs what ptrace needs: a refusal says why now.
    let mut mem = open_mem(t).map_err(|e| anyhow!("{}: {e}", t.who()))?;
    let mut why = Vec::new();
    for file in &candidates {
        match python_in(t, file, &names, &mut mem) {
            Ok(Some(py)) => return Ok(py),
            Ok(None) => {}
            Err(e) => why.push(format!("{}: {e}", file.display())),
        }
    }
    let exe_name = exe
        .as_deref()
        .map_or_else(|| "its executable".to_string(), |e| e.display().to_string());
    if !why.is_empty() {
        bail!("{}: {}", t.who(), why.join("; "));
    }
    bail!(
        "{} is not a CPython process: neither {exe_name} nor a libpython it maps has Py_AddPendingCall and PyRun_SimpleString",
        t.who()
    )
}

fn python_in(
    t: &Target,
    file: &Path,
    names: &[&str],
    mem: &mut std::fs::File,
) -> Result<Option<Python>, String> {
    let data = read_mapped(t, file)?;
    let elf = match elf::Elf::parse(&data, elf::native_machine()) {
        Ok(e) => e,
        Err(e) if e.contains("another architecture") || e.contains("64-bit") => {
            return Err(format!(
                "{e}: vramscope attach works on a process of its own architecture ({})",
                std::env::consts::ARCH
            ))
        }
        Err(_) => return Ok(None),
    };
    let (Some((pending, _)), Some((run, _))) = (
        elf.symbol("Py_AddPendingCall"),
        elf.symbol("PyRun_SimpleString"),
    ) else {
        return Ok(None);
    };
    let loads = elf.loads();
    let mapped: Vec<&procfs::Mapping> = t
        .maps
        .iter()
        .filter(|m| m.path.as_deref() == Some(file))
        .collect();
    let bias = mapped
        .iter()
        .find_map(|m| elf::load_bias(&loads, m.start, m.offset))
        .ok_or("no mapping of it matches its segments")?;
    for (name, addr) in [("Py_AddPendingCall", pending), ("PyRun_SimpleString", run)] {
        let at = addr.wrapping_add(bias);
        if !mapped
            .iter()
            .any(|m| m.exec && (m.start..m.end).contains(&at))
        {
            return Err(format!("{name} is not in its executable code"));
        }
        let want = elf
            .bytes_at(addr, 16)
            .ok_or("its code is not in the file")?;
        let got = read_at(mem, at, 16).map_err(|e| format!("reading its memory: {e}"))?;
        if got != want {
            return Err(
                "the file on disk is not the one the process runs (replaced since it started?)"
                    .into(),
            );
        }
    }
    Ok(Some(Python {
        pending_call: pending.wrapping_add(bias),
        run_string: run.wrapping_add(bias),
        version: remote_exec::version(elf.read_uint("Py_Version"), names),
    }))
}

/// A file the process maps, as the process sees it: through its root
/// (a container's files), else the exact mapped file (even when deleted
/// since), else the path here.
fn read_mapped(t: &Target, file: &Path) -> Result<Vec<u8>, String> {
    let mut tries: Vec<PathBuf> =
        vec![Path::new(&format!("/proc/{}/root", t.pid))
            .join(file.strip_prefix("/").unwrap_or(file))];
    if let Some(m) = t.maps.iter().find(|m| m.path.as_deref() == Some(file)) {
        tries.push(PathBuf::from(format!(
            "/proc/{}/map_files/{:x}-{:x}",
            t.pid, m.start, m.end
        )));
    }
    tries.push(file.to_path_buf());
    let mut last = String::new();
    for p in &tries {
        match std::fs::read(p) {
            Ok(d) => return Ok(d),
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!("cannot be read ({last})"))
}

fn open_mem(t: &Target) -> Result<std::fs::File, String> {
    std::fs::File::open(format!("/proc/{}/mem", t.pid)).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            refusal(t.pid, &t.status)
        } else {
            format!("opening its memory: {e}")
        }
    })
}

fn read_at(mem: &mut std::fs::File, at: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    mem.seek(SeekFrom::Start(at))?;
    mem.read_exact(&mut buf)?;
    Ok(buf)
}

/// Why ptrace (or reading a process's memory) is refused, and what to do.
fn refusal(pid: u32, status: &procfs::Status) -> String {
    // Read again: a debugger (or another `vramscope attach`) may have
    // attached since.
    let tracer = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| procfs::parse_status(&s))
        .map_or(status.tracer, |s| s.tracer);
    let cap =
        std::fs::read_to_string("/proc/self/status").is_ok_and(|s| procfs::has_cap_sys_ptrace(&s));
    let yama = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    let owner_root = std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == 0);
    refusal_text(tracer, yama, cap, owner_root && status.uids[1] != 0)
}

/// [`refusal`] from what it read: the tracer, Yama's `ptrace_scope`,
/// whether this process has CAP_SYS_PTRACE, and whether the target is
/// undumpable (its `/proc` entry belongs to root though it runs as us).
fn refusal_text(tracer: u32, yama: Option<u32>, cap: bool, undumpable: bool) -> String {
    let what = "ptrace refused";
    if tracer != 0 {
        return format!("{what}: it is being traced by process {tracer} (a debugger or strace): detach it first");
    }
    match yama {
        Some(3) => {
            return format!("{what}: ptrace is disabled on this machine (Yama: /proc/sys/kernel/yama/ptrace_scope is 3, which only a reboot undoes): start the job with `vramscope run` instead")
        }
        Some(2) if !cap => {
            return format!("{what}: only a tracer with CAP_SYS_PTRACE may attach here (Yama: /proc/sys/kernel/yama/ptrace_scope is 2): give vramscope that capability (`sudo setcap cap_sys_ptrace+ep $(command -v vramscope)`), or start the job with `vramscope run`")
        }
        Some(1) if !cap => {
            return format!("{what}: Yama lets a process trace only its own children (/proc/sys/kernel/yama/ptrace_scope is 1): run `sudo sysctl kernel.yama.ptrace_scope=0`, or give vramscope CAP_SYS_PTRACE (`sudo setcap cap_sys_ptrace+ep $(command -v vramscope)`)")
        }
        _ => {}
    }
    if undumpable && !cap {
        return format!("{what}: the process is not dumpable (it called prctl(PR_SET_DUMPABLE, 0), or changed its user): only a tracer with CAP_SYS_PTRACE may attach");
    }
    if !cap {
        return format!("{what}: this process lacks CAP_SYS_PTRACE, or a seccomp filter forbids ptrace (in a container: `--cap-add=SYS_PTRACE`, and a seccomp profile that allows ptrace)");
    }
    format!("{what} (EPERM) although this process has CAP_SYS_PTRACE: a security module (SELinux, AppArmor) or a seccomp filter forbids it")
}

/// The injection by ptrace, for this build's architecture.
#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
fn inject(t: &Target, py: &Python, text: &str) -> Result<()> {
    let syscall_insn = find_syscall(t)?;
    let plan = ptrace::Plan {
        syscall_insn,
        pending_call: py.pending_call,
        run_string: py.run_string,
        text: text.as_bytes().to_vec(),
    };
    match ptrace::inject(t.pid, &plan) {
        Ok(0) => Ok(()),
        Ok(-1) => bail!(
            "{}: CPython's queue of pending calls is full; nothing was queued, try again",
            t.who()
        ),
        Ok(rc) => bail!(
            "{}: Py_AddPendingCall returned {rc}; nothing was queued",
            t.who()
        ),
        Err(ptrace::Error::Refused) => bail!("{}: {}", t.who(), refusal(t.pid, &t.status)),
        Err(ptrace::Error::Gone) => bail!("no such process: {}", t.pid),
        Err(e) => bail!("{}: {e}", t.who()),
    }
}

#[cfg(not(all(
    target_os = "linux",
    target_env = "gnu",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
fn inject(t: &Target, _py: &Python, _text: &str) -> Result<()> {
    bail!(
        "{}: attaching to a running Python before 3.14 needs Linux on x86_64 or aarch64 with glibc (this build: {} {}); start the job with `vramscope run` instead",
        t.who(),
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// A system-call instruction in the process's executable memory: in its
/// C library first, then the vDSO, then any other code it maps.
#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
fn find_syscall(t: &Target) -> Result<u64> {
    let rank = |m: &procfs::Mapping| {
        if m.file_name().is_some_and(procfs::is_libc) {
            0
        } else if m.special() == Some("[vdso]") {
            1
        } else {
            2
        }
    };
    let mut code: Vec<&procfs::Mapping> = t
        .maps
        .iter()
        .filter(|m| {
            m.exec && m.read && m.special() != Some("[vsyscall]") && m.start < i64::MAX as u64
        })
        .collect();
    code.sort_by_key(|m| rank(m));
    let mut mem = open_mem(t).map_err(|e| anyhow!("{}: {e}", t.who()))?;
    const CHUNK: u64 = 64 * 1024;
    for m in code {
        let end = m.end.min(m.start + 4 * 1024 * 1024);
        let mut at = m.start;
        while at < end {
            let len = CHUNK.min(end - at) as usize;
            let Ok(bytes) = read_at(&mut mem, at, len) else {
                break;
            };
            if let Some(a) = ptrace::find_syscall(&bytes, at) {
                return Ok(a);
            }
            // An instruction across two chunks is found by overlapping them.
            at += (len as u64).saturating_sub(8).max(1);
        }
    }
    bail!("{}: no system-call instruction found in its code", t.who())
}

/// The Python text run in the job (see the module's documentation): one
/// statement that binds no name in the job's `__main__`, and swallows
/// everything. Paths travel as hex, so any byte in them is safe.
pub(crate) fn script(
    agent_dir: &Path,
    result: &Path,
    shm_dir: Option<&Path>,
    settle: f64,
) -> Result<String> {
    use std::os::unix::ffi::OsStrExt;
    let hex = |p: &Path| -> String {
        p.as_os_str()
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let shm = shm_dir.map(|p| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            std::env::current_dir().unwrap_or_default().join(p)
        }
    });
    let settle = if settle.is_finite() {
        settle.clamp(0.0, 86400.0)
    } else {
        30.0
    };
    let inner = format!(
        r#"import os, sys
r = os.fsdecode(bytes.fromhex('{result}'))
try:
    d = os.fsdecode(bytes.fromhex('{agent}'))
    s = os.fsdecode(bytes.fromhex('{shm}')) or None
    import importlib.util
    spec = importlib.util.spec_from_file_location('_vramscope_remote', os.path.join(d, 'vramscope', '_remote.py'))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    m.run(r, s, {settle:.3}, d)
except BaseException as e:
    try:
        import json
        with open(r + '.err', 'w') as f:
            json.dump({{'status': 'failed', 'reason': '%s: %s' % (type(e).__name__, e), 'final': True}}, f)
        os.replace(r + '.err', r)
    except BaseException:
        pass
"#,
        result = hex(result),
        agent = hex(agent_dir),
        shm = shm.as_deref().map(hex).unwrap_or_default(),
    );
    let inner_hex: String = inner.bytes().map(|b| format!("{b:02x}")).collect();
    Ok(format!(
        "try:\n    exec(bytes.fromhex('{inner_hex}').decode(), {{'__name__': '__vramscope_attach__'}})\nexcept BaseException:\n    pass\n"
    ))
}

/// The JSON the job writes.
#[derive(Debug, serde::Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    cuda_initialized: Option<bool>,
    #[serde(default)]
    r#final: bool,
}

/// Waits for the job's answer; a settled one ends the wait.
fn wait_result(t: &Target, path: &Path, since: Instant, timeout: Duration) -> Result<Outcome> {
    let deadline = since + timeout;
    let mut last: Option<Answer> = None;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(a) = serde_json::from_str::<Answer>(&text) {
                let done = a.r#final;
                last = Some(a);
                if done {
                    break;
                }
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        if last.is_none() && !Path::new(&format!("/proc/{}", t.pid)).exists() {
            bail!("{} exited before the agent ran", t.who());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let Some(a) = last else {
        bail!(
            "{}: the agent is queued but did not run within {:.0} s: it runs when the job's main thread next runs Python code (it may be blocked in a long call); `vramscope rings` shows it once it runs",
            t.who(),
            timeout.as_secs_f64()
        )
    };
    let mode = a.mode.clone().unwrap_or_else(|| "none".into());
    match a.status.as_str() {
        "already" => Ok(Outcome::Already { mode }),
        "attached" if mode == "failed" => {
            bail!("{}: the agent failed to start: {}", t.who(), a.reason)
        }
        "attached" => Ok(Outcome::Attached {
            mode,
            reason: a.reason,
            settled: a.r#final,
            cuda_initialized: a.cuda_initialized,
        }),
        "no torch" => bail!("{} has no torch: {}", t.who(), a.reason),
        "off" => bail!("{}: the agent is off: {}", t.who(), a.reason),
        _ => bail!("{}: the agent failed to start: {}", t.who(), a.reason),
    }
}

/// A directory of this user's only (mode 0700) in the temporary
/// directory, removed when dropped unless kept.
struct PrivateDir {
    path: PathBuf,
    keep: std::cell::Cell<bool>,
}

impl PrivateDir {
    fn new() -> Result<PrivateDir> {
        let base = std::env::temp_dir();
        let mut last = None;
        for i in 0..16u32 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let path = base.join(format!(
                "vramscope-attach-{}-{nanos:08x}{i}",
                std::process::id()
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {
                    return Ok(PrivateDir {
                        path,
                        keep: false.into(),
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => {
                    return Err(
                        anyhow!(e).context(format!("creating a directory in {}", base.display()))
                    )
                }
            }
        }
        Err(anyhow!(
            "creating a private directory in {}: {:?}",
            base.display(),
            last
        ))
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn keep(&self) {
        self.keep.set(true);
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        if !self.keep.get() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_say_why_and_what_to_do() {
        let t = refusal_text(77, Some(1), false, false);
        assert!(t.contains("traced by process 77"), "{t}");
        let t = refusal_text(0, Some(1), false, false);
        assert!(
            t.contains("ptrace_scope is 1") && t.contains("sysctl kernel.yama.ptrace_scope=0"),
            "{t}"
        );
        let t = refusal_text(0, Some(2), false, false);
        assert!(
            t.contains("ptrace_scope is 2") && t.contains("CAP_SYS_PTRACE"),
            "{t}"
        );
        let t = refusal_text(0, Some(3), true, false);
        assert!(
            t.contains("ptrace_scope is 3") && t.contains("reboot"),
            "{t}"
        );
        // With the capability, Yama 1 and 2 allow it: the cause is elsewhere.
        let t = refusal_text(0, Some(1), true, false);
        assert!(t.contains("security module"), "{t}");
        let t = refusal_text(0, None, false, true);
        assert!(t.contains("not dumpable"), "{t}");
        let t = refusal_text(0, None, false, false);
        assert!(t.contains("--cap-add=SYS_PTRACE"), "{t}");
        for t in [
            refusal_text(0, Some(2), false, false),
            refusal_text(0, None, false, false),
        ] {
            assert!(!t.contains('\n'));
        }
    }

    #[test]
    fn the_job_s_python_is_its_virtual_environment_s() {
        let tmp = std::env::temp_dir().join(format!("vramscope-venv-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let lib = tmp.join("venv/lib/python3.12/site-packages/torch/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(tmp.join("venv/bin")).unwrap();
        std::fs::write(tmp.join("venv/bin/python3"), "").unwrap();
        std::fs::write(tmp.join("venv/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        let maps_text = format!(
            "7f00-7f10 r-xp 00000000 fd:01 1 {}\n",
            lib.join("libc10.so").display()
        );
        let maps = procfs::parse_maps(maps_text.as_bytes());
        let base = Path::new("/usr/bin/python3.12");
        assert_eq!(job_python(&maps, base), tmp.join("venv/bin/python3"));
        // Not in a virtual environment: the running interpreter.
        std::fs::remove_file(tmp.join("venv/bin/python3")).unwrap();
        assert_eq!(job_python(&maps, base), base);
        assert_eq!(job_python(&[], base), base);
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn outcome_lines() {
        let who = "process 7 (python3)";
        let a = |mode: &str, reason: &str, settled, cuda| Outcome::Attached {
            mode: mode.into(),
            reason: reason.into(),
            settled,
            cuda_initialized: cuda,
        };
        assert_eq!(
            Outcome::Already {
                mode: "sampled".into()
            }
            .line(who),
            "process 7 (python3): already instrumented (mode sampled)"
        );
        assert!(a("exact", "", true, Some(true))
            .line(who)
            .contains("exact mode"));
        assert!(a("sampled", "no compiler", true, Some(true))
            .line(who)
            .ends_with("sampled mode: no compiler"));
        assert!(a("pending", "", true, Some(false))
            .line(who)
            .contains("initialises CUDA"));
        assert!(a("pending", "", false, Some(true))
            .line(who)
            .contains("still starting"));
    }

    /// The injected text is plain ASCII, binds nothing in `__main__`, and
    /// run by a Python without torch it answers "no torch" and nothing else
    /// (no output, no exception).
    #[test]
    fn the_script_runs_quietly_and_answers() {
        let tmp =
            std::env::temp_dir().join(format!("vramscope-attach-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).unwrap();
        let agent = crate::agent::extract_to(&tmp.join("cache")).unwrap();
        let result = tmp
            .join("a dir with 'quotes' and spaces")
            .join("result.json");
        std::fs::create_dir_all(result.parent().unwrap()).unwrap();
        let text = script(&agent, &result, Some(Path::new("/dev/shm")), 1.0).unwrap();
        assert!(text.is_ascii());
        let Ok(out) = std::process::Command::new("python3")
            .arg("-c")
            .arg(format!("{text}\nnames = sorted(n for n in globals() if not n.startswith('__'))\nprint(names)\n"))
            .env_remove("PYTHONPATH")
            .output()
        else {
            println!("SKIPPED: no python3");
            let _ = std::fs::remove_dir_all(&tmp);
            return;
        };
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "");
        let answer: Answer =
            serde_json::from_str(&std::fs::read_to_string(&result).unwrap()).unwrap();
        assert_eq!(answer.status, "no torch");
        assert!(answer.r#final);
        // An agent directory that is not there: a failure, still quiet.
        let text = script(&tmp.join("nowhere"), &result, None, 1.0).unwrap();
        let out = std::process::Command::new("python3")
            .arg("-c")
            .arg(&text)
            .output()
            .unwrap();
        assert!(out.status.success() && out.stderr.is_empty());
        let answer: Answer =
            serde_json::from_str(&std::fs::read_to_string(&result).unwrap()).unwrap();
        assert_eq!(answer.status, "failed");
        assert!(
            answer.reason.contains("nowhere") || answer.reason.contains("Error"),
            "{}",
            answer.reason
        );
        // SystemExit raised in the text does not end the process.
        let out = std::process::Command::new("python3")
            .arg("-c")
            .arg(format!(
                "{}\nprint('alive')",
                text.replace("exec(", "raise SystemExit(3) or exec(")
            ))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "alive");
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
