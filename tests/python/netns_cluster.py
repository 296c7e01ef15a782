#!/usr/bin/env python3
"""A FailSafe group across real network namespaces: the coordinator (`serve`
with one local device) in one namespace, workers joining over TCP from three
more (`failsafe worker --join`), all on a bridge of veth pairs, collectives
over gloo between namespaces:

- greedy streams give the text of a single-device server;
- one remote worker SIGKILLed mid-stream, then every worker of one namespace
  at once, then one namespace's link cut (ip link set down): every stream
  finishes with that same text;
- the cut link restored: its worker joins again by itself and the coordinator
  serves on it again, with no operator.

With --bench it instead prints the time per output token of one stream
(decode steps of one sequence) across namespaces against the same device
count on one host over shared memory and over gloo, and with --allreduce
BENCH the all-reduce latency of gloo members spread over the namespaces
against shared memory (failsafe_bench_allreduce --netns).

Needs root (CAP_NET_ADMIN) and iproute2; exits 77 (skipped) without them.

  python3 netns_cluster.py --failsafe PATH [--bench [--allreduce BENCH] [--devices 5]]
"""
import argparse
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet_haproxy import MAX_TOKENS, burst, complete, metric, streaming  # noqa: E402
from serve_lifecycle import FAILURES, Server, check, finish  # noqa: E402

CLONE_NEWNET = 0x40000000
SUBNET = "10.77.0"
PORT = 18400  # inside the test's own namespace: no one else listens there


def ip(*args, check_rc=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check_rc and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


class Net:
    """Namespaces: a switch (a bridge), the coordinator's and `hosts` more."""

    def __init__(self, hosts):
        tag = f"fs{os.getpid()}"
        self.switch = tag + "sw"
        self.coord = tag + "c"
        self.hosts = [f"{tag}h{i}" for i in range(1, hosts + 1)]
        self.made = []
        for ns in [self.switch, self.coord, *self.hosts]:
            ip("netns", "add", ns)
            self.made.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate([self.coord, *self.hosts]):
            port = f"v{i}"
            ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")

    def enter(self, ns):
        """Moves this (single-threaded) process into `ns`: its sockets and children."""
        libc = ctypes.CDLL(None, use_errno=True)
        with open(f"/run/netns/{ns}") as f:
            if libc.setns(f.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")

    def cut(self, ns):
        ip("-n", ns, "link", "set", "eth0", "down")

    def heal(self, ns):
        ip("-n", ns, "link", "set", "eth0", "up")

    def remove(self):
        for ns in self.made:
            ip("netns", "del", ns, check_rc=False)


def privileged():
    if shutil.which("ip") is None:
        return "no `ip` (iproute2; scripts/install-deps.sh --test installs it)"
    probe = f"fs{os.getpid()}probe"
    r = ip("netns", "add", probe, check_rc=False)
    if r.returncode != 0:
        return f"cannot create network namespaces ({r.stderr.strip()}): needs root"
    ip("netns", "del", probe, check_rc=False)
    return None


class Worker:
    def __init__(self, failsafe, ns, token_file, tmp, name):
        self.ns = ns
        self.err = open(os.path.join(tmp, name + ".err"), "w")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, failsafe, "worker", "--join", f"{SUBNET}.1:{PORT}",
             "--cluster-token-file", token_file, "--log-level", "warn"],
            stdout=subprocess.DEVNULL, stderr=self.err)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def cluster(failsafe, model, tmp, token_file, net, per_host, extra=(), floor="3s"):
    """Workers in the host namespaces, then the coordinator with one local device."""
    workers = []
    for ns, n in zip(net.hosts, per_host):
        for k in range(n):
            workers.append(Worker(failsafe, ns, token_file, tmp, f"{ns}-{k}"))
    server = Server(failsafe, model, tmp,
                    ["--remote-devices", str(len(workers)), "--listen", f"{SUBNET}.1:{PORT}",
                     "--cluster-token-file", token_file, "--max-num-seqs", "16",
                     # Generous under load (2 cores, many processes): a cut link
                     # is found by its heartbeats (2 s) before a step's deadline.
                     "--step-timeout-floor", floor, *extra],
                    name="coordinator", devices=len(workers) + 1)
    return server, workers


def stop(server, workers):
    if server:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    for w in workers:
        try:
            w.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            w.kill()


def faults(failsafe, model, tmp, token_file, net):
    ref = Server(failsafe, model, tmp, ["--max-num-seqs", "16"], name="one", devices=1)
    try:
        res = burst(ref.port, 2)
        texts = {r[0] for r in res if r and r[2] is None}
        check(len(texts) == 1 and all(r[1] == MAX_TOKENS for r in res), "one device serves")
        reference = next(iter(texts), None)
    finally:
        stop(ref, [])
    server, workers = cluster(failsafe, model, tmp, token_file, net, [1, 2, 1])
    try:
        check(server.port is not None, "serve starts with 4 workers from 3 namespaces: " +
              server.stderr()[-400:])
        res = burst(server.port, 6)
        check(all(r and r[2] is None and r[0] == reference for r in res),
              f"streams across namespaces have the text of one device: {[r and r[2] for r in res]}")

        def kill_one():
            streaming(server.port, 0.05)  # a few tokens in
            workers[0].kill()  # the only worker of host 1

        res = burst(server.port, 6, during=kill_one)
        check(all(r and r[2] is None and r[0] == reference for r in res),
              f"a remote worker killed mid-stream: same text: {[r and r[2] for r in res]}")

        def kill_host():
            streaming(server.port, 0.05)  # a few tokens in
            for w in workers:
                if w.ns == net.hosts[1]:
                    os.kill(w.proc.pid, signal.SIGKILL)

        res = burst(server.port, 6, during=kill_host)
        check(all(r and r[2] is None and r[0] == reference for r in res),
              f"every worker of one namespace killed: same text: {[r and r[2] for r in res]}")

        cut_worker = [w for w in workers if w.ns == net.hosts[2]][0]
        lost_after = []

        def cut_link():
            streaming(server.port, 0.05)  # a few tokens in
            net.cut(net.hosts[2])
            t = time.time()
            while metric(server.port, "failsafe_devices_alive") != 1 and time.time() < t + 15:
                time.sleep(0.02)
            lost_after.append(time.time() - t)

        res = burst(server.port, 6, during=cut_link)
        check(all(r and r[2] is None and r[0] == reference for r in res),
              f"a namespace's link cut: same text: {[r and r[2] for r in res]}")
        # Its heartbeats stop for the link timeout (2 s), then it is lost.
        check(lost_after[0] < 6, f"the cut-off device is lost within seconds ({lost_after[0]:.1f} s)")
        check("lost" in server.stderr(), "the coordinator logged the lost links")
        # The link comes back: the worker joins again by itself (--rejoin) and
        # the coordinator takes it as its device again (--respawn); nobody acts.
        net.heal(net.hosts[2])
        t = time.time()
        while metric(server.port, "failsafe_devices_alive") != 2 and time.time() < t + 60:
            time.sleep(0.1)
        back = time.time() - t
        check(metric(server.port, "failsafe_devices_alive") == 2,
              f"the worker rejoined on its own once the link returned ({back:.1f} s)")
        check(cut_worker.proc.poll() is None, "its supervising process never exited")
        res = burst(server.port, 6)
        check(all(r and r[2] is None and r[0] == reference for r in res),
              f"streams after the rejoin: same text: {[r and r[2] for r in res]}")
    finally:
        if FAILURES and server:
            print("coordinator's log:\n" + server.stderr()[-4000:], flush=True)
        stop(server, workers)


def per_token_ms(port, n=3):
    """Median over n single streams of wall time per output token."""
    import statistics
    out = []
    for _ in range(n):
        res = [None]
        t0 = time.time()
        complete(port, res, 0)
        if res[0] and res[0][2] is None and res[0][1]:
            out.append((time.time() - t0) * 1e3 / res[0][1])
    return statistics.median(out) if out else float("nan")


def bench(failsafe, model, tmp, token_file, net, devices):
    rows = []
    for name, extra in (("shm, one namespace", ["--comm", "shm"]),
                        ("gloo, one namespace", ["--comm", "gloo"])):
        s = Server(failsafe, model, tmp, ["--max-num-seqs", "16", *extra], name=name[:4],
                   devices=devices)
        try:
            rows.append((name, per_token_ms(s.port)))
        finally:
            stop(s, [])
    net_hosts = len(net.hosts)
    per_host = [(devices - 1) // net_hosts + (1 if i < (devices - 1) % net_hosts else 0)
                for i in range(net_hosts)]
    s, workers = cluster(failsafe, model, tmp, token_file, net, per_host)
    try:
        rows.append((f"gloo, {net_hosts + 1} namespaces", per_token_ms(s.port)))
    finally:
        stop(s, workers)
    base = rows[0][1]
    print(f"{devices} devices, {MAX_TOKENS} greedy tokens per stream, one stream at a time")
    for name, ms in rows:
        print(f"  {name:24s} {ms:7.2f} ms per token  ({ms / base:.2f}x shared memory)",
              flush=True)


def allreduce_bench(binary, net, members):
    spaces = [net.coord, *net.hosts]
    spec = ",".join(f"{ns}={SUBNET}.{i + 1}" for i, ns in enumerate(spaces))
    subprocess.run([binary, "--members", members, "--tokens", "1,16,128", "--netns", spec],
                   check=True)


def in_namespaces(failsafe, hosts, body):
    """body(failsafe, model, tmp, token_file, net) with a tiny-llama model, a
    cluster token, and `hosts` host namespaces; this process in the
    coordinator's."""
    failsafe = os.path.abspath(failsafe)
    net = None
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        subprocess.run([failsafe, "make-model", "--preset", "tiny-llama", "--out", model,
                        "--seed", "5"], check=True, capture_output=True)
        token_file = os.path.join(tmp, "token")
        with open(token_file, "w") as f:
            f.write(os.urandom(16).hex() + "\n")
        try:
            net = Net(hosts)
            net.enter(net.coord)
            body(failsafe, model, tmp, token_file, net)
        finally:
            if net:
                net.remove()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--failsafe", required=True)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--devices", type=int, default=5, help="--bench: devices")
    ap.add_argument("--allreduce", help="--bench: failsafe_bench_allreduce, run across namespaces")
    ap.add_argument("--members", default="2,4", help="--bench: all-reduce group sizes")
    args = ap.parse_args()
    why = privileged()
    if why:
        print(f"SKIP: {why}")
        sys.exit(77)
    def body(failsafe, model, tmp, token_file, net):
        if args.bench:
            if args.allreduce:
                allreduce_bench(args.allreduce, net, args.members)
            bench(failsafe, model, tmp, token_file, net, args.devices)
        else:
            faults(failsafe, model, tmp, token_file, net)

    in_namespaces(args.failsafe, 3, body)
    finish()


if __name__ == "__main__":
    main()
