// Encodes texts with @huggingface/transformers from a local tokenizer.json:
// reads JSON Lines {"text": ...} on stdin, prints {"ids": [...]} per line.
//
//   node encode.mjs DIR < texts.jsonl
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { PreTrainedTokenizer, env } from "@huggingface/transformers";

env.allowRemoteModels = false;
const dir = process.argv[2];
const json = JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8"));
const configPath = join(dir, "tokenizer_config.json");
const config = existsSync(configPath) ? JSON.parse(readFileSync(configPath, "utf8")) : {};
const tok = new PreTrainedTokenizer(json, config);
for (const line of readFileSync(0, "utf8").split("\n")) {
  if (!line.trim()) continue;
  const { text } = JSON.parse(line);
  console.log(JSON.stringify({ ids: Array.from(tok.encode(text, { add_special_tokens: false })) }));
}
