"""FailSafe's tokenizer.model loader against Debian's python3-sentencepiece,
and its two loaders against each other where one vocabulary ships in both
formats.

For every tokenizer.model and every corpus string (tokenizer_corpus.py):
  - the ids equal SentencePiece's: special pieces written in the text (control
    and unknown pieces) are cut out first, leftmost-longest, and every other
    stretch is encoded by SentencePiece on its own;
  - where the string has no special pieces, the decoded text equals
    SentencePiece's decode of the same ids, and Decode(Encode(x)) == x wherever
    SentencePiece round-trips.
For each PAIR (a tokenizer.json directory and a tokenizer.model of the same
vocabulary), both loaders give the same ids and text on every valid UTF-8
string without special tokens (--pair-all: also with special tokens). Invalid
UTF-8 is left out: each loader reads it as its own reference does (U+FFFD per
maximal subpart for tokenizer.json, per byte for SentencePiece). Strings with
a character whose piece the two files spell differently are left out too
(the Llama-2 tokenizer.json copy stores U+00A0 as U+0020; --pair lists them).

  python3 tokenizer_sentencepiece.py --failsafe PATH MODEL... [--pair DIR MODEL]...
"""
import argparse
import json
import os
import subprocess
import sys

import sentencepiece as spm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_corpus import corpus  # noqa: E402


def engine(failsafe, tokenizer, strings):
    lines = "".join(json.dumps({"hex": s.hex()}) + "\n" for s in strings)
    out = subprocess.run([failsafe, "tokenize", "--tokenizer", tokenizer, "--jsonl", "-"],
                         input=lines.encode(), capture_output=True, check=True).stdout
    return [json.loads(l) for l in out.decode().splitlines()]


def specials_of(sp):
    return sorted({sp.id_to_piece(i) for i in range(sp.get_piece_size())
                   if sp.is_control(i) or sp.is_unknown(i)}, key=len, reverse=True)


def reference_ids(sp, specials, s):
    """Special pieces cut out leftmost-longest; the rest encoded by SentencePiece."""
    ids, start, i = [], 0, 0
    encoded = [p.encode() for p in specials]
    while i < len(s):
        hit = next((p for p in encoded if s.startswith(p, i)), None)
        if hit is None:
            i += 1
            continue
        if i > start:
            ids += sp.encode(s[start:i])
        ids.append(sp.piece_to_id(hit.decode()))
        i += len(hit)
        start = i
    if start < len(s):
        ids += sp.encode(s[start:])
    return ids


failures = 0


def report(what, bad, total):
    global failures
    print(f"{'ok  ' if not bad else 'FAIL'} {what}: {total - len(bad)}/{total} identical")
    for b in bad[:5]:
        print("     ", repr(b)[:600])
    if bad:
        failures += 1


def check_model(failsafe, path, strings):
    sp = spm.SentencePieceProcessor(model_file=path)
    specials = specials_of(sp)
    ours = engine(failsafe, path, strings)
    bad_ids, bad_text, bad_trip = [], [], []
    trips = plain = 0
    for s, o in zip(strings, ours):
        want = reference_ids(sp, specials, s)
        if o["ids"] != want:
            bad_ids.append((s, want, o["ids"]))
            continue
        if any(p.encode() in s for p in specials):
            continue
        plain += 1
        ref_text = sp.decode(want).encode()
        if bytes.fromhex(o["decoded_hex"]) != ref_text:
            bad_text.append((want, ref_text, bytes.fromhex(o["decoded_hex"])))
        if ref_text == s:
            trips += 1
            if bytes.fromhex(o["decoded_hex"]) != s:
                bad_trip.append(s)
    name = os.path.relpath(path)
    report(f"{name}: encode {len(strings)} strings", bad_ids, len(strings))
    report(f"{name}: decode ({plain} strings without special pieces)", bad_text, plain)
    report(f"{name}: Decode(Encode(x)) == x where SentencePiece round-trips", bad_trip, trips)


def valid_utf8(s):
    try:
        s.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def check_pair(failsafe, json_dir, model, strings, all_strings):
    sp = spm.SentencePieceProcessor(model_file=model)
    specials = [p.encode() for p in specials_of(sp)]
    with open(os.path.join(json_dir, "tokenizer.json"), encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    differ = {sp.id_to_piece(i) for t, i in vocab.items() if sp.id_to_piece(i) != t}
    lost = {c for piece in differ for c in piece if c != "\u2581"}
    if lost:
        print(f"     pieces spelled differently: {sorted(differ)}; strings with "
              f"{sorted(lost)} are left out")
    chosen = [s for s in strings
              if valid_utf8(s) and not any(c in s.decode() for c in lost) and
              (all_strings or not any(p in s for p in specials))]
    a = engine(failsafe, json_dir, chosen)
    b = engine(failsafe, model, chosen)
    bad = [(s, x["ids"], y["ids"]) for s, x, y in zip(chosen, a, b)
           if x["ids"] != y["ids"] or x["decoded_hex"] != y["decoded_hex"]]
    report(f"{os.path.relpath(json_dir)} (tokenizer.json) == {os.path.relpath(model)}", bad,
           len(chosen))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--failsafe", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--pair", nargs=2, action="append", default=[], metavar=("JSON_DIR", "MODEL"))
    p.add_argument("--pair-all", nargs=2, action="append", default=[],
                   metavar=("JSON_DIR", "MODEL"))
    p.add_argument("models", nargs="*")
    a = p.parse_args()
    strings = corpus(a.seed, a.count)
    for m in a.models:
        check_model(a.failsafe, m, strings)
    for d, m in a.pair:
        check_pair(a.failsafe, d, m, strings, False)
    for d, m in a.pair_all:
        check_pair(a.failsafe, d, m, strings, True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
