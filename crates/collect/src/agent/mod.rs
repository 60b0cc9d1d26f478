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
//! injected), `doctor` (the checks), `build`, and `env` (the environment
//! the agent reads).

pub mod build;
mod doctor;
mod env;
mod extract;
mod run;

pub(crate) use build::prebuild_for;
pub use doctor::{doctor, doctor_with, Check, Level};
pub use extract::{dir_name, extract, extract_to, verified, FILES};
pub use run::{exec, run};
