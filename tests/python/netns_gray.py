#!/usr/bin/env python3
"""Gray failures of a link: a FailSafe group across network namespaces (as
netns_cluster.py) where one host's link to the others runs through a relay of
this test's own, which delays or drops its frames on demand. The kernels
these tests run on may lack `tc netem`; the relay is a pair of TAP devices
(one in the host's namespace as its eth0, one on the switch's bridge) and a
process that copies Ethernet frames between them, each held for the delay
and dropped with the loss probability.

With streams running, the link of the host with two of the four devices is
made slow (200 ms each way, then 100 ms: a pace of a collective per round
trip, no device ever still for long), then lossy (30% of frames dropped
each way):
- every stream finishes with the text of a single-device server;
- the coordinator's own device and the healthy host's device are never
  declared dead: the devices behind the bad link go;
- the longest gap between two tokens of a stream stays within a few seconds
  (printed: the step's deadline, the detection, the recovery);
- once the link heals, the workers behind it join again by themselves.

Needs root (CAP_NET_ADMIN), iproute2 and /dev/net/tun; exits 77 without them.

  python3 netns_gray.py --failsafe PATH
"""
import argparse
import fcntl
import heapq
import os
import random
import select
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet_haproxy import (MAX_TOKENS, burst, metric, one_device_text, same_text,  # noqa: E402
                           streaming)
from netns_cluster import SUBNET, Net, cluster, in_namespaces, ip, privileged, stop  # noqa: E402
from serve_lifecycle import FAILURES, check, finish  # noqa: E402

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000


def open_tap(ns, name):
    """A TAP device `name` created in namespace `ns`; this process stays where it was."""
    net = Net.__new__(Net)
    here = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        net.enter(ns)
        fd = os.open("/dev/net/tun", os.O_RDWR)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    finally:
        import ctypes
        if ctypes.CDLL(None, use_errno=True).setns(here, 0x40000000) != 0:
            raise OSError(ctypes.get_errno(), "setns back")
        os.close(here)
    return fd


def relay(host_ns, switch_ns, port, control):
    """Copies frames between the host's eth0 and the switch's `port`, each
    held for the delay in `control` ("delay_ms loss", re-read when it changes)
    and dropped with its loss probability."""
    a, b = open_tap(host_ns, "eth0"), open_tap(switch_ns, port)
    peer = {a: b, b: a}
    delay, loss, stamp = 0.0, 0.0, None
    queue, seq = [], 0
    print("ready", flush=True)
    while True:
        try:
            st = os.stat(control).st_mtime_ns
            if st != stamp:
                stamp = st
                with open(control) as f:
                    d, l = f.read().split()
                delay, loss = float(d) / 1e3, float(l)
        except (OSError, ValueError):
            pass
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, fd, frame = heapq.heappop(queue)
            try:
                os.write(fd, frame)
            except OSError:
                pass
        timeout = 0.02 if not queue else max(0.0, min(0.02, queue[0][0] - now))
        ready, _, _ = select.select([a, b], [], [], timeout)
        for fd in ready:
            try:
                frame = os.read(fd, 65536)
            except OSError:
                continue
            if loss and random.random() < loss:
                continue
            seq += 1
            heapq.heappush(queue, (time.monotonic() + delay, seq, peer[fd], frame))


class Link:
    """Host `ns`'s link to the switch through the relay, in place of its veth."""

    def __init__(self, net, ns, index, tmp):
        self.control = os.path.join(tmp, f"link-{ns}")
        self.set(0, 0)
        port = f"t{index}"
        ip("-n", net.switch, "link", "del", f"v{index}")  # the veth pair goes with it
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--relay",
                                      ns, net.switch, port, self.control],
                                     stdout=subprocess.PIPE, text=True)
        check(self.proc.stdout.readline().strip() == "ready", "the relay made its TAP devices")
        ip("-n", net.switch, "link", "set", port, "master", "br0", "up")
        ip("-n", ns, "addr", "add", f"{SUBNET}.{index + 1}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")

    def set(self, delay_ms, loss):
        tmp = self.control + ".new"
        with open(tmp, "w") as f:
            f.write(f"{delay_ms} {loss}\n")
        os.replace(tmp, self.control)

    def close(self):
        self.proc.kill()
        self.proc.wait()


def alive(server):
    return metric(server.port, "failsafe_devices_alive")


def wait_alive(server, n, seconds):
    t = time.time()
    while alive(server) != n and time.time() < t + seconds:
        time.sleep(0.05)
    return time.time() - t


def gray(failsafe, model, tmp, token_file, net):
    reference = one_device_text(failsafe, model, tmp)
    # Host 1: one worker on a healthy link; host 2: two workers behind the relay.
    link = Link(net, net.hosts[1], 2, tmp)
    # A deadline floor of 1 s: a round trip of a quarter of it is a bad link.
    # (The coordinator logs at info: a failure shows each removal and rejoin.)
    server, workers = cluster(failsafe, model, tmp, token_file, net, [1, 2], floor="1s",
                              extra=["--log-level", "info"])
    try:
        check(server.port is not None, "serve starts with 3 workers: " + server.stderr()[-400:])
        check(wait_alive(server, 4, 30) < 30, "4 devices alive")
        healthy_pids = {w.proc.pid for w in workers if w.ns == net.hosts[0]}
        for label, delay_ms, loss in (("200 ms each way", 200, 0.0),
                                      ("100 ms each way", 100, 0.0),
                                      ("30% of frames lost each way", 0, 0.3)):
            seen = {}

            def degrade():
                streaming(server.port, 0.3)  # tokens flowing
                link.set(delay_ms, loss)
                t = time.time()
                while alive(server) not in (2,) and time.time() < t + 20:
                    time.sleep(0.02)
                seen["removed_after"] = time.time() - t
                seen["alive_min"] = alive(server)

            t0 = time.time()
            res = burst(server.port, 6, degrade)
            gaps = [r[3] for r in res if r]
            check(same_text(res, reference),
                  f"{label}: every stream finishes with the text of one device: "
                  f"{[r and r[2] for r in res]}")
            check(seen["alive_min"] == 2,
                  f"{label}: the two devices behind the link go, the other two stay "
                  f"(alive: {seen['alive_min']})")
            check(all(w.proc.poll() is None for w in workers if w.proc.pid in healthy_pids),
                  f"{label}: the healthy host's worker lives")
            print(f"{label}: the side behind the link removed {seen['removed_after']:.2f} s "
                  f"after it degraded; longest gap between tokens {max(gaps):.2f} s; "
                  f"{time.time() - t0:.1f} s for 6 streams of {MAX_TOKENS} tokens", flush=True)
            check(max(gaps) < 3, f"{label}: no stream stalls for long ({max(gaps):.2f} s)")
            link.set(0, 0)
            back = wait_alive(server, 4, 60)
            check(alive(server) == 4, f"{label}: the link healed, its workers joined again "
                  f"by themselves ({back:.1f} s)")
        res = burst(server.port, 6)
        check(same_text(res, reference),
              f"after both: same text on 4 devices: {[r and r[2] for r in res]}")
    finally:
        if FAILURES and server:
            print("coordinator's log:\n" + server.stderr()[-12000:], flush=True)
        stop(server, workers)
        link.close()


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "--relay":
        relay(*sys.argv[2:])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--failsafe", required=True)
    args = ap.parse_args()
    why = privileged() or (None if os.path.exists("/dev/net/tun") else "no /dev/net/tun")
    if why:
        print(f"SKIP: {why}")
        sys.exit(77)
    in_namespaces(args.failsafe, 2, gray)
    finish()


if __name__ == "__main__":
    main()
