#!/usr/bin/env bash
# The main job: the YCSB side-by-side comparison (plain RocksDB, RocksDB
# through a pass-through stage, through a stage with the default controller,
# RocksDB's auto-tuned rate limiter, the stage with SILK, and with static
# limits). Installs what the build needs when it is missing, builds with the
# release profile (the first build compiles RocksDB's C++ code, about 15
# minutes on 2 cores), then runs `bench-ycsb` with the arguments given, in the
# current directory (no arguments: `bench-ycsb run`, the mixture workload,
# six systems of 60 s each, results in ./ycsb-results). `bash scripts/ycsb.sh figures`
# runs the paper's three workloads; `--device kernel:rbps=..,wbps=..` runs
# on the real disk throttled by a cgroup (as root).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/scripts/setup.sh"
# Build from the workspace root so its .cargo/config.toml applies, with the
# very cargo command of scripts/test.sh (without running the tests), so
# RocksDB's C++ code is compiled once for both. A `-p bench-ycsb` build
# resolves the build tools' features without the other crates' (regex,
# itertools, log and either, which bindgen shares with kv-remote's protobuf
# generator and the dev-dependencies), and that gives librocksdb-sys another
# hash: a second 15-minute compile. The bench binary is built with the
# workspace's tests (cargo builds a package's binaries for its integration
# tests).
(cd "$root" && cargo test --release --workspace --locked --no-run)
if [ "$#" -eq 0 ]; then
    set -- run
fi
target="${CARGO_TARGET_DIR:-target}"
[[ "$target" = /* ]] || target="$root/$target"
exec "$target/release/bench-ycsb" "$@"
