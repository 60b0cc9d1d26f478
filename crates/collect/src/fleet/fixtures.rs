//! A small fleet for tests (compiled for tests and the `fixtures` feature
//! only): three nodes, one of them down, three processes, one leaking.

use super::model::{Fleet, Gpu, Node, Proc};

/// A running process `pid` on `host` with `resv` bytes reserved and half of
/// it allocated.
pub(crate) fn proc(inst: &str, host: &str, pid: &str, resv: f64, leak: bool) -> Proc {
    Proc {
        instance: inst.into(),
        host: host.into(),
        pid: pid.into(),
        process: format!("train{pid}"),
        device: "0".into(),
        reserved: Some(resv),
        allocated: Some(resv / 2.0),
        leak: Some(leak),
        running: true,
        ..Proc::default()
    }
}

/// `alpha` (pid 10), `beta` (pids 20, leaking, and 21) and a node that is
/// down (`c:1`, no host name).
pub fn fleet() -> Fleet {
    let node = |inst: &str, host: &str, procs: Vec<Proc>, up: bool| Node {
        instance: inst.into(),
        host: host.into(),
        up,
        gpus: vec![Gpu::default()],
        procs,
    };
    Fleet {
        nodes: vec![
            node(
                "a:1",
                "alpha",
                vec![proc("a:1", "alpha", "10", 5.0, false)],
                true,
            ),
            node(
                "b:1",
                "beta",
                vec![
                    proc("b:1", "beta", "20", 9.0, true),
                    proc("b:1", "beta", "21", 1.0, false),
                ],
                true,
            ),
            node("c:1", "", vec![], false),
        ],
    }
}
