#!/usr/bin/env python3
"""Unusual model shapes through the multi-process engine against PyTorch.

Writes Hugging Face style checkpoints (config.json + safetensors) of shapes the
presets never use: one KV head, KV head counts of 3 and 5, head groups that do
not divide the devices, more devices than KV heads, head_dim 48/80/96/256,
hidden and intermediate sizes and vocabularies that are multiples of nothing,
tied and untied embeddings, llama3 RoPE scaling, large rope_theta, a
sliding window shorter than the prompt, Mixtral with odd expert sizes, and
f32/bf16/f16 weights. Each one runs `failsafe logits` on 1..9 devices under
every placement; logits must be within the per-dtype tolerance of the float64
PyTorch forward pass (tests/python/torch_reference.py) and every greedy token
must equal the reference's (bar near ties).

It also checks that config.json fields describing a model the engine does
not compute (biases, activations, rope scalings it does not implement) and
tensors it would not read are refused at load with the field named, instead
of being ignored and giving wrong numbers.
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import TOLERANCE, forward, load_model  # noqa: E402


def write_safetensors(path, tensors, dtype):
    """tensors: name -> float64 numpy array; stored as dtype (f32, bf16, f16)."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        if dtype == "f32":
            raw, tag = arr.astype("<f4").tobytes(), "F32"
        elif dtype == "f16":
            raw, tag = arr.astype("<f2").tobytes(), "F16"
        else:  # bf16: round to nearest even from f32
            u = arr.astype("<f4").view("<u4").astype(np.uint64)
            u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
            raw, tag = u.tobytes(), "BF16"
        header[name] = {"dtype": tag, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)


def make_checkpoint(d, cfg, dtype, seed, extra_tensors=None):
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(seed)
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or H // nh
    inter, V = cfg["intermediate_size"], cfg["vocab_size"]

    def mat(rows, cols):
        return rng.normal(0.0, 1.0 / np.sqrt(cols), size=(rows, cols))

    def norm(n):
        return 1.0 + 0.1 * rng.normal(size=(n,))

    t = {"model.embed_tokens.weight": rng.normal(0.0, 1.0, size=(V, H))}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = norm(H)
        t[p + "self_attn.q_proj.weight"] = mat(nh * hd, H)
        t[p + "self_attn.k_proj.weight"] = mat(nkv * hd, H)
        t[p + "self_attn.v_proj.weight"] = mat(nkv * hd, H)
        t[p + "self_attn.o_proj.weight"] = mat(H, nh * hd)
        if cfg["architectures"][0] in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM"):
            t[p + "self_attn.q_proj.bias"] = 0.5 * rng.normal(size=(nh * hd,))
            t[p + "self_attn.k_proj.bias"] = 0.5 * rng.normal(size=(nkv * hd,))
            t[p + "self_attn.v_proj.bias"] = 0.5 * rng.normal(size=(nkv * hd,))
        if cfg["architectures"][0] in ("Gemma2ForCausalLM", "Gemma3ForCausalLM"):
            t[p + "pre_feedforward_layernorm.weight"] = norm(H) - 1  # Gemma scales by 1 + w
            t[p + "post_feedforward_layernorm.weight"] = norm(H) - 1
        if cfg["architectures"][0] in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                                       "Gemma3ForCausalLM"):
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
        t[p + "post_attention_layernorm.weight"] = norm(H)
        experts = cfg.get("num_local_experts") or cfg.get("num_experts")
        if experts:
            # Mixtral's names, or Qwen3-MoE's (each expert moe_intermediate_size wide).
            mixtral = "num_local_experts" in cfg
            inter = inter if mixtral else cfg["moe_intermediate_size"]
            t[p + ("block_sparse_moe.gate.weight" if mixtral else "mlp.gate.weight")] = \
                mat(experts, H)
            for e in range(experts):
                ep = p + (f"block_sparse_moe.experts.{e}." if mixtral else f"mlp.experts.{e}.")
                gate, down, up = (("w1", "w2", "w3") if mixtral
                                  else ("gate_proj", "down_proj", "up_proj"))
                t[ep + gate + ".weight"] = mat(inter, H)
                t[ep + down + ".weight"] = mat(H, inter)
                t[ep + up + ".weight"] = mat(inter, H)
            shared = cfg.get("shared_expert_intermediate_size")
            if shared:  # Qwen2-MoE: a shared expert behind a sigmoid gate
                sp = p + "mlp.shared_expert."
                t[sp + "gate_proj.weight"] = mat(shared, H)
                t[sp + "down_proj.weight"] = mat(H, shared)
                t[sp + "up_proj.weight"] = mat(shared, H)
                t[p + "mlp.shared_expert_gate.weight"] = mat(1, H)
        else:
            t[p + "mlp.gate_proj.weight"] = mat(inter, H)
            t[p + "mlp.up_proj.weight"] = mat(inter, H)
            t[p + "mlp.down_proj.weight"] = mat(H, inter)
    t["model.norm.weight"] = norm(H)
    if not cfg.get("tie_word_embeddings", False):
        t["lm_head.weight"] = mat(V, H)
    for name, shape in (extra_tensors or {}).items():
        t[name] = rng.normal(size=shape)
    if cfg["architectures"][0] == "Phi3ForCausalLM":  # fused as Phi-3 stores them
        for l in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{l}."
            t[p + "self_attn.qkv_proj.weight"] = np.concatenate(
                [t.pop(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
            t[p + "mlp.gate_up_proj.weight"] = np.concatenate(
                [t.pop(p + "mlp.gate_proj.weight"), t.pop(p + "mlp.up_proj.weight")])
    write_safetensors(os.path.join(d, "model.safetensors"), t, dtype)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)


def llama(H, layers, nh, nkv, inter, V, head_dim=None, **kw):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
           "num_hidden_layers": layers, "num_attention_heads": nh, "num_key_value_heads": nkv,
           "intermediate_size": inter, "vocab_size": V, "hidden_act": "silu",
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
    if head_dim:
        cfg["head_dim"] = head_dim
    cfg.update(kw)
    return cfg


def qwen(version, H, layers, nh, nkv, inter, V, head_dim=None, **kw):
    cfg = llama(H, layers, nh, nkv, inter, V, head_dim=head_dim, rope_theta=1000000.0,
                rms_norm_eps=1e-6, use_sliding_window=False, **kw)
    cfg.update(architectures=[f"Qwen{version}ForCausalLM"], model_type=f"qwen{version}")
    if version == 3:
        cfg["attention_bias"] = False
    if "num_experts" in kw:  # Qwen2-MoE or Qwen3-MoE: every layer sparse
        cfg.update(architectures=[f"Qwen{version}MoeForCausalLM"], model_type=f"qwen{version}_moe",
                   decoder_sparse_step=1, mlp_only_layers=[])
        cfg.setdefault("norm_topk_prob", version == 3)
    return cfg


def gemma3(H, layers, nh, nkv, inter, V, head_dim, window, pattern, **kw):
    cfg = llama(H, layers, nh, nkv, inter, V, head_dim=head_dim, rope_theta=1000000.0,
                rms_norm_eps=1e-6, tie_word_embeddings=True, sliding_window=window,
                sliding_window_pattern=pattern, rope_local_base_freq=10000.0,
                query_pre_attn_scalar=head_dim, **kw)
    del cfg["hidden_act"]
    cfg.update(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
               hidden_activation="gelu_pytorch_tanh")
    return cfg


def gemma2(H, layers, nh, nkv, inter, V, head_dim, window, **kw):
    cfg = gemma3(H, layers, nh, nkv, inter, V, head_dim, window, pattern=2, **kw)
    del cfg["rope_local_base_freq"], cfg["sliding_window_pattern"]  # one base; every other
    cfg.update(architectures=["Gemma2ForCausalLM"], model_type="gemma2")
    return cfg


# (label, config, dtype, [(devices, placements)] run by default, the same with --all)
ALL = ["standard", "nonuniform", "cyclic", "hybrid"]
SHAPES = [
    ("one KV head, head_dim 48, hidden 88, vocab 997",
     llama(88, 2, 4, 1, 250, 997, head_dim=48), "f32",
     [(3, ["standard", "hybrid"]), (5, ["cyclic"])],
     [(1, ["hybrid"]), (3, ALL), (5, ["hybrid", "cyclic"])]),
    ("3 KV heads of 3 queries, head_dim 80, tied",
     llama(120, 2, 9, 3, 344, 1013, head_dim=80, tie_word_embeddings=True, rms_norm_eps=1e-6),
     "bf16", [(2, ["nonuniform"]), (7, ["hybrid"])],
     [(2, ALL), (4, ["hybrid", "nonuniform"]), (7, ["hybrid", "cyclic"])]),
    ("5 KV heads of 2 queries, head_dim 96, llama3 rope scaling",
     llama(160, 2, 10, 5, 1000, 523, head_dim=96, rope_theta=500000.0,
           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
     "f16", [(3, ["cyclic", "hybrid"]), (9, ["nonuniform"])],
     [(2, ["hybrid", "cyclic"]), (3, ALL), (9, ["hybrid", "nonuniform"])]),
    ("2 KV heads, head_dim 256 and 128-wide hidden",
     llama(128, 2, 2, 2, 424, 771, head_dim=256), "f32", [(3, ["hybrid"])],
     [(1, ["hybrid"]), (3, ["hybrid", "nonuniform"])]),
    ("7 MHA heads of 128, hidden 896",
     llama(896, 1, 7, 7, 2000, 389), "bf16", [(6, ["hybrid"])],
     [(6, ["hybrid", "cyclic", "nonuniform"])]),
    ("Mistral, sliding window 24 under a 70-token prompt",
     dict(llama(96, 2, 6, 2, 200, 611), architectures=["MistralForCausalLM"], model_type="mistral",
          sliding_window=24), "f32", [(4, ["cyclic"])], [(1, ["hybrid"]), (4, ["hybrid", "cyclic"])]),
    ("Mixtral, 3 experts of 2, odd expert width 90",
     dict(llama(72, 2, 6, 3, 90, 409, head_dim=24), architectures=["MixtralForCausalLM"],
          model_type="mixtral", num_local_experts=3, num_experts_per_tok=2, sliding_window=None),
     "bf16", [(5, ["hybrid"])], [(2, ["hybrid"]), (5, ["hybrid", "nonuniform"])]),
    # Qwen names a window it does not use (use_sliding_window false): a window
    # of 24 under the 70-token prompt would change every logit after it.
    ("Qwen2, 3 KV heads of 4, q/k/v biases, tied, window named but off",
     qwen(2, 120, 2, 12, 3, 328, 613, head_dim=20, tie_word_embeddings=True, sliding_window=24,
          max_window_layers=1),
     "bf16", [(5, ["hybrid"]), (4, ["nonuniform"])],
     [(1, ["hybrid"]), (4, ALL), (5, ["hybrid", "cyclic"])]),
    ("Qwen3, 1 KV head of 5, head_dim 64 over hidden 96, q/k norms",
     qwen(3, 96, 2, 5, 1, 200, 431, head_dim=64, sliding_window=None, max_window_layers=2),
     "f32", [(3, ["cyclic", "hybrid"])], [(1, ["hybrid"]), (3, ALL), (6, ["hybrid"])]),
    ("Qwen3-MoE, 6 experts of 40 (top 3), 2 KV heads of 3, q/k norms",
     qwen(3, 80, 2, 6, 2, 300, 457, head_dim=32, num_experts=6, num_experts_per_tok=3,
          moe_intermediate_size=40),
     "bf16", [(4, ["hybrid"]), (3, ["nonuniform"])], [(1, ["hybrid"]), (3, ALL), (5, ["hybrid"])]),
    ("Qwen2-MoE, 5 experts of 36 (top 2, not renormalised), shared expert of 108, 6 MHA heads",
     qwen(2, 96, 2, 6, 6, 300, 467, head_dim=16, num_experts=5, num_experts_per_tok=2,
          moe_intermediate_size=36, shared_expert_intermediate_size=108),
     "f32", [(4, ["cyclic"]), (7, ["hybrid"])], [(1, ["hybrid"]), (4, ALL), (7, ["hybrid"])]),
    ("Phi-3, fused qkv and gate_up, 6 KV heads of 2, window 40",
     dict(llama(144, 2, 12, 6, 232, 521, head_dim=24), architectures=["Phi3ForCausalLM"],
          model_type="phi3", sliding_window=40, original_max_position_embeddings=4096),
     "f32", [(4, ["cyclic"]), (7, ["hybrid"])], [(1, ["hybrid"]), (4, ALL), (7, ["hybrid"])]),
    ("Phi-3 LongRoPE trained at 48 positions, served at 4096 (long factors, scaled)",
     dict(llama(96, 2, 6, 3, 200, 487, head_dim=32), architectures=["Phi3ForCausalLM"],
          model_type="phi3", sliding_window=None, original_max_position_embeddings=48,
          rope_scaling={"type": "longrope", "short_factor": [1 + 0.05 * i for i in range(16)],
                        "long_factor": [1 + 0.8 * i for i in range(16)]}),
     "bf16", [(3, ["hybrid"])], [(1, ["hybrid"]), (3, ALL), (5, ["cyclic"])]),
    ("Gemma 2, 2 KV heads of 3, soft-capped scores (6) and logits (4), window 18",
     gemma2(96, 2, 6, 2, 200, 449, head_dim=24, window=18, attn_logit_softcapping=6.0,
            final_logit_softcapping=4.0),
     "f32", [(3, ["hybrid"])], [(1, ["hybrid"]), (3, ALL), (4, ["cyclic"])]),
    ("Gemma 3, 3 KV heads of 2, head_dim 40, window 20, every 2nd layer global",
     gemma3(112, 4, 6, 3, 176, 503, head_dim=40, window=20, pattern=2,
            rope_scaling={"rope_type": "linear", "factor": 4.0}),
     "bf16", [(5, ["hybrid"]), (2, ["nonuniform"])], [(1, ["hybrid"]), (3, ALL), (5, ["hybrid"])]),
]


def run_logits(failsafe, d, prompt, devices, placement, chunk, decode=8):
    cmd = [failsafe, "logits", "--model", d, "--prompt-ids", ",".join(map(str, prompt)),
           "--decode", str(decode), "--prefill-chunk", str(chunk), "--devices", str(devices),
           "--placement", placement]
    if devices == 1:
        cmd.append("--processes")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        return None, p.stderr.strip()
    return json.loads(p.stdout), None


def compare(res, ref, prompt, dtype):
    worst, mismatched = 0.0, 0
    for p, got in zip(res["positions"], res["logits"]):
        got = torch.tensor(got, dtype=torch.float64)
        want = ref[p]
        worst = max(worst, (got - want).abs().max().item() / want.abs().max().item())
        if p >= len(prompt) - 1:
            top2 = torch.topk(want, 2).values
            chosen = res["output_ids"][p - (len(prompt) - 1)]
            if chosen != int(want.argmax()) and (top2[0] - top2[1]).item() > 1e-3:
                mismatched += 1
    return worst <= TOLERANCE[dtype] and mismatched == 0, worst, mismatched


def check_shapes(failsafe, tmp, only, everything):
    ok = True
    for i, (label, cfg, dtype, quick, full) in enumerate(SHAPES):
        if only is not None and i not in only:
            continue
        runs = full if everything else quick
        d = os.path.join(tmp, f"shape{i}")
        make_checkpoint(d, cfg, dtype, seed=100 + i)
        rng = random.Random(i)
        prompt = [rng.randrange(0, cfg["vocab_size"]) for _ in range(70)]
        ref_cache = {}
        for devices, placements in runs:
            for placement in placements:
                res, err = run_logits(failsafe, d, prompt, devices, placement, chunk=29)
                if res is None:
                    print(f"FAIL {label}: {devices} devices {placement}: {err}")
                    ok = False
                    continue
                full = prompt + res["output_ids"][:-1]
                key = tuple(full)
                if key not in ref_cache:
                    c, W = load_model(d)
                    ref_cache[key] = forward(c, W, full, bf16_inputs=dtype == "bf16")
                good, worst, mism = compare(res, ref_cache[key], prompt, dtype)
                print(f"{'ok  ' if good else 'FAIL'} {label} ({dtype}): {devices} devices {placement}: "
                      f"max relative error {worst:.2e}, greedy mismatches {mism}")
                ok &= good
    return ok


# Configurations the engine does not compute: refused at load, naming the field.
REFUSED = [
    ("attention_bias", dict(attention_bias=True), "attention_bias"),
    ("mlp_bias", dict(mlp_bias=True), "mlp_bias"),
    ("gelu activation", dict(hidden_act="gelu"), "hidden_act"),
    ("linear rope scaling", dict(rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling"),
    ("dynamic rope scaling", dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_scaling"),
    ("rope scaling without a type", dict(rope_scaling={"factor": 2.0}), "rope_scaling"),
    ("partial rotary", dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    ("Qwen2 with sliding windows on", dict(architectures=["Qwen2ForCausalLM"],
                                           use_sliding_window=True, sliding_window=32),
     "use_sliding_window"),
    ("Qwen3 with biases", dict(architectures=["Qwen3ForCausalLM"], attention_bias=True),
     "attention_bias"),
    ("Gemma 3 with silu", dict(architectures=["Gemma3ForCausalLM"], hidden_activation="silu"),
     "only gelu_pytorch_tanh"),
    ("Phi-3 longrope with too few factors", dict(architectures=["Phi3ForCausalLM"], rope_scaling={
        "type": "longrope", "short_factor": [1.0] * 7, "long_factor": [2.0] * 8}), "short_factor"),
    ("longrope on Llama", dict(rope_scaling={
        "type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}), "rope_scaling"),
    ("Qwen3-MoE without renormalised top-k", dict(
        architectures=["Qwen3MoeForCausalLM"], num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=False), "norm_topk_prob"),
    ("Qwen2-MoE with a shared expert not a multiple of the experts' width", dict(
        architectures=["Qwen2MoeForCausalLM"], num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=48),
     "shared_expert_intermediate_size"),
    ("Qwen3-MoE with dense layers", dict(
        architectures=["Qwen3MoeForCausalLM"], num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[0]), "mlp_only_layers"),
]


def check_refused(failsafe, tmp):
    ok = True
    base = llama(64, 1, 4, 2, 96, 300)
    for i, (label, change, field) in enumerate(REFUSED):
        d = os.path.join(tmp, f"refused{i}")
        cfg = dict(base)
        cfg.update(change)
        make_checkpoint(d, dict(base), "f32", seed=i)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        res, err = run_logits(failsafe, d, [1, 2, 3], 1, "hybrid", 16, decode=1)
        good = res is None and field in (err or "")
        print(f"{'ok  ' if good else 'FAIL'} refused: {label}: {err if res is None else 'accepted'}")
        ok &= good
    # Tensors the engine would not read (biases of a Qwen2-style checkpoint).
    d = os.path.join(tmp, "extra-tensors")
    make_checkpoint(d, base, "f32", seed=9,
                    extra_tensors={"model.layers.0.self_attn.q_proj.bias": (base["hidden_size"],)})
    res, err = run_logits(failsafe, d, [1, 2, 3], 1, "hybrid", 16, decode=1)
    good = res is None and "q_proj.bias" in (err or "")
    print(f"{'ok  ' if good else 'FAIL'} refused: a tensor the engine does not read: "
          f"{err if res is None else 'accepted'}")
    ok &= good
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--failsafe", required=True)
    ap.add_argument("--only", type=int, action="append", help="run only these shapes (index)")
    ap.add_argument("--all", action="store_true", help="every device count and placement listed")
    ap.add_argument("--no-refused", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        ok &= check_shapes(args.failsafe, tmp, args.only, args.all)
        if not args.no_refused:
            ok &= check_refused(args.failsafe, tmp)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
