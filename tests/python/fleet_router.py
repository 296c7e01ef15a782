#!/usr/bin/env python3
"""Three `failsafe serve` nodes behind `failsafe router`, as real processes,
under concurrent greedy and seeded streams (completions and chat):

- kill -9 the node that holds the most streams: every stream finishes with
  the text of the fault-free run, and the router counts the resumes;
- SIGSTOP a whole node (its server and its device processes): the same; the
  node comes back with SIGCONT;
- the killed node restarted on its port: the router sees it up again and
  sends it work;
- with root: each node in a network namespace of its own, and one node's link
  cut mid-stream: the same (without root that scenario is skipped, and the
  nodes listen on loopback ports);
- the same kill -9 behind HAProxy alone, for comparison: how many streams it
  loses (printed, not checked: HAProxy does not resume);
- two routers behind HAProxy (a router keeps no state beyond its requests):
  both take streams, and a node killed under them loses none.

With --figures it prints, per failure kind, the longest gap between tokens a
client saw, as JSON on the last line (bench/router_bench.py uses it).

  python3 fleet_router.py --failsafe PATH [--haproxy PATH] [--figures]
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lifecycle import check, finish  # noqa: E402

MAX_TOKENS = 400
NODE_PORT = 18510  # in a namespace of its own, or the first of three loopback ports


def free_ports(n):
    import socket
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class Proc:
    """A failsafe process in a session of its own (so a signal reaches its
    children too), its stdout read until `ready` names the port."""

    def __init__(self, args, tmp, name, ns=None):
        self.args = (["ip", "netns", "exec", ns] if ns else []) + args
        self.tmp, self.name = tmp, name
        self.start()

    def start(self):
        self.err = open(os.path.join(self.tmp, self.name + ".err"), "a")
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     start_new_session=True)
        self.port = None
        deadline = time.time() + 60
        for line in self.proc.stdout:
            if " on http://" in line:
                self.port = int(line.split(" on http://")[1].split()[0].rsplit(":", 1)[1])
                break
            if time.time() > deadline:
                break
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

    def signal(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self):
        self.signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def get(host, port, path, timeout=5):
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read().decode(errors="replace")
    c.close()
    return r.status, body


def metric(host, port, name):
    try:
        status, text = get(host, port, "/metrics")
    except OSError:
        return None
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    return total if found else None


def bodies():
    """Greedy and seeded streams, completions and chat, each its own prompt."""
    out = []
    for i in range(8):
        chat = i % 2 == 1
        b = {"model": "tiny", "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True,
             "stream_options": {"include_usage": True},
             "temperature": 0 if i % 4 < 2 else 0.9}
        if b["temperature"] > 0:
            b["seed"] = 100 + i
        text = f"Stream {i} goes on whatever happens to its node"
        if chat:
            b["messages"] = [{"role": "user", "content": text}]
        else:
            b["prompt"] = text
        out.append(("/v1/chat/completions" if chat else "/v1/completions", b))
    return out


def stream(host, port, path, body, rec):
    """One stream; rec gets its text, chunk times, usage and any error."""
    rec.update(text="", times=[], tokens=None, error=None, done=False)
    try:
        c = http.client.HTTPConnection(host, port, timeout=120)
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            rec["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
            return
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                rec["done"] = True
                break
            ev = json.loads(line[6:])
            if "error" in ev:
                rec["error"] = str(ev["error"])
                return
            for ch in ev.get("choices", []):
                piece = ch.get("text")
                if piece is None:
                    piece = (ch.get("delta") or {}).get("content") or ""
                if piece:
                    rec["text"] += piece
                    rec["times"].append(time.monotonic())
            if ev.get("usage"):
                rec["tokens"] = ev["usage"]["completion_tokens"]
        c.close()
        if not rec["done"]:
            rec["error"] = "the stream ended without [DONE]"
    except Exception as e:  # noqa: BLE001
        rec["error"] = repr(e)


def burst(host, port, fault=None, when=10):
    """Every body at once; `fault` runs once each stream has `when` pieces,
    or once the fastest is a quarter of the way (a node slow to start its
    streams, say one just continued, must not let the others finish first:
    the fault would then find nothing in flight to resume)."""
    recs = [dict() for _ in bodies()]
    threads = [threading.Thread(target=stream, args=(host, port, path, body, rec))
               for (path, body), rec in zip(bodies(), recs)]
    for t in threads:
        t.start()
    if fault:
        deadline = time.time() + 60
        while time.time() < deadline and not all(
                len(r.get("times", [])) >= when or r.get("done") or r.get("error")
                for r in recs) and not any(
                len(r.get("times", [])) >= MAX_TOKENS // 4 for r in recs):
            time.sleep(0.005)
        fault()
    for t in threads:
        t.join(timeout=180)
    return recs


def max_gap(recs):
    gaps = [b - a for r in recs for a, b in zip(r.get("times", []), r.get("times", [])[1:])]
    return max(gaps) if gaps else 0.0


def whole(recs, reference):
    """Streams that finished with the fault-free text."""
    return sum(1 for r, ref in zip(recs, reference)
               if r.get("done") and not r.get("error") and r["text"] == ref
               and r.get("tokens") == MAX_TOKENS)


class Fleet:
    def __init__(self, failsafe, model, tmp, net):
        self.net = net
        self.nodes, self.hosts = [], []
        ports = [NODE_PORT] * 3 if net else free_ports(3)
        for i in range(3):
            host = f"10.77.0.{i + 2}" if net else "127.0.0.1"
            ns = net.hosts[i] if net else None
            self.hosts.append((host, ports[i]))
            self.nodes.append(Proc(
                [failsafe, "serve", "--model", model, "--devices", "2", "--host", host,
                 "--port", str(ports[i]), "--served-model-name", "tiny", "--max-num-seqs", "16",
                 "--no-respawn"], tmp, f"node{i}", ns))
        self.router = Proc(
            [failsafe, "router", "--port", "0", "--health-interval", "100ms",
             "--health-timeout", "500ms", *[a for h, p in self.hosts for a in ("--node", f"{h}:{p}")]],
            tmp, "router")

    def states(self):
        try:
            _, body = get("127.0.0.1", self.router.port, "/router/nodes")
            return [n["state"] for n in json.loads(body)["nodes"]]
        except (OSError, ValueError):
            return []

    def wait_states(self, want, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.states() == want:
                return True
            time.sleep(0.05)
        return False

    def flights(self):
        _, body = get("127.0.0.1", self.router.port, "/router/nodes")
        return [n["in_flight"] for n in json.loads(body)["nodes"]]

    def resumed(self):
        return metric("127.0.0.1", self.router.port, "failsafe_router_requests_resumed_total") or 0

    def stop(self):
        self.router.stop()
        for n in self.nodes:
            n.stop()


def burst_struck(fleet, name, port, reference, fault, recover, resumed_total, tries=3):
    """A burst through `port` with fault() struck in it (it returns the node
    it struck): (records, streams whole, resumes, the node).

    Every stream whole with none resumed can only mean the fault came after
    that node's streams had all ended (the client reads behind the router,
    and on a loaded machine a node can finish 400 tokens between the count
    that chose it and the fault): recover(node) brings the node back, and
    once every node is up the burst runs again. A stream the router failed
    to move would not be whole: a killed node's stream errs, a stopped or
    cut one stands still until the burst's end."""
    for attempt in range(1, tries + 1):
        before = resumed_total()
        hit = {}
        recs = burst("127.0.0.1", port, lambda: hit.update(node=fault()))
        ok = whole(recs, reference)
        resumed = resumed_total() - before
        if ok < len(recs) or resumed > 0 or attempt == tries:
            return recs, ok, resumed, hit.get("node")
        print(f"     {name}: none resumed, every stream whole: the fault came after node "
              f"{hit['node']}'s streams ended; again", flush=True)
        recover(hit["node"])
        fleet.wait_states(["up"] * 3)


def scenario(fleet, name, reference, fault, figures, recover):
    """A burst with `fault` struck at the node holding the most of the
    router's streams (burst_struck)."""
    def inject():
        flights = fleet.flights()
        node = flights.index(max(flights))
        print(f"     {name} node {node} (the router's streams per node: {flights})", flush=True)
        fault(node)
        return node

    recs, ok, resumed, node = burst_struck(fleet, name, fleet.router.port, reference, inject,
                                           recover, fleet.resumed)
    check(ok == len(recs), f"{name}: {ok} of {len(recs)} streams finish with the fault-free text "
                           f"(errors: {[r['error'] for r in recs if r.get('error')][:2]})")
    check(resumed > 0, f"{name}: the router resumed streams ({resumed:.0f})")
    figures[name] = {"max_gap_s": round(max_gap(recs), 3), "streams": len(recs),
                     "lost": len(recs) - ok, "resumed": resumed}
    print(f"     longest gap between tokens: {max_gap(recs) * 1e3:.0f} ms", flush=True)
    return node


def busiest(fleet):
    """The node with the most requests running, by the nodes' own gauges."""
    running = [metric(h, p, "failsafe_num_requests_running") or 0 for h, p in fleet.hosts]
    return running.index(max(running))


def routers_behind_haproxy(args, failsafe, fleet, tmp, reference):
    """Two routers behind HAProxy (the router keeps no state beyond its
    requests): both take streams, and a node killed under them costs none."""
    if not args.haproxy or not os.path.exists(args.haproxy):
        print("skip two routers behind HAProxy: no haproxy")
        return
    from fleet_haproxy import HAProxy  # noqa: E402
    second = Proc(list(fleet.router.args), tmp, "router2")  # the same flags, its own port
    lb = HAProxy(args.haproxy, tmp, [("r1", fleet.router.port), ("r2", second.port)])
    try:
        check(fleet.wait_states(["up"] * 3) and lb.wait_for({"r1": "UP", "r2": "UP"}),
              "two routers up behind HAProxy")
        def resumed_total():
            return sum(metric("127.0.0.1", port, "failsafe_router_requests_resumed_total") or 0
                       for port in (fleet.router.port, second.port))

        def fault():
            node = busiest(fleet)
            fleet.nodes[node].kill()
            return node

        recs, ok, resumed, killed = burst_struck(fleet, "two routers", lb.port, reference, fault,
                                                 lambda node: fleet.nodes[node].start(),
                                                 resumed_total)
        check(ok == len(recs), f"two routers behind HAProxy, kill -9 of a node: {ok} of "
                               f"{len(recs)} streams finish with the fault-free text "
                               f"({resumed:.0f} resumed)")
        check(resumed > 0, "the routers resumed the killed node's streams")
        taken = [metric("127.0.0.1", port, "failsafe_router_requests_total") or 0
                 for port in (fleet.router.port, second.port)]
        check(all(t > 0 for t in taken), f"both routers took streams ({taken})")
        fleet.nodes[killed].start()
    finally:
        lb.stop()
        second.stop()


def haproxy_compare(args, fleet, tmp, reference, figures):
    if not args.haproxy or not os.path.exists(args.haproxy):
        print("skip HAProxy comparison: no haproxy")
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fleet_haproxy import HAProxy  # noqa: E402
    lb = HAProxy(args.haproxy, tmp, [(f"n{i}", f"{h}:{p}") for i, (h, p) in enumerate(fleet.hosts)])
    try:
        if not lb.wait_for({"n0": "UP", "n1": "UP", "n2": "UP"}):
            print("skip HAProxy comparison: its health checks did not pass")
            return
        killed = {}

        def report(name, what, recs):
            lost = len(recs) - whole(recs, reference)
            print(f"     behind HAProxy alone, {what}: {lost} of {len(recs)} streams lost, "
                  f"longest gap {max_gap(recs) * 1e3:.0f} ms", flush=True)
            figures[name] = {"streams": len(recs), "lost": lost,
                             "max_gap_s": round(max_gap(recs), 3)}

        def fault():
            killed["i"] = busiest(fleet)
            fleet.nodes[killed["i"]].kill()

        report("haproxy_kill9", "kill -9 of a node", burst("127.0.0.1", lb.port, fault))
        fleet.nodes[killed["i"]].start()
        if not lb.wait_for({"n0": "UP", "n1": "UP", "n2": "UP"}):
            return

        # A node stopped for 3 s: HAProxy waits on its streams (they are not
        # lost while the node comes back, but stand still as long).
        def stop3():
            i = busiest(fleet)
            fleet.nodes[i].signal(signal.SIGSTOP)
            time.sleep(3)
            fleet.nodes[i].signal(signal.SIGCONT)

        report("haproxy_sigstop3s", "a node stopped for 3 s", burst("127.0.0.1", lb.port, stop3))
    finally:
        lb.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--failsafe", required=True)
    ap.add_argument("--haproxy", default=shutil.which("haproxy") or "/usr/sbin/haproxy")
    ap.add_argument("--figures", action="store_true", help="print the figures as JSON at the end")
    ap.add_argument("--no-netns", action="store_true", help="loopback ports even with root")
    args = ap.parse_args()
    failsafe = os.path.abspath(args.failsafe)
    net = None
    if not args.no_netns:
        from netns_cluster import Net, privileged  # noqa: E402
        why = privileged()
        if why:
            print(f"note: nodes on loopback ports, no link to cut ({why})")
        else:
            net = Net(3)
            net.enter(net.coord)
    figures = {}
    fleet = None
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        subprocess.run([failsafe, "make-model", "--preset", "tiny-llama", "--out", model,
                        "--seed", "5"], check=True, capture_output=True)
        try:
            fleet = Fleet(failsafe, model, tmp, net)
            check(all(n.port for n in fleet.nodes) and fleet.router.port, "three nodes and a router")
            check(fleet.wait_states(["up"] * 3), "the router sees every node up")

            ref = burst("127.0.0.1", fleet.router.port)
            reference = [r["text"] for r in ref]
            check(all(r.get("done") and not r.get("error") and r.get("tokens") == MAX_TOKENS
                      for r in ref), "the fault-free run: every stream whole")
            # The router changes nothing: the same text from a node directly.
            direct = [dict()]
            path, body = bodies()[2]
            stream(*fleet.hosts[0], path, body, direct[0])
            check(direct[0]["text"] == reference[2], "a node directly gives the router's text")

            killed = scenario(fleet, "kill9", reference, lambda i: fleet.nodes[i].kill(), figures,
                              lambda i: fleet.nodes[i].start())
            want = ["up"] * 3
            want[killed] = "down"
            # A loaded machine may be slow to answer a health check: a
            # moment's "down" of another node is not what this checks.
            check(fleet.wait_states(want, timeout=10), f"the killed node is down ({fleet.states()})")
            # Restart it on its port: it rejoins and takes work.
            fleet.nodes[killed].start()
            check(fleet.wait_states(["up"] * 3), "the restarted node is up again")
            host, port = fleet.hosts[killed]
            burst("127.0.0.1", fleet.router.port)
            served = metric(host, port, "failsafe_requests_total") or 0
            check(served > 0, f"the restarted node serves again ({served:.0f} requests)")

            def cont(i):
                fleet.nodes[i].signal(signal.SIGCONT)

            stopped = scenario(fleet, "sigstop", reference,
                               lambda i: fleet.nodes[i].signal(signal.SIGSTOP), figures, cont)
            cont(stopped)
            check(fleet.wait_states(["up"] * 3), "the stopped node is up again after SIGCONT")

            if net:
                def heal(i):
                    net.heal(net.hosts[i])

                cut = scenario(fleet, "link_cut", reference, lambda i: net.cut(net.hosts[i]),
                               figures, heal)
                heal(cut)
                check(fleet.wait_states(["up"] * 3), "the cut node is up again once its link is")

            haproxy_compare(args, fleet, tmp, reference, figures)
            routers_behind_haproxy(args, failsafe, fleet, tmp, reference)
        finally:
            if fleet:
                fleet.stop()
            if net:
                net.remove()
    if args.figures:
        print(json.dumps(figures))
    finish()


if __name__ == "__main__":
    main()
