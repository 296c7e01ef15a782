#!/usr/bin/env python3
"""What the sampling surface costs, side by side in one run against one
`failsafe serve`: a JSON-schema request against the same request
unconstrained, unconstrained streams with and without constrained ones in
the same batches, and n = 8 in one request against eight requests.

The model is synthetic (tiny-llama's shape) with a real 32,000-token
vocabulary (Llama 2's tokenizer, from data/tokenizers), so the masks walk a
real vocabulary. Only ratios are printed as results; absolute times hold only
for this machine.

    python3 bench/api_bench.py --failsafe build/src/cli/failsafe [--rounds 3]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "count": {"type": "integer"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        "mode": {"enum": ["fast", "safe", "slow"]},
    },
    "required": ["name", "count", "ok", "tags", "mode"],
}


def post(base, path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.load(r)
    return out, time.perf_counter() - t0


def metric(base, name):
    with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def per_token(results):
    tokens = sum(r["usage"]["completion_tokens"] for r, _ in results)
    return sum(t for _, t in results) / max(tokens, 1), tokens


def concurrent(base, bodies):
    out = [None] * len(bodies)

    def run(i):
        out[i] = post(base, "/v1/completions", bodies[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--failsafe", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--devices", type=int, default=2)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="fs-api-bench-")
    model = os.path.join(work, "model")
    subprocess.run([args.failsafe, "make-model", "--preset", "tiny-llama", "--vocab-size", "32000",
                    "--out", model, "--seed", "1"], check=True, stdout=subprocess.DEVNULL)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(DATA, "tokenizers", "llama-2", f), os.path.join(model, f))
    server = subprocess.Popen([args.failsafe, "serve", "--model", model, "--devices",
                               str(args.devices), "--port", "0", "--no-respawn"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        base = None
        for line in server.stdout:
            m = re.search(r"on (http://[0-9.:]+)", line)
            if m:
                base = m.group(1)
                break
        if not base:
            sys.exit("the server did not start")
        prompt = "Describe one serving device as a JSON object with its name and state. " * 4
        plain = {"prompt": prompt, "max_tokens": 48, "temperature": 0.8}
        shaped = dict(plain, response_format={"type": "json_schema",
                                              "json_schema": {"name": "d", "schema": SCHEMA}})
        # A free-text string field: as many tokens as unconstrained text.
        free = dict(plain, response_format={"type": "json_schema", "json_schema": {
            "name": "t", "schema": {"type": "object", "properties": {"text": {"type": "string"}},
                                    "required": ["text"]}}})
        post(base, "/v1/completions", dict(shaped, seed=999))  # compiles the schemas once
        post(base, "/v1/completions", dict(free, seed=999))
        one_plain, one_shaped, one_free, mixed_alone, mixed_with = [], [], [], [], []
        n8, sep8, n8_hits, sep8_hits = [], [], [], []
        for r in range(args.rounds):
            # One request at a time: time per token, constrained and not.
            a = [post(base, "/v1/completions", dict(plain, seed=r * 10 + i, ignore_eos=True))
                 for i in range(4)]
            b = [post(base, "/v1/completions", dict(shaped, seed=r * 10 + i)) for i in range(4)]
            c = [post(base, "/v1/completions", dict(free, seed=r * 10 + i)) for i in range(4)]
            one_plain.append(per_token(a)[0])
            one_shaped.append(per_token(b)[0])
            one_free.append(per_token(c)[0])
            # Eight unconstrained streams beside eight more unconstrained,
            # then beside eight constrained to a free-text string (as long).
            mine = [dict(plain, seed=r * 100 + i, ignore_eos=True) for i in range(8)]
            alone = concurrent(base, mine + [dict(plain, seed=r * 100 + 50 + i, ignore_eos=True)
                                             for i in range(8)])
            both = concurrent(base, mine + [dict(free, seed=r * 100 + 50 + i) for i in range(8)])
            mixed_alone.append(per_token(alone)[0])
            mixed_with.append(per_token(both[:8])[0])
            # n = 8 against eight requests (distinct prompts per round, so the
            # prefix cache starts cold for both).
            long_prompt = prompt * 8  # about 600 tokens: a prefill takes a step or more
            p = f"Round {r}. " + long_prompt
            h0 = metric(base, "failsafe_prefix_cache_hit_tokens_total")
            _, t = post(base, "/v1/completions", {"prompt": p, "max_tokens": 32, "n": 8,
                                                  "seed": r, "ignore_eos": True})
            h1 = metric(base, "failsafe_prefix_cache_hit_tokens_total")
            n8.append(t)
            n8_hits.append(h1 - h0)
            p = f"Again {r}. " + long_prompt
            t0 = time.perf_counter()
            concurrent(base, [{"prompt": p, "max_tokens": 32, "seed": r * 8 + i, "ignore_eos": True}
                              for i in range(8)])
            sep8.append(time.perf_counter() - t0)
            sep8_hits.append(metric(base, "failsafe_prefix_cache_hit_tokens_total") - h1)
        med = lambda xs: sorted(xs)[len(xs) // 2]
        print(f"rounds: {args.rounds}, devices: {args.devices}, vocabulary 32000 (Llama 2)")
        print(f"json_schema (5 typed fields) / unconstrained, time per token, one request: "
              f"{med(one_shaped) / med(one_plain):.2f}x "
              f"({med(one_shaped) * 1e3:.1f} vs {med(one_plain) * 1e3:.1f} ms)")
        print(f"json_schema (one free string) / unconstrained, time per token, one request: "
              f"{med(one_free) / med(one_plain):.2f}x "
              f"({med(one_free) * 1e3:.1f} vs {med(one_plain) * 1e3:.1f} ms)")
        print(f"8 unconstrained streams beside 8 constrained / beside 8 unconstrained, "
              f"their time per token: {med(mixed_with) / med(mixed_alone):.2f}x")
        print(f"n = 8 / eight requests, wall time: {med(n8) / med(sep8):.2f}x "
              f"({med(n8):.2f} vs {med(sep8):.2f} s); prompt tokens taken from the cache: "
              f"{med(n8_hits):.0f} vs {med(sep8_hits):.0f}")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
