// FailSafe's tokenizer.json implementation against @huggingface/transformers
// (its tokenizers run offline from a local tokenizer.json): the same ids for
// every corpus string, the same text for every decode (with and without
// special tokens, and for random id sequences), and Decode(Encode(x)) == x
// wherever the reference round-trips.
//
//   node tokenizer_reference.mjs --failsafe PATH --python PYTHON [--synthetic] DIR...
//
// DIR is a model directory with a tokenizer.json (and optionally
// tokenizer_config.json); --synthetic adds a byte-level BPE one (a synthetic
// model's). The corpus comes from tests/python/tokenizer_corpus.py (run with
// PYTHON), or from --corpus FILE (JSON Lines {"hex": ...}).
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { PreTrainedTokenizer, env } from "@huggingface/transformers";

env.allowRemoteModels = false;
const args = process.argv.slice(2);
const opt = (name) => args[args.indexOf(name) + 1];
const failsafe = opt("--failsafe");
const corpusFile = args.includes("--corpus") ? opt("--corpus") : null;
const python = args.includes("--python") ? opt("--python") : "python3";
const valued = new Set(["--failsafe", "--corpus", "--python"]);
const dirs = args.filter((a, i) => !a.startsWith("--") && !valued.has(args[i - 1]));
let scratch = null;
if (args.includes("--synthetic")) {
  scratch = mkdtempSync(join(tmpdir(), "fs-tok-"));
  execFileSync(failsafe, ["make-model", "--preset", "tiny-llama", "--out", join(scratch, "byte-level")]);
  dirs.push(join(scratch, "byte-level"));
}
if (!failsafe || dirs.length === 0) {
  throw new Error("usage: node tokenizer_reference.mjs --failsafe PATH [--python P] DIR...");
}

const corpusText = corpusFile
  ? readFileSync(corpusFile, "utf8")
  : execFileSync(python, [
      join(dirname(fileURLToPath(import.meta.url)), "../python/tokenizer_corpus.py"),
    ]).toString();
const corpus = corpusText.trim().split("\n").map((l) => JSON.parse(l).hex);
const utf8 = new TextDecoder("utf-8");
const fromHex = (h) => Buffer.from(h, "hex");
const text = (h) => utf8.decode(fromHex(h));

// Runs failsafe tokenize over JSON Lines requests; returns one answer per line.
function engine(dir, requests) {
  const input = requests.map((r) => JSON.stringify(r)).join("\n") + "\n";
  const out = execFileSync(failsafe, ["tokenize", "--tokenizer", dir, "--jsonl", "-"], {
    input,
    maxBuffer: 1 << 28,
  });
  return out.toString().trim().split("\n").map((l) => JSON.parse(l));
}

// The reference's ByteFallback decoder reads byte runs with a TextDecoder
// that swallows a byte order mark (U+FEFF) at the start of a run; the Rust
// library and SentencePiece keep it, and so does FailSafe.
let bomQuirks = 0;
function bomQuirk(want, got) {
  const same = got.replaceAll("\ufeff", "") === want.replaceAll("\ufeff", "") && got.length > want.length;
  if (same) bomQuirks++;
  return same;
}

let failures = 0;
function report(what, mismatches, total) {
  const ok = mismatches.length === 0;
  console.log(`${ok ? "ok  " : "FAIL"} ${what}: ${total - mismatches.length}/${total} identical`);
  for (const m of mismatches.slice(0, 5)) console.log("     ", JSON.stringify(m).slice(0, 600));
  if (!ok) failures++;
}

for (const dir of dirs) {
  const json = JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8"));
  const configPath = join(dir, "tokenizer_config.json");
  const config = existsSync(configPath) ? JSON.parse(readFileSync(configPath, "utf8")) : {};
  const tok = new PreTrainedTokenizer(json, config);
  const cleanUp = config.clean_up_tokenization_spaces ?? false;
  const decode = (ids, skip) =>
    ids.length === 0
      ? ""
      : tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: cleanUp });

  // Encoding, decoding and round trips over the corpus.
  const ours = engine(dir, corpus.map((hex) => ({ hex })));
  const idMismatch = [], decMismatch = [], roundTrip = [];
  let roundTrips = 0;
  corpus.forEach((hex, i) => {
    const s = text(hex);
    const want = Array.from(tok.encode(s, { add_special_tokens: false }));
    const got = ours[i].ids;
    if (JSON.stringify(want) !== JSON.stringify(got)) {
      idMismatch.push({ text: s, want, got });
      return;
    }
    for (const skip of [false, true]) {
      const w = decode(want, skip);
      const g = utf8.decode(fromHex(skip ? ours[i].decoded_skip_hex : ours[i].decoded_hex));
      if (w !== g && !bomQuirk(w, g)) decMismatch.push({ ids: want, skip, want: w, got: g });
    }
    if (decode(want, false) === s) {
      roundTrips++;
      if (utf8.decode(fromHex(ours[i].decoded_hex)) !== s) roundTrip.push({ text: s });
    }
  });
  const name = dir.split("/").filter(Boolean).slice(-1)[0];
  report(`${name}: encode ${corpus.length} strings`, idMismatch, corpus.length);
  report(`${name}: decode (with and without special tokens)`, decMismatch, 2 * corpus.length);
  report(`${name}: Decode(Encode(x)) == x where the reference round-trips`, roundTrip, roundTrips);

  // BOS/EOS from the post-processor.
  const some = corpus.slice(0, 60);
  const withSpecial = engine(dir, some.map((hex) => ({ hex, add_special: true })));
  const specialMismatch = [];
  some.forEach((hex, i) => {
    const want = Array.from(tok.encode(text(hex), { add_special_tokens: true }));
    if (JSON.stringify(want) !== JSON.stringify(withSpecial[i].ids))
      specialMismatch.push({ text: text(hex), want, got: withSpecial[i].ids });
  });
  report(`${name}: encode with special tokens`, specialMismatch, some.length);

  // Random id sequences (byte tokens, specials, anything) decode alike.
  let seed = 12345;
  const rand = (n) => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed % n;
  };
  // (A reduce: a vocabulary of 262,144 is too many arguments for Math.max.)
  const size =
    [...Object.values(json.model.vocab), ...(json.added_tokens ?? []).map((a) => a.id)].reduce(
      (a, b) => Math.max(a, b),
      0,
    ) + 1;
  const sequences = [];
  for (let k = 0; k < 300; k++) {
    const n = 1 + rand(12);
    const ids = [];
    for (let t = 0; t < n; t++) ids.push(rand(4) === 0 ? rand(Math.min(size, 300)) : rand(size));
    sequences.push(ids);
  }
  const decoded = engine(dir, sequences.map((ids) => ({ decode: ids })));
  const randomMismatch = [];
  sequences.forEach((ids, i) => {
    for (const skip of [false, true]) {
      const w = decode(ids, skip);
      const g = utf8.decode(fromHex(skip ? decoded[i].decoded_skip_hex : decoded[i].decoded_hex));
      if (w !== g) randomMismatch.push({ ids, skip, want: w, got: g });
    }
  });
  report(`${name}: decode random id sequences`, randomMismatch, 2 * sequences.length);
}
if (scratch) rmSync(scratch, { recursive: true, force: true });
if (bomQuirks > 0) console.log(`     (${bomQuirks} decodes differ only by the reference dropping U+FEFF)`);
process.exit(failures === 0 ? 0 : 1);
