#!/usr/bin/env bash
# Copies this machine's perf with the libraries it links and its loader
# into DIR, to run on a machine without perf (the GPU machine: carry DIR
# there; tests/gpu/perf_attrib.sh). Prints the PERF value to use there,
# relative to the repository root when DIR is inside it.
#   scripts/carry_perf.sh DIR
set -euo pipefail
dir=${1:?usage: scripts/carry_perf.sh DIR}
perf=$(command -v perf) || { echo "no perf on this machine" >&2; exit 1; }
perf=$(readlink -f "$perf")
mkdir -p "$dir/lib"
cp "$perf" "$dir/perf"
ldd "$perf" | awk '$3 ~ /^\// {print $3}' | while read -r l; do cp -L "$l" "$dir/lib/"; done
loader=$(ldd "$perf" | awk '$1 ~ /^\/.*ld-linux/ {print $1}')
cp -L "$loader" "$dir/$(basename "$loader")"
echo "PERF=\"$dir/$(basename "$loader") --library-path $dir/lib $dir/perf\""
