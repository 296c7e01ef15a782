#!/usr/bin/env python3
"""Bad model directories: each must give a one-line error naming the file and
the field, a non-zero exit, and never a crash."""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile


def run(failsafe, model_dir):
    p = subprocess.run([failsafe, "generate", "--model", model_dir, "--max-tokens", "1"],
                       capture_output=True, text=True, errors="replace", timeout=120)
    return p.returncode, p.stderr.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--failsafe", required=True)
    args = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(tmp, "good")
        subprocess.run([args.failsafe, "make-model", "--preset", "tiny-llama", "--out", good],
                       check=True, capture_output=True)
        code, err = run(args.failsafe, good)
        assert code == 0, f"good model failed: {err}"

        def variant(name, mutate):
            d = os.path.join(tmp, name)
            shutil.copytree(good, d)
            mutate(d)
            return d

        def edit_json(rel, fn):
            def m(d):
                path = os.path.join(d, rel)
                with open(path) as f:
                    j = json.load(f)
                fn(j)
                with open(path, "w") as f:
                    json.dump(j, f)
            return m

        def write(rel, data):
            def m(d):
                with open(os.path.join(d, rel), "wb") as f:
                    f.write(data)
            return m

        def truncate(rel, size):
            def m(d):
                with open(os.path.join(d, rel), "r+b") as f:
                    f.truncate(size)
            return m

        def patch_header(fn):
            def m(d):
                path = os.path.join(d, "model.safetensors")
                with open(path, "rb") as f:
                    data = f.read()
                (n,) = struct.unpack("<Q", data[:8])
                header = json.loads(data[8:8 + n])
                fn(header)
                h = json.dumps(header).encode()
                h += b" " * ((8 - (8 + len(h)) % 8) % 8)
                with open(path, "wb") as f:
                    f.write(struct.pack("<Q", len(h)) + h + data[8 + n:])
            return m

        def remove(rel):
            return lambda d: os.remove(os.path.join(d, rel))

        q0 = "model.layers.0.self_attn.q_proj.weight"
        cases = [
            ("no config", remove("config.json"), ["config.json", "cannot open"]),
            ("garbled config", write("config.json", b"{\"architectures\": [\"Llama"), ["config.json", "not valid JSON"]),
            ("unknown architecture", edit_json("config.json", lambda j: j.update(architectures=["BertModel"])),
             ["config.json", "architectures", "BertModel"]),
            ("missing field", edit_json("config.json", lambda j: j.pop("num_hidden_layers")),
             ["config.json", "num_hidden_layers"]),
            ("wrong shape", edit_json("config.json", lambda j: j.update(hidden_size=128)),
             ["model.safetensors", "shape"]),
            ("wrong dtype", patch_header(lambda h: h[q0].update(dtype="I32")),
             ["model.safetensors", q0, "dtype"]),
            ("truncated file", truncate("model.safetensors", 100000), ["model.safetensors", "data_offsets"]),
            ("truncated header", truncate("model.safetensors", 5), ["model.safetensors", "truncated"]),
            ("lying offsets", patch_header(lambda h: h[q0].update(data_offsets=[0, 99]) or None),
             ["model.safetensors", q0, "data_offsets"]),
            ("no weights", remove("model.safetensors"), ["model.safetensors", "cannot open"]),
            ("malformed tokenizer", write("tokenizer.json", b"{\"model\": {\"type\": \"BPE\"}}"),
             ["tokenizer.json", "model.vocab"]),
            ("garbled tokenizer", write("tokenizer.json", b"\x00\x01garbage"), ["tokenizer.json", "JSON"]),
            ("no tokenizer", remove("tokenizer.json"), ["no tokenizer.json or tokenizer.model"]),
            ("garbled tokenizer.model",
             lambda d: (remove("tokenizer.json")(d), write("tokenizer.model", b"\x00garbage")(d)),
             ["tokenizer.model", "not a SentencePiece model"]),
            ("unsupported normalizer", edit_json("tokenizer.json", lambda j: j.update(
                normalizer={"type": "BertNormalizer"})), ["tokenizer.json", "normalizer", "BertNormalizer"]),
            ("unsupported chat template", write("tokenizer_config.json",
                                                b'{"chat_template": "{% include \'other.jinja\' %}"}'),
             ["tokenizer_config.json", "chat template", "unsupported statement", "include"]),
            ("chat template syntax", write("tokenizer_config.json", b'{"chat_template": "{% if x %}"}'),
             ["tokenizer_config.json", "line 1", "endif"]),
            ("bad stop tokens", write("generation_config.json", b'{"eos_token_id": ["x"]}'),
             ["generation_config.json", "eos_token_id"]),
            ("stop token outside the vocabulary", write("generation_config.json", b'{"eos_token_id": [99999]}'),
             ["stop token id 99999"]),
        ]
        for name, mutate, needles in cases:
            d = variant(name.replace(" ", "_"), mutate)
            code, err = run(args.failsafe, d)
            lines = err.splitlines()
            ok = (code == 1 and len(lines) == 1 and lines[0].startswith("error: ")
                  and all(n in lines[0] for n in needles))
            print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {code}: {err}")
            failures += not ok
        # Token ids given on the command line are read whole.
        for ids, needle in [("1 2", "'1 2' is not a token id"), ("5,1.5", "'1.5' is not a token id"),
                            ("5,,6", "'' is not a token id"), ("7,x", "'x' is not a token id"),
                            ("99999", "outside the vocabulary")]:
            p = subprocess.run([args.failsafe, "logits", "--model", good, "--prompt-ids", ids,
                                "--decode", "1"], capture_output=True, text=True, timeout=120)
            err = p.stderr.strip()
            ok = p.returncode == 1 and err.startswith("error: ") and needle in err
            print(f"{'ok  ' if ok else 'FAIL'} logits --prompt-ids '{ids}': exit {p.returncode}: {err}")
            failures += not ok
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
