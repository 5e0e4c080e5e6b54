#!/usr/bin/env python3
"""Where do bench-ycsb's threads wait? Samples every thread of the running
bench-ycsb process every 5 ms (state and wchan from /proc); for each
episode in which a thread stayed in one (state, wchan) other than a timer
sleep for at least 5 ms, writes one JSON line: unix_ms of its start, its
length, the thread's name, state and wchan, and (for uninterruptible
waits) its kernel stack read once during the episode. Stops by itself
after --limit seconds or when the process it follows is gone."""
import json, os, sys, time, argparse

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--limit", type=float, default=1800.0)
ap.add_argument("--period", type=float, default=0.005)
args = ap.parse_args()

def bench_pids():
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"bench-ycsb") and b"run" in cmd:
                pids.append(int(p))
    return pids

def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None

IDLE = {"hrtimer_nanosleep", "0", ""}
end = time.time() + args.limit
cur = {}  # tid -> [state, wchan, start, comm, stack]
out = open(args.out, "a")
seen_any = False
pids, scanned = [], 0.0
while time.time() < end:
    if not pids or time.time() - scanned > 1.0:
        pids, scanned = bench_pids(), time.time()
    if not pids:
        if seen_any:
            break
        time.sleep(0.2)
        continue
    seen_any = True
    now = time.time()
    live = set()
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            stat = read(base + "/stat")
            wchan = read(base + "/wchan")
            if stat is None or wchan is None:
                continue
            state = stat[stat.rindex(")") + 2]
            key = (state, wchan)
            live.add(tid)
            c = cur.get(tid)
            if c is None or (c[0], c[1]) != key:
                if c is not None:
                    dur = now - c[2]
                    if dur >= 0.005 and c[1] not in IDLE and c[0] != "R":
                        out.write(json.dumps({"unix_ms": int(c[2] * 1000), "ms": round(dur * 1000, 1), "comm": c[3],
                                              "tid": int(tid), "state": c[0], "wchan": c[1], "stack": c[4]}) + "\n")
                comm = (read(base + "/comm") or "?").strip()
                cur[tid] = [state, wchan, now, comm, None]
            elif c[4] is None and state == "D" and now - c[2] >= 0.005:
                c[4] = (read(base + "/stack") or "").split("\n")[:12]
    for tid in list(cur):
        if tid not in live:
            del cur[tid]
    out.flush()
    time.sleep(args.period)
