#!/usr/bin/env python3
"""PyTorch with transformers on the same weights and GPU as
failsafe_bench_gpu (scripts/gpu-check.sh): decode at several batch sizes
with a static KV cache, eager and (--compile) with torch.compile, and a
prefill of one long sequence. Prints figures and writes them as JSON.

Decode time per step is the difference between two generations of
different lengths from the same prompt, over the difference in steps: the
prefill and the first step cancel out.
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def timed(fn, reps=1):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--compile", default="", help="batch sizes to also time with torch.compile")
    ap.add_argument("--json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16,
                                                 device_map="cuda")
    model.eval()
    print(f"transformers: loaded in {time.perf_counter() - t0:.1f} s, torch {torch.__version__}",
          flush=True)
    vocab = model.config.vocab_size
    out = {"decode": [], "decode_compiled": []}
    g = torch.Generator(device="cuda").manual_seed(0)

    def decode(batch, compiled):
        ids = torch.randint(3, vocab, (batch, args.context), device="cuda", generator=g)
        mask = torch.ones_like(ids)

        def gen(n):
            kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                      do_sample=False, cache_implementation="static", pad_token_id=0)
            try:
                model.generate(**kw, disable_compile=not compiled)
            except (TypeError, ValueError) as e:
                if "disable_compile" not in str(e):
                    raise
                model.generate(**kw)
        short, long = 8, 40
        gen(short)  # warm (and compile)
        gen(long)
        t_short = timed(lambda: gen(short), 2)
        t_long = timed(lambda: gen(long), 2)
        return (t_long - t_short) / (long - short)

    with torch.no_grad():
        for b in [int(x) for x in args.batches.split(",") if x]:
            step = decode(b, False)
            print(f"eager static cache: batch {b:3d}: {step * 1e3:8.3f} ms/step, "
                  f"{b / step:9.1f} tokens/s", flush=True)
            out["decode"].append({"batch": b, "step_s": step})
        for b in [int(x) for x in args.compile.split(",") if x]:
            try:
                step = decode(b, True)
            except Exception as e:  # noqa: BLE001
                print(f"torch.compile: batch {b}: failed: {e}", flush=True)
                continue
            print(f"torch.compile static cache: batch {b:3d}: {step * 1e3:8.3f} ms/step, "
                  f"{b / step:9.1f} tokens/s", flush=True)
            out["decode_compiled"].append({"batch": b, "step_s": step})
        if args.prefill:
            ids = torch.randint(3, vocab, (1, args.prefill), device="cuda", generator=g)
            model(input_ids=ids, use_cache=False)
            s = timed(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1), 3)
            print(f"prefill {args.prefill} tokens: {s * 1e3:.1f} ms, {args.prefill / s:.0f} "
                  "tokens/s", flush=True)
            out["prefill"] = {"tokens": args.prefill, "s": s}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
