// A real OpenAI client against FailSafe: starts `failsafe serve` on a free
// port with a small synthetic model, streams a chat completion with the
// official `openai` npm package, kills a device through the admin API in the
// middle of the stream, and checks that the stream finishes with the same
// text as an undisturbed one. Then the sampling surface through the same
// client (logprobs, echo, n, best_of, penalties, logit_bias, min_p,
// min_tokens, a forced tool call, a JSON schema): each answer on the three devices left equals, bit for bit,
// the answer the four gave before the failure.
//
//   node openai_stream.mjs --failsafe PATH
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";

const args = process.argv.slice(2);
const failsafe = args[args.indexOf("--failsafe") + 1];
if (!failsafe) throw new Error("usage: node openai_stream.mjs --failsafe PATH");

const dir = mkdtempSync(join(tmpdir(), "fs-node-"));
execFileSync(failsafe, ["make-model", "--preset", "tiny-llama", "--out", join(dir, "model"), "--seed", "3"]);
const eos = JSON.parse(readFileSync(join(dir, "model", "config.json"), "utf8")).eos_token_id;
const server = spawn(failsafe, ["serve", "--model", join(dir, "model"), "--devices", "4", "--port", "0",
                                "--enable-admin", "--served-model-name", "tiny", "--no-respawn"],
                     { stdio: ["ignore", "pipe", "inherit"] });
const base = await new Promise((resolve, reject) => {
  let out = "";
  server.stdout.on("data", (d) => {
    out += d;
    const m = out.match(/on (http:\/\/[0-9.:]+)/);
    if (m) resolve(m[1]);
  });
  server.on("exit", (code) => reject(new Error(`server exited with ${code}`)));
  setTimeout(() => reject(new Error("server did not start")), 30000);
});

let failures = 0;
function check(cond, what) {
  console.log(`${cond ? "ok  " : "FAIL"} ${what}`);
  if (!cond) failures++;
}

try {
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused" });
  const models = await client.models.list();
  check(models.data[0].id === "tiny", "models.list names the served model");

  const request = {
    model: "tiny",
    messages: [{ role: "user", content: "Tell me about resilient serving." }],
    max_tokens: 120,
    temperature: 0,
    ignore_eos: true,
    stream: true,
    stream_options: { include_usage: true },
  };
  async function streamText(onChunk) {
    const stream = await client.chat.completions.create(request);
    let text = "";
    let chunks = 0;
    let usage = null;
    let finish = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      if (chunk.choices.length) {
        text += chunk.choices[0].delta.content ?? "";
        finish = chunk.choices[0].finish_reason ?? finish;
      }
      chunks++;
      if (onChunk) await onChunk(chunks);
    }
    return { text, chunks, usage, finish };
  }

  // The sampling surface; returns what must not change with the placement.
  async function features() {
    const out = {};
    const scored = await client.completions.create({
      model: "tiny", prompt: "Resilient serving keeps every request", max_tokens: 0, echo: true, logprobs: 2,
    });
    const lp = scored.choices[0].logprobs;
    check(scored.choices[0].text === "Resilient serving keeps every request", "echo returns the prompt");
    check(lp.token_logprobs[0] === null && lp.token_logprobs.slice(1).every((x) => x < 0),
          `echo scores the prompt (${lp.token_logprobs.length} tokens)`);
    out.scored = lp.token_logprobs;
    const chat = await client.chat.completions.create({
      model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 6, temperature: 0,
      ignore_eos: true, logprobs: true, top_logprobs: 3,
    });
    const content = chat.choices[0].logprobs.content;
    check(content.length === 6 && content.every((t) => t.top_logprobs.length === 3),
          "chat logprobs: six tokens with three alternatives each");
    out.chat = content;
    const many = await client.completions.create({
      model: "tiny", prompt: "Samples", max_tokens: 8, n: 3, seed: 5, temperature: 1, ignore_eos: true,
      frequency_penalty: 0.5, presence_penalty: 0.3, min_p: 0.05,
    });
    check(many.choices.length === 3 && new Set(many.choices.map((c) => c.text)).size === 3,
          "n = 3 gives three seeded samples");
    out.many = many.choices.map((c) => c.text);
    const best = await client.completions.create({
      model: "tiny", prompt: "Samples", max_tokens: 8, n: 1, best_of: 3, seed: 5, temperature: 1, ignore_eos: true,
      repetition_penalty: 1.2,
    });
    check(best.choices.length === 1, "best_of 3 returns one choice");
    out.best = best.choices[0].text;
    const biased = await client.completions.create({
      model: "tiny", prompt: "Bias", max_tokens: 4, temperature: 0, ignore_eos: true, logprobs: 0,
      logit_bias: { "100": 100 },
    });
    check(new Set(biased.choices[0].logprobs.tokens).size === 1, "logit_bias forces a token");
    const short = await client.completions.create({
      model: "tiny", prompt: "Short", max_tokens: 10, temperature: 0, min_tokens: 3,
      logit_bias: { [String(eos)]: 100 },
    });
    check(short.usage.completion_tokens === 4 && short.choices[0].finish_reason === "stop",
          "min_tokens holds a favoured end back for three tokens");
    const tools = [{ type: "function", function: { name: "get_weather", parameters: {
      type: "object", properties: { city: { type: "string", maxLength: 8 }, days: { type: "integer" } },
      required: ["city", "days"] } } }];
    const call = await client.chat.completions.create({
      model: "tiny", messages: [{ role: "user", content: "Weather?" }], tools, max_tokens: 80, seed: 2,
      tool_choice: { type: "function", function: { name: "get_weather" } },
    });
    const tc = call.choices[0].message.tool_calls;
    const args = tc && tc.length === 1 ? JSON.parse(tc[0].function.arguments) : {};
    check(tc && tc[0].function.name === "get_weather" && typeof args.city === "string" &&
          Number.isInteger(args.days), "a named tool_choice gives a call whose arguments follow the parameters");
    out.call = tc && tc[0].function.arguments;
    const shaped = await client.chat.completions.create({
      model: "tiny", messages: [{ role: "user", content: "JSON" }], max_tokens: 80, seed: 3,
      response_format: { type: "json_schema", json_schema: { name: "x", schema: {
        type: "object", properties: { ok: { type: "boolean" }, mode: { enum: ["a", "b"] } },
        required: ["ok", "mode"] } } },
    });
    const parsed = JSON.parse(shaped.choices[0].message.content);
    check(typeof parsed.ok === "boolean" && ["a", "b"].includes(parsed.mode), "json_schema output parses and follows it");
    out.shaped = shaped.choices[0].message.content;
    const bad = await client.completions.create({ model: "tiny", prompt: "x", logprobs: 50 }).catch((e) => e);
    check(bad.status === 400 && bad.param === "logprobs", "an out-of-range logprobs is a 400 naming it");
    return out;
  }
  const before = await features();

  const plain = await streamText();
  check(plain.chunks > 10, `a chat completion streams (${plain.chunks} chunks)`);
  check(plain.usage && plain.usage.completion_tokens === 120, "include_usage reports 120 completion tokens");
  check(plain.finish === "length", "finish_reason is length");

  const killed = await streamText(async (n) => {
    if (n === 15) {
      const r = await fetch(`${base}/admin/devices/2/fail`, { method: "POST", body: "" });
      check(r.status === 200, "admin API killed device 2 mid-stream");
    }
  });
  check(killed.text === plain.text, "the stream finished with the same text despite the failure");
  const status = await (await fetch(`${base}/admin/status`)).json();
  check(status.recoveries.length === 1 && status.recoveries[0].failed_devices[0] === 2,
        "the server recovered from device 2's failure");
  const health = await fetch(`${base}/health`);
  check(health.status === 200, "health is 200 with three devices left");
  const after = await features();
  for (const k of Object.keys(before))
    check(JSON.stringify(after[k]) === JSON.stringify(before[k]), `${k}: the same on three devices as on four`);
} catch (e) {
  console.log(`FAIL ${e.stack || e}`);
  failures++;
} finally {
  server.kill("SIGTERM");
  rmSync(dir, { recursive: true, force: true });
}
process.exit(failures ? 1 : 0);
