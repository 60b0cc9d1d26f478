#!/usr/bin/env bash
# Builds and runs one fuzz target without cargo-fuzz:
#
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer options...]
#
# TARGET: header, reader, recording, trace, control, snapshot, snapshot_shared
# diff or fleet_json (fuzz/fuzz_targets/). A target with a dictionary,
# fuzz/TARGET.dict, is given it (-dict=).
# The build is a release build of the fuzz package only, instrumented the way
# cargo-fuzz does it (SanitizerCoverage, `--cfg fuzzing`, debug assertions);
# the binaries land in fuzz/target/x86_64-unknown-linux-gnu/release/TARGET.
# The corpus grows in fuzz/corpus/TARGET (seeded from fuzz/seeds/TARGET and
# the test fixtures), crashes go to fuzz/artifacts/TARGET/; both are ignored
# by git. Reproduce a crash with: BIN fuzz/artifacts/TARGET/crash-…
set -euo pipefail
target=${1:?usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer options...]}
seconds=${2:?usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer options...]}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
triple=$(rustc -vV | sed -n 's/^host: //p')
cd "$root/fuzz"
RUSTC_BOOTSTRAP=1 \
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
-Cdebug-assertions -Coverflow-checks --cfg fuzzing" \
  cargo build --release --target "$triple" --target-dir target --bin "$target"
bin="$root/fuzz/target/$triple/release/$target"
corpus="$root/fuzz/corpus/$target"
artifacts="$root/fuzz/artifacts/$target"
mkdir -p "$corpus" "$artifacts"
seeds=()
[ -d "$root/fuzz/seeds/$target" ] && seeds+=("$root/fuzz/seeds/$target")
case $target in
  recording) seeds+=("$root/tests/fixtures/recordings") ;;
  trace) seeds+=("$root/tests/fixtures/sim") ;;
  snapshot|snapshot_shared) seeds+=("$root/tests/fixtures/snapshots/releases") ;;
esac
options=()
[ -f "$root/fuzz/$target.dict" ] && options+=(-dict="$root/fuzz/$target.dict")
exec "$bin" "$corpus" "${seeds[@]}" -artifact_prefix="$artifacts/" \
  -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
  ${options[@]+"${options[@]}"} "$@"
