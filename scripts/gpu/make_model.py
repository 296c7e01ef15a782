#!/usr/bin/env python3
"""Writes a model of a published shape with synthetic bf16 weights, in
Hugging Face layout, for the GPU benchmarks (scripts/gpu-check.sh): the
engine and PyTorch with transformers then read the same files.

  make_model.py --shape llama-3.1-8b --out DIR [--layers N] [--seed 1]
  make_model.py --shape mixtral-8x7b --out DIR --layers 4

Weights are drawn on the GPU (normal, std 0.02; norms 1) from the seed, one
layer at a time, and written one safetensors file per layer. --layers keeps
the first N layers of the shape (every layer has the same shape, so a step's
time per layer is that of the full model).
"""
import argparse
import json
import os

import struct

import torch

SHAPES = {
    # meta-llama/Llama-3.1-8B's config.json
    "llama-3.1-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, vocab_size=128256,
                         max_position_embeddings=131072, rope_theta=500000.0,
                         rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=8192,
                                           rope_type="llama3"),
                         rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=128000,
                         eos_token_id=128001, hidden_act="silu"),
    # mistralai/Mixtral-8x7B-v0.1's config.json
    "mixtral-8x7b": dict(architectures=["MixtralForCausalLM"], model_type="mixtral",
                         hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                         vocab_size=32000, max_position_embeddings=32768, rope_theta=1e6,
                         num_local_experts=8, num_experts_per_tok=2, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                         hidden_act="silu", sliding_window=None),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    cfg = dict(SHAPES[args.shape])
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    cfg["torch_dtype"] = "bfloat16"
    os.makedirs(args.out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, nq, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def mat(rows, cols):
        t = torch.empty(rows, cols, device=dev, dtype=torch.bfloat16)
        t.normal_(0.0, 0.02, generator=gen)
        return t.cpu()

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    weight_map = {}

    def write(name, tensors):
        # The safetensors format: an 8-byte header length, a JSON header,
        # then each tensor's bytes.
        header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
        for k, t in tensors.items():
            raw = t.contiguous().view(torch.int16).numpy().tobytes()
            header[k] = {"dtype": "BF16", "shape": list(t.shape),
                         "data_offsets": [offset, offset + len(raw)]}
            offset += len(raw)
            blobs.append(raw)
            weight_map[k] = name
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for b in blobs:
                f.write(b)

    write("embed.safetensors", {"model.embed_tokens.weight": mat(V, H)})
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t = {p + "input_layernorm.weight": ones(H), p + "post_attention_layernorm.weight": ones(H),
             p + "self_attn.q_proj.weight": mat(nq * hd, H),
             p + "self_attn.k_proj.weight": mat(nkv * hd, H),
             p + "self_attn.v_proj.weight": mat(nkv * hd, H),
             p + "self_attn.o_proj.weight": mat(H, nq * hd)}
        if cfg["model_type"] == "mixtral":
            e = cfg["num_local_experts"]
            t[p + "block_sparse_moe.gate.weight"] = mat(e, H)
            for j in range(e):
                q = p + f"block_sparse_moe.experts.{j}."
                t[q + "w1.weight"] = mat(I, H)
                t[q + "w2.weight"] = mat(H, I)
                t[q + "w3.weight"] = mat(I, H)
        else:
            t[p + "mlp.gate_proj.weight"] = mat(I, H)
            t[p + "mlp.up_proj.weight"] = mat(I, H)
            t[p + "mlp.down_proj.weight"] = mat(H, I)
        write(f"layer-{l:03d}.safetensors", t)
    write("head.safetensors", {"model.norm.weight": ones(H), "lm_head.weight": mat(V, H)})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    total = sum(os.path.getsize(os.path.join(args.out, n)) for n in set(weight_map.values()))
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    print(f"wrote {args.shape} ({cfg['num_hidden_layers']} layers, {total / 1e9:.2f} GB) to "
          f"{args.out}")


if __name__ == "__main__":
    main()
