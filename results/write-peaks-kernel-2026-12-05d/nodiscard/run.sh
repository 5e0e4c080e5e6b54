#!/bin/bash
# Diagnostic only: the root file system without online discard for one run; restored on exit.
trap 'mount -o remount,discard / ; findmnt -no OPTIONS / > /tmp/wp5/restored' EXIT
mount -o remount,nodiscard / || exit 1
findmnt -no OPTIONS / > /tmp/wp5/during
python3 /tmp/wp3/waits.py --out /tmp/wp5/waits.jsonl --limit 900 &
./target/release/bench-ycsb run --workload write-heavy --profile write-peaks --settle --duration 30s --device kernel:rbps=64MiB,wbps=64MiB --systems default,paio-static --repeats 3 --drain-timeout 20s --quiet --out /tmp/wp5/run > /tmp/wp5/run.log 2>&1
wait
