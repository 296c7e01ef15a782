#!/usr/bin/env python3
"""Independent numerical reference for FailSafe's forward pass.

Builds synthetic models with `failsafe make-model`, reads the same
safetensors files with its own parser, runs a plain PyTorch (float64)
Llama / Mixtral / Qwen2 / Qwen3 / Qwen3-MoE / Qwen2-MoE / Phi-3 / Gemma 2 / Gemma 3 forward pass over the whole sequence, and compares the logits
that `failsafe logits` prints for a chunked prefill and greedy decode steps.

Error measure, per compared position: max |failsafe - reference| divided by
max |reference| over the vocabulary. It must be at most TOLERANCE[dtype] of
the model's weights. f32 and f16 weights: the engine computes in f32 on the
weights' exact values (f16 widened exactly), the reference in float64 on the
same values, and the bound is 1e-4. bf16 weights: the engine takes the bf16
chain (src/backend/cpu/gemm.h), as PyTorch's bf16 inference does: the input of
every product with a bf16 weight is rounded to bf16 first (a relative step of
up to 2^-9), the products are exact and summed in f32. The reference does the
same rounding (in float64 otherwise), which brings it a little closer (on
tiny-llama 3.8e-3 against 4.4e-3 without it), but not to f32's 1e-6: once the
engine's f32 activations and the reference's float64 ones differ, some of
them round to bf16 the other way, and every such input carries the 2^-9
step into the layers after it. The bound is therefore that of bf16
activations themselves, 2e-2 (measured up to 3.8e-3 across the presets and
tests/python/model_shapes.py's shapes); greedy tokens must still agree (bar
near ties). The Qwen MoE presets are checked at f32 and f16, not bf16: their
many narrow experts put routing near-ties within bf16's step (relative gaps
of 0.4-0.8% between the k-th and the next expert's probability on
tiny-qwen2-moe), where one token routed the other way moves its logits by
a few percent in any implementation.

With --llama2c BIN --converted DIR it also checks a converted llama2.c model:
the reference then runs llama2.c's own forward pass (adjacent-pair RoPE,
weights read straight from the original checkpoint), so the check covers the
converter's q/k permutation and layout as well as the engine.
"""
import argparse
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

TOLERANCE = {"f32": 1e-4, "bf16": 2e-2, "f16": 1e-4}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[base + b:base + e]
        shape = info["shape"]
        if info["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype="<f4").astype(np.float64)
        elif info["dtype"] == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(np.float64)
        elif info["dtype"] == "BF16":
            u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u16.view(np.float32).astype(np.float64)
        else:
            raise ValueError(f"{path}: {name}: dtype {info['dtype']}")
        out[name] = torch.from_numpy(arr.reshape(shape).copy())
    return out


# transformers' Gemma3TextConfig defaults: Gemma3ForConditionalGeneration's
# published text_config names only what differs from these.
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "rope_local_base_freq": 10000.0,
    "sliding_window_pattern": 6, "tie_word_embeddings": True,
}
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                   "model.multi_modal_projector.")
TEXT_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
                 ("language_model.lm_head.", "lm_head."))


def load_model(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    vision_language = cfg["architectures"][0] == "Gemma3ForConditionalGeneration"
    if vision_language:  # its language model, as transformers builds it
        cfg = {**GEMMA3_TEXT_DEFAULTS, **cfg.get("text_config", {}),
               "architectures": ["Gemma3ForCausalLM"]}
    elif cfg["architectures"][0] == "Gemma3ForCausalLM":
        cfg = {**GEMMA3_TEXT_DEFAULTS, **cfg}
    index = os.path.join(model_dir, "model.safetensors.index.json")
    weights = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for fn in files:
        weights.update(read_safetensors(os.path.join(model_dir, fn)))
    if vision_language:
        text = {}
        for name, w in weights.items():
            if name.startswith(VISION_PREFIXES):
                continue
            for old, new in TEXT_PREFIXES:
                if name.startswith(old):
                    name = new + name[len(old):]
            text[name] = w
        weights = text
    # Phi-3's fused projections, split as its modeling code chunks them: q,
    # k, v rows in order; the gate's rows, then the up projection's.
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    q_dim = cfg["num_attention_heads"] * hd
    kv_dim = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * hd
    for name in [n for n in weights if n.endswith("self_attn.qkv_proj.weight")]:
        qkv, p = weights.pop(name), name[:-len("qkv_proj.weight")]
        weights[p + "q_proj.weight"] = qkv[:q_dim]
        weights[p + "k_proj.weight"] = qkv[q_dim:q_dim + kv_dim]
        weights[p + "v_proj.weight"] = qkv[q_dim + kv_dim:]
    for name in [n for n in weights if n.endswith("mlp.gate_up_proj.weight")]:
        gate, up = weights.pop(name).chunk(2, dim=0)
        p = name[:-len("gate_up_proj.weight")]
        weights[p + "gate_proj.weight"], weights[p + "up_proj.weight"] = gate, up
    return cfg, weights


def inv_freq(cfg, local=False):
    """local: a Gemma 3 sliding layer's (rope_local_base_freq, unscaled)."""
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    theta = cfg["rope_local_base_freq"] if local else cfg.get("rope_theta", 10000.0)
    freqs = [1.0 / theta ** (2 * i / hd) for i in range(hd // 2)]
    rs = None if local else cfg.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "linear":
        freqs = [f / rs["factor"] for f in freqs]
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        out = []
        for fr in freqs:
            wavelen = 2 * math.pi / fr
            if wavelen < old / hi:
                out.append(fr)
            elif wavelen > old / lo:
                out.append(fr / factor)
            else:
                smooth = (old / wavelen - lo) / (hi - lo)
                out.append((1 - smooth) * fr / factor + smooth * fr)
        freqs = out
    if rs and rs.get("rope_type", rs.get("type")) in ("longrope", "su"):
        # Phi-3: the long factors when the model's context exceeds the one it
        # was trained at (transformers decides by the sequence's length, the
        # same whenever the sequence is longer than that).
        orig = cfg.get("original_max_position_embeddings", cfg["max_position_embeddings"])
        ext = rs["long_factor"] if cfg["max_position_embeddings"] > orig else rs["short_factor"]
        freqs = [f / e for f, e in zip(freqs, ext)]
    return torch.tensor(freqs, dtype=torch.float64)


def rope_attention_factor(cfg):
    """LongRoPE's scale of cos and sin (1 for every other RoPE)."""
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type")) not in ("longrope", "su"):
        return 1.0
    if rs.get("attention_factor"):
        return rs["attention_factor"]
    orig = cfg.get("original_max_position_embeddings", cfg["max_position_embeddings"])
    factor = cfg["max_position_embeddings"] / orig
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, freqs, scale=1.0):
    # x: [T, heads, hd], rotate-half convention
    ang = pos[:, None].double() * freqs[None, :]  # [T, hd/2]
    cos, sin = scale * torch.cos(ang)[:, None, :], scale * torch.sin(ang)[:, None, :]
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def forward(cfg, W, ids, bf16_inputs=False, bf16_kv=False):
    """bf16_inputs: round the input of every product with a weight matrix to
    bf16 (through f32, as the engine holds it), as the engine does for bf16
    weights. bf16_kv: round every key (after RoPE) and value to bf16, as a
    bf16 KV cache stores them."""
    def mm(h, name):
        if bf16_inputs:
            h = h.float().to(torch.bfloat16).double()
        return h @ W[name].T

    H = cfg["hidden_size"]
    gemma = cfg["architectures"][0] in ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
    attn_cap = (cfg.get("attn_logit_softcapping") or 0) if gemma else 0
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or H // nh
    eps = cfg.get("rms_norm_eps", 1e-5)
    # Qwen names a window that only use_sliding_window turns on.
    window = (cfg.get("sliding_window") or 0) if cfg.get("use_sliding_window", True) else 0
    T = len(ids)
    pos = torch.arange(T)
    layers = cfg["num_hidden_layers"]
    x = W["model.embed_tokens.weight"][torch.tensor(ids)]
    # Gemma 3: (1 + w) norms, sandwich norms, GeGLU, embeddings times
    # sqrt(hidden) in the model's type, a query scale of its own, sliding
    # layers (their own RoPE base) between global ones.
    sliding = [window > 0] * layers
    scale = 1 / math.sqrt(hd)
    if gemma:
        x = x * (torch.tensor(H ** 0.5, dtype=torch.bfloat16 if bf16_inputs else torch.float32)
                 .double())
        scale = cfg.get("query_pre_attn_scalar", hd) ** -0.5
        if "layer_types" in cfg:
            sliding = [t == "sliding_attention" for t in cfg["layer_types"]]
        else:
            pattern = cfg.get("sliding_window_pattern", 6 if "rope_local_base_freq" in cfg else 2)
            sliding = [(l + 1) % pattern != 0 for l in range(layers)]

    def norm(h, name):
        return rms_norm(h, 1 + W[name] if gemma else W[name], eps)

    qi = torch.arange(T)[:, None]
    ki = torch.arange(T)[None, :]
    masks = {}
    for w in (0, window):
        allowed = ki <= qi
        if w:
            allowed = allowed & (ki > qi - w)
        masks[w] = torch.where(allowed, 0.0, float("-inf")).double()
    for l in range(layers):
        p = f"model.layers.{l}."
        local = gemma and sliding[l] and "rope_local_base_freq" in cfg
        freqs = inv_freq(cfg, local=local)
        mask = masks[window if sliding[l] else 0]
        h = norm(x, p + "input_layernorm.weight")
        q, k, v = (mm(h, p + f"self_attn.{n}_proj.weight") for n in "qkv")
        if p + "self_attn.q_proj.bias" in W:  # Qwen2, Qwen2-MoE
            q, k, v = (t + W[p + f"self_attn.{n}_proj.bias"] for t, n in zip((q, k, v), "qkv"))
        q, k, v = q.view(T, nh, hd), k.view(T, nkv, hd), v.view(T, nkv, hd)
        if p + "self_attn.q_norm.weight" in W:  # Qwen3: each head normalised before RoPE
            q = norm(q, p + "self_attn.q_norm.weight")
            k = norm(k, p + "self_attn.k_norm.weight")
        af = 1.0 if local else rope_attention_factor(cfg)
        q, k = rope(q, pos, freqs, af), rope(k, pos, freqs, af)
        if bf16_kv:
            k, v = (t.float().to(torch.bfloat16).double() for t in (k, v))
        g = nh // nkv
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        if attn_cap:  # Gemma 2
            scores = attn_cap * torch.tanh(scores / attn_cap)
        scores = scores + mask
        attn = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v).reshape(T, nh * hd)
        o = mm(attn, p + "self_attn.o_proj.weight")
        if gemma:
            o = norm(o, p + "post_attention_layernorm.weight")
        x = x + o
        h = norm(x, p + ("pre_feedforward_layernorm.weight" if gemma
                         else "post_attention_layernorm.weight"))
        experts = cfg.get("num_local_experts") or cfg.get("num_experts")
        if experts:
            K = cfg["num_experts_per_tok"]
            mixtral = "num_local_experts" in cfg  # else Qwen3-MoE's names
            router = p + ("block_sparse_moe.gate.weight" if mixtral else "mlp.gate.weight")
            probs = torch.softmax(mm(h, router), dim=-1)
            topw, topi = torch.topk(probs, K, dim=-1)
            if cfg.get("norm_topk_prob", True):
                topw = topw / topw.sum(-1, keepdim=True)
            out = torch.zeros_like(x)
            for e in range(experts):
                if mixtral:
                    ep = p + f"block_sparse_moe.experts.{e}."
                    g, u, d = ep + "w1.weight", ep + "w3.weight", ep + "w2.weight"
                else:
                    ep = p + f"mlp.experts.{e}."
                    g, u, d = (ep + n + "_proj.weight" for n in ("gate", "up", "down"))
                y = mm(torch.nn.functional.silu(mm(h, g)) * mm(h, u), d)
                weight = (topw * (topi == e)).sum(-1, keepdim=True)
                out = out + y * weight
            if cfg.get("shared_expert_intermediate_size"):  # Qwen2-MoE
                sp = p + "mlp.shared_expert."
                y = mm(torch.nn.functional.silu(mm(h, sp + "gate_proj.weight")) *
                       mm(h, sp + "up_proj.weight"), sp + "down_proj.weight")
                out = out + torch.sigmoid(mm(h, p + "mlp.shared_expert_gate.weight")) * y
            x = x + out
        else:
            gate = mm(h, p + "mlp.gate_proj.weight")
            act = (torch.nn.functional.gelu(gate, approximate="tanh") if gemma
                   else torch.nn.functional.silu(gate))
            y = mm(act * mm(h, p + "mlp.up_proj.weight"), p + "mlp.down_proj.weight")
            if gemma:
                y = norm(y, p + "post_feedforward_layernorm.weight")
            x = x + y
    x = norm(x, "model.norm.weight")
    logits = mm(x, "model.embed_tokens.weight" if cfg.get("tie_word_embeddings", gemma)
                else "lm_head.weight")
    final_cap = (cfg.get("final_logit_softcapping") or 0) if gemma else 0
    return final_cap * torch.tanh(logits / final_cap) if final_cap else logits


def llama2c_forward(path, ids):
    """llama2.c's run.c forward pass over a whole sequence, from its checkpoint."""
    with open(path, "rb") as f:
        data = f.read()
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", data[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    hd = dim // heads
    kv = kv_heads * hd
    w = np.frombuffer(data[28:], dtype="<f4").astype(np.float64)
    at = 0

    def take(*shape):
        nonlocal at
        n = int(np.prod(shape))
        out = torch.from_numpy(w[at:at + n].reshape(shape).copy())
        at += n
        return out

    emb = take(vocab, dim)
    rms_att, wq, wk = take(layers, dim), take(layers, dim, dim), take(layers, kv, dim)
    wv, wo, rms_ffn = take(layers, kv, dim), take(layers, dim, dim), take(layers, dim)
    w1, w2, w3 = take(layers, hidden, dim), take(layers, dim, hidden), take(layers, hidden, dim)
    rms_final = take(dim)
    take(seq_len, hd // 2)
    take(seq_len, hd // 2)
    wcls = emb if shared else take(vocab, dim)
    T = len(ids)
    freqs = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * freqs[None, :]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]

    def rope_pairs(x):  # rotates (2i, 2i+1) within each head
        a, b = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    mask = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1)
    x = emb[torch.tensor(ids)]
    for l in range(layers):
        h = rms_norm(x, rms_att[l], 1e-5)
        q = rope_pairs((h @ wq[l].T).view(T, heads, hd))
        k = rope_pairs((h @ wk[l].T).view(T, kv_heads, hd)).repeat_interleave(heads // kv_heads, dim=1)
        v = (h @ wv[l].T).view(T, kv_heads, hd).repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd) + mask
        attn = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v).reshape(T, dim)
        x = x + attn @ wo[l].T
        h = rms_norm(x, rms_ffn[l], 1e-5)
        x = x + (torch.nn.functional.silu(h @ w1[l].T) * (h @ w3[l].T)) @ w2[l].T
    return rms_norm(x, rms_final, 1e-5) @ wcls.T


ENGINE_ARGS = []  # --engine-args: e.g. a GPU's (scripts/gpu-check.sh)


def kv_dtype(dtype):
    """What the engine's KV cache holds: --kv-dtype among ENGINE_ARGS (auto:
    bf16 for bf16 weights), else f32 (its default)."""
    kv = "f32"
    if "--kv-dtype" in ENGINE_ARGS:
        kv = ENGINE_ARGS[ENGINE_ARGS.index("--kv-dtype") + 1]
    if kv == "auto":
        return "bf16" if dtype == "bf16" else "f32"
    return kv


COMMAND_TIMEOUT_S = 180  # one `failsafe logits`: a hung engine is a failure, not a stall


def check(failsafe, model_dir, prompt, chunk, threads, label, dtype, reference=None):
    cmd = [failsafe, "logits", "--model", model_dir, "--prompt-ids", ",".join(map(str, prompt)),
           "--decode", "16", "--prefill-chunk", str(chunk), "--threads", str(threads),
           *ENGINE_ARGS]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"FAIL {label}: no answer in {COMMAND_TIMEOUT_S} s", flush=True)
        return False
    if r.returncode != 0:
        print(f"FAIL {label}: exit {r.returncode}: {r.stderr[-2000:]}", flush=True)
        return False
    res = json.loads(r.stdout)
    full = prompt + res["output_ids"][:-1]
    if reference is None:
        cfg, W = load_model(model_dir)
        ref = forward(cfg, W, full, bf16_inputs=dtype == "bf16",
                      bf16_kv=kv_dtype(dtype) == "bf16")
    else:
        ref = reference(full)
    worst = 0.0
    mismatched = 0
    for step, (p, got) in enumerate(zip(res["positions"], res["logits"])):
        got = torch.tensor(got, dtype=torch.float64)
        want = ref[p]
        err = (got - want).abs().max().item() / want.abs().max().item()
        worst = max(worst, err)
        if p >= len(prompt) - 1:
            # Greedy choice must match the reference unless it is a near tie.
            top2 = torch.topk(want, 2).values
            chosen = res["output_ids"][p - (len(prompt) - 1)]
            if chosen != int(want.argmax()) and (top2[0] - top2[1]).item() > 1e-3:
                mismatched += 1
    n = len(res["positions"])
    ok = worst <= TOLERANCE[dtype] and mismatched == 0
    print(f"{'ok  ' if ok else 'FAIL'} {label}: {n} positions, max relative error {worst:.2e}, "
          f"greedy mismatches {mismatched}", flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--failsafe", required=True)
    ap.add_argument("--llama2c", help="a llama2.c checkpoint")
    ap.add_argument("--converted", help="its conversion (failsafe convert-llama2c)")
    ap.add_argument("--engine-args", default="",
                    help="more `failsafe logits` flags, e.g. '--gpus 0' (the CUDA backend)")
    ap.add_argument("--dtypes", default="f32,bf16,f16",
                    help="only the models of these weight types, e.g. bf16,f16 where a product "
                         "mode changes only the 16-bit products")
    args = ap.parse_args()
    dtypes = set(args.dtypes.split(","))
    ENGINE_ARGS.extend(args.engine_args.split())
    if "--gpus" in ENGINE_ARGS and "chain" not in ENGINE_ARGS:
        # cuBLASLt rounds f16 products' activations to f16 (the CPU keeps them
        # in f32): the bound of 16-bit activations, as bf16's.
        TOLERANCE["f16"] = TOLERANCE["bf16"]
    torch.set_num_threads(2)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for preset, dtype, shards in [("tiny-llama", "f32", 1), ("tiny-mixtral", "f32", 1),
                                      ("tiny-llama", "bf16", 2), ("tiny-mixtral", "f16", 3),
                                      ("tiny-qwen2", "f32", 1), ("tiny-qwen2", "bf16", 2),
                                      ("tiny-qwen3", "f32", 1), ("tiny-qwen3", "bf16", 1),
                                      ("tiny-qwen3-moe", "f32", 1), ("tiny-qwen3-moe", "f16", 2),
                                      ("tiny-qwen2-moe", "f32", 1), ("tiny-qwen2-moe", "f16", 2),
                                      ("tiny-phi3", "f32", 1), ("tiny-phi3", "bf16", 2),
                                      ("tiny-gemma3", "f32", 1), ("tiny-gemma3", "bf16", 2),
                                      ("tiny-gemma3+vision", "bf16", 2),
                                      ("tiny-gemma2", "f32", 1), ("tiny-gemma2", "bf16", 1)]:
            if dtype not in dtypes:
                continue
            d = os.path.join(tmp, f"{preset}-{dtype}")
            # +vision: Gemma3ForConditionalGeneration as published, served as text
            extra = ["--vision-language", "language_model.model."] if preset.endswith("+vision") else []
            made = subprocess.run([args.failsafe, "make-model", "--preset", preset.split("+")[0],
                                   "--out", d, "--seed", "7", "--dtype", dtype, "--shards",
                                   str(shards), *extra], capture_output=True, text=True)
            if made.returncode != 0:
                print(f"FAIL {preset} {dtype}: make-model: {made.stderr[-2000:]}", flush=True)
                ok = False
                continue
            rng = random.Random(preset)
            prompt = [rng.randrange(0, 500) for _ in range(120)]
            ok &= check(args.failsafe, d, prompt, 50, 1, f"{preset} {dtype} prefill 50+50+20, 1 thread", dtype)
            if dtype != "f16":
                ok &= check(args.failsafe, d, prompt[:37], 5, 2, f"{preset} {dtype} prefill in chunks of 5, 2 threads", dtype)
    if args.llama2c and "f32" in dtypes:
        prompt = [1] + [random.Random(5).randrange(3, 500) for _ in range(40)]
        ok &= check(args.failsafe, args.converted, prompt, 16, 1,
                    "llama2.c checkpoint vs its conversion, prefill 16+16+9", "f32",
                    reference=lambda ids: llama2c_forward(args.llama2c, ids))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
