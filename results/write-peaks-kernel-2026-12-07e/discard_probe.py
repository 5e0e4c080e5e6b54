#!/usr/bin/env python3
"""Does freeing a file's blocks stall reads on this disk?

Usage: discard_probe.py [ROUNDS=6] [FILE_MIB=64] [FILES=1]
(env MODES: a comma list of none, unlink, unlink+fsync, pieces,
pieces+fsync, pieces256; default the first five).

A probe thread reads 4 KiB (O_DIRECT) at a random offset of a 256 MiB
file every 5 ms. In each round, for each mode (forward in even rounds,
backward in odd ones), the main thread writes and fsyncs FILES files of
FILE_MIB MiB, waits 1 s, frees them and waits until 3 s after the free
began:
  none          nothing freed in the window (unlinked after it closes)
  unlink        unlink() each file
  unlink+fsync  the same, then fsync the directory (forces a journal commit)
  pieces        ftruncate() each file 1 MiB shorter every 10 ms, then unlink
                (what rocks-env does with its default 1 MiB pieces)
  pieces+fsync  the same with an fsync after each piece
  pieces256     256 KiB pieces, 2.5 ms apart (the same rate)
Prints, per mode, the probe reads that ended inside its windows: count,
p50, p99, max, how many took 10 ms or more, and the worst per round.
Bounded (ROUNDS x modes); files live in one temp dir under /work (the
root disk, with ext4's online `discard`), removed at the end, also on
failure.
"""
import mmap, os, random, sys, tempfile, threading, time, shutil

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 6
SIZE = (int(sys.argv[2]) if len(sys.argv) > 2 else 64) << 20
FILES = int(sys.argv[3]) if len(sys.argv) > 3 else 1
PIECE = 1 << 20
d = tempfile.mkdtemp(prefix="discard-probe-", dir="/work")
lat = []  # (t_end, ms)
stop = False


def probe():
    path = os.path.join(d, "probe")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)
    n = (256 << 20) // 4096
    while not stop:
        off = random.randrange(n) * 4096
        t0 = time.monotonic()
        os.preadv(fd, [buf], off)
        t1 = time.monotonic()
        lat.append((t1, (t1 - t0) * 1e3))
        time.sleep(0.005)
    os.close(fd)


def write_file(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    chunk = os.urandom(1 << 20)
    for _ in range(SIZE // len(chunk)):
        os.write(fd, chunk)
    os.fsync(fd)
    os.close(fd)
    dfd = os.open(d, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)


def free(path, mode):
    if mode == "unlink":
        os.unlink(path)
    elif mode == "unlink+fsync":
        os.unlink(path)
        dfd = os.open(d, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
    elif mode.startswith("pieces"):
        sync = mode.endswith("+fsync")
        piece = (256 << 10) if mode.startswith("pieces256") else PIECE
        fd = os.open(path, os.O_WRONLY)
        size = SIZE
        while size > piece:
            size -= piece
            os.ftruncate(fd, size)
            if sync:
                os.fsync(fd)
            time.sleep(0.010 * piece / PIECE)
        os.close(fd)
        os.unlink(path)
    elif mode == "none":
        pass


def main():
    global stop
    modes = os.environ.get("MODES", "none,unlink,unlink+fsync,pieces,pieces+fsync").split(",")
    windows = {m: [] for m in modes}
    t = None
    try:
        # the probe file: written once, fsynced
        fd = os.open(os.path.join(d, "probe"), os.O_WRONLY | os.O_CREAT, 0o644)
        chunk = os.urandom(1 << 20)
        for _ in range(256):
            os.write(fd, chunk)
        os.fsync(fd)
        os.close(fd)
        t = threading.Thread(target=probe)
        t.start()
        for r in range(ROUNDS):
            for m in (modes if r % 2 == 0 else modes[::-1]):
                paths = [os.path.join(d, f"f-{r}-{m}-{i}") for i in range(FILES)]
                for path in paths:
                    write_file(path)
                time.sleep(1.0)
                t0 = time.monotonic()
                if m.startswith("unlink"):
                    for path in paths[:-1]:
                        os.unlink(path)
                    free(paths[-1], m)
                else:
                    for path in paths:
                        free(path, m)
                time.sleep(max(0.0, t0 + 3.0 - time.monotonic()))
                windows[m].append((t0, t0 + 3.0))
                if m == "none":
                    for path in paths:
                        os.unlink(path)  # freed after its window closed
    finally:
        stop = True
        if t is not None:
            t.join()
        shutil.rmtree(d, ignore_errors=True)
    print(f"{'mode':14} {'reads':>6} {'p50':>6} {'p99':>7} {'max':>7} {'>=10ms':>7}  worst per round (ms)")
    for m in modes:
        xs = [ms for (te, ms) in lat for (a, b) in windows[m] if a <= te <= b]
        worst = [max([ms for (te, ms) in lat if a <= te <= b] or [0]) for (a, b) in windows[m]]
        xs.sort()
        p = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]
        print(f"{m:14} {len(xs):6} {p(0.5):6.2f} {p(0.99):7.2f} {xs[-1]:7.2f} {sum(1 for x in xs if x >= 10):7}  "
              + " ".join(f"{w:.1f}" for w in worst))


if __name__ == "__main__":
    main()
