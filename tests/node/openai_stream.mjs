// A real OpenAI client against FailSafe: starts `failsafe serve` on a free
// port with a small synthetic model, streams a chat completion with the
// official `openai` npm package, kills a device through the admin API in the
// middle of the stream, and checks that the stream finishes with the same
// text as an undisturbed one.
//
//   node openai_stream.mjs --failsafe PATH
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";

const args = process.argv.slice(2);
const failsafe = args[args.indexOf("--failsafe") + 1];
if (!failsafe) throw new Error("usage: node openai_stream.mjs --failsafe PATH");

const dir = mkdtempSync(join(tmpdir(), "fs-node-"));
execFileSync(failsafe, ["make-model", "--preset", "tiny-llama", "--out", join(dir, "model"), "--seed", "3"]);
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
} catch (e) {
  console.log(`FAIL ${e.stack || e}`);
  failures++;
} finally {
  server.kill("SIGTERM");
  rmSync(dir, { recursive: true, force: true });
}
process.exit(failures ? 1 : 0);
