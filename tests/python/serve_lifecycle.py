#!/usr/bin/env python3
"""`failsafe serve` as an operator runs it, with real processes and signals:

- SIGTERM stops accepting, lets a stream in flight finish, exits 0 with every
  device process gone;
- SIGTERM with a hung device and a request in flight still exits 0, within the
  drain timeout plus a bounded engine stop;
- SIGKILL of the server takes its device processes with it within a second,
  and nothing is left behind: no /dev/shm entry, and a model directory a
  killed process was writing is removed by the next start;
- a low open-file limit is reported at start-up;
- the admin token comes from a file or the environment; an admin API bound to
  a non-loopback address without one is warned about;
- with --rebalance-slow, a device throttled by a SIGSTOP/SIGCONT duty cycle
  is measured slow and given a smaller share (/admin/status), and its stream
  finishes whole.

  python3 serve_lifecycle.py --failsafe PATH
"""
import argparse
import http.client
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

FAILURES = []


def finish():
    """Exits 1 if any check failed, else says all passed."""
    if FAILURES:
        print(f"{len(FAILURES)} failed", flush=True)
        sys.exit(1)
    print("all passed", flush=True)


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


class Server:
    """A `failsafe serve` process on a free port; stderr goes to a file."""

    def __init__(self, failsafe, model, tmp, extra=(), env=None, preexec=None, name="serve",
                 devices=2):
        self.err_path = os.path.join(tmp, name + ".err")
        self.err = open(self.err_path, "w")
        args = [failsafe, "serve", "--model", model, "--devices", str(devices), "--port", "0",
                "--served-model-name", "tiny", *extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env=env, preexec_fn=preexec)
        self.port = None
        deadline = time.time() + 60
        for line in self.proc.stdout:
            m = re.search(r"on http://[0-9.]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
            if time.time() > deadline:
                break
        # Keep reading stdout so the server never blocks on a full pipe.
        self.out = []
        threading.Thread(target=lambda: self.out.extend(self.proc.stdout), daemon=True).start()
        self.workers = children(self.proc.pid)

    def stderr(self):
        self.err.flush()
        with open(self.err_path) as f:
            return f.read()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    return out


def running(pid):
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def request(port, method, path, body=None, headers=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"} if body is not None else {}
    h.update(headers or {})
    c.request(method, path, body=None if body is None else json.dumps(body), headers=h)
    r = c.getresponse()
    data = r.read().decode(errors="replace")
    c.close()
    return r.status, data


def open_stream(port, max_tokens):
    """Sends a streaming completion; returns the connection and its response."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions",
              body=json.dumps({"prompt": "The engine keeps serving", "max_tokens": max_tokens,
                               "ignore_eos": True, "stream": True,
                               "stream_options": {"include_usage": True}}),
              headers={"Content-Type": "application/json"})
    return c, c.getresponse()


def refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return False
    except OSError:
        return True


def shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def test_sigterm_drains(failsafe, model, tmp):
    s = Server(failsafe, model, tmp, ["--drain-timeout", "30"], name="drain")
    check(s.port is not None and len(s.workers) == 2, "serve starts with 2 device processes")
    conn, resp = open_stream(s.port, 150)
    first = resp.readline()  # the first event: the stream is going
    check(resp.status == 200 and first, "a stream is in flight")
    os.kill(s.proc.pid, signal.SIGTERM)
    t0 = time.time()
    while not refused(s.port) and time.time() - t0 < 3:
        time.sleep(0.05)
    check(refused(s.port), "after SIGTERM new connections are refused")
    body = resp.read().decode(errors="replace")
    conn.close()
    m = re.search(r'"completion_tokens":(\d+)', body)
    check(m is not None and int(m.group(1)) == 150 and "data: [DONE]" in body,
          "the stream in flight finishes whole (150 tokens, [DONE])")
    try:
        code = s.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        code = None
    check(code == 0, f"the server exits 0 after the drain (exit {code})")
    check(not any(running(w) for w in s.workers), "its device processes are gone")
    s.kill()


def test_sigterm_with_a_hung_device(failsafe, model, tmp):
    s = Server(failsafe, model, tmp, ["--drain-timeout", "1"], name="hung")
    conn, resp = open_stream(s.port, 2000)
    resp.readline()
    for w in s.workers:
        os.kill(w, signal.SIGSTOP)  # the engine stalls mid-step
    t0 = time.time()
    os.kill(s.proc.pid, signal.SIGTERM)
    body = resp.read().decode(errors="replace")
    conn.close()
    check("server_shutting_down" in body and "data: [DONE]" in body,
          "at the drain deadline the stream ends with an error event")
    try:
        code = s.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        code = None
    took = time.time() - t0
    check(code == 0 and took < 12, f"SIGTERM with hung devices exits 0 in {took:.1f} s")
    time.sleep(0.2)
    check(not any(running(w) for w in s.workers), "the hung device processes are gone")
    s.kill()


def test_sigkill(failsafe, model, tmp, cache):
    before = shm_entries()
    s = Server(failsafe, model, tmp, ["--cache-dir", cache], name="kill")
    check(len(s.workers) == 2 and all(running(w) for w in s.workers), "devices are running")
    t0 = time.time()
    os.kill(s.proc.pid, signal.SIGKILL)
    s.proc.wait()
    while any(running(w) for w in s.workers) and time.time() - t0 < 5:
        time.sleep(0.01)
    took = time.time() - t0
    check(not any(running(w) for w in s.workers),
          f"SIGKILL of the server: its devices exit too ({took * 1000:.0f} ms)")
    check(took < 1.0, "... within a second")
    check(shm_entries() - before == set(), "nothing is left in /dev/shm (memfd regions)")
    # A model that a killed process was writing, and one a live process is writing.
    models = os.path.join(cache, "models")
    os.makedirs(models, exist_ok=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = os.path.join(models, f"small-llama-seed0.tmp.{dead.pid}")
    live = os.path.join(models, f"small-llama-seed0.tmp.{os.getpid()}")
    os.makedirs(stale)
    os.makedirs(live)
    s = Server(failsafe, model, tmp, ["--cache-dir", cache], name="restart")
    check(s.port is not None, "the next start serves")
    check(not os.path.exists(stale), "the next start removes a dead process's model directory")
    check(os.path.exists(live), "... and leaves a live process's alone")
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait(timeout=15)


def test_file_limit(failsafe, model, tmp):
    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    s = Server(failsafe, model, tmp, [], preexec=low_limit, name="nofile")
    check("open-file limit" in s.stderr() and "1024" in s.stderr(),
          "a hard open-file limit of 1024 is reported against 4096 connections")
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait(timeout=15)
    s = Server(failsafe, model, tmp, ["--max-connections", "200"], preexec=low_limit,
               name="nofile-ok")
    check("open-file limit" not in s.stderr(), "... and not when the connections fit")
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait(timeout=15)


def test_admin_token(failsafe, model, tmp):
    token_file = os.path.join(tmp, "token")
    with open(token_file, "w") as f:
        f.write("file-token\n")
    os.chmod(token_file, 0o600)
    env = dict(os.environ)
    env.pop("FAILSAFE_ADMIN_TOKEN", None)
    s = Server(failsafe, model, tmp, ["--enable-admin", "--admin-token-file", token_file], env=env,
               name="token-file")
    code, _ = request(s.port, "GET", "/admin/status")
    check(code == 401, "admin without the token: 401")
    code, _ = request(s.port, "GET", "/admin/status",
                      headers={"Authorization": "Bearer file-token"})
    check(code == 200, "admin with the token from the file: 200")
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait(timeout=15)
    env["FAILSAFE_ADMIN_TOKEN"] = "env-token"
    s = Server(failsafe, model, tmp, ["--enable-admin"], env=env, name="token-env")
    code, _ = request(s.port, "GET", "/admin/status", headers={"Authorization": "Bearer env-token"})
    check(code == 200, "admin with the token from FAILSAFE_ADMIN_TOKEN: 200")
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait(timeout=15)
    p = subprocess.run([failsafe, "serve", "--model", model, "--enable-admin",
                        "--admin-token-file", token_file, "--port", "0"],
                       env=env, capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and "more than once" in p.stderr,
          "two token sources at once are refused")
    env.pop("FAILSAFE_ADMIN_TOKEN")
    s = Server(failsafe, model, tmp, ["--enable-admin", "--host", "0.0.0.0"], env=env,
               name="open")
    check("without a token" in s.stderr(), "admin on 0.0.0.0 without a token is warned about")
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait(timeout=15)


def test_rebalance_slow(failsafe, model, tmp):
    s = Server(failsafe, model, tmp, ["--rebalance-slow", "--enable-admin"], name="rebalance")
    check(s.port is not None and len(s.workers) == 2, "serve --rebalance-slow starts")
    status = json.loads(request(s.port, "GET", "/admin/status")[1])
    victim = next(d["pid"] for d in status["devices"] if d["device"] == 1)
    streams = [open_stream(s.port, 1500) for _ in range(4)]
    stop = threading.Event()

    def throttle():  # device 1 runs 30% of every 20 ms, as a CPU quota holds it
        while not stop.is_set():
            os.kill(victim, signal.SIGSTOP)
            time.sleep(0.014)
            os.kill(victim, signal.SIGCONT)
            time.sleep(0.006)

    t = threading.Thread(target=throttle)
    t.start()
    share, rebalanced = 1.0, False
    deadline = time.time() + 40
    while time.time() < deadline and not (share < 1 and rebalanced):
        time.sleep(0.5)
        status = json.loads(request(s.port, "GET", "/admin/status")[1])
        share = next(d["speed"]["share"] for d in status["devices"] if d["device"] == 1)
        rebalanced = any(r.get("rebalance") for r in status["recoveries"])
    stop.set()
    t.join()
    os.kill(victim, signal.SIGCONT)
    check(share < 1 and rebalanced,
          f"the throttled device gets a smaller share (share {share}, rebalanced {rebalanced})")
    for conn, resp in streams:
        body = resp.read().decode(errors="replace")
        conn.close()
        m = re.search(r'"completion_tokens":(\d+)', body)
        check(m is not None and int(m.group(1)) == 1500, "a stream through the rebalance is whole")
    s.kill()


def tiny_model(failsafe, tmp):
    """A tiny-llama model made in `tmp`; its directory."""
    model = os.path.join(tmp, "model")
    subprocess.run([failsafe, "make-model", "--preset", "tiny-llama", "--out", model,
                    "--seed", "5"], check=True, capture_output=True)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--failsafe", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model(args.failsafe, tmp)
        cache = os.path.join(tmp, "cache")
        test_sigterm_drains(args.failsafe, model, tmp)
        test_sigterm_with_a_hung_device(args.failsafe, model, tmp)
        test_sigkill(args.failsafe, model, tmp, cache)
        test_file_limit(args.failsafe, model, tmp)
        test_admin_token(args.failsafe, model, tmp)
        test_rebalance_slow(args.failsafe, model, tmp)
    finish()


if __name__ == "__main__":
    main()
