#!/usr/bin/env python3
"""What `failsafe router` costs and what it saves, in one run:

1. Overhead: one `failsafe serve` node, and the router in front of it; the
   same load (`failsafe bench` load mode: K streams at once) against the node
   directly and through the router, alternating, for each level of
   --concurrency. Printed as ratios router / direct of output throughput and
   of time between tokens (p50, p99) and time to first token (p50), medians
   over --rounds. Everything shares this machine's cores: the router's CPU
   time is taken from the node's.
2. Failures (tests/python/fleet_router.py --figures): three nodes behind the
   router under concurrent streams; per failure kind (kill -9 of a node,
   SIGSTOP of a whole node, a cut link when run as root), the longest gap
   between tokens a client saw and the streams lost; and the streams lost to
   the same kill -9 behind HAProxy alone.

    python3 bench/router_bench.py --failsafe build/src/cli/failsafe \\
        [--concurrency 100,500] [--output-len 256] [--rounds 3] [--preset small-llama]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from fleet_router import Proc, free_ports  # noqa: E402


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(failsafe, url, levels, input_len, output_len):
    out = subprocess.run([failsafe, "bench", "--url", url, "--concurrency", levels,
                          "--input-len", str(input_len), "--output-len", str(output_len),
                          "--json"], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def overhead(args, failsafe, model, tmp):
    port = free_ports(1)[0]
    node = Proc([failsafe, "serve", "--model", model, "--devices", str(args.devices),
                 "--port", str(port), "--served-model-name", "tiny", "--max-num-seqs", "256",
                 "--max-queue", "4096"], tmp, "node")
    router = Proc([failsafe, "router", "--port", "0", "--node", f"127.0.0.1:{port}"], tmp,
                  "router")
    runs = {"direct": [], "router": []}
    cpu = {"seconds": 0.0, "tokens": 0}
    try:
        urls = {"direct": f"http://127.0.0.1:{port}",
                "router": f"http://127.0.0.1:{router.port}"}
        time.sleep(1)
        load(failsafe, urls["direct"], "50", args.input_len, 16)  # warm-up
        for r in range(args.rounds):
            order = ["direct", "router"] if r % 2 == 0 else ["router", "direct"]
            for who in order:
                before = cpu_seconds(router.proc.pid)
                result = load(failsafe, urls[who], args.concurrency, args.input_len,
                              args.output_len)
                if who == "router":
                    cpu["seconds"] += cpu_seconds(router.proc.pid) - before
                    cpu["tokens"] += sum(level["completion_tokens"] for level in result)
                runs[who].append(result)
    finally:
        router.stop()
        node.stop()
    print(f"\nOverhead: router / direct, {args.preset}, {args.rounds} rounds alternating, "
          f"{args.input_len} prompt + {args.output_len} output tokens per stream, "
          f"node on {args.devices} devices")
    print(f"{'streams':>8} {'served':>13} {'throughput':>11} {'TBT p50':>8} {'TBT p99':>8} "
          f"{'TTFT p50':>9}   (direct tok/s)")
    figures = []
    for i, level in enumerate(args.concurrency.split(",")):
        def med(who, f):
            return statistics.median(f(run[i]) for run in runs[who])

        def tput(x):
            return x["completion_tokens"] / x["seconds"]

        ratio = {
            "throughput": med("router", tput) / med("direct", tput),
            "tbt_p50": med("router", lambda x: x["tbt_ms"]["p50"]) /
            med("direct", lambda x: x["tbt_ms"]["p50"]),
            "tbt_p99": med("router", lambda x: x["tbt_ms"]["p99"]) /
            med("direct", lambda x: x["tbt_ms"]["p99"]),
            "ttft_p50": med("router", lambda x: x["ttft_ms"]["p50"]) /
            med("direct", lambda x: x["ttft_ms"]["p50"]),
        }
        served = (f"{min(run[i]['served'] for run in runs['router'])}/"
                  f"{min(run[i]['served'] for run in runs['direct'])}")
        print(f"{level:>8} {served:>13} {ratio['throughput']:>10.3f}x {ratio['tbt_p50']:>7.3f}x "
              f"{ratio['tbt_p99']:>7.3f}x {ratio['ttft_p50']:>8.3f}x   "
              f"({med('direct', tput):.0f})")
        figures.append({"streams": int(level), **{k: round(v, 3) for k, v in ratio.items()}})
    per_token = cpu["seconds"] / max(1, cpu["tokens"]) * 1e6
    print(f"router CPU: {per_token:.1f} us per streamed token (taken from the node's cores here)")
    figures.append({"router_cpu_us_per_token": round(per_token, 1)})
    return figures


def failures(failsafe):
    out = subprocess.run([sys.executable, os.path.join(HERE, "..", "tests", "python",
                                                       "fleet_router.py"),
                          "--failsafe", failsafe, "--figures"],
                         capture_output=True, text=True, timeout=600)
    lines = out.stdout.strip().splitlines()
    figures = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
    print("\nFailures: three nodes behind the router, 8 concurrent streams (greedy and seeded)")
    print(f"{'failure':>18} {'longest gap':>12} {'lost':>6} {'resumed':>8}")
    for kind, f in figures.items():
        resumed = f"{f['resumed']:>8.0f}" if "resumed" in f else f"{'-':>8}"
        print(f"{kind:>18} {f['max_gap_s'] * 1e3:>10.0f}ms {f['lost']:>3}/{f['streams']} {resumed}")
    if out.returncode != 0:
        print("fleet_router.py reported failed checks:\n" + out.stdout[-2000:])
    return figures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--failsafe", required=True)
    ap.add_argument("--concurrency", default="100,500")
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--preset", default="tiny-llama",
                    help="the node's model (make-model preset): small-llama (175M) makes the "
                         "node's compute dominate, as on a real model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-failures", action="store_true")
    args = ap.parse_args()
    failsafe = os.path.abspath(args.failsafe)
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        subprocess.run([failsafe, "make-model", "--preset", args.preset, "--out", model,
                        "--seed", "5"], check=True, capture_output=True)
        result = {"overhead": overhead(args, failsafe, model, tmp)}
    if not args.skip_failures:
        result["failures"] = failures(failsafe)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
