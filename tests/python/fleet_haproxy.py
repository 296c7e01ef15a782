#!/usr/bin/env python3
"""Two `failsafe serve` nodes behind HAProxy (least connections, health checks
on /health), as a fleet runs them:

- both nodes take work; a device killed (SIGKILL) on one node mid-stream
  changes no text, and both nodes keep taking work;
- a node taken below its --min-devices answers /health with 503, the balancer
  marks it down and sends every new request to the other node, while the
  streams it already had finish; a device restored brings it back;
- /metrics carries the gauges fleet routers scrape from vLLM, and FailSafe's
  capacity gauges.

  python3 fleet_haproxy.py --failsafe PATH [--haproxy PATH]
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lifecycle import Server, check, finish, request  # noqa: E402

PROMPT = "A fleet of nodes keeps serving"
MAX_TOKENS = 120


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HAProxy:
    def __init__(self, binary, tmp, nodes):
        self.port = free_port()
        self.sock = os.path.join(tmp, "haproxy.sock")
        cfg = os.path.join(tmp, "haproxy.cfg")
        # A node: a loopback port, or "host:port".
        servers = "\n".join(f"  server {name} {port if ':' in str(port) else f'127.0.0.1:{port}'}"
                            " check" for name, port in nodes)
        with open(cfg, "w") as f:
            f.write(f"""global
  maxconn 512
  stats socket {self.sock} mode 600 level admin
defaults
  mode http
  timeout connect 2s
  timeout client 120s
  timeout server 120s
  option redispatch
  retries 2
frontend llm
  bind 127.0.0.1:{self.port}
  default_backend nodes
backend nodes
  balance leastconn
  option httpchk GET /health
  http-check expect status 200
  default-server inter 200ms fall 2 rise 2
{servers}
""")
        self.err = open(os.path.join(tmp, "haproxy.err"), "w")
        self.proc = subprocess.Popen([binary, "-db", "-f", cfg], stdout=self.err,
                                     stderr=subprocess.STDOUT)

    def states(self):
        """Server name -> status (UP, DOWN, ...), from the stats socket."""
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(2)
                s.connect(self.sock)
                s.sendall(b"show stat\n")
                data = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
        except OSError:
            return {}
        out = {}
        for line in data.decode().splitlines():
            f = line.split(",")
            if len(f) > 17 and f[0] == "nodes" and f[1] not in ("BACKEND", "FRONTEND"):
                out[f[1]] = f[17]
        return out

    def wait_for(self, want, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if all(self.states().get(k, "").startswith(v) for k, v in want.items()):
                return True
            time.sleep(0.1)
        return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def complete(port, results, i):
    """One streaming completion; results[i] = (text, completion tokens, error,
    longest gap in seconds between two pieces of text)."""
    try:
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", "/v1/completions",
                  body=json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                                   "temperature": 0, "ignore_eos": True, "stream": True,
                                   "stream_options": {"include_usage": True}}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            results[i] = (None, 0, f"HTTP {r.status}: {r.read()[:200]!r}", 0.0)
            return
        text, tokens, last, gap = "", 0, None, 0.0
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                results[i] = (None, tokens, str(ev["error"]), gap)
                return
            for ch in ev.get("choices", []):
                if ch.get("text"):
                    now = time.monotonic()
                    gap = max(gap, now - last) if last is not None else gap
                    last = now
                    text += ch["text"]
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
        c.close()
        results[i] = (text, tokens, None, gap)
    except Exception as e:  # noqa: BLE001
        results[i] = (None, 0, repr(e), 0.0)


def burst(port, n, during=None):
    """n concurrent streams; `during` runs once they are all going."""
    results = [None] * n
    threads = [threading.Thread(target=complete, args=(port, results, i)) for i in range(n)]
    for t in threads:
        t.start()
    if during:
        during()
    for t in threads:
        t.join(timeout=180)
    return results


def streaming(port, settle):
    """Waits (30 s at most) until a request runs, then `settle` seconds more."""
    deadline = time.time() + 30
    while time.time() < deadline and not metric(port, "failsafe_num_requests_running"):
        time.sleep(0.01)
    time.sleep(settle)


def one_device_text(failsafe, model, tmp):
    """The text a single-device server streams for complete()'s request."""
    one = Server(failsafe, model, tmp, ["--max-num-seqs", "16"], name="one", devices=1)
    try:
        res = burst(one.port, 2)
        text = res[0][0] if res[0] and res[0][2] is None else None
        check(text is not None, "one device serves")
        return text
    finally:
        one.kill()


def same_text(results, reference):
    """Every stream finished, with the reference text."""
    return all(r and r[2] is None and r[0] == reference for r in results)


def metric(port, name):
    status, text = request(port, "GET", "/metrics")
    if status != 200:
        return None
    total, found = 0.0, False
    for line in text.splitlines():
        m = re.match(re.escape(name) + r"(\{[^}]*\})? (\S+)$", line)
        if m:
            total += float(m.group(2))
            found = True
    return total if found else None


def served(node):
    return metric(node.port, "failsafe_requests_total") or 0


def device_pids(node):
    status, body = request(node.port, "GET", "/admin/status")
    return {d["device"]: d["pid"] for d in json.loads(body)["devices"] if d["alive"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--failsafe", required=True)
    ap.add_argument("--haproxy", default=shutil.which("haproxy") or "/usr/sbin/haproxy")
    args = ap.parse_args()
    if not os.path.exists(args.haproxy):
        print(f"SKIP: no haproxy at {args.haproxy} (scripts/install-deps.sh --test installs it)")
        sys.exit(77)
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        subprocess.run([args.failsafe, "make-model", "--preset", "tiny-llama", "--out", model,
                        "--seed", "5"], check=True, capture_output=True)
        node_args = ["--min-devices", "2", "--enable-admin", "--max-num-seqs", "16", "--no-respawn"]
        a = Server(args.failsafe, model, tmp, node_args, name="a", devices=3)
        b = Server(args.failsafe, model, tmp, node_args, name="b", devices=3)
        lb = None
        try:
            check(a.port and b.port, "two nodes serve")
            lb = HAProxy(args.haproxy, tmp, [("a", a.port), ("b", b.port)])
            check(lb.wait_for({"a": "UP", "b": "UP"}), "the balancer's health checks pass both")

            # Both nodes take work; the fault-free text.
            before = (served(a), served(b))
            res = burst(lb.port, 8)
            texts = {r[0] for r in res if r and r[2] is None}
            check(all(r and r[2] is None and r[1] == MAX_TOKENS for r in res),
                  f"8 streams through the balancer complete: {[r and r[2] for r in res]}")
            check(len(texts) == 1, "every stream has the same (greedy) text")
            reference = next(iter(texts)) if texts else None
            check(served(a) > before[0] and served(b) > before[1], "both nodes took streams")

            # A device killed on node a mid-stream: same text, both nodes serve on.
            pids = device_pids(a)
            victim = max(pids)
            before = (served(a), served(b))

            def kill_mid_stream():
                deadline = time.time() + 30
                while time.time() < deadline and not metric(a.port, "failsafe_num_requests_running"):
                    time.sleep(0.01)
                os.kill(pids[victim], signal.SIGKILL)

            res = burst(lb.port, 8, during=kill_mid_stream)
            check(all(r and r[2] is None and r[0] == reference for r in res),
                  f"streams across a device killed on node a keep their text: "
                  f"{[r and r[2] for r in res]}")
            check(served(a) > before[0] and served(b) > before[1],
                  "both nodes took streams through the kill")
            time.sleep(0.5)
            check(lb.states().get("a") == "UP", "node a with 2 of 3 devices stays up")
            check(metric(a.port, "failsafe_devices_alive") == 2, "node a reports 2 devices alive")
            cap = metric(a.port, "failsafe_capacity_fraction")
            check(cap is not None and 0 < cap < 1,
                  f"node a's capacity fraction fell below 1 ({cap})")
            check(metric(b.port, "failsafe_capacity_fraction") == 1, "node b's capacity is 1")
            for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                         "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
                check(metric(a.port, name) is not None, f"/metrics has {name}")

            # Node a below its minimum: /health 503, the balancer stops sending to it,
            # streams it has finish.
            pids = device_pids(a)
            second = max(pids)
            in_flight = [None] * 4
            threads = [threading.Thread(target=complete, args=(a.port, in_flight, i))
                       for i in range(4)]
            for t in threads:
                t.start()
            deadline = time.time() + 30
            while time.time() < deadline and not metric(a.port, "failsafe_num_requests_running"):
                time.sleep(0.01)
            os.kill(pids[second], signal.SIGKILL)
            deadline = time.time() + 10
            while time.time() < deadline and request(a.port, "GET", "/health")[0] == 200:
                time.sleep(0.05)
            status, body = request(a.port, "GET", "/health")
            check(status == 503 and "fewer than the 2 required" in body,
                  f"node a below --min-devices answers /health 503: {status} {body[:120]}")
            check(lb.wait_for({"a": "DOWN", "b": "UP"}), "the balancer marks node a down")
            for t in threads:
                t.join(timeout=180)
            check(all(r and r[2] is None and r[0] == reference for r in in_flight),
                  "the streams node a already had finish with their text")
            before = (served(a), served(b))
            res = burst(lb.port, 6)
            check(all(r and r[2] is None and r[0] == reference for r in res),
                  "new streams through the balancer complete with the same text")
            check(served(a) == before[0] and served(b) == before[1] + 6,
                  f"every new stream went to node b ({served(a) - before[0]} to a)")

            # A device restored: node a is healthy again and takes work.
            status, _ = request(a.port, "POST", f"/admin/devices/{second}/restore", body={})
            check(status == 200, "a device of node a is restored")
            check(lb.wait_for({"a": "UP", "b": "UP"}), "the balancer marks node a up again")
            before = served(a)
            burst(lb.port, 8)
            check(served(a) > before, "node a takes streams again")
        finally:
            if lb:
                lb.stop()
            for n in (a, b):
                n.proc.send_signal(signal.SIGTERM)
                try:
                    n.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    n.kill()
    finish()


if __name__ == "__main__":
    main()
