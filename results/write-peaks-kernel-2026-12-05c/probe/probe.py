# Sleeps 1 ms in a loop for a bounded time; prints every wake-up that came
# more than 8 ms late (unix ms, lateness ms).
import time, sys
end = time.monotonic() + float(sys.argv[1])
out = open(sys.argv[2], 'w')
prev = time.monotonic()
while True:
    time.sleep(0.001)
    now = time.monotonic()
    if now > end: break
    gap = (now - prev) * 1000
    if gap > 8:
        out.write(f"{int(time.time()*1000)} {gap:.1f}\n"); out.flush()
    prev = now
