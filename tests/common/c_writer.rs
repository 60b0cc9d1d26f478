//! Building and starting the C test producers (`tests/c`, `tests/compat`),
//! for the tests that drive one: included by path, one copy per test
//! binary (`#[path = "common/c_writer.rs"] mod c_writer;`).
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Lines, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

/// Whether this machine has a C compiler (`cc`).
pub(crate) fn have_cc() -> bool {
    Command::new("cc")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Compiles `src` (relative to the crate) into `exe`, warnings as errors.
/// `lang`: the compiler and its language flags (`["cc", "-std=gnu11"]`);
/// `extra`: flags after the common ones (`-pthread`).
pub(crate) fn compile(src: &str, exe: &Path, lang: &[&str], extra: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
    let st = Command::new(lang[0])
        .args(&lang[1..])
        .args(["-O2", "-Wall", "-Wextra", "-Werror"])
        .args(extra)
        .arg("-o")
        .arg(exe)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("a C compiler ({}) is needed for this test: {e}", lang[0]));
    assert!(st.success(), "compiling {} failed", src.display());
    exe.to_path_buf()
}

/// A running C producer, its segment (the first line it prints) and the
/// rest of what it prints.
pub(crate) struct Writer {
    pub child: Child,
    pub path: PathBuf,
    pub lines: Lines<BufReader<ChildStdout>>,
}

/// Starts `exe` with `args`; returns once it printed its segment's path.
pub(crate) fn start<S: AsRef<OsStr>>(exe: &Path, args: &[S]) -> Writer {
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let path = PathBuf::from(lines.next().unwrap().unwrap());
    Writer { child, path, lines }
}

impl Writer {
    /// Writes one line to the producer's standard input.
    pub(crate) fn tell(&mut self, line: &str) {
        writeln!(self.child.stdin.as_mut().unwrap(), "{line}").unwrap();
    }
}
