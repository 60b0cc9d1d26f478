//! Hostile inputs, one test per attack of the adversarial review (issue 11):
//! crafted segments from a small writer of the format, a second user where
//! the machine allows it, a pid namespace where `unshare` works, a truncating
//! process, a sparse file, a flood of orphan allocations. A test that needs
//! what this machine lacks prints `SKIPPED: …` and returns.
//!
//! One module per area; each test is named after the item it pins
//! (`item_NN_…`: the adversarial review; `itemN_…` in `fleet`: the
//! reliability issue, whose other items are pinned in `tests/serve.rs` and
//! `tests/fleet_prometheus.rs`).

#[path = "../common/c_writer.rs"]
mod c_writer;
#[path = "../common/mod.rs"]
mod common;
#[path = "../stand_in/mod.rs"]
mod stand_in;

mod agent;
mod containers;
mod fleet;
mod memory;
mod names;
mod numbers;
mod pickles;
mod reader;
mod views;

#[test]
#[ignore = "a stand-in producer, run by the tests of `views` as a process of its own"]
fn stand_in_producer() {
    stand_in::main();
}

#[test]
#[ignore = "one `open`'s exact peak, run by the tests of `pickles` as a process of its own"]
fn peak_of_one_open() {
    pickles::peak_of_one_open();
}
