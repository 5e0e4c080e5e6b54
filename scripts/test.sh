#!/usr/bin/env bash
# Runs the whole test suite on a fresh Debian machine: installs what the build
# needs when it is missing, then `cargo test --release --workspace`.
# Everything is built with the release profile so RocksDB's C++ code (built
# by librocksdb-sys) is compiled once for tests, benches and binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo test --release --workspace --locked "$@"
