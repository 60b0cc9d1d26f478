//! The in-process PyTorch agent, embedded in the binary.
//!
//! `assets/agent/` (a small Python package, the C++ tracker source and the C
//! ring writer) is compiled into the binary and extracted on demand to
//! `$XDG_CACHE_HOME/vramscope/agent-<version>-<hash>/`, so users need no pip
//! install. From there:
//!
//! - [`run`](fn@run) / [`exec`] run a user's command with the agent injected (a
//!   `sitecustomize.py` on `PYTHONPATH` that attaches when the script
//!   imports torch, chaining any sitecustomize it shadows);
//! - [`extract`](fn@extract) gives the directory to put on `PYTHONPATH` for
//!   `import vramscope; vramscope.attach()`;
//! - [`doctor`](fn@doctor) checks what the agent and the dashboard need, running the
//!   agent's own search (`python3 -m vramscope.doctor`) for the Python side.
//!
//! - [`build`] builds the tracker before a job needs it (`run` does so
//!   before it starts the command; `vramscope agent build` ahead of time).
//!
//! No `unsafe` here: process spawning and files only.
//!
//! The files split along those jobs: `extract` (the embedded files and
//! the private directory they go to), `run` (a command with the agent
//! injected), `doctor` (the checks), and `build`; the environment the
//! agent reads is here.

use std::ffi::OsString;
use std::path::Path;

pub mod build;
mod doctor;
mod extract;
mod run;

pub(crate) use build::prebuild_for;
pub use doctor::{doctor, doctor_with, Check, Level};
pub use extract::{dir_name, extract, extract_to, verified, FILES};
pub use run::{exec, run};

/// Environment variables the agent reads (see `vramscope/__init__.py`).
pub(crate) const ENV_AUTO: &str = "VRAMSCOPE_AUTO";
pub(crate) const ENV_SHM_DIR: &str = "VRAMSCOPE_SHM_DIR";
pub(crate) const ENV_PYTHON: &str = "VRAMSCOPE_PYTHON";

/// `PYTHONPATH` with `dir` first, then what this process has.
pub(crate) fn pythonpath_with(dir: &Path) -> OsString {
    let mut pp = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("PYTHONPATH").filter(|v| !v.is_empty()) {
        pp.push(":");
        pp.push(old);
    }
    pp
}
