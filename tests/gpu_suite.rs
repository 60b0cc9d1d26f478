//! The agent's GPU tests (tests/gpu/run.sh). Ignored by a plain `cargo test`
//! (so a machine without a GPU reports it as ignored, never as passed);
//! `scripts/test` runs it with `--ignored` when an NVIDIA GPU and a CUDA
//! PyTorch are present, and then it must pass. Run by hand without a GPU
//! it fails, saying what is missing.

use std::process::Command;

fn gpu_with_torch() -> bool {
    let smi = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .map(|o| o.status.success() && !o.stdout.is_empty())
        .unwrap_or(false);
    smi && Command::new("python3")
        .args([
            "-c",
            "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
        ])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
#[ignore = "needs an NVIDIA GPU with PyTorch: scripts/test runs it with --ignored when one is present"]
fn gpu_suite() {
    assert!(
        gpu_with_torch(),
        "GPU tests need an NVIDIA GPU with a CUDA PyTorch (nvidia-smi -L and torch.cuda.is_available())"
    );
    let root = env!("CARGO_MANIFEST_DIR");
    let st = Command::new("bash")
        .arg(format!("{root}/tests/gpu/run.sh"))
        .status()
        .expect("bash");
    assert!(
        st.success(),
        "tests/gpu/run.sh failed (logs in target/gpu-logs)"
    );
}
