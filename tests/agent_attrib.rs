//! The agent's module attribution (`assets/agent/vramscope/_attrib.py`) with
//! no torch and no GPU: the real module against the stand-in torch in
//! `tests/agent_attrib/fake_torch` and a stand-in tracker library
//! (`tests/agent_attrib/test_attrib.py`): module paths, the forward,
//! backward, optimizer and other phases per thread, leaves without
//! parameters, exceptions, compiled regions, stack capture (command 5),
//! wrappers and the id bound. Needs python3; without it the test says
//! SKIPPED.

use std::path::Path;
use std::process::Command;

#[test]
fn attribution_logic_without_torch() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if Command::new("python3").arg("--version").output().is_err() {
        println!("SKIPPED: attribution_logic_without_torch: no python3");
        return;
    }
    let path = std::env::join_paths([
        root.join("tests/agent_attrib/fake_torch"),
        root.join("assets/agent"),
    ])
    .unwrap();
    let out = Command::new("python3")
        .arg("-B")
        .arg(root.join("tests/agent_attrib/test_attrib.py"))
        .env("PYTHONPATH", path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("test_attrib.py: all passed"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok ")).count(),
        22,
        "{text}"
    );
}
