#!/usr/bin/env python3
"""Each model family FailSafe loads, against Hugging Face transformers' own
modeling code (where transformers is installed: the GPU machine).

For every family preset (`failsafe make-model`: tiny-qwen2, tiny-qwen3,
tiny-qwen3-moe, tiny-qwen2-moe, tiny-phi3, tiny-gemma2, tiny-gemma3, tiny-gemma3 as
Gemma3ForConditionalGeneration with a vision tower, and tiny-llama, tiny-mixtral for
comparison) it runs `failsafe logits` (a chunked prefill and greedy decode
steps, with the given engine flags, e.g. `--gpus 0`) and transformers'
AutoModelForCausalLM (Gemma3ForConditionalGeneration, text only, for the
vision-language checkpoint) in float32 (eager attention) on the same weights and the
same tokens, and prints the largest relative logit difference per family:
max |failsafe - transformers| / max |transformers| over the vocabulary, at
every position the engine reports. Fails above 1e-4 or on a greedy token
that differs from transformers' (bar near ties).

  python3 scripts/gpu/hf_families.py --failsafe BIN [--engine-args "--gpus 0"]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import torch
import transformers

PRESETS = ["tiny-llama", "tiny-mixtral", "tiny-qwen2", "tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen2-moe",
           "tiny-phi3", "tiny-gemma2", "tiny-gemma3", "tiny-gemma3+vision"]
TOLERANCE = 1e-4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--failsafe", required=True)
    ap.add_argument("--engine-args", default="")
    args = ap.parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for preset in PRESETS:
            try:
                good = check(args, tmp, preset)
            except Exception as e:  # noqa: BLE001: one family's failure stops no other
                detail = e.stderr[-2000:] if isinstance(e, subprocess.CalledProcessError) else ""
                print(f"FAIL {preset}: {e} {detail}", flush=True)
                good = False
            ok &= good
    sys.exit(0 if ok else 1)


def check(args, tmp, preset):
    """One family against transformers: its line, and whether it passed."""
    d = os.path.join(tmp, preset)
    vision = preset.endswith("+vision")
    extra = ["--vision-language", "language_model.model."] if vision else []
    subprocess.run([args.failsafe, "make-model", "--preset", preset.split("+")[0], "--out",
                    d, "--seed", "3", *extra], check=True, capture_output=True, text=True)
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    text_cfg = cfg.get("text_config", cfg)
    if "layer_types" in text_cfg and text_cfg.get("model_type") == "gemma3_text":
        # Releases that predate layer_types read the pattern instead
        # (the presets put a global layer every third).
        text_cfg["sliding_window_pattern"] = 3
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=1)
    rng = random.Random(preset)
    prompt = [rng.randrange(3, 500) for _ in range(90)]
    res = subprocess.run(
        [args.failsafe, "logits", "--model", d, "--prompt-ids", ",".join(map(str, prompt)),
         "--decode", "8", "--prefill-chunk", "40", *args.engine_args.split()],
        check=True, capture_output=True, text=True, timeout=180)
    got = json.loads(res.stdout)
    full = prompt + got["output_ids"][:-1]
    cls = (transformers.Gemma3ForConditionalGeneration if vision
           else transformers.AutoModelForCausalLM)
    model = cls.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        ref = model(torch.tensor([full])).logits[0].double()
    worst, mismatched = 0.0, 0
    for p, row in zip(got["positions"], got["logits"]):
        want = ref[p]
        row = torch.tensor(row, dtype=torch.float64)
        worst = max(worst, ((row - want).abs().max() / want.abs().max()).item())
        if p >= len(prompt) - 1:
            top2 = torch.topk(want, 2).values
            chosen = got["output_ids"][p - (len(prompt) - 1)]
            if chosen != int(want.argmax()) and (top2[0] - top2[1]).item() > 1e-3:
                mismatched += 1
    good = worst <= TOLERANCE and mismatched == 0
    print(f"{'ok  ' if good else 'FAIL'} {preset} ({cfg['architectures'][0]}): "
          f"{len(got['positions'])} positions, max relative error {worst:.2e}, "
          f"greedy mismatches {mismatched}", flush=True)
    return good


if __name__ == "__main__":
    main()
