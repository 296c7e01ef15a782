#!/usr/bin/env python3
"""Every device of a `failsafe serve` at once, as clients see it over HTTP:

- every device process frozen (SIGSTOP, as a host under memory pressure, a
  VM migration or a debugger attach freezes them) for 0.3, 1, 2 and 5 s
  while six streams run, and for 2 s while idle: no device is declared
  dead, the same processes serve on, and every stream finishes with the
  text of a single-device server, its longest gap the freeze and little
  more;
- every device process killed (SIGKILL) mid-stream: `/health` answers 503
  and the capacity gauge reads 0 while nothing can serve, the devices are
  respawned without an operator, and every stream waits for them (within
  --outage-timeout) and finishes with that text.

Each case prints the longest gap between two pieces of text of any stream.

  python3 serve_outage.py --failsafe PATH
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fleet_haproxy  # noqa: E402
from fleet_haproxy import burst, metric, one_device_text, same_text, streaming  # noqa: E402
from serve_lifecycle import (FAILURES, Server, check, children, finish, request,  # noqa: E402
                             running, tiny_model)

DEVICES = 4
fleet_haproxy.MAX_TOKENS = 400  # streams that outlast every freeze's start


def devices(server):
    return sorted(p for p in children(server.proc.pid) if running(p))


def freeze(pids, seconds):
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    time.sleep(seconds)
    for p in pids:
        os.kill(p, signal.SIGCONT)


def test_freezes(server, reference):
    pids = devices(server)
    check(len(pids) == DEVICES, f"{DEVICES} device processes ({pids})")
    for seconds in (0.3, 1.0, 2.0, 5.0):
        res = burst(server.port, 6, lambda: (streaming(server.port, 0.1), freeze(pids, seconds)))
        gap = max((r[3] for r in res if r), default=0.0)
        check(same_text(res, reference),
              f"every device frozen {seconds} s mid-stream: every stream finishes with the text "
              f"of one device: {[r and r[2] for r in res]}")
        check(devices(server) == pids and metric(server.port, "failsafe_devices_alive") == DEVICES,
              f"frozen {seconds} s: no device declared dead, the same processes serve")
        print(f"every device frozen {seconds} s mid-stream: 6 of 6 streams whole, "
              f"longest gap {gap:.2f} s", flush=True)
        check(seconds - 0.1 <= gap < seconds + 2, f"frozen {seconds} s mid-stream: the gap is "
              f"the freeze and little more ({gap:.2f} s)")
    freeze(pids, 2.0)
    res = burst(server.port, 6)
    check(same_text(res, reference) and devices(server) == pids,
          "every device frozen 2 s while idle: the same processes serve the same text")


def test_kill_every_device(server, reference):
    pids = devices(server)
    seen = {"health": set(), "capacity": set()}

    def kill_all():
        streaming(server.port, 0.1)
        for p in pids:
            os.kill(p, signal.SIGKILL)
        t = time.time()
        # Until the devices are back: what a router and a load balancer see.
        gone = False
        while time.time() < t + 30:
            status, _ = request(server.port, "GET", "/health")
            seen["health"].add(status)
            seen["capacity"].add(metric(server.port, "failsafe_capacity_fraction"))
            alive = metric(server.port, "failsafe_devices_alive")
            gone |= alive is not None and alive < DEVICES
            if gone and alive == DEVICES and status == 200:
                break
            time.sleep(0.01)
        seen["back_after"] = time.time() - t

    res = burst(server.port, 6, kill_all)
    gap = max((r[3] for r in res if r), default=0.0)
    check(same_text(res, reference),
          f"every device killed mid-stream: every stream waits for the respawned devices and "
          f"finishes with the text of one device: {[r and r[2] for r in res]}")
    check(503 in seen["health"], f"/health says 503 while nothing can serve ({seen['health']})")
    check(0.0 in seen["capacity"], f"the capacity gauge reads 0 while nothing can serve "
          f"({sorted(c for c in seen['capacity'] if c is not None)})")
    fresh = devices(server)
    check(len(fresh) == DEVICES and not set(fresh) & set(pids),
          f"{DEVICES} new device processes, respawned without an operator ({fresh})")
    print(f"every device killed mid-stream: 6 of 6 streams whole, longest gap {gap:.2f} s, "
          f"all devices back {seen['back_after']:.2f} s after the kill", flush=True)
    res = burst(server.port, 6)
    check(same_text(res, reference), "after the respawn: the same text on every device")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--failsafe", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model(args.failsafe, tmp)
        reference = one_device_text(args.failsafe, model, tmp)
        server = Server(args.failsafe, model, tmp,
                        ["--max-num-seqs", "16", "--log-level", "info"], devices=DEVICES)
        try:
            check(server.port is not None, "serve starts: " + server.stderr()[-400:])
            test_freezes(server, reference)
            test_kill_every_device(server, reference)
        finally:
            if server.proc.poll() is None:
                server.proc.send_signal(signal.SIGTERM)
                try:
                    server.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.kill()
            if FAILURES:
                print("server's log:\n" + server.stderr()[-8000:], flush=True)
    finish()


if __name__ == "__main__":
    main()
