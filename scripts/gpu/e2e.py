#!/usr/bin/env python3
"""The engine end to end on a GPU (part of scripts/gpu-check.sh).

- stories260K (the real model, f32) tells its published story on the GPU:
  one device, and 8 device processes sharing the GPU under hybrid placement;
- the same tokens on 1, 2, 3, 4 and 7 device processes under every placement,
  for stories260K and for a synthetic bf16 model (whose logits must also be
  the same bits everywhere, and the same whatever the prefill chunk);
- with --gpu-gemm chain, the logits of the CPU backend, bit for bit;
- a bf16 KV cache (--kv-dtype bf16): the same tokens and logits on 1, 3 and
  7 devices and in chunks, near the CPU backend's bf16 cache;
- the prefix cache on: requests sharing a prompt prefix through `serve`
  answer what a server without the cache answers;
- with --peer, every GPU run's all-reduces read the other device
  processes' GPU memory (CUDA IPC) rather than staging through the host;
- with --library, they go through the devices' library of collectives
  (NCCL), which needs every device on a GPU of its own: `distinct` puts
  device i on GPU i (the emulated GPU has 8), `apart` keeps them on GPU 0 as
  hosts apart (FAILSAFE_NCCL_APART: NCCL's network transport, a check of
  its joins and aborts on a machine with one GPU).

Prints one line per check ("ok" or "FAIL") and exits 1 if any failed.
"""
import argparse
import http.client
import json
import os
import queue
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

PUBLISHED = ("Once upon a time, there was a little girl named Lily. She loved to play outside in "
             "the park. One day, she saw a big, red ball. She wanted to play with it, but it was "
             "too high.")
PLACEMENTS = ["standard", "nonuniform", "cyclic", "hybrid"]
DEVICES = [1, 2, 3, 4, 7]

failures = 0
ATTENTION = "cores"  # --gpu-attention of every GPU run (--attention)
PEER = []  # ["--peer-collectives"] with --peer: all-reduces from the devices' own memory
LIBRARY = None  # --library: "distinct" or "apart"
TIMEOUT = []  # ["--step-timeout-floor", T] with --step-timeout-floor


def report(ok, what):
    global failures
    print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        failures += 1


def run(cmd, timeout=150):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout


def gpu_args(devices, gemm):
    gpus = [str(i) for i in range(devices)] if LIBRARY == "distinct" else ["0"] * devices
    return ["--gpus", ",".join(gpus), "--gpu-gemm", gemm, "--gpu-attention", ATTENTION, *PEER,
            *TIMEOUT]


def generate(fs, model, devices, placement, extra, tokens=61):
    out = run([fs, "generate", "--model", model, "--max-tokens", str(tokens), "--json",
               "--devices", str(devices), "--placement", placement, *extra])
    return json.loads(out.strip().splitlines()[-1])


def logits(fs, model, prompt, devices, placement, extra, chunk=512):
    out = run([fs, "logits", "--model", model, "--prompt-ids", ",".join(map(str, prompt)),
               "--decode", "8", "--prefill-chunk", str(chunk), "--devices", str(devices),
               "--placement", placement, *extra])
    return json.loads(out)


def check_collectives_in_use(fs, model, gemm, prompt, devices=4):
    """With --peer or --library: every device says its all-reduces go the
    way asked (a group that could not would take another way, or stage
    through the host, and pass every other check)."""
    if LIBRARY:
        label, said_text = "device library", "all-reduces by the device library among the"
        why_text, what = ("not by the device library", "device group:"), "all-reduce through it"
    else:
        label, said_text = "peer collectives", "all-reduces read the"
        why_text, what = ("stage through the host",), "read one another's memory"
    try:
        r = subprocess.run([fs, "logits", "--model", model, "--prompt-ids",
                            ",".join(map(str, prompt)), "--decode", "2", "--devices", str(devices),
                            "--log-level", "debug", *gpu_args(devices, gemm)],
                           capture_output=True, text=True, timeout=150)
        said = len(re.findall(rf"{re.escape(said_text)} {devices} members", r.stderr))
        why = [l for l in r.stderr.splitlines() if any(w in l for w in why_text)][:1]
        report(r.returncode == 0 and said == devices,
               f"{label}: {said} of {devices} GPU devices {what}"
               + (f" ({why[0]})" if why else ""))
    except Exception as e:  # noqa: BLE001
        report(False, f"{label}: {e}")


def check_stories(fs, stories, gemm):
    for devices, placement in [(1, "hybrid"), (8, "hybrid")]:
        try:
            r = generate(fs, stories, devices, placement, gpu_args(devices, gemm))
            report(r["text"].strip() == PUBLISHED,
                   f"stories260K on {devices} GPU device(s), {placement}: the published story"
                   + ("" if r["text"].strip() == PUBLISHED else f" (got {r['text']!r})"))
        except Exception as e:  # noqa: BLE001
            report(False, f"stories260K on {devices} GPU device(s): {e}")


def check_placements(fs, model, label, gemm, prompt, compare_logits):
    try:
        ref = logits(fs, model, prompt, 1, "hybrid", gpu_args(1, gemm))
        cpu = logits(fs, model, prompt, 1, "hybrid", [])
    except Exception as e:  # noqa: BLE001
        report(False, f"{label}: {e}")
        return
    # Every device count and placement: the same tokens (and logits).
    bad = []
    for devices in DEVICES:
        for placement in PLACEMENTS:
            if devices == 1 and placement != "hybrid":
                continue
            try:
                r = logits(fs, model, prompt, devices, placement, gpu_args(devices, gemm))
            except Exception as e:  # noqa: BLE001
                bad.append(f"{devices}/{placement}: {e}")
                continue
            if r["output_ids"] != ref["output_ids"]:
                bad.append(f"{devices}/{placement}: tokens differ")
            elif compare_logits and r["logits"] != ref["logits"]:
                bad.append(f"{devices}/{placement}: logits differ")
    what = "tokens and logits bit for bit" if compare_logits else "tokens"
    report(not bad, f"{label}, gemm {gemm}: the same {what} on 1, 2, 3, 4, 7 GPU devices x "
           f"{len(PLACEMENTS)} placements" + (f": {bad[:4]}" if bad else ""))
    # Chunked prefill: a token's logits do not depend on its chunk.
    try:
        chunked = logits(fs, model, prompt, 1, "hybrid", gpu_args(1, gemm), chunk=7)
        # Logits are recorded at the end of each chunk: compare the positions
        # both runs recorded (the prompt's last and every decode step's).
        a = dict(zip(chunked["positions"], chunked["logits"]))
        b = dict(zip(ref["positions"], ref["logits"]))
        common = sorted(set(a) & set(b))
        report(len(common) > 1 and all(a[p] == b[p] for p in common),
               f"{label}, gemm {gemm}: prefill in chunks of 7 gives the logits of one chunk, "
               f"bit for bit ({len(common)} positions)")
    except Exception as e:  # noqa: BLE001
        report(False, f"{label} chunks: {e}")
    # Against the CPU backend: bit for bit with the chains; close otherwise.
    worst = 0.0
    for g, c in zip(ref["logits"], cpu["logits"]):
        top = max(abs(v) for v in c) or 1.0
        worst = max(worst, max(abs(a - b) for a, b in zip(g, c)) / top)
    if gemm == "chain" and label.startswith("stories"):
        # f32 everywhere: the chains are the CPU's products, other kernels
        # (norms, attention) round differently in the last bits.
        report(worst < 1e-5, f"{label}, gemm chain: logits within {worst:.1e} of the CPU backend")
    else:
        report(worst < 2e-2 and ref["output_ids"] == cpu["output_ids"],
               f"{label}, gemm {gemm}: logits within {worst:.1e} of the CPU backend, same tokens")


def check_kv_bf16(fs, model, gemm, prompt):
    """A bf16 KV cache: the same tokens and logits on 1, 3 and 7 GPU devices
    and in chunks of 7; tokens and logits near the CPU backend's bf16 cache
    (both round each key and value alike, then attend in f32)."""
    kv = ["--kv-dtype", "bf16"]
    try:
        ref = logits(fs, model, prompt, 1, "hybrid", gpu_args(1, gemm) + kv)
        cpu = logits(fs, model, prompt, 1, "hybrid", kv)
        bad = []
        for devices, placement in [(3, "cyclic"), (7, "hybrid")]:
            r = logits(fs, model, prompt, devices, placement, gpu_args(devices, gemm) + kv)
            if r["output_ids"] != ref["output_ids"] or r["logits"] != ref["logits"]:
                bad.append(f"{devices}/{placement}")
        chunked = logits(fs, model, prompt, 1, "hybrid", gpu_args(1, gemm) + kv, chunk=7)
        a = dict(zip(chunked["positions"], chunked["logits"]))
        b = dict(zip(ref["positions"], ref["logits"]))
        if not all(a[p] == b[p] for p in set(a) & set(b)):
            bad.append("chunks of 7")
        worst = 0.0
        for g, c in zip(ref["logits"], cpu["logits"]):
            top = max(abs(v) for v in c) or 1.0
            worst = max(worst, max(abs(x - y) for x, y in zip(g, c)) / top)
        report(not bad and worst < 2e-2 and ref["output_ids"] == cpu["output_ids"],
               f"bf16 KV cache, gemm {gemm}: the same tokens and logits on 1, 3, 7 GPU devices "
               f"and in chunks of 7, within {worst:.1e} of the CPU backend's"
               + (f": {bad}" if bad else ""))
    except Exception as e:  # noqa: BLE001
        report(False, f"bf16 KV cache, gemm {gemm}: {e}")


class Server:
    def __init__(self, fs, model, extra, log):
        self.log = open(log, "w")
        self.proc = subprocess.Popen([fs, "serve", "--model", model, "--port", "0", *extra],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.port = None
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.proc.stdout], daemon=True).start()
        deadline = time.time() + 120  # a silent server too
        while self.port is None and time.time() < deadline:
            try:
                m = re.search(r"on http://[0-9.]+:(\d+)", lines.get(timeout=1))
            except queue.Empty:
                continue
            if m:
                self.port = int(m.group(1))

    def complete(self, prompt, max_tokens=24):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        c.request("POST", "/v1/completions",
                  body=json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        body = json.loads(r.read())
        c.close()
        return body["choices"][0]["text"]

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def check_prefix_cache(fs, stories, gemm, tmp):
    prefix = ("Once upon a time, there was a little boy named Tom. He liked to run in the big "
              "green park with his dog. ") * 2
    prompts = [prefix + s for s in ["One day", "The dog", "Then Tom saw", "One day"]]
    answers = {}
    for mode in ["off", "on"]:
        try:
            s = Server(fs, stories, ["--devices", "4", "--prefix-cache", mode,
                                     *gpu_args(4, gemm)], os.path.join(tmp, f"serve-{mode}.err"))
            try:
                if s.port is None:
                    raise RuntimeError("the server did not start")
                answers[mode] = [s.complete(p) for p in prompts]
            finally:
                s.stop()
        except Exception as e:  # noqa: BLE001
            report(False, f"prefix cache {mode}: {e}")
            return
    report(answers["on"] == answers["off"],
           "prefix cache on 4 GPU devices: requests sharing a prefix answer as without the cache")


def check_graphs(fs, stories, bf16, gemm, prompt_stories, prompt_bf16):
    """CUDA graphs (--cuda-graphs) and programmatic dependent launch
    (--gpu-dependent-launch) change no bit."""
    try:
        r = generate(fs, stories, 1, "hybrid", gpu_args(1, gemm) + ["--cuda-graphs"])
        report(r["text"].strip() == PUBLISHED,
               f"stories260K on 1 GPU device with CUDA graphs, gemm {gemm}: the published story")
        for label, model, prompt in [("stories260K", stories, prompt_stories),
                                     ("tiny-llama bf16", bf16, prompt_bf16)]:
            a = logits(fs, model, prompt, 1, "hybrid", gpu_args(1, gemm))
            b = logits(fs, model, prompt, 1, "hybrid", gpu_args(1, gemm) + ["--cuda-graphs"])
            report(a["logits"] == b["logits"] and a["output_ids"] == b["output_ids"],
                   f"{label}, gemm {gemm}: CUDA graphs give the logits without them, bit for bit")
            # Programmatic dependent launch: alone, with graphs, and on 4
            # devices.
            pdl = ["--gpu-dependent-launch"]
            for what, n, extra in [("", 1, []), (" with CUDA graphs", 1, ["--cuda-graphs"]),
                                   (" on 4 devices", 4, [])]:
                c = logits(fs, model, prompt, n, "hybrid", gpu_args(n, gemm) + pdl + extra)
                report(a["logits"] == c["logits"] and a["output_ids"] == c["output_ids"],
                       f"{label}, gemm {gemm}: dependent launch{what} gives the logits of 1 "
                       "device without it, bit for bit")
    except Exception as e:  # noqa: BLE001
        report(False, f"CUDA graphs, gemm {gemm}: {e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--failsafe", required=True)
    ap.add_argument("--stories", required=True, help="data/models/stories260K")
    ap.add_argument("--gemm", default="lt")
    ap.add_argument("--bf16-only", action="store_true",
                    help="only the synthetic bf16 model (what a product mode changes)")
    ap.add_argument("--graphs", action="store_true",
                    help="the CUDA graphs and dependent launch checks too")
    ap.add_argument("--graphs-only", action="store_true",
                    help="only the CUDA graphs and dependent launch checks")
    ap.add_argument("--attention", default="cores", choices=["cores", "tensor", "segments"],
                    help="--gpu-attention of every GPU run")
    ap.add_argument("--peer", action="store_true",
                    help="every GPU run with --peer-collectives (CUDA IPC between the devices)")
    ap.add_argument("--library", choices=["distinct", "apart"],
                    help="every GPU run's all-reduces through the device library (NCCL): each "
                    "device on a GPU of its own, or all on GPU 0 as hosts apart")
    ap.add_argument("--step-timeout-floor",
                    help="every GPU run's --step-timeout-floor (the emulated GPU: its kernels "
                    "run on the CPU, 7 device processes on a few cores, and a first step's "
                    "one-off work may keep a device from its next collective for longer than "
                    "the default floor, which is set for real GPUs; these checks are of bits, "
                    "not of the hang detector)")
    args = ap.parse_args()
    global ATTENTION, PEER, LIBRARY, TIMEOUT
    TIMEOUT = ["--step-timeout-floor", args.step_timeout_floor] if args.step_timeout_floor else []
    ATTENTION = args.attention
    PEER = ["--peer-collectives"] if args.peer or args.library else []
    LIBRARY = args.library
    if LIBRARY == "apart":
        os.environ["FAILSAFE_NCCL_APART"] = "1"
    fs = args.failsafe
    with tempfile.TemporaryDirectory() as tmp:
        bf16 = os.path.join(tmp, "tiny-llama-bf16")
        run([fs, "make-model", "--preset", "tiny-llama", "--dtype", "bf16", "--out", bf16,
             "--seed", "3"])
        rng = random.Random(11)
        stories_prompt = [1] + [rng.randrange(3, 500) for _ in range(40)]
        bf16_prompt = [rng.randrange(0, 500) for _ in range(90)]
        if PEER:
            check_collectives_in_use(fs, bf16, args.gemm, bf16_prompt)
        if args.graphs or args.graphs_only:
            check_graphs(fs, args.stories, bf16, args.gemm, stories_prompt, bf16_prompt)
        if args.graphs_only:
            sys.exit(1 if failures else 0)
        if not args.bf16_only:
            check_stories(fs, args.stories, args.gemm)
            check_placements(fs, args.stories, "stories260K", args.gemm, stories_prompt, True)
        check_placements(fs, bf16, "tiny-llama bf16", args.gemm, bf16_prompt, True)
        check_kv_bf16(fs, bf16, args.gemm, bf16_prompt)
        if not args.bf16_only:
            check_prefix_cache(fs, args.stories, args.gemm, tmp)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
