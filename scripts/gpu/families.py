#!/usr/bin/env python3
"""Every model family on GPU devices against the CPU backend, from the same
program (part of scripts/gpu-check.sh, and a CI test over the emulated GPU).

For each family preset (`failsafe make-model`, bf16: Llama, Mixtral, Qwen2
with its biases, Qwen3 with its q/k norms, the two Qwen MoE layouts, Phi-3's
fused projections, Gemma 2's soft caps and Gemma 3's sandwich norms and
local layers) it runs `failsafe logits` (a prefill in chunks of 5, then
greedy decode) on the CPU backend and on GPU devices in each given way
(`--gpu-gemm` and `--gpu-attention`, one device, and three sharing GPU 0),
and checks: the same tokens (bar near ties), and every logit within
--tolerance of the CPU backend's, relative to the row's largest (16-bit
activations: a last-bit difference of an f32 sum may round a bf16
activation the other way, so not bit for bit). hf_families.py checks the same presets against
transformers' own modeling code where transformers is installed.

  python3 scripts/gpu/families.py --failsafe BIN [--ways chain,fused+tensor]

Prints one line per family and way ("ok" or "FAIL") and exits 1 if any
failed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

PRESETS = ["tiny-llama", "tiny-mixtral", "tiny-qwen2", "tiny-qwen3", "tiny-qwen3-moe",
           "tiny-qwen2-moe", "tiny-phi3", "tiny-gemma2", "tiny-gemma3"]
PROMPT = [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 3, 7]


def logits(fs, model, extra, timeout):
    r = subprocess.run([fs, "logits", "--model", model, "--prompt-ids",
                        ",".join(map(str, PROMPT)), "--decode", "4", "--prefill-chunk", "5",
                        *extra], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"exit {r.returncode}: {r.stderr.strip()[-600:]}")
    return json.loads(r.stdout)


def compare(cpu, got, tolerance):
    """(ok, what): the same tokens, and each row's logits within `tolerance`
    of the CPU backend's, relative to the row's largest; a token may differ
    only where the CPU backend's logits for the two tokens are that close
    (a near tie), and rows after it (another prefix) are not compared."""
    if got["positions"] != cpu["positions"]:
        return False, f"logits at positions {got['positions']}, not {cpu['positions']}"
    first_out = len(PROMPT)  # the position of the first decoded token
    cpu_ids = dict(zip(range(first_out, first_out + len(cpu["output_ids"])), cpu["output_ids"]))
    got_ids = dict(zip(range(first_out, first_out + len(got["output_ids"])), got["output_ids"]))
    worst = 0.0
    for pos, g, c in zip(cpu["positions"], got["logits"], cpu["logits"]):
        top = max(abs(v) for v in c) or 1.0
        worst = max(worst, max(abs(a - b) for a, b in zip(g, c)) / top)
        a, b = cpu_ids.get(pos + 1), got_ids.get(pos + 1)
        if a != b:
            if a is None or b is None or abs(c[a] - c[b]) > tolerance * top:
                return False, (f"token {b} at position {pos + 1}, not {a}; logits within "
                               f"{worst:.1e} of the CPU backend's until there")
            return worst <= tolerance, (f"a near tie at position {pos + 1} ({a} or {b}); logits "
                                        f"within {worst:.1e} of the CPU backend's until there")
    return worst <= tolerance, f"the same tokens, logits within {worst:.1e} of the CPU backend's"


def gpu_args(way, devices):
    gemm, _, attention = way.partition("+")
    args = ["--gpus", ",".join(["0"] * devices), "--devices", str(devices), "--gpu-gemm", gemm]
    if attention:
        args += ["--gpu-attention", attention]
    if devices > 1:
        args += ["--placement", "hybrid"]
    return args


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--failsafe", required=True)
    ap.add_argument("--ways", default="chain,fused+tensor",
                    help="GPU product mode[+attention] per run, comma-separated")
    ap.add_argument("--presets", default=",".join(PRESETS))
    # Relative to a row's largest logit: bf16 activations, and on tensor
    # cores queries, keys, values and softmax weights in bf16 (Gemma 2's
    # soft-capped logits, a few units at most, come nearest: 1.7e-2).
    ap.add_argument("--tolerance", type=float, default=4e-2)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--step-timeout-floor", default="",
                    help="passed on (the emulated GPU's devices are slow to first move)")
    args = ap.parse_args()
    extra = ["--step-timeout-floor", args.step_timeout_floor] if args.step_timeout_floor else []
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        for preset in args.presets.split(","):
            model = os.path.join(work, preset)
            subprocess.run([args.failsafe, "make-model", "--preset", preset, "--dtype", "bf16",
                            "--seed", "3", "--out", model], check=True, capture_output=True)
            try:
                cpu = logits(args.failsafe, model, [], args.timeout)
            except Exception as e:  # noqa: BLE001
                print(f"FAIL {preset}: the CPU backend: {e}", flush=True)
                failures += 1
                continue
            for way in args.ways.split(","):
                for devices in (1, 3):
                    label = f"{preset}, {way}, {devices} GPU device{'s' if devices > 1 else ''}"
                    try:
                        got = logits(args.failsafe, model, gpu_args(way, devices) + extra,
                                     args.timeout)
                    except Exception as e:  # noqa: BLE001
                        print(f"FAIL {label}: {e}", flush=True)
                        failures += 1
                        continue
                    ok, what = compare(cpu, got, args.tolerance)
                    print(f"{'ok  ' if ok else 'FAIL'} {label}: {what}", flush=True)
                    failures += not ok
    print(f"families: {failures} failed" if failures else "families: all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
