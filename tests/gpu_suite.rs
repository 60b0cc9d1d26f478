//! The agent's GPU tests (tests/gpu/run.sh) when an NVIDIA GPU and a CUDA
//! PyTorch are present; otherwise a visible SKIPPED line.

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
fn gpu_suite() {
    if !gpu_with_torch() {
        println!("SKIPPED: GPU tests need an NVIDIA GPU with PyTorch (tests/gpu/run.sh)");
        return;
    }
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
