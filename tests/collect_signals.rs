//! Signals go through the collector's runtime: `stopped()` ends at a
//! SIGTERM, and the dashboard's `Live::on_signal` callback runs on each
//! SIGHUP. (Its own test binary: the handlers stay installed.)

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn signals_end_a_wait_and_reach_the_dashboard() {
    let rt = vramscope_collect::runtime().unwrap();
    let ended = rt.block_on(async {
        let wait = tokio::spawn(vramscope_collect::signals::stopped());
        // Let the handlers install before raising.
        tokio::time::sleep(Duration::from_millis(50)).await;
        // tokio's handler is installed: the default action (exit) does not run.
        kill("-TERM");
        tokio::time::timeout(Duration::from_secs(5), wait).await
    });
    assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");

    let mut cfg = vramscope_collect::Config::new(tempfile::tempdir().unwrap().keep());
    cfg.nvml = false;
    let live = vramscope_collect::Live::start(cfg).unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    live.on_signal(move || {
        c.fetch_add(1, Ordering::AcqRel);
    });
    std::thread::sleep(Duration::from_millis(50));
    for _ in 0..2 {
        kill("-HUP");
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while calls.load(Ordering::Acquire) < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(calls.load(Ordering::Acquire), 2);
}

/// Sends `signal` to this process, as another process would.
fn kill(signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
