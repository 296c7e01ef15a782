// The OpenAI sampling surface over real HTTP: log-probabilities (and echo's
// prompt log-probabilities) equal to the model's own, several choices seeded
// per index, best_of, penalties, logit_bias, min_p and min_tokens, OpenAI's
// 400s for bad values, structured outputs and tool calls, and all of it
// unchanged when a device dies mid-request.
#include <gtest/gtest.h>
#include <httplib.h>

#include <future>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "backend/backend.h"
#include "engine/local_executor.h"
#include "engine/request_sampler.h"
#include "server/openai_api.h"
#include "server/test_server.h"

namespace failsafe {
namespace {

using nlohmann::json;

json PostOk(const TestServer& s, const std::string& path, const json& body) {
  auto res = s.Post(path, body);
  EXPECT_TRUE(res);
  if (!res) return json();
  EXPECT_EQ(res->status, 200) << res->body;
  return json::parse(res->body);
}

// A request answered 400 with OpenAI's error body naming `param`.
void Expect400(const TestServer& s, const std::string& path, const json& body,
               const std::string& param) {
  auto r = s.Post(path, body);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << body.dump() << " " << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["param"], param) << r->body;
}

// SSE payloads of a streamed request, parsed (all but [DONE]).
std::vector<json> StreamChunks(const TestServer& s, const std::string& path, json body,
                               const std::function<void(int)>& on_event = {}) {
  body["stream"] = true;
  std::vector<json> out;
  for (const std::string& e : StreamEvents(s.port(), path, body, 0, on_event)) {
    if (e != "[DONE]") out.push_back(json::parse(e));
  }
  return out;
}

// The single-device engine's greedy run with the logits of every position.
GenerateResult Reference(const std::vector<int>& prompt, int max_tokens) {
  auto exec = LocalExecutor::Create(TestModelDir(), {});
  auto sampler = MakeCpuBackend(1);
  GenerateOptions g;
  g.max_tokens = max_tokens;
  g.prefill_chunk = 1;
  g.record_logits = true;
  auto r = GenerateOne(**exec, *sampler, prompt, g);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(*r) : GenerateResult{};
}

TEST(OpenAiSampling, LogprobsAndEchoAreTheModelsOwn) {
  TestServer s;
  const std::vector<int> prompt = s.tok->Encode("Logprobs of a served model", true);
  json j = PostOk(s, "/v1/completions",
                  {{"prompt", prompt},
                   {"max_tokens", 6},
                   {"temperature", 0},
                   {"ignore_eos", true},
                   {"logprobs", 3},
                   {"echo", true}});
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), prompt.size() + 6);
  std::vector<int> all = prompt;
  const int vocab = s.service->config().vocab_size;
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  // Reference: the logits of every prompt position, and the greedy tokens.
  const GenerateResult ref = Reference(prompt, 6);
  all.insert(all.end(), ref.output_ids.begin(), ref.output_ids.end());
  ASSERT_EQ(ref.logits.size(), prompt.size() + 5);
  for (size_t p = 0; p + 1 < all.size(); ++p) {
    PositionLogprobs want;
    ComputeLogprobs(ref.logits[p].data(), vocab, all[p + 1], 3, &want);
    EXPECT_EQ(lp["token_logprobs"][p + 1].get<float>(), want.logprob) << "position " << p;
    // The alternatives and the chosen token, by their text (tokens of one
    // text share a key): the likeliest is the reference's best.
    const json& top = lp["top_logprobs"][p + 1];
    EXPECT_LE(top.size(), 4u);
    float best = -std::numeric_limits<float>::infinity();
    for (const auto& [text, v] : top.items()) best = std::max(best, v.get<float>());
    EXPECT_EQ(best, want.top[0].logprob) << "position " << p;
  }
  // Offsets count up through the tokens' texts.
  for (size_t i = 1; i < lp["text_offset"].size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<int>(),
              lp["text_offset"][i - 1].get<int>() +
                  static_cast<int>(lp["tokens"][i - 1].get<std::string>().size()));
  }

  // max_tokens 0 with echo: the prompt alone, scored, as evaluation
  // harnesses ask for it.
  json e = PostOk(s, "/v1/completions",
                  {{"prompt", "Logprobs of a served model"},
                   {"max_tokens", 0},
                   {"logprobs", 0},
                   {"echo", true}});
  EXPECT_EQ(e["choices"][0]["text"], "Logprobs of a served model");
  EXPECT_EQ(e["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(e["usage"]["completion_tokens"], 0);
  ASSERT_EQ(e["choices"][0]["logprobs"]["token_logprobs"].size(), prompt.size());
  for (size_t p = 1; p < prompt.size(); ++p) {
    EXPECT_EQ(e["choices"][0]["logprobs"]["token_logprobs"][p].get<float>(),
              lp["token_logprobs"][p].get<float>());
  }

  // Chat: entries with bytes and alternatives; streamed ones are the same.
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Hello"}}}},
                     {"max_tokens", 5},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"logprobs", true},
                     {"top_logprobs", 2}};
  json c = PostOk(s, "/v1/chat/completions", chat);
  const json& content = c["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 5u);
  for (const json& t : content) {
    ASSERT_EQ(t["top_logprobs"].size(), 2u);
    // Greedy: the token drawn is the likeliest.
    EXPECT_EQ(t["logprob"], t["top_logprobs"][0]["logprob"]);
    EXPECT_EQ(t["token"], t["top_logprobs"][0]["token"]);
    EXPECT_TRUE(t["bytes"].is_array());
  }
  json streamed = json::array();
  for (const json& chunk : StreamChunks(s, "/v1/chat/completions", chat)) {
    const json& l = chunk["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (const json& t : l["content"]) streamed.push_back(t);
  }
  EXPECT_EQ(streamed, content);
}

// A long prompt scored in many chunks, four logits rows a step, beside
// other requests: every position's log-probability as computed alone.
TEST(OpenAiSampling, PromptLogprobsOfALongPromptInChunks) {
  TestServerOptions o;
  o.max_num_seqs = 4;
  o.max_batch_tokens = 32;
  o.prefix_cache = true;
  TestServer s(o);
  std::string text;
  for (int i = 0; i < 30; ++i) text += "word" + std::to_string(i) + " ";
  const std::vector<int> prompt = s.tok->Encode(text, true);
  ASSERT_GT(prompt.size(), 60u);
  const GenerateResult ref = Reference(prompt, 1);
  ASSERT_EQ(ref.logits.size(), prompt.size());
  const int vocab = s.service->config().vocab_size;
  // Others run meanwhile (the same prompt: its blocks are cached, and the
  // scored request must still compute every position).
  std::vector<std::future<httplib::Result>> others;
  for (int i = 0; i < 3; ++i) {
    others.push_back(std::async(std::launch::async, [&] {
      return s.Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 20}});
    }));
  }
  json j = PostOk(s, "/v1/completions",
                  {{"prompt", prompt}, {"max_tokens", 0}, {"logprobs", 1}, {"echo", true}});
  for (auto& f : others) EXPECT_EQ(f.get()->status, 200);
  const json& got = j["choices"][0]["logprobs"]["token_logprobs"];
  ASSERT_EQ(got.size(), prompt.size());
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    PositionLogprobs want;
    ComputeLogprobs(ref.logits[p].data(), vocab, prompt[p + 1], 0, &want);
    ASSERT_EQ(got[p + 1].get<float>(), want.logprob) << "position " << p;
  }
}

TEST(OpenAiSampling, ChoicesAreSeededPerIndexAndShareThePrompt) {
  TestServerOptions o;
  o.prefix_cache = true;
  TestServer s(o);
  const json base = {{"prompt", "Several samples of one prompt, long enough to share blocks"},
                     {"max_tokens", 8},
                     {"temperature", 1.0},
                     {"seed", 7},
                     {"ignore_eos", true}};
  json one = PostOk(s, "/v1/completions", base);
  json three = base;
  three["n"] = 3;
  json a = PostOk(s, "/v1/completions", three);
  json b = PostOk(s, "/v1/completions", three);
  ASSERT_EQ(a["choices"].size(), 3u);
  std::set<std::string> texts;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a["choices"][i]["index"], i);
    EXPECT_EQ(a["choices"][i]["text"], b["choices"][i]["text"]);
    texts.insert(a["choices"][i]["text"].get<std::string>());
  }
  // Choice 0 is the request's own seed; the others differ.
  EXPECT_EQ(a["choices"][0]["text"], one["choices"][0]["text"]);
  EXPECT_EQ(texts.size(), 3u);
  EXPECT_EQ(a["usage"]["completion_tokens"], 24);
  // Streamed, each index's chunks concatenate to the same texts.
  std::vector<std::string> streamed(3);
  for (const json& chunk : StreamChunks(s, "/v1/completions", three)) {
    for (const json& ch : chunk["choices"])
      streamed[ch["index"].get<int>()] += ch["text"].get<std::string>();
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(streamed[i], a["choices"][i]["text"]);
  // best_of 3, n 1: the draw of the highest total log-probability, one of
  // the three.
  json best = base;
  best["best_of"] = 3;
  json bo = PostOk(s, "/v1/completions", best);
  ASSERT_EQ(bo["choices"].size(), 1u);
  EXPECT_TRUE(texts.count(bo["choices"][0]["text"].get<std::string>()));
  EXPECT_TRUE(bo["choices"][0]["logprobs"].is_null());
  // The prompt's KV was computed for the first draws and reused by the others.
  const std::string m = s.Metrics();
  EXPECT_GT(MetricValue(m, "failsafe_prefix_cache_hit_tokens_total"), 0) << m;
}

TEST(OpenAiSampling, ControlsChangeTheDraw) {
  TestServer s;
  const int eos = s.service->config().eos_token_id;
  ASSERT_GE(eos, 0);
  const std::vector<int> prompt = s.tok->Encode("Controls", true);
  auto tokens_of = [&](const json& body) {
    json j = body;
    j["prompt"] = prompt;
    j["logprobs"] = 0;
    json r = PostOk(s, "/v1/completions", j);
    std::vector<std::string> out;
    for (const json& t : r["choices"][0]["logprobs"]["tokens"]) out.push_back(t);
    return std::make_pair(out, r["choices"][0]["finish_reason"].get<std::string>());
  };
  // A bias of 100 on one token: greedy draws nothing else.
  const int forced = 100;
  auto [biased, why] = tokens_of({{"max_tokens", 5},
                                  {"temperature", 0},
                                  {"ignore_eos", true},
                                  {"logit_bias", {{std::to_string(forced), 100}}}});
  ASSERT_EQ(biased.size(), 5u);
  for (const std::string& t : biased) EXPECT_EQ(t, biased[0]);
  EXPECT_EQ(why, "length");
  // The end-of-sequence token favoured, min_tokens holds it back for 4.
  auto [held, why2] = tokens_of({{"max_tokens", 10},
                                 {"temperature", 0},
                                 {"min_tokens", 4},
                                 {"logit_bias", {{std::to_string(eos), 100}}}});
  EXPECT_EQ(held.size(), 5u);  // four, then the end
  EXPECT_EQ(why2, "stop");
  // Penalties change a greedy draw, reproducibly.
  const json plain = {{"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
  json pen = plain;
  pen["frequency_penalty"] = 2.0;
  pen["presence_penalty"] = 2.0;
  pen["repetition_penalty"] = 1.5;
  auto p0 = tokens_of(plain).first, p1 = tokens_of(pen).first, p2 = tokens_of(pen).first;
  EXPECT_NE(p0, p1);
  EXPECT_EQ(p1, p2);
}

TEST(OpenAiSampling, BadValuesGetOpenAiErrors) {
  TestServer s;
  auto expect400 = [&](const std::string& path, json body, const std::string& param) {
    if (path == "/v1/completions" && !body.contains("prompt")) body["prompt"] = "x";
    if (path == "/v1/chat/completions") body["messages"] = {{{"role", "user"}, {"content", "x"}}};
    Expect400(s, path, body, param);
  };
  expect400("/v1/completions", {{"logprobs", 21}}, "logprobs");
  expect400("/v1/completions", {{"logprobs", true}}, "logprobs");
  expect400("/v1/chat/completions", {{"top_logprobs", 2}}, "top_logprobs");
  expect400("/v1/chat/completions", {{"logprobs", true}, {"top_logprobs", 30}}, "top_logprobs");
  expect400("/v1/completions", {{"logit_bias", {{"x", 1}}}}, "logit_bias");
  expect400("/v1/completions", {{"logit_bias", {{"5", 101}}}}, "logit_bias");
  expect400("/v1/completions", {{"presence_penalty", 3}}, "presence_penalty");
  expect400("/v1/completions", {{"repetition_penalty", 0}}, "repetition_penalty");
  expect400("/v1/completions", {{"min_p", 1.5}}, "min_p");
  expect400("/v1/completions", {{"min_tokens", 20}, {"max_tokens", 5}}, "min_tokens");
  expect400("/v1/completions", {{"n", 3}, {"best_of", 2}}, "best_of");
  expect400("/v1/completions", {{"best_of", 2}, {"stream", true}}, "best_of");
  expect400("/v1/completions", {{"max_tokens", 0}}, "max_tokens");
  expect400("/v1/completions", {{"prompt", json::array({"a", 5})}}, "prompt");
  // A list of prompts: one choice each, in order.
  json two = PostOk(s, "/v1/completions",
                    {{"prompt", {"first", "second"}}, {"max_tokens", 2}, {"temperature", 0}});
  ASSERT_EQ(two["choices"].size(), 2u);
  EXPECT_EQ(two["choices"][1]["index"], 1);
}

// A device killed mid-request changes no log-probability, no seeded choice
// and no penalised token.
TEST(OpenAiSampling, UnchangedWhenADeviceDies) {
  TestServer s;
  const json body = {{"prompt", "Through a failure the figures stay"},
                     {"max_tokens", 40},
                     {"temperature", 0.8},
                     {"seed", 11},
                     {"n", 2},
                     {"logprobs", 2},
                     {"frequency_penalty", 0.5},
                     {"ignore_eos", true}};
  json calm = PostOk(s, "/v1/completions", body);
  std::vector<json> lps(2, json::array());
  std::vector<std::string> texts(2);
  auto chunks = StreamChunks(s, "/v1/completions", body, [&](int n) {
    if (n == 10) {
      httplib::Client admin("127.0.0.1", s.port());
      auto r = admin.Post("/admin/devices/1/fail", "", "application/json");
      EXPECT_EQ(r->status, 200);
    }
  });
  for (const json& c : chunks) {
    for (const json& ch : c["choices"]) {
      const int i = ch["index"];
      texts[i] += ch["text"].get<std::string>();
      if (ch["logprobs"].is_null()) continue;
      for (const json& v : ch["logprobs"]["token_logprobs"]) lps[i].push_back(v);
    }
  }
  ASSERT_EQ(s.Status()["recoveries"].size(), 1u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(texts[i], calm["choices"][i]["text"]);
    EXPECT_EQ(lps[i], calm["choices"][i]["logprobs"]["token_logprobs"]);
  }
}

// response_format json_schema: every choice that ends is JSON of the schema,
// the same when a device dies under the stream; json_object gives objects;
// a schema the grammar cannot honour is a 400.
TEST(OpenAiSampling, StructuredOutputsFollowTheSchemaThroughAFailure) {
  TestServer s;
  const json schema = json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 6},
      "count": {"type": "integer"},
      "ok": {"type": "boolean"},
      "mode": {"enum": ["fast", "safe"]}
    },
    "required": ["name", "count", "ok", "mode"]
  })");
  const json body = {
      {"messages", {{{"role", "user"}, {"content", "Describe a device as JSON."}}}},
      {"max_tokens", 200},
      {"temperature", 0.7},
      {"seed", 3},
      {"n", 2},
      {"response_format",
       {{"type", "json_schema"}, {"json_schema", {{"name", "device"}, {"schema", schema}}}}}};
  json calm = PostOk(s, "/v1/chat/completions", body);
  ASSERT_EQ(calm["choices"].size(), 2u);
  for (const json& c : calm["choices"]) {
    EXPECT_EQ(c["finish_reason"], "stop") << c.dump();
    const json v = json::parse(c["message"]["content"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(v.is_object()) << c["message"]["content"];
    ASSERT_EQ(v.size(), 4u) << v.dump();
    EXPECT_TRUE(v["name"].is_string());
    EXPECT_LE(v["name"].get<std::string>().size(), 6u * 4);  // six characters of UTF-8
    EXPECT_TRUE(v["count"].is_number_integer());
    EXPECT_TRUE(v["ok"].is_boolean());
    EXPECT_TRUE(v["mode"] == "fast" || v["mode"] == "safe") << v.dump();
  }
  std::vector<std::string> texts(2);
  auto chunks = StreamChunks(s, "/v1/chat/completions", body, [&](int n) {
    if (n == 8) {
      httplib::Client admin("127.0.0.1", s.port());
      EXPECT_EQ(admin.Post("/admin/devices/3/fail", "", "application/json")->status, 200);
    }
  });
  for (const json& c : chunks) {
    for (const json& ch : c["choices"]) {
      if (ch["delta"].contains("content"))
        texts[ch["index"].get<int>()] += ch["delta"]["content"].get<std::string>();
    }
  }
  ASSERT_EQ(s.Status()["recoveries"].size(), 1u);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(texts[i], calm["choices"][i]["message"]["content"]);

  // JSON mode: an object, whole if it ended.
  for (int seed = 0; seed < 3; ++seed) {
    json j = PostOk(s, "/v1/completions",
                    {{"prompt", "An object:"},
                     {"max_tokens", 120},
                     {"seed", seed},
                     {"response_format", {{"type", "json_object"}}}});
    const std::string text = j["choices"][0]["text"];
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text[0], '{');
    if (j["choices"][0]["finish_reason"] == "stop") {
      EXPECT_TRUE(json::parse(text, nullptr, false).is_object()) << text;
    }
  }
  const json pattern = {
      {"messages", {{{"role", "user"}, {"content", "x"}}}},
      {"response_format",
       {{"type", "json_schema"},
        {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"pattern", "a+"}}}}}}}};
  Expect400(s, "/v1/chat/completions", pattern, "response_format");
  EXPECT_NE(s.Post("/v1/chat/completions", pattern)->body.find("pattern"), std::string::npos);
}

// A request resumed on another node (other device count) from the tokens the
// first one sent goes on with exactly the tokens the first would have
// produced: greedy, seeded, penalised, on both endpoints; a router counts
// what it sent through return_token_ids.
TEST(OpenAiSampling, AResumedRequestGoesOnWithTheSameTokens) {
  TestServerOptions four, three;
  four.devices = 4;
  three.devices = 3;
  TestServer a(four), b(three);
  const json completions = {{"prompt", "A node dies and another one goes on"},
                            {"max_tokens", 30},
                            {"temperature", 0.9},
                            {"seed", 21},
                            {"frequency_penalty", 0.3},
                            {"ignore_eos", true},
                            {"return_token_ids", true}};
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Go on."}}}},
                     {"max_tokens", 24},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"return_token_ids", true}};
  for (const auto& [path, body] : {std::make_pair("/v1/completions", completions),
                                   std::make_pair("/v1/chat/completions", chat)}) {
    json whole = PostOk(a, path, body);
    const json& choice = whole["choices"][0];
    const std::vector<int> ids = choice["token_ids"];
    ASSERT_EQ(static_cast<int>(ids.size()), body["max_tokens"].get<int>());
    const std::string text = path == std::string("/v1/completions")
                                 ? choice["text"].get<std::string>()
                                 : choice["message"]["content"].get<std::string>();
    // What a router saw of a stream before the node died: the token ids of
    // its first chunks, and the text sent with the first k of them.
    std::vector<int> sent;
    std::vector<std::string> text_after;  // [k]: the text streamed with the first k tokens
    std::string streamed;
    auto chunks = StreamChunks(a, path, body);
    for (const json& c : chunks) {
      if (c["choices"].empty()) continue;
      const json& ch = c["choices"][0];
      streamed += path == std::string("/v1/completions") ? ch["text"].get<std::string>()
                                                         : ch["delta"].value("content", "");
      for (int t : ch["token_ids"]) {
        sent.push_back(t);
        text_after.resize(sent.size() + 1, streamed);
      }
    }
    EXPECT_EQ(sent, ids);
    EXPECT_EQ(streamed, text);
    for (size_t k : {size_t{1}, size_t{7}, ids.size() - 1}) {
      json resumed = body;
      resumed["resume_token_ids"] = std::vector<int>(ids.begin(), ids.begin() + k);
      json rest = PostOk(b, path, resumed);
      const json& rc = rest["choices"][0];
      EXPECT_EQ(rc["token_ids"].get<std::vector<int>>(),
                std::vector<int>(ids.begin() + k, ids.end()))
          << path << " resumed after " << k;
      const std::string tail = path == std::string("/v1/completions")
                                   ? rc["text"].get<std::string>()
                                   : rc["message"]["content"].get<std::string>();
      // The text goes on exactly where the text sent with k tokens ended.
      EXPECT_EQ(text_after[k] + tail, text) << path << " resumed after " << k;
      EXPECT_EQ(rest["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
      EXPECT_EQ(rc["finish_reason"], choice["finish_reason"]);
    }
  }
  Expect400(a, "/v1/completions",
            {{"prompt", "x"}, {"max_tokens", 3}, {"resume_token_ids", {1, 2, 3}}},
            "resume_token_ids");
}

TEST(ToolCalls, FoundInEachFamilysFormat) {
  std::string content;
  auto qwen = ParseToolCalls(
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}"
      "\n</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>",
      &content);
  ASSERT_TRUE(qwen);
  ASSERT_EQ(qwen->size(), 2u);
  EXPECT_EQ((*qwen)[0].name, "get_weather");
  EXPECT_EQ(json::parse((*qwen)[0].arguments), json::parse(R"({"city": "Bern"})"));
  EXPECT_EQ((*qwen)[1].name, "now");
  EXPECT_EQ(content, "Let me look.");
  auto llama = ParseToolCalls(
      "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", &content);
  ASSERT_TRUE(llama);
  EXPECT_EQ((*llama)[0].arguments, R"({"city":"Oslo"})");
  EXPECT_TRUE(content.empty());
  auto mistral = ParseToolCalls(
      "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": "
      "\"{\\\"x\\\": 1}\"}]",
      &content);
  ASSERT_TRUE(mistral);
  ASSERT_EQ(mistral->size(), 2u);
  EXPECT_EQ((*mistral)[1].arguments, R"({"x": 1})");
  EXPECT_FALSE(ParseToolCalls("The weather is fine.", &content));
  EXPECT_FALSE(ParseToolCalls("{\"answer\": 42}", &content));  // JSON, not a call
  EXPECT_FALSE(ParseToolCalls("<tool_call>{\"name\": \"a\"", &content));
  EXPECT_TRUE(MayBeToolCall("  <tool_"));
  EXPECT_TRUE(MayBeToolCall("[TOOL"));
  EXPECT_TRUE(MayBeToolCall("{\"na"));
  EXPECT_FALSE(MayBeToolCall("The"));
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city.",
   "parameters": {"type": "object", "properties": {
     "city": {"type": "string", "maxLength": 8},
     "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}},
  {"type": "function", "function": {"name": "now", "parameters": {"type": "object",
   "properties": {"zone": {"enum": ["utc", "local"]}}, "required": ["zone"]}}}])");

json ChatWithTools(const json& tool_choice) {
  return {{"messages",
           {{{"role", "user"}, {"content", "Weather in Bern?"}},
            {{"role", "assistant"},
             {"content", nullptr},
             {"tool_calls",
              {{{"id", "call_1"},
                {"type", "function"},
                {"function", {{"name", "now"}, {"arguments", "{\"zone\": \"utc\"}"}}}}}}},
            {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "12:00"}}}},
          {"tools", kTools},
          {"tool_choice", tool_choice},
          {"max_tokens", 150},
          {"temperature", 0.7},
          {"seed", 4}};
}

// A forced call (a named function, or required) comes back as tool_calls
// whose arguments follow the function's parameters, streamed or not, and
// the same when a device dies; bad tool requests are 400s.
TEST(ToolCalls, ForcedCallsFollowTheParameters) {
  TestServer s;
  const json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  json one = PostOk(s, "/v1/chat/completions", ChatWithTools(named));
  const json& msg = one["choices"][0]["message"];
  EXPECT_EQ(one["choices"][0]["finish_reason"], "stop") << one.dump();
  EXPECT_TRUE(msg["content"].is_null());
  ASSERT_EQ(msg["tool_calls"].size(), 1u) << one.dump();
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  const json args = json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>());
  EXPECT_TRUE(args["city"].is_string());
  EXPECT_TRUE(args["unit"] == "celsius" || args["unit"] == "fahrenheit") << args.dump();

  json req = PostOk(s, "/v1/chat/completions", ChatWithTools("required"));
  EXPECT_EQ(req["choices"][0]["finish_reason"], "tool_calls") << req.dump();
  const json& calls = req["choices"][0]["message"]["tool_calls"];
  ASSERT_GE(calls.size(), 1u) << req.dump();
  for (const json& c : calls) {
    const std::string name = c["function"]["name"];
    EXPECT_TRUE(name == "get_weather" || name == "now");
    EXPECT_TRUE(json::parse(c["function"]["arguments"].get<std::string>()).is_object());
  }

  // Streamed, through a device failure: the same call, in one delta.
  json streamed_calls;
  auto chunks = StreamChunks(s, "/v1/chat/completions", ChatWithTools("required"), [&](int n) {
    if (n == 1) {
      httplib::Client admin("127.0.0.1", s.port());
      EXPECT_EQ(admin.Post("/admin/devices/0/fail", "", "application/json")->status, 200);
    }
  });
  std::string finish;
  for (const json& c : chunks) {
    const json& ch = c["choices"][0];
    if (ch["delta"].contains("tool_calls")) streamed_calls = ch["delta"]["tool_calls"];
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(streamed_calls.size(), calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(streamed_calls[i]["function"], calls[i]["function"]);
    EXPECT_EQ(streamed_calls[i]["index"], i);
  }

  // auto: a free answer; this random model's is no call, so it is content.
  json free = PostOk(s, "/v1/chat/completions", ChatWithTools("auto"));
  EXPECT_TRUE(free["choices"][0]["message"]["content"].is_string());

  auto expect400 = [&](const json& body, const std::string& param) {
    Expect400(s, "/v1/chat/completions", body, param);
  };
  json no_tools = ChatWithTools("required");
  no_tools.erase("tools");
  expect400(no_tools, "tool_choice");
  expect400(ChatWithTools({{"type", "function"}, {"function", {{"name", "missing"}}}}),
            "tool_choice");
  json bad = ChatWithTools("auto");
  bad["tools"][0]["function"]["name"] = "has space";
  expect400(bad, "tools");
}

}  // namespace
}  // namespace failsafe
