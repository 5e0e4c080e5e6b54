#!/usr/bin/env bash
# The main job: the YCSB side-by-side comparison (plain RocksDB, RocksDB's
# auto-tuned rate limiter, RocksDB through a stage with SILK, and with static
# limits). Installs what the build needs when it is missing, builds with the
# release profile (the first build compiles RocksDB's C++ code), then runs
# `bench-ycsb` with the arguments given, from the current directory
# (no arguments: `bench-ycsb run`, the mixture workload, about 5 minutes,
# results in ./ycsb-results).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/scripts/setup.sh"
if [ "$#" -eq 0 ]; then
    set -- run
fi
exec cargo run --quiet --release --locked --manifest-path "$root/Cargo.toml" -p bench-ycsb -- "$@"
