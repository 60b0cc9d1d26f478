//! Python 3.14 and later: `sys.remote_exec(pid, script)` (PEP 768), the
//! interpreter's own way to run a script inside another Python process.
//! It is run by the target's own interpreter (`/proc/PID/exe`, started
//! with `-I` so that the user's environment changes nothing); CPython then
//! runs the script on the target's main thread at its next safe point, as
//! the ptrace injector's pending call does. Where the job has switched it
//! off (`PYTHON_DISABLE_REMOTE_DEBUG`, `-X disable_remote_debug`), that
//! choice is kept: the failure is reported, no ptrace injection is tried.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::elf;

/// The first version with `sys.remote_exec`.
pub(crate) const FIRST: (u32, u32) = (3, 14);

/// The target's CPython version: its `Py_Version` (3.11+, exact) when
/// known, else the version in the name of its libpython or executable
/// (`libpython3.14.so.1.0`, `python3.14`), the first name that has one.
pub(crate) fn version(py_version: Option<u64>, names: &[&str]) -> Option<(u32, u32)> {
    py_version
        .and_then(elf::version_from_hex)
        .or_else(|| names.iter().find_map(|n| elf::version_from_name(n)))
}

/// Whether that version has `sys.remote_exec`.
pub(crate) fn has_remote_exec(version: Option<(u32, u32)>) -> bool {
    version.is_some_and(|v| v >= FIRST)
}

/// The target's interpreter as a path this process can run: the file
/// `/proc/PID/exe` names when it is still that file, else the link itself
/// (which the kernel resolves to the running file).
pub(crate) fn interpreter(pid: u32) -> PathBuf {
    let link = PathBuf::from(format!("/proc/{pid}/exe"));
    let same = |p: &Path| {
        let (Ok(a), Ok(b)) = (std::fs::metadata(p), std::fs::metadata(&link)) else {
            return false;
        };
        a.dev() == b.dev() && a.ino() == b.ino()
    };
    match std::fs::read_link(&link) {
        Ok(p) if p.is_absolute() && same(&p) => p,
        _ => link,
    }
}

/// Runs `python -I -c CODE ARGS...` for at most `timeout`: its exit
/// status and the last line of its stderr.
fn python(
    python: &Path,
    code: &str,
    args: &[&str],
    timeout: Duration,
) -> Result<(bool, String), String> {
    let mut child = Command::new(python)
        .arg("-I")
        .arg("-c")
        .arg(code)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not finish within {timeout:?}",
                    python.display()
                ));
            }
            Err(e) => return Err(format!("waiting for {}: {e}", python.display())),
        }
    };
    let mut err = String::new();
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    let last = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    Ok((status.success(), last.to_string()))
}

/// Whether `python` runs here and has `sys.remote_exec`.
pub(crate) fn runnable(py: &Path) -> bool {
    python(
        py,
        "import sys; sys.exit(0 if hasattr(sys, 'remote_exec') else 3)",
        &[],
        Duration::from_secs(10),
    )
    .is_ok_and(|(ok, _)| ok)
}

/// Asks the target to run `script` (a file it can read).
pub(crate) fn remote_exec(py: &Path, pid: u32, script: &Path) -> Result<(), String> {
    let script = script
        .to_str()
        .ok_or_else(|| format!("the script's path {} is not UTF-8", script.display()))?;
    let (ok, last) = python(
        py,
        "import sys; sys.remote_exec(int(sys.argv[1]), sys.argv[2])",
        &[&pid.to_string(), script],
        Duration::from_secs(20),
    )?;
    if ok {
        Ok(())
    } else {
        Err(format!(
            "sys.remote_exec failed: {}",
            if last.is_empty() { "no message" } else { &last }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_from_the_symbol_first_then_names() {
        // Py_Version wins over a name that says otherwise.
        assert_eq!(version(Some(0x030E00F0), &["python3.12"]), Some((3, 14)));
        assert_eq!(
            version(None, &["python3", "libpython3.14.so.1.0"]),
            Some((3, 14))
        );
        assert_eq!(
            version(None, &["python3.12", "libpython3.14.so.1.0"]),
            Some((3, 12))
        );
        assert_eq!(version(None, &["python3.15t"]), Some((3, 15)));
        assert_eq!(version(None, &["python3", "sleep"]), None);
        assert_eq!(version(Some(0), &[]), None);
    }

    #[test]
    fn remote_exec_from_3_14() {
        assert!(has_remote_exec(Some((3, 14))));
        assert!(has_remote_exec(Some((3, 15))));
        assert!(has_remote_exec(Some((4, 0))));
        assert!(!has_remote_exec(Some((3, 13))));
        assert!(!has_remote_exec(Some((2, 7))));
        assert!(!has_remote_exec(None));
    }

    #[test]
    fn this_process_s_interpreter_is_its_file() {
        let me = interpreter(std::process::id());
        assert_eq!(me, std::env::current_exe().unwrap());
        // Not a Python: no sys.remote_exec (and it does not hang).
        assert!(!runnable(Path::new("/bin/false")));
        assert!(!runnable(Path::new("/no/such/python")));
    }
}
