#!/usr/bin/python3
"""Live view for `make demo`: one line a second with queue depth, the pool by
state and the autoscaler's desired size, read from the broker's and the
autoscaler's /metrics pages. Stops on SIGTERM."""
import re
import signal
import sys
import time
import urllib.request

running = True


def stop(*_):
    global running
    running = False


def scrape(url):
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            text = r.read().decode()
    except Exception:
        return {}
    values = {}
    for line in text.splitlines():
        m = re.match(r'^([a-z_]+(?:\{[^}]*\})?) (\S+)$', line)
        if m:
            values[m.group(1)] = float(m.group(2))
    return values


def main():
    broker, scaler = sys.argv[1], sys.argv[2]
    signal.signal(signal.SIGTERM, stop)
    start = time.time()
    while running:
        b, a = scrape(broker), scrape(scaler)
        queued = sum(v for k, v in b.items() if k.startswith('fleet_queue_depth'))
        print('  [live %5.1fs] queue_depth=%-5d inflight=%-3d pool: starting=%d running=%d '
              'retiring=%d desired=%d  done=%d' % (
                  time.time() - start, queued, b.get('fleet_batches_inflight', 0),
                  a.get('fleet_autoscaler_workers{state="starting"}', 0),
                  a.get('fleet_autoscaler_workers{state="running"}', 0),
                  a.get('fleet_autoscaler_workers{state="retiring"}', 0),
                  a.get('fleet_autoscaler_desired_workers', 0),
                  b.get('fleet_batches_completed_total{outcome="ok"}', 0)
                  + b.get('fleet_batches_completed_total{outcome="failed"}', 0)),
              flush=True)
        time.sleep(1)


if __name__ == '__main__':
    main()
