//! The injector: queues one call of `PyRun_SimpleString(text)` in a
//! running CPython, through ptrace, with no unsafe code (the `nix` crate
//! wraps ptrace and waitpid; the target's memory is written through
//! `/proc/PID/mem`).
//!
//! The steps, on the process's main thread (the thread whose id is the
//! process id):
//!
//! 1. `PTRACE_SEIZE` and `PTRACE_INTERRUPT` (no SIGSTOP is sent: the job's
//!    parent and shell see nothing), then wait for the stop; its general
//!    and floating-point registers are saved.
//! 2. An `mmap` system call, made by pointing the thread at a system-call
//!    instruction of its own code (found beforehand in the C library or
//!    the vDSO) and single-stepping it: one private anonymous page (or a
//!    few), readable and writable.
//! 3. The Python text is written into it.
//! 4. A call `Py_AddPendingCall(PyRun_SimpleString, page)` returning to
//!    address 0: the thread runs it and faults at 0 on return, which
//!    ptrace reports; the return value (0: queued) is read there.
//! 5. The saved registers go back exactly and the process is detached.
//!
//! Nothing is loaded into the process (no dlopen) and nothing of the C
//! library is called (no malloc: the interrupted thread may hold its
//! lock). `Py_AddPendingCall` may be called from any thread, without the
//! GIL; CPython then runs `PyRun_SimpleString(page)` on its main thread
//! between two bytecodes, with the GIL held: the job's own thread, at a
//! point where running Python code is safe. The page stays mapped (the
//! call runs later); it is the only trace left in the process.
//!
//! System calls the thread was blocked in (a `sleep`, a `read` on a pipe)
//! go on as they would after a signal the job ignores: at the first stop
//! the kernel has not yet decided to restart the call; every register set
//! the injector installs has `orig_rax = -1` (x86-64: "not in a system
//! call", so the kernel restarts nothing at an address of ours), and the
//! saved set, put back before the last resume, has the original one, so
//! the kernel restarts the interrupted call then. On aarch64 the kernel
//! has already rewound the program counter to the `svc` when the thread
//! stops there, and the saved registers re-issue it.
//!
//! On aarch64 the thread is used only where it stopped at a system call
//! ([`arch::safe_point`]): a system call discards the SVE state beyond
//! the FPSIMD registers, so one injected into SVE code would damage it.
//! A thread caught elsewhere is let go at once, untouched, and caught
//! again, for about two seconds (a training job's main thread waits on
//! the GPU or its data often).
//!
//! Signals that arrive while the thread is held are kept and delivered
//! when it is released (the first through `PTRACE_DETACH`, any other by
//! `kill`); a signal raised by the injected call itself (a fault) is not
//! delivered: the registers are restored as if the call never happened.
//! Every wait is bounded; whatever fails after the seize, the registers
//! are put back and the process detached before the error is returned.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// The architecture's part: registers, the system-call instruction, the
/// calling convention. x86-64 (System V) and aarch64 (AAPCS64).
#[cfg(target_arch = "x86_64")]
pub(crate) mod arch {
    pub(crate) type Regs = libc::user_regs_struct;
    pub(crate) type FpRegs = libc::user_fpregs_struct;

    /// `syscall`.
    pub(crate) const SYSCALL: &[u8] = &[0x0f, 0x05];
    /// Alignment of an instruction.
    pub(crate) const ALIGN: u64 = 1;
    pub(crate) const SYS_MMAP: u64 = 9;
    /// EFLAGS' trap (single-step) and direction flags.
    const TF: u64 = 1 << 8;
    const DF: u64 = 1 << 10;

    pub(crate) fn pc(r: &Regs) -> u64 {
        r.rip
    }

    /// The registers that make `nr(args)` at the instruction `at`.
    pub(crate) fn syscall(saved: &Regs, at: u64, nr: u64, a: [u64; 6]) -> Regs {
        let mut r = *saved;
        r.rip = at;
        r.rax = nr;
        r.orig_rax = u64::MAX; // not in a system call: nothing to restart
        r.rdi = a[0];
        r.rsi = a[1];
        r.rdx = a[2];
        r.r10 = a[3];
        r.r8 = a[4];
        r.r9 = a[5];
        r.eflags &= !(TF | DF);
        r
    }

    pub(crate) fn syscall_result(r: &Regs) -> u64 {
        r.rax
    }

    /// The registers that call `func(a0, a1)` with a return to address 0,
    /// and the return address to write at the new stack pointer. The stack
    /// goes below the red zone (128 bytes the interrupted code may use),
    /// aligned so that the callee sees `rsp + 8` on 16 bytes, as a call
    /// would leave it.
    pub(crate) fn call(
        saved: &Regs,
        func: u64,
        a0: u64,
        a1: u64,
    ) -> (Regs, Option<(u64, [u8; 8])>) {
        let mut r = *saved;
        let sp = (saved.rsp.wrapping_sub(256) & !0xf).wrapping_sub(8);
        r.rsp = sp;
        r.rip = func;
        r.rdi = a0;
        r.rsi = a1;
        r.rax = 0;
        r.orig_rax = u64::MAX;
        r.eflags &= !(TF | DF);
        (r, Some((sp, [0u8; 8])))
    }

    pub(crate) fn call_result(r: &Regs) -> u64 {
        r.rax
    }

    /// Whether the thread may be used where it stopped: always (a system
    /// call preserves every register, vector ones included, and so does
    /// the injector, which puts back the x87/SSE state; the upper halves
    /// of the AVX registers are not touched by CPython's code).
    pub(crate) fn safe_point(_r: &Regs, _code: impl Fn(u64) -> Option<[u8; 4]>) -> bool {
        true
    }
}

#[cfg(target_arch = "aarch64")]
pub(crate) mod arch {
    pub(crate) type Regs = libc::user_regs_struct;
    pub(crate) type FpRegs = libc::user_fpsimd_struct;

    /// `svc #0`.
    pub(crate) const SYSCALL: &[u8] = &[0x01, 0x00, 0x00, 0xd4];
    pub(crate) const ALIGN: u64 = 4;
    pub(crate) const SYS_MMAP: u64 = 222;
    /// PSTATE's single-step and branch-type (BTI) bits.
    const SS: u64 = 1 << 21;
    const BTYPE: u64 = 0b11 << 10;

    pub(crate) fn pc(r: &Regs) -> u64 {
        r.pc
    }

    pub(crate) fn syscall(saved: &Regs, at: u64, nr: u64, a: [u64; 6]) -> Regs {
        let mut r = *saved;
        r.pc = at;
        r.regs[8] = nr;
        r.regs[..6].copy_from_slice(&a);
        r.pstate &= !(SS | BTYPE);
        r
    }

    pub(crate) fn syscall_result(r: &Regs) -> u64 {
        r.regs[0]
    }

    /// `func(a0, a1)` returning to 0 (the link register); the stack below
    /// the interrupted code's, 16-byte aligned. Nothing to write.
    pub(crate) fn call(
        saved: &Regs,
        func: u64,
        a0: u64,
        a1: u64,
    ) -> (Regs, Option<(u64, [u8; 8])>) {
        let mut r = *saved;
        r.sp = saved.sp.wrapping_sub(256) & !0xf;
        r.pc = func;
        r.regs[0] = a0;
        r.regs[1] = a1;
        r.regs[30] = 0;
        r.pstate &= !(SS | BTYPE);
        (r, None)
    }

    pub(crate) fn call_result(r: &Regs) -> u64 {
        r.regs[0]
    }

    /// Whether the thread may be used where it stopped: only at a system
    /// call (its `svc` at the program counter, about to be restarted, or
    /// just before it, returned from). A system call discards the SVE
    /// state beyond the FPSIMD registers (Documentation/arch/arm64/sve.rst),
    /// so the injected `mmap`, and the FPSIMD-only register set ptrace
    /// gives back, would damage a thread stopped in the middle of SVE
    /// code; at a system call there is nothing more to lose.
    pub(crate) fn safe_point(r: &Regs, code: impl Fn(u64) -> Option<[u8; 4]>) -> bool {
        let svc = |at: u64| code(at).is_some_and(|w| w[..] == *SYSCALL);
        svc(r.pc) || r.pc.checked_sub(4).is_some_and(svc)
    }
}

use arch::{FpRegs, Regs};

/// What to inject, all addresses in the target.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// A system-call instruction ([`arch::SYSCALL`]) in executable memory.
    pub(crate) syscall_insn: u64,
    /// `Py_AddPendingCall`.
    pub(crate) pending_call: u64,
    /// `PyRun_SimpleString`.
    pub(crate) run_string: u64,
    /// The Python source, without its terminating NUL (added here).
    pub(crate) text: Vec<u8>,
}

/// Why an injection did not queue the call. Except for
/// [`Error::NotRestored`], the process was left as it was.
#[derive(Debug)]
pub(crate) enum Error {
    /// `PTRACE_SEIZE` refused (EPERM): see `diagnose_refusal`.
    Refused,
    /// No such process (it ended before the seize).
    Gone,
    /// The process ended while it was held: how.
    Died(String),
    /// A step did not finish in time: which.
    Timeout(&'static str),
    /// Anything else (the process was restored and detached).
    Failed(String),
    /// The process could not be put back (it never stopped again).
    NotRestored(String),
    /// The thread stopped where it may not be used (aarch64: outside a
    /// system call); nothing was changed.
    Busy,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Refused => write!(f, "ptrace refused"),
            Error::Gone => write!(f, "no such process"),
            Error::Died(how) => write!(f, "the process ended during the injection ({how})"),
            Error::Timeout(what) => write!(f, "timed out {what}; the process was left as it was"),
            Error::Failed(why) => write!(f, "{why}; the process was left as it was"),
            Error::Busy => write!(
                f,
                "its main thread kept running machine code (not waiting in a system call), where vramscope may not interrupt it on this architecture: try again; the process was left as it was"
            ),
            Error::NotRestored(why) => write!(
                f,
                "{why}; its registers could not be restored (it may crash)"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// How long the thread may take to stop once interrupted (a process in
/// uninterruptible sleep, on a slow disk, stops when that ends).
const STOP_WAIT: Duration = Duration::from_secs(3);
/// How long each injected step may take.
const STEP_WAIT: Duration = Duration::from_secs(3);

/// Queues the call; returns `Py_AddPendingCall`'s value (0: queued, -1:
/// CPython's queue of pending calls is full).
pub(crate) fn inject(pid: u32, plan: &Plan) -> Result<i32, Error> {
    let pid = i32::try_from(pid)
        .map(Pid::from_raw)
        .map_err(|_| Error::Gone)?;
    // Ctrl-C, SIGTERM or a hangup while the thread runs injected code
    // would end this process and let the kernel detach the thread where
    // it stands: they wait until it is released (SIGKILL cannot wait).
    let mut held = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        held.add(s);
    }
    let mut before = SigSet::empty();
    let masked = signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&held), Some(&mut before));
    let outcome = held_inject(pid, plan);
    if masked.is_ok() {
        let _ = signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None);
    }
    outcome
}

fn held_inject(pid: Pid, plan: &Plan) -> Result<i32, Error> {
    // A thread caught where it may not be used is let go and caught again
    // (for about two seconds).
    let mut tries = 0;
    loop {
        match seized_inject(pid, plan) {
            Err(Error::Busy) if tries < 40 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

fn seized_inject(pid: Pid, plan: &Plan) -> Result<i32, Error> {
    let mut t = Tracee::seize(pid)?;
    let result = t.run(plan);
    // Put back and detach, whatever happened (a second time is a no-op).
    let released = t.release();
    match (result, released) {
        (_, Err(e @ (Error::Died(_) | Error::NotRestored(_)))) => Err(e),
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        (Ok(rc), Ok(())) => Ok(rc),
    }
}

/// A seized thread: what to put back, and the signals to hand on.
struct Tracee {
    pid: Pid,
    saved: Option<(Regs, FpRegs)>,
    /// Whether the thread sits in a ptrace stop now.
    stopped: bool,
    /// Whether registers other than the saved ones were installed.
    changed: bool,
    /// Signals that arrived while held, delivered at the release.
    deferred: Vec<Signal>,
    /// Detached, or the process is gone.
    done: bool,
}

impl Tracee {
    fn seize(pid: Pid) -> Result<Tracee, Error> {
        match ptrace::seize(pid, ptrace::Options::empty()) {
            Ok(()) => {}
            Err(Errno::EPERM) => return Err(Error::Refused),
            Err(Errno::ESRCH) => return Err(Error::Gone),
            Err(e) => return Err(Error::Failed(format!("PTRACE_SEIZE: {e}"))),
        }
        let mut t = Tracee {
            pid,
            saved: None,
            stopped: false,
            changed: false,
            deferred: Vec::new(),
            done: false,
        };
        if let Err(e) = ptrace::interrupt(pid) {
            let _ = ptrace::detach(pid, None);
            t.done = true;
            return Err(Error::Failed(format!("PTRACE_INTERRUPT: {e}")));
        }
        Ok(t)
    }

    fn run(&mut self, plan: &Plan) -> Result<i32, Error> {
        self.first_stop()?;
        let regs = ptrace::getregs(self.pid).map_err(|e| self.os("reading the registers", e))?;
        let fp = ptrace::getregset::<ptrace::regset::NT_PRFPREG>(self.pid)
            .map_err(|e| self.os("reading the floating-point registers", e))?;
        self.saved = Some((regs, fp));
        let pid = self.pid;
        let word = |at: u64| -> Option<[u8; 4]> {
            let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
            let mut w = [0u8; 4];
            mem.read_exact_at(&mut w, at).ok()?;
            Some(w)
        };
        if !arch::safe_point(&regs, word) {
            return Err(Error::Busy);
        }

        // (2) A few pages for the text.
        let mut text = plan.text.clone();
        text.push(0);
        let len = (text.len() as u64).div_ceil(4096) * 4096;
        const PROT_READ_WRITE: u64 = 0x1 | 0x2;
        const MAP_PRIVATE_ANONYMOUS: u64 = 0x02 | 0x20;
        let args = [0, len, PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS, u64::MAX, 0];
        let page = self.syscall(&regs, plan.syscall_insn, arch::SYS_MMAP, args)?;
        if page > u64::MAX - 4095 {
            return Err(Error::Failed(format!(
                "mmap in the process failed: {}",
                Errno::from_raw(-(page as i64) as i32)
            )));
        }
        // (3) The text.
        self.write(page, &text)?;
        // (4) The call.
        let (call, stack) = arch::call(&regs, plan.pending_call, plan.run_string, page);
        if let Some((at, bytes)) = stack {
            self.write(at, &bytes)?;
        }
        let ret = self.call(&call)?;
        Ok(ret as u32 as i32)
    }

    /// Waits for the stop the seize's interrupt asked for.
    fn first_stop(&mut self) -> Result<(), Error> {
        let deadline = Instant::now() + STOP_WAIT;
        match self.wait(deadline, "waiting for the process to stop")? {
            WaitStatus::PtraceEvent(..) => {}
            WaitStatus::Stopped(_, sig) => self.defer(sig),
            other => return Err(Error::Failed(format!("unexpected stop {other:?}"))),
        }
        Ok(())
    }

    /// Makes one system call at `at` and returns its raw result.
    fn syscall(&mut self, saved: &Regs, at: u64, nr: u64, args: [u64; 6]) -> Result<u64, Error> {
        let regs = arch::syscall(saved, at, nr, args);
        self.set(&regs)?;
        let after = at + arch::SYSCALL.len() as u64;
        let deadline = Instant::now() + STEP_WAIT;
        // A signal that stops the thread before the instruction ran leaves
        // it where it was: step again (the signal waits for the release).
        for _ in 0..16 {
            ptrace::step(self.pid, None).map_err(|e| self.os("PTRACE_SINGLESTEP", e))?;
            self.stopped = false;
            match self.wait(deadline, "waiting for the mmap system call")? {
                WaitStatus::Stopped(_, Signal::SIGTRAP) | WaitStatus::PtraceEvent(..) => {}
                WaitStatus::Stopped(_, sig) => self.defer(sig),
                other => return Err(Error::Failed(format!("unexpected stop {other:?}"))),
            }
            let now = ptrace::getregs(self.pid).map_err(|e| self.os("reading the registers", e))?;
            match arch::pc(&now) {
                pc if pc == after => return Ok(arch::syscall_result(&now)),
                pc if pc == at => continue,
                pc => {
                    return Err(Error::Failed(format!(
                        "the system call stepped to {pc:#x}, not {after:#x}"
                    )))
                }
            }
        }
        Err(Error::Failed(
            "the system call never ran (signals kept interrupting it)".into(),
        ))
    }

    /// Runs the prepared call until it returns to address 0.
    fn call(&mut self, regs: &Regs) -> Result<u64, Error> {
        self.set(regs)?;
        let deadline = Instant::now() + STEP_WAIT;
        loop {
            ptrace::cont(self.pid, None).map_err(|e| self.os("PTRACE_CONT", e))?;
            self.stopped = false;
            let status = self.wait(
                deadline,
                "waiting for Py_AddPendingCall to return (is its lock held?)",
            )?;
            match status {
                WaitStatus::Stopped(
                    _,
                    sig @ (Signal::SIGSEGV
                    | Signal::SIGBUS
                    | Signal::SIGILL
                    | Signal::SIGFPE
                    | Signal::SIGTRAP),
                ) => {
                    let now = ptrace::getregs(self.pid)
                        .map_err(|e| self.os("reading the registers", e))?;
                    let fault = ptrace::getsiginfo(self.pid)
                        .map(|i| i.si_code > 0)
                        .unwrap_or(true);
                    if !fault {
                        self.defer(sig); // sent by someone: the job's
                        continue;
                    }
                    if sig == Signal::SIGSEGV && arch::pc(&now) == 0 {
                        return Ok(arch::call_result(&now));
                    }
                    return Err(Error::Failed(format!(
                        "the injected call faulted ({sig:?} at {:#x}): the process uses a \
                         shadow stack, or its Python differs from the file on disk",
                        arch::pc(&now)
                    )));
                }
                WaitStatus::Stopped(_, sig) => self.defer(sig),
                WaitStatus::PtraceEvent(..) => {} // the interrupt, or a group stop
                other => return Err(Error::Failed(format!("unexpected stop {other:?}"))),
            }
        }
    }

    fn set(&mut self, regs: &Regs) -> Result<(), Error> {
        self.changed = true;
        ptrace::setregs(self.pid, *regs).map_err(|e| self.os("writing the registers", e))
    }

    /// Writes into the stopped process's memory.
    fn write(&mut self, at: u64, bytes: &[u8]) -> Result<(), Error> {
        let mem = OpenOptions::new()
            .write(true)
            .open(format!("/proc/{}/mem", self.pid))
            .and_then(|f| f.write_all_at(bytes, at));
        mem.map_err(|e| Error::Failed(format!("writing into the process's memory at {at:#x}: {e}")))
    }

    fn defer(&mut self, sig: Signal) {
        if !self.deferred.contains(&sig) {
            self.deferred.push(sig);
        }
    }

    /// A ptrace call failed: ESRCH means the process went away (or is not
    /// stopped, which `wait` would have said).
    fn os(&mut self, what: &str, e: Errno) -> Error {
        if e == Errno::ESRCH && !std::path::Path::new(&format!("/proc/{}", self.pid)).exists() {
            self.done = true;
            return Error::Died("it exited".into());
        }
        Error::Failed(format!("{what}: {e}"))
    }

    /// The next stop (or end) of the thread, by `deadline`.
    fn wait(&mut self, deadline: Instant, what: &'static str) -> Result<WaitStatus, Error> {
        let mut pause = Duration::from_micros(50);
        loop {
            match waitpid(self.pid, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
                Ok(WaitStatus::StillAlive) => {}
                Ok(WaitStatus::Exited(_, code)) => {
                    self.done = true;
                    return Err(Error::Died(format!("exit status {code}")));
                }
                Ok(WaitStatus::Signaled(_, sig, _)) => {
                    self.done = true;
                    return Err(Error::Died(format!("killed by {sig:?}")));
                }
                Ok(status) => {
                    self.stopped = true;
                    return Ok(status);
                }
                // A stop by a signal `nix` has no name for (a real-time
                // one): it is a stop all the same; the signal is lost.
                Err(Errno::EINVAL) => {
                    self.stopped = true;
                    return Ok(WaitStatus::PtraceEvent(self.pid, Signal::SIGTRAP, 0));
                }
                Err(Errno::EINTR) => {}
                Err(Errno::ECHILD) => {
                    self.done = true;
                    return Err(Error::Died("it is gone".into()));
                }
                Err(e) => return Err(Error::Failed(format!("waitpid: {e}"))),
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout(what));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    /// Stops the thread if it runs, puts the saved registers back, detaches
    /// and hands on the signals that arrived meanwhile. Idempotent.
    fn release(&mut self) -> Result<(), Error> {
        if self.done {
            return Ok(());
        }
        if !self.stopped {
            let _ = ptrace::interrupt(self.pid);
            let deadline = Instant::now() + STOP_WAIT;
            match self.wait(deadline, "waiting for the process to stop again") {
                Ok(WaitStatus::Stopped(_, sig)) => {
                    // A fault of the injected code is not the job's.
                    if !matches!(
                        sig,
                        Signal::SIGSEGV
                            | Signal::SIGBUS
                            | Signal::SIGILL
                            | Signal::SIGFPE
                            | Signal::SIGTRAP
                    ) {
                        self.defer(sig);
                    }
                }
                Ok(_) => {}
                Err(Error::Timeout(_)) if self.changed => {
                    return Err(Error::NotRestored(
                        "the process did not stop again within 3 s".into(),
                    ))
                }
                // Nothing of it was changed: the kernel detaches it
                // when this process exits, as it was.
                Err(Error::Timeout(_)) => {
                    self.done = true;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        if self.changed {
            if let Some((regs, fp)) = self.saved {
                let put = ptrace::setregs(self.pid, regs)
                    .and_then(|()| ptrace::setregset::<ptrace::regset::NT_PRFPREG>(self.pid, fp));
                if let Err(e) = put {
                    let err = self.os("restoring the registers", e);
                    if let Error::Died(_) = err {
                        return Err(err);
                    }
                    return Err(Error::NotRestored(format!("restoring the registers: {e}")));
                }
            }
        }
        let mut signals = std::mem::take(&mut self.deferred).into_iter();
        let first = signals.next();
        let detached = ptrace::detach(self.pid, first);
        self.done = true;
        if let Err(e) = detached {
            return Err(self.os("PTRACE_DETACH", e));
        }
        for sig in signals {
            let _ = signal::kill(self.pid, sig);
        }
        Ok(())
    }
}

impl Drop for Tracee {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// Finds a system-call instruction in `code` (bytes of the process from
/// address `base`): its address.
pub(crate) fn find_syscall(code: &[u8], base: u64) -> Option<u64> {
    let n = arch::SYSCALL.len();
    let mut i = 0;
    while i + n <= code.len() {
        let at = base + i as u64;
        // (x86-64's alignment is 1: any byte may start an instruction.)
        #[allow(clippy::modulo_one)]
        let aligned = at % arch::ALIGN == 0;
        if aligned && &code[i..i + n] == arch::SYSCALL {
            return Some(at);
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_instructions_are_found_aligned() {
        let mut code = vec![0x90u8; 64];
        let n = arch::SYSCALL.len();
        let at = 24;
        code[at..at + n].copy_from_slice(arch::SYSCALL);
        assert_eq!(find_syscall(&code, 0x1000), Some(0x1000 + at as u64));
        assert_eq!(find_syscall(&code[..at + n - 1], 0x1000), None);
        if arch::ALIGN > 1 {
            // Off alignment it is not an instruction.
            assert_eq!(find_syscall(&code[1..], 0x1001), None);
        }
    }

    #[test]
    fn the_call_s_stack_is_aligned_below_the_red_zone() {
        let saved: Regs = zeroed_regs();
        for sp in [0x7ffd_1000u64, 0x7ffd_1001, 0x7ffd_1008, 0x7ffd_100f] {
            let mut s = saved;
            set_sp(&mut s, sp);
            let (r, stack) = arch::call(&s, 0x1234, 1, 2);
            assert_eq!(arch::pc(&r), 0x1234);
            let new_sp = get_sp(&r);
            assert!(new_sp + 128 < sp, "below the red zone");
            if let Some((at, bytes)) = stack {
                // x86-64: the return address at rsp, rsp + 8 on 16 bytes.
                assert_eq!(at, new_sp);
                assert_eq!(bytes, [0u8; 8]);
                assert_eq!((new_sp + 8) % 16, 0);
            } else {
                assert_eq!(new_sp % 16, 0);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x86_64_uses_the_thread_wherever_it_stopped() {
        assert!(arch::safe_point(&zeroed_regs(), |_| None));
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn aarch64_uses_the_thread_only_at_a_system_call() {
        let mut r = zeroed_regs();
        r.pc = 0x1004;
        let svc_at = |at: u64| {
            move |a: u64| {
                Some(if a == at {
                    [0x01, 0x00, 0x00, 0xd4]
                } else {
                    [0x1f, 0x20, 0x03, 0xd5]
                })
            }
        };
        assert!(arch::safe_point(&r, svc_at(0x1004)), "about to restart it");
        assert!(
            arch::safe_point(&r, svc_at(0x1000)),
            "just returned from it"
        );
        assert!(!arch::safe_point(&r, svc_at(0x1008)));
        assert!(!arch::safe_point(&r, |_| None));
    }

    /// A register set of zeros, without unsafe (every field is an integer).
    fn zeroed_regs() -> Regs {
        #[cfg(target_arch = "x86_64")]
        {
            libc::user_regs_struct {
                r15: 0,
                r14: 0,
                r13: 0,
                r12: 0,
                rbp: 0,
                rbx: 0,
                r11: 0,
                r10: 0,
                r9: 0,
                r8: 0,
                rax: 0,
                rcx: 0,
                rdx: 0,
                rsi: 0,
                rdi: 0,
                orig_rax: 0,
                rip: 0,
                cs: 0,
                eflags: 0,
                rsp: 0,
                ss: 0,
                fs_base: 0,
                gs_base: 0,
                ds: 0,
                es: 0,
                fs: 0,
                gs: 0,
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            libc::user_regs_struct {
                regs: [0; 31],
                sp: 0,
                pc: 0,
                pstate: 0,
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn set_sp(r: &mut Regs, sp: u64) {
        r.rsp = sp;
    }
    #[cfg(target_arch = "x86_64")]
    fn get_sp(r: &Regs) -> u64 {
        r.rsp
    }
    #[cfg(target_arch = "aarch64")]
    fn set_sp(r: &mut Regs, sp: u64) {
        r.sp = sp;
    }
    #[cfg(target_arch = "aarch64")]
    fn get_sp(r: &Regs) -> u64 {
        r.sp
    }
}
