// The server over real HTTP on loopback: OpenAI formats, streaming, errors,
// cancellation on disconnect, the queue limit, metrics, and a stream that
// keeps going while a device is killed underneath it.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/clock.h"
#include "engine/executor.h"
#include "engine/local_executor.h"
#include "server/test_server.h"

namespace failsafe {
namespace {

using nlohmann::json;

const std::string& Dir() { return TestModelDir(); }

TestServerOptions Options(int devices, int max_queue, int max_num_seqs, int64_t outage_timeout_ms) {
  TestServerOptions o;
  o.devices = devices;
  o.max_queue = max_queue;
  o.max_num_seqs = max_num_seqs;
  o.outage_timeout_ms = outage_timeout_ms;
  return o;
}

struct Fixture : TestServer {
  std::unique_ptr<httplib::Client> client;

  explicit Fixture(int devices = 4, int max_queue = 64, int max_num_seqs = 64,
                   int64_t outage_timeout_ms = 30000)
      : TestServer(Options(devices, max_queue, max_num_seqs, outage_timeout_ms)),
        client(Client()) {}

  // Streams a request; returns the SSE data payloads. stop_after > 0 drops the
  // connection after that many events.
  std::vector<std::string> Stream(const std::string& path, const json& body, int stop_after = 0,
                                  const std::function<void(int)>& on_event = {}) {
    return StreamEvents(server->port(), path, body, stop_after, on_event);
  }
};

// The single-device engine's greedy tokens for a prompt: the reference.
std::vector<int> Greedy(const std::vector<int>& prompt, int n) {
  auto exec = LocalExecutor::Create(Dir(), {});
  auto sampler = MakeCpuBackend(1);
  GenerateOptions g;
  g.max_tokens = n;
  auto r = GenerateOne(**exec, *sampler, prompt, g);
  return r->output_ids;
}

TEST(Server, CompletionsMatchTheEngine) {
  Fixture f;
  std::vector<int> prompt = f.tok->Encode("The engine keeps serving", true);
  const std::string want = f.tok->Decode(Greedy(prompt, 12), true);
  auto res = f.Post("/v1/completions", {{"prompt", "The engine keeps serving"},
                                        {"max_tokens", 12},
                                        {"temperature", 0},
                                        {"ignore_eos", true}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json j = json::parse(res->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], want);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int>(prompt.size()));
  // Token-id prompts work too, and streaming gives the same text.
  std::string streamed;
  json usage;
  auto events = f.Stream("/v1/completions", {{"prompt", prompt},
                                             {"max_tokens", 12},
                                             {"temperature", 0},
                                             {"ignore_eos", true},
                                             {"stream", true},
                                             {"stream_options", {{"include_usage", true}}}});
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    if (c.contains("usage")) {
      usage = c["usage"];
      continue;
    }
    streamed += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(streamed, want);
  EXPECT_EQ(usage["completion_tokens"], 12);
}

TEST(Server, ChatCompletionsAndStopStrings) {
  Fixture f;
  json body = {{"messages", {{{"role", "user"}, {"content", "hello"}}}},
               {"max_tokens", 20},
               {"temperature", 0},
               {"ignore_eos", true}};
  auto res = f.Post("/v1/chat/completions", body);
  ASSERT_EQ(res->status, 200) << res->body;
  json j = json::parse(res->body);
  EXPECT_EQ(j["object"], "chat.completion");
  const std::string full = j["choices"][0]["message"]["content"];
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  ASSERT_GE(full.size(), 6u);
  // Stop at a piece of the output: the text ends before it.
  const std::string stop = full.substr(full.size() / 2, 3);
  body["stop"] = stop;
  j = json::parse(f.Post("/v1/chat/completions", body)->body);
  const std::string cut = j["choices"][0]["message"]["content"];
  EXPECT_EQ(cut, full.substr(0, full.find(stop)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  // Streaming chat: role first, then content deltas, then the finish.
  body.erase("stop");
  body["stream"] = true;
  auto events = f.Stream("/v1/chat/completions", body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(json::parse(events[0])["choices"][0]["delta"]["role"], "assistant");
  std::string streamed;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json d = json::parse(events[i])["choices"][0]["delta"];
    if (d.contains("content")) streamed += d["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, full);
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
}

TEST(Server, BadRequestsGetOpenAiErrors) {
  Fixture f;
  auto expect400 = [&](const std::string& path, const std::string& body,
                       const std::string& needle) {
    auto res = f.client->Post(path.c_str(), body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << body;
    json j = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << res->body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(j["error"]["code"].is_string()) << res->body;
    EXPECT_TRUE(j["error"].contains("param")) << res->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos)
        << res->body;
  };
  expect400("/v1/completions", "{not json", "not valid JSON");
  // Why it is not JSON: a lone UTF-16 surrogate, and where.
  expect400("/v1/completions", R"({"prompt": "\ud800 x"})",
            "not valid JSON: parse error at line 1, column 19");
  expect400("/v1/completions", R"({"prompt": "\ud800 x"})", "surrogate");
  expect400("/v1/completions", R"({"prompt": "x", "temprature": 1})", "temprature");
  expect400("/v1/completions", R"({"prompt": "x", "temperature": 5})", "temperature");
  expect400("/v1/completions", R"({"prompt": "x", "top_p": 0})", "top_p");
  expect400("/v1/completions", R"({"prompt": "x", "n": 0})", "n must be");
  expect400("/v1/completions", R"({"prompt": "x", "max_tokens": 0})", "max_tokens");
  expect400("/v1/completions", R"({"prompt": [1, 2, 99999]})", "token ids");
  expect400("/v1/completions", json{{"prompt", std::vector<int>(1030, 5)}}.dump(),
            "context length");
  expect400("/v1/completions", R"({"prompt": "x", "max_tokens": 5000})", "context length");
  expect400("/v1/chat/completions", R"({"messages": []})", "messages");
  expect400("/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})",
            "role");
  expect400("/v1/completions", R"({"prompt": "x", "stream_options": {"include_usage": true}})",
            "stream");
  expect400("/tokenize", R"({"prompt": "x", "add_special_tokens": "no"})", "add_special_tokens");
  auto missing = f.client->Get("/v1/nothing");
  EXPECT_EQ(missing->status, 404);
  EXPECT_TRUE(json::parse(missing->body).contains("error"));
}

TEST(Server, ModelsHealthTokenizeMetrics) {
  Fixture f;
  auto models = json::parse(f.client->Get("/v1/models")->body);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(f.client->Get("/health")->status, 200);
  auto t = json::parse(f.Post("/tokenize", {{"prompt", "héllo wörld"}})->body);
  auto d = json::parse(f.Post("/detokenize", {{"tokens", t["tokens"]}})->body);
  EXPECT_EQ(d["prompt"], "<|begin_of_text|>héllo wörld");
  (void)f.Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 3}, {"ignore_eos", true}});
  const std::string m = f.client->Get("/metrics")->body;
  for (const char* needle :
       {"failsafe_time_to_first_token_seconds_bucket", "failsafe_inter_token_latency_seconds_count",
        "failsafe_e2e_request_latency_seconds_sum", "failsafe_num_requests_running",
        "failsafe_kv_cache_usage{device=\"3\"}", "failsafe_devices_alive 4",
        "failsafe_generation_tokens_total 3", "failsafe_recoveries_total{mode=\"full\"} 0",
        "failsafe_device_share{device=\"2\"} 1", "failsafe_device_slow{device=\"2\"} 0",
        "failsafe_device_work_fraction{device=\"1\"}", "failsafe_rebalances_total 0"}) {
    EXPECT_NE(m.find(needle), std::string::npos) << needle;
  }
  // Each device's measured speed and share in /admin/status.
  const json status = f.Status();
  ASSERT_EQ(status["devices"].size(), 4u);
  for (const json& d : status["devices"]) {
    EXPECT_EQ(d["speed"]["share"], 1.0) << d;
    EXPECT_FALSE(d["speed"]["slow"].get<bool>()) << d;
    EXPECT_TRUE(d["speed"].contains("relative_speed")) << d;
  }
}

// A client that goes away cancels its request and frees its KV.
TEST(Server, DisconnectCancels) {
  Fixture f;
  auto events =
      f.Stream("/v1/completions",
               {{"prompt", "x"}, {"max_tokens", 900}, {"ignore_eos", true}, {"stream", true}}, 5);
  EXPECT_EQ(events.size(), 5u);
  bool aborted = false;
  for (int i = 0; i < 100 && !aborted; ++i) {
    const std::string m = f.client->Get("/metrics")->body;
    aborted = m.find("failsafe_requests_total{finish_reason=\"abort\"} 1") != std::string::npos &&
              m.find("failsafe_num_requests_running 0") != std::string::npos;
    if (!aborted) ::usleep(50000);
  }
  EXPECT_TRUE(aborted);
  auto st = json::parse(f.client->Get("/admin/status")->body);
  for (auto& d : st["devices"]) EXPECT_EQ(d["kv_used_pages"], 0);
}

TEST(Server, FullQueueAnswers429) {
  Fixture f(4, /*max_queue=*/1, /*max_num_seqs=*/1);
  std::vector<int> codes(6, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", f.server->port());
      c.set_read_timeout(60, 0);
      auto r = c.Post("/v1/completions",
                      json{{"prompt", "x"}, {"max_tokens", 200}, {"ignore_eos", true}}.dump(),
                      "application/json");
      codes[i] = r ? r->status : -1;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GT(std::count(codes.begin(), codes.end(), 429), 0);
  EXPECT_GT(std::count(codes.begin(), codes.end(), 200), 0);
}

// Kill a device while a stream is in flight: it finishes with the same tokens.
TEST(Server, StreamSurvivesADeviceKilledUnderneath) {
  Fixture f;
  std::vector<int> prompt = f.tok->Encode("The engine keeps serving", true);
  const std::string want = f.tok->Decode(Greedy(prompt, 300), true);
  std::string got;
  auto events = f.Stream("/v1/completions",
                         {{"prompt", prompt},
                          {"max_tokens", 300},
                          {"temperature", 0},
                          {"ignore_eos", true},
                          {"stream", true}},
                         0, [&](int n) {
                           if (n == 20) {
                             httplib::Client admin("127.0.0.1", f.server->port());
                             auto r = admin.Post("/admin/devices/2/fail", "", "application/json");
                             EXPECT_EQ(r->status, 200);
                           }
                         });
  for (size_t i = 0; i + 1 < events.size(); ++i)
    got += json::parse(events[i])["choices"][0]["text"].get<std::string>();
  // The server sends invalid UTF-8 (random bytes of a random model) as U+FFFD.
  const std::string want_json =
      json::parse(json(want).dump(-1, ' ', false, json::error_handler_t::replace));
  EXPECT_EQ(got, want_json);
  auto st = json::parse(f.client->Get("/admin/status")->body);
  ASSERT_EQ(st["recoveries"].size(), 1u);
  EXPECT_EQ(st["recoveries"][0]["failed_devices"], json::array({2}));
  EXPECT_EQ(f.client->Get("/health")->status, 200);
  // Back again.
  EXPECT_EQ(f.client->Post("/admin/devices/2/restore", "", "application/json")->status, 200);
  EXPECT_EQ(f.client->Post("/admin/devices/2/restore", "", "application/json")->status,
            400);  // alive already
}

// SIGSTOP a device under a stream: detected within 1 s, the stream resumes with the
// same text, and the figures in /admin/status and /metrics are the stall the
// client saw.
TEST(Server, AStoppedDeviceCostsTheStallTheFiguresReport) {
  Fixture f;
  std::vector<int> prompt = f.tok->Encode("A device stops answering", true);
  const std::string want = f.tok->Decode(Greedy(prompt, 200), true);
  auto status = json::parse(f.client->Get("/admin/status")->body);
  const int pid = status["devices"][1]["pid"].get<int>();
  ASSERT_GT(pid, 0);
  std::vector<int64_t> arrivals;
  int64_t stopped_ns = 0;
  auto events = f.Stream("/v1/completions",
                         {{"prompt", prompt},
                          {"max_tokens", 200},
                          {"temperature", 0},
                          {"ignore_eos", true},
                          {"stream", true}},
                         0, [&](int n) {
                           arrivals.push_back(MonotonicNanos());
                           if (n == 20) {
                             stopped_ns = MonotonicNanos();
                             ::kill(pid, SIGSTOP);
                           }
                         });
  ::kill(pid, SIGCONT);  // fenced already: a no-op
  std::string got;
  for (size_t i = 0; i + 1 < events.size(); ++i)
    got += json::parse(events[i])["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(got, json::parse(json(want).dump(-1, ' ', false, json::error_handler_t::replace)));
  // The client's stall: its last token before the stop to its first after.
  double gap_ms = 0, normal_ms = 0;
  for (size_t i = 1; i < arrivals.size(); ++i) {
    if (arrivals[i - 1] <= stopped_ns && arrivals[i] > stopped_ns) {
      gap_ms = (arrivals[i] - arrivals[i - 1]) * 1e-6;
    } else if (arrivals[i] <= stopped_ns) {
      normal_ms = std::max(normal_ms, (arrivals[i] - arrivals[i - 1]) * 1e-6);
    }
  }
  // Detection is the stall's larger part and has its own bound below; the
  // rest (abort, replan, the first step) takes a few steps, which on two
  // cores shared with another test can take a second more.
  EXPECT_LT(gap_ms, 3000);
  status = json::parse(f.client->Get("/admin/status")->body);
  ASSERT_EQ(status["recoveries"].size(), 1u);
  const json& r = status["recoveries"][0];
  EXPECT_EQ(r["failed_devices"], json::array({1}));
  EXPECT_NE(r["causes"][0].get<std::string>().find("no progress"), std::string::npos);
  EXPECT_TRUE(r["resumed"].get<bool>());
  // The report runs from the device's last move to the end of the first step
  // after the recovery; the client's gap from its token before to its token
  // after: the same stall, give or take a step and the HTTP hop.
  const double stall_ms = r["stall_ms"].get<double>();
  EXPECT_NEAR(stall_ms, gap_ms, 100 + 2 * normal_ms) << "client gap " << gap_ms;
  EXPECT_GE(r["detect_ms"].get<double>(), 450);
  EXPECT_LT(r["detect_ms"].get<double>(), 1000);
  double phases = 0;
  for (const char* p : {"detect_ms", "abort_ms", "replan_ms", "apply_ms", "first_step_ms"})
    phases += r[p].get<double>();
  EXPECT_LE(phases, stall_ms + 1);
  EXPECT_GT(phases, 0.9 * stall_ms);
  // /metrics shows the same recovery.
  const std::string metrics = f.client->Get("/metrics")->body;
  const std::string key = "failsafe_last_recovery_seconds{mode=\"full\"} ";
  const size_t at = metrics.find(key);
  ASSERT_NE(at, std::string::npos) << metrics;
  EXPECT_NEAR(std::stod(metrics.substr(at + key.size())), stall_ms * 1e-3, 1e-6);
}

// Streams a long request on its own thread; `started` is set at its first event.
struct Streamer {
  std::vector<std::string> events;
  std::promise<void> started;
  std::thread thread;
  Streamer(Fixture& f, int max_tokens) {
    thread = std::thread([this, &f, max_tokens] {
      bool signalled = false;
      events = f.Stream(
          "/v1/completions",
          {{"prompt", "x"}, {"max_tokens", max_tokens}, {"ignore_eos", true}, {"stream", true}}, 0,
          [&](int) {
            if (!signalled) started.set_value();
            signalled = true;
          });
      if (!signalled) started.set_value();
    });
    started.get_future().wait();
  }
  // The finish reason of the last chunk before [DONE] ("error" for an error event).
  std::string Finish() const {
    for (size_t i = events.size(); i-- > 0;) {
      if (events[i] == "[DONE]") continue;
      auto j = json::parse(events[i]);
      if (j.contains("error")) return "error";  // an error event ends the stream
      if (!j["choices"][0]["finish_reason"].is_null())
        return j["choices"][0]["finish_reason"].get<std::string>();
    }
    return "";
  }
};

// While the engine cannot serve, /health and new requests say so at once
// (503 with the reason, a capacity of 0); a request accepted before waits
// for a device to come back and completes.
TEST(Server, DuringAnOutageNewRequestsGet503AndAcceptedOnesWait) {
  Fixture f(2);
  Streamer running(f, 600);
  EXPECT_EQ(f.client->Post("/admin/devices/0/fail", "", "application/json")->status, 200);
  EXPECT_EQ(f.client->Post("/admin/devices/1/fail", "", "application/json")->status, 200);
  auto h = f.client->Get("/health");
  EXPECT_EQ(h->status, 503);
  EXPECT_FALSE(json::parse(h->body)["reason"].get<std::string>().empty());
  // A router weighting nodes by their capacity sends this one nothing.
  EXPECT_NE(f.client->Get("/metrics")->body.find("\nfailsafe_capacity_fraction 0\n"),
            std::string::npos);
  // A new request fails at once with the reason; a restored device serves.
  const int64_t t0 = MonotonicNanos();
  auto r = f.Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 4}, {"ignore_eos", true}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_LT(MonotonicNanos() - t0, 2000000000LL) << "a new request is refused at once";
  json e = json::parse(r->body)["error"];
  EXPECT_EQ(e["code"], "engine_unavailable");
  EXPECT_NE(e["message"].get<std::string>().find("alive"), std::string::npos) << r->body;
  EXPECT_EQ(f.client->Post("/admin/devices/0/restore", "", "application/json")->status, 200);
  running.thread.join();
  EXPECT_EQ(running.Finish(), "length");
  r = f.Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 4}, {"ignore_eos", true}});
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(f.client->Get("/health")->status, 200);
  EXPECT_EQ(f.Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 4}})->status, 200);
}

// With no device coming back, accepted requests end after --outage-timeout
// with an error rather than wait forever; the server keeps answering.
TEST(Server, AcceptedRequestsFailAfterTheOutageTimeout) {
  Fixture f(2, 64, 64, /*outage_timeout_ms=*/400);
  Streamer running(f, 600);
  const int64_t t0 = MonotonicNanos();
  EXPECT_EQ(f.client->Post("/admin/devices/0/fail", "", "application/json")->status, 200);
  EXPECT_EQ(f.client->Post("/admin/devices/1/fail", "", "application/json")->status, 200);
  running.thread.join();
  const double waited_s = (MonotonicNanos() - t0) * 1e-9;
  EXPECT_EQ(running.Finish(), "error");
  EXPECT_GE(waited_s, 0.4);
  EXPECT_LT(waited_s, 10.0);
  auto m = f.client->Get("/metrics");
  EXPECT_NE(m->body.find("failsafe_requests_total{finish_reason=\"error\"} 1"), std::string::npos);
  EXPECT_EQ(f.Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 4}})->status, 503);
}

}  // namespace
}  // namespace failsafe
