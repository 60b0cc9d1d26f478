//! Standard output, for every command that prints data: [`print`](fn@print) writes
//! and flushes; a closed pipe (`vramscope snapshot --json | head -1`) is the
//! end of the output, not a failure — the error it returns is
//! [`Closed`], which `main` turns into a quiet exit 0. Any other write
//! error is an error like any other.
//!
//! No `println!` for data in `src/cmd/`: it panics on a closed pipe.
use std::fmt;
use std::io::{self, Write};

/// Standard output was closed by its reader.
#[derive(Debug)]
pub(crate) struct Closed;

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for Closed {}

/// Whether `e` is (caused by) a closed standard output.
pub(crate) fn is_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<Closed>()
            || c.downcast_ref::<io::Error>()
                .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// Writes `text` to standard output and flushes it.
pub(crate) fn print(text: &str) -> anyhow::Result<()> {
    let mut o = io::stdout().lock();
    o.write_all(text.as_bytes())
        .and_then(|()| o.flush())
        .map_err(wrap)
}

/// `text` and a newline.
pub(crate) fn line(text: &str) -> anyhow::Result<()> {
    let mut s = String::with_capacity(text.len() + 1);
    s.push_str(text);
    s.push('\n');
    print(&s)
}

/// A buffered writer on standard output for a long stream of lines
/// (`sim --trace`); its errors go through [`wrap`].
pub(crate) fn stream() -> io::BufWriter<io::StdoutLock<'static>> {
    io::BufWriter::with_capacity(1 << 16, io::stdout().lock())
}

/// A write error on standard output, as this module reports it.
pub(crate) fn wrap(e: io::Error) -> anyhow::Error {
    if e.kind() == io::ErrorKind::BrokenPipe {
        anyhow::Error::new(Closed)
    } else {
        anyhow::Error::new(e).context("writing to standard output")
    }
}
