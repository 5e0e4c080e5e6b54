#!/bin/bash
# Sets SCHED_IDLE on every rocksdb background thread of process $1 until it exits.
pid=$1
while kill -0 $pid 2>/dev/null; do
  for t in /proc/$pid/task/*; do
    n=$(cat $t/comm 2>/dev/null)
    case "$n" in rocksdb:*) chrt -i -p 0 ${t##*/} >/dev/null 2>&1;; esac
  done
  sleep 0.2
done
