"""Real tokenizer files with weights of the right shapes, served end to end.

Two checkpoint directories get random weights with their vocabulary's size
(`failsafe make-model --vocab-size`):
  - Mistral v3 (a Llama shape): tokenizer.model (SentencePiece) and the Mistral
    v3 chat template;
  - Phi-3-mini (a Phi3ForCausalLM: fused projections, a sliding window),
    Qwen2.5 (Qwen2ForCausalLM), Qwen3 (Qwen3ForCausalLM) and Gemma 3
    (Gemma3ForCausalLM, a vocabulary of 262,208): tokenizer.json and its
    tokenizer_config.json (with its template).
For each, `failsafe serve` on 2 worker processes must answer chat and streamed
completions; the chat prompt must be the template rendered by python3-jinja2
as Hugging Face renders it, tokenized as the reference libraries do
(python3-sentencepiece with control pieces cut out for the .model; the npm
@huggingface/transformers for tokenizer.json): usage.prompt_tokens and
`failsafe chat-template`'s ids equal the reference's; and a conversation the
template refuses (raise_exception) is answered with 400 and its message.

  python3 real_checkpoints.py --failsafe PATH --node NODE --data DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import sentencepiece as spm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_template_reference import environment  # noqa: E402
from tokenizer_sentencepiece import reference_ids, specials_of  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CHATS = [
    [{"role": "user", "content": "Hello there!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Ünïcödé 🚀 question?"},
     {"role": "assistant", "content": "An answer."}, {"role": "user", "content": "  And a follow-up.  "}],
]
failures = 0


def check(ok, what):
    global failures
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    failures += not ok


def post(base, path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def serve(failsafe, model):
    p = subprocess.Popen([failsafe, "serve", "--model", model, "--devices", "2", "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = p.stdout.readline()
    if " on http://" not in line:
        p.kill()
        raise RuntimeError(f"server did not start: {line}{p.stdout.read()}")
    return p, line.split(" on ")[1].split()[0]


def set_token_ids(model, bos, eos):
    """config.json's bos/eos as the real checkpoint's."""
    path = os.path.join(model, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(bos_token_id=bos, eos_token_id=eos)
    with open(path, "w") as f:
        json.dump(cfg, f)


def run_checkpoint(a, name, model, template_source, special, reference_encode):
    env = environment()
    template = env.from_string(template_source)
    server, base = serve(a.failsafe, model)
    try:
        for i, chat in enumerate(CHATS):
            text = template.render(messages=chat, tools=None, documents=None,
                                   add_generation_prompt=True, **special)
            want = reference_encode(text)
            status, body = post(base, "/v1/chat/completions",
                                {"messages": chat, "max_tokens": 4, "temperature": 0})
            ok = status == 200 and json.loads(body)["usage"]["prompt_tokens"] == len(want)
            check(ok, f"{name}: chat {i} served with the reference's {len(want)} prompt tokens "
                      f"({status})")
            out = subprocess.run([a.failsafe, "chat-template", "--template", model, "--jsonl", "-"],
                                 input=json.dumps({"messages": chat}) + "\n", capture_output=True,
                                 text=True, check=True).stdout
            got = json.loads(out)
            check(got.get("text") == text and got.get("ids") == want,
                  f"{name}: chat {i} prompt text and ids equal jinja2 + the reference tokenizer")
        status, body = post(base, "/v1/completions",
                            {"prompt": "Once upon a time", "max_tokens": 8, "stream": True})
        check(status == 200 and body.count("data: ") >= 2, f"{name}: streamed completion")
        status, body = post(base, "/v1/chat/completions",
                            {"messages": [{"role": "assistant", "content": "first"}], "max_tokens": 2})
        try:
            env.from_string(template_source).render(
                messages=[{"role": "assistant", "content": "first"}], tools=None, documents=None,
                add_generation_prompt=True, **special)
            check(status == 200, f"{name}: an assistant-first chat is accepted as jinja2 accepts it")
        except Exception as e:  # noqa: BLE001
            check(status == 400 and str(e) in json.loads(body)["error"]["message"],
                  f"{name}: the template's exception is a 400 with its message ({status})")
    finally:
        server.terminate()
        server.wait(timeout=60)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--failsafe", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--data", required=True)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # Mistral v3: tokenizer.model and the Mistral v3 template.
        mistral = os.path.join(tmp, "mistral-v3")
        subprocess.run([a.failsafe, "make-model", "--preset", "tiny-llama", "--vocab-size", "32768",
                        "--out", mistral], check=True, capture_output=True)
        os.remove(os.path.join(mistral, "tokenizer.json"))
        os.remove(os.path.join(mistral, "generation_config.json"))
        sp_path = os.path.join(a.data, "tokenizers/mistral-v3/tokenizer.model")
        shutil.copy(sp_path, os.path.join(mistral, "tokenizer.model"))
        with open(os.path.join(a.data, "chat_templates/mistral-v3-spm.jinja")) as f:
            mistral_template = f.read()
        with open(os.path.join(mistral, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                       "chat_template": mistral_template}, f)
        set_token_ids(mistral, 1, 2)
        sp = spm.SentencePieceProcessor(model_file=sp_path)
        specials = specials_of(sp)
        run_checkpoint(a, "mistral-v3 (tokenizer.model)", mistral, mistral_template,
                       {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                       lambda text: reference_ids(sp, specials, text.encode()))

        # tokenizer.json and its tokenizer_config.json (with its template):
        # Phi-3-mini (SentencePiece-style BPE), Qwen2.5 and Qwen3 (byte-level
        # BPE), Gemma 3 (a vocabulary of 262,144 and a split on spaces).
        for name, preset, vocab, tokenizer, bos, eos in (
                ("phi-3-mini", "tiny-phi3", 32064, "phi-3-mini", 1, 32000),
                ("qwen2.5", "tiny-qwen2", 151936, "qwen2.5", 151643, 151645),
                ("qwen3", "tiny-qwen3", 151936, "qwen3", 151643, 151645),
                ("gemma-3", "tiny-gemma3", 262208, "gemma-3", 2, [1, 106])):
            model = os.path.join(tmp, name)
            subprocess.run([a.failsafe, "make-model", "--preset", preset, "--vocab-size",
                            str(vocab), "--out", model], check=True, capture_output=True)
            os.remove(os.path.join(model, "generation_config.json"))
            for f in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(os.path.join(a.data, "tokenizers", tokenizer, f),
                            os.path.join(model, f))
            set_token_ids(model, bos, eos)
            with open(os.path.join(model, "tokenizer_config.json")) as f:
                cfg = json.load(f)

            def transformers_encode(text, model=model):
                out = subprocess.run([a.node, os.path.join(HERE, "../node/encode.mjs"), model],
                                     input=json.dumps({"text": text}) + "\n",
                                     capture_output=True, text=True, check=True).stdout
                return json.loads(out)["ids"]

            special = {k: cfg[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                       if cfg.get(k) is not None}
            run_checkpoint(a, f"{name} (tokenizer.json)", model, cfg["chat_template"], special,
                           transformers_encode)
            shutil.rmtree(model)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
