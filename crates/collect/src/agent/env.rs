//! The environment the agent reads, and `PYTHONPATH` with the agent first.

use std::ffi::OsString;
use std::path::Path;

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
