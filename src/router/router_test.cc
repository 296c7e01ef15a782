// The fleet router over in-process nodes (each a real engine with device
// processes and its own HTTP server): streams and answers as a node gives
// them, and a node that dies mid-stream costs the client nothing: the stream
// goes on, on another node, with the fault-free text. Real `serve` processes
// killed, stopped and restarted: tests/python/fleet_router.py.
#include "router/router.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <csignal>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "server/test_server.h"

namespace failsafe {
namespace {

using json = nlohmann::json;

RouterOptions Options(const std::vector<const TestServer*>& nodes) {
  RouterOptions o;
  for (const TestServer* n : nodes) o.nodes.push_back("127.0.0.1:" + std::to_string(n->port()));
  o.server.port = 0;
  o.pool.health_interval_ms = 100;
  o.pool.health_timeout_ms = 500;
  return o;
}

struct StreamResult {
  std::string text;
  std::vector<int> ids;  // when asked for
  std::set<std::string> response_ids;
  int completion_tokens = -1;
  bool done = false, error = false;
  bool role_twice = false;
  std::string tool_calls;  // name(arguments) of each call (call ids differ between nodes)
  std::string finish;
};

StreamResult Collect(const std::vector<std::string>& events, bool chat) {
  StreamResult r;
  int roles = 0;
  for (const std::string& e : events) {
    if (e == "[DONE]") {
      r.done = true;
      continue;
    }
    json j = json::parse(e);
    if (j.contains("error")) r.error = true;
    if (j.contains("id")) r.response_ids.insert(j["id"].get<std::string>());
    if (j.contains("usage") && j["usage"].is_object())
      r.completion_tokens = j["usage"]["completion_tokens"];
    if (!j.contains("choices")) continue;
    for (const json& c : j["choices"]) {
      if (chat) {
        if (c["delta"].contains("role")) ++roles;
        if (c["delta"].contains("content")) r.text += c["delta"]["content"].get<std::string>();
      } else {
        r.text += c["text"].get<std::string>();
      }
      if (chat && c["delta"].contains("tool_calls")) {
        for (const json& t : c["delta"]["tool_calls"]) {
          r.tool_calls += t["function"]["name"].get<std::string>() + "(" +
                          t["function"]["arguments"].get<std::string>() + ")";
        }
      }
      if (c.contains("finish_reason") && !c["finish_reason"].is_null())
        r.finish = c["finish_reason"];
      if (c.contains("token_ids"))
        for (int t : c["token_ids"]) r.ids.push_back(t);
    }
  }
  r.role_twice = roles > 1;
  return r;
}

json Completion(bool chat, double temperature, int max_tokens) {
  json b = {{"max_tokens", max_tokens},
            {"temperature", temperature},
            {"ignore_eos", true},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}}};
  if (chat) {
    b["messages"] = {{{"role", "user"}, {"content", "Tell a story about a node that failed."}}};
  } else {
    b["prompt"] = "Once upon a time a node failed and";
  }
  if (temperature > 0) b["seed"] = 11;
  return b;
}

// Strikes the node of two (a, b) that has the router's one request in
// flight, once, at the client's `at`-th event of the stream. On a loaded
// machine the node may finish the stream, and the router relay all of it,
// before the client reads that far: then nothing is struck (missed()), and
// a test that counts the stream's move runs it again, kTries times at most.
class StrikeServing {
 public:
  static constexpr int kTries = 3;
  StrikeServing(const FleetRouter& router, TestServer& a, TestServer& b, int at,
                std::function<void(TestServer&)> strike)
      : router_(router), a_(a), b_(b), at_(at), strike_(std::move(strike)) {}
  // StreamEvents' callback.
  std::function<void(int)> OnEvent() {
    return [this](int n) {
      if (n != at_ || struck_ || missed_) return;
      const std::vector<NodeSnapshot> nodes = router_.Nodes();
      TestServer* serving = nodes[0].in_flight > 0 ? &a_ : nodes[1].in_flight > 0 ? &b_ : nullptr;
      if (!serving) {
        missed_ = true;
        return;
      }
      strike_(*serving);
      struck_ = true;
    };
  }
  bool struck() const { return struck_; }
  bool missed() const { return missed_; }

 private:
  const FleetRouter& router_;
  TestServer &a_, &b_;
  const int at_;
  std::function<void(TestServer&)> strike_;
  bool struck_ = false, missed_ = false;
};

void StopServer(TestServer& node) { node.server->Stop(); }

// Times requests left a node for another, whatever the cause.
int64_t Resumed(const FleetRouter& router) {
  int64_t n = 0;
  for (const auto& r : router.counters().resumed) n += r;
  return n;
}

std::string Path(bool chat) { return chat ? "/v1/chat/completions" : "/v1/completions"; }

TEST(FleetRouter, StreamsAndAnswersAsANodeDoes) {
  TestServerOptions two;
  two.devices = 2;
  TestServer a(two), b(two);
  FleetRouter router(Options({&a, &b}));
  ASSERT_TRUE(router.Start().ok());
  for (bool chat : {false, true}) {
    const json body = Completion(chat, 0.8, 24);
    const StreamResult direct = Collect(StreamEvents(a.port(), Path(chat), body), chat);
    const StreamResult routed = Collect(StreamEvents(router.port(), Path(chat), body), chat);
    ASSERT_TRUE(direct.done);
    EXPECT_TRUE(routed.done);
    EXPECT_FALSE(routed.error);
    EXPECT_EQ(routed.text, direct.text);
    EXPECT_EQ(routed.completion_tokens, 24);
    EXPECT_TRUE(routed.ids.empty()) << "ids the client did not ask for";
    EXPECT_EQ(routed.response_ids.size(), 1u);
    // Not streamed: the node's answer as it is.
    json whole = body;
    whole["stream"] = false;
    whole.erase("stream_options");
    httplib::Client c("127.0.0.1", router.port());
    auto r = c.Post(Path(chat), whole.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    const json j = json::parse(r->body);
    EXPECT_EQ(chat ? j["choices"][0]["message"]["content"] : j["choices"][0]["text"], direct.text);
  }
  // A request the nodes refuse is refused as they refuse it, and not retried.
  httplib::Client c("127.0.0.1", router.port());
  auto bad = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": -1})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("max_tokens"), std::string::npos);
  auto odd = c.Post("/v1/completions", R"({"prompt": "x", "stream": "yes", "echo": 1})",
                    "application/json");
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->status, 400) << odd->body;
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny");
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(json::parse(health->body)["nodes_healthy"], 2);
  for (int i = 0; i < static_cast<int>(ResumeCause::kCount); ++i)
    EXPECT_EQ(router.counters().resumed[i], 0) << ResumeCauseName(static_cast<ResumeCause>(i));
}

// The node a stream is on stops (its server closes every connection) after
// some tokens: the stream goes on elsewhere with the same text, one id, the
// assistant's role once, and usage counted as for one request.
TEST(FleetRouter, AStreamWhoseNodeDiesGoesOnElsewhereWithTheSameText) {
  TestServerOptions two, three;
  two.devices = 2;
  three.devices = 3;
  for (bool chat : {false, true}) {
    for (double temperature : {0.0, 0.8}) {
      for (int attempt = 1;; ++attempt) {
        SCOPED_TRACE(testing::Message()
                     << "chat " << chat << " t " << temperature << " attempt " << attempt);
        TestServer a(two), b(three), reference(two);
        FleetRouter router(Options({&a, &b}));
        ASSERT_TRUE(router.Start().ok());
        json body = Completion(chat, temperature, 40);
        body["return_token_ids"] = true;
        const StreamResult direct = Collect(StreamEvents(reference.port(), Path(chat), body), chat);
        ASSERT_TRUE(direct.done);
        StrikeServing stop(router, a, b, 12, StopServer);
        const auto events = StreamEvents(router.port(), Path(chat), body, 0, stop.OnEvent());
        if (stop.missed() && attempt < StrikeServing::kTries) continue;
        const StreamResult routed = Collect(events, chat);
        EXPECT_TRUE(stop.struck());
        EXPECT_TRUE(routed.done);
        EXPECT_FALSE(routed.error);
        EXPECT_EQ(routed.text, direct.text);
        EXPECT_EQ(routed.ids, direct.ids);
        EXPECT_EQ(routed.completion_tokens, 40);
        EXPECT_EQ(routed.response_ids.size(), 1u);
        EXPECT_FALSE(routed.role_twice);
        EXPECT_EQ(Resumed(router), 1);
        break;
      }
    }
  }
}

// A sampled stream without a seed is given one, so that it too goes on with
// the tokens it would have had; with no node left, a clear error.
TEST(FleetRouter, UnseededStreamsResumeAndNoNodeLeftIsAnError) {
  TestServerOptions two;
  two.devices = 2;
  TestServer a(two), b(two);
  FleetRouter router(Options({&a, &b}));
  ASSERT_TRUE(router.Start().ok());
  json body = Completion(false, 1.0, 30);
  body.erase("seed");
  // (Whether or not the stream ended before the stop, it ends whole.)
  StrikeServing stop(router, a, b, 10, StopServer);
  const StreamResult r =
      Collect(StreamEvents(router.port(), "/v1/completions", body, 0, stop.OnEvent()), false);
  EXPECT_TRUE(r.done);
  EXPECT_FALSE(r.error);
  EXPECT_EQ(r.completion_tokens, 30);
  a.server->Stop();
  b.server->Stop();
  ASSERT_GE(WaitFor(
                [&] {
                  return router.Nodes()[0].state == NodeState::kDown &&
                         router.Nodes()[1].state == NodeState::kDown;
                },
                5000),
            0);
  httplib::Client c("127.0.0.1", router.port());
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  auto refused = c.Post("/v1/completions", Completion(false, 0, 5).dump(), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_NE(refused->body.find("no node is available"), std::string::npos);
  json plain = {{"prompt", "x"}, {"max_tokens", 3}};
  auto r503 = c.Post("/v1/completions", plain.dump(), "application/json");
  ASSERT_TRUE(r503);
  EXPECT_EQ(r503->status, 503);
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(MetricValue(metrics->body, "failsafe_router_nodes_healthy"), 0);
  EXPECT_GE(MetricValue(metrics->body, "failsafe_router_requests_failed_total"), 2);
}

// A node whose devices all stop (SIGSTOP) keeps its connections and its
// health checks but sends no token: past the stall deadline the stream moves.
// The floor is far above a healthy node's gap between tokens even on a
// loaded machine, so that the stream moves once: for the stop.
TEST(FleetRouter, AStreamWithNoTokenWithinItsDeadlineMoves) {
  TestServerOptions two;
  two.devices = 2;
  for (int attempt = 1;; ++attempt) {
    SCOPED_TRACE(testing::Message() << "attempt " << attempt);
    TestServer a(two), b(two), reference(two);
    RouterOptions o = Options({&a, &b});
    o.stall_floor_ms = 1500;
    FleetRouter router(o);
    ASSERT_TRUE(router.Start().ok());
    const json body = Completion(true, 0.7, 40);
    const StreamResult direct = Collect(StreamEvents(reference.port(), Path(true), body), true);
    std::vector<pid_t> stopped;
    StrikeServing freeze(router, a, b, 10, [&](TestServer& node) {
      for (pid_t p : node.worker_pids) {
        ::kill(p, SIGSTOP);
        stopped.push_back(p);
      }
    });
    const auto events = StreamEvents(router.port(), Path(true), body, 0, freeze.OnEvent());
    for (pid_t p : stopped) ::kill(p, SIGCONT);
    if (freeze.missed() && attempt < StrikeServing::kTries) continue;
    const StreamResult routed = Collect(events, true);
    EXPECT_TRUE(routed.done);
    EXPECT_EQ(routed.text, direct.text);
    EXPECT_EQ(routed.completion_tokens, 40);
    EXPECT_EQ(router.counters().resumed[static_cast<int>(ResumeCause::kStall)], 1);
    break;
  }
}

// A forced tool call is held back by the node until it is whole; the ids
// still flow, so a node that dies under it costs nothing: the answer comes
// whole from the next node, the same as without a failure.
TEST(FleetRouter, AToolCallHeldBackWhenItsNodeDiesComesWhole) {
  TestServerOptions two;
  two.devices = 2;
  TestServer reference(two);
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "weather", "parameters": {"type": "object",
     "properties": {"city": {"type": "string", "maxLength": 12},
     "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}])");
  const json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Bern?"}}}},
                     {"tools", tools},
                     {"tool_choice", "required"},
                     {"max_tokens", 120},
                     {"temperature", 0.7},
                     {"seed", 9},
                     {"stream", true},
                     {"return_token_ids", true}};
  const StreamResult direct = Collect(StreamEvents(reference.port(), Path(true), body), true);
  ASSERT_TRUE(direct.done);
  // The whole answer comes at the end: a call, or (cut at max_tokens) text.
  ASSERT_FALSE(direct.tool_calls.empty() && direct.text.empty());
  for (int attempt = 1;; ++attempt) {
    SCOPED_TRACE(testing::Message() << "attempt " << attempt);
    TestServer a(two), b(two);
    FleetRouter router(Options({&a, &b}));
    ASSERT_TRUE(router.Start().ok());
    StrikeServing stop(router, a, b, 8, StopServer);
    const auto events = StreamEvents(router.port(), Path(true), body, 0, stop.OnEvent());
    if (stop.missed() && attempt < StrikeServing::kTries) continue;
    const StreamResult routed = Collect(events, true);
    EXPECT_TRUE(stop.struck());
    EXPECT_TRUE(routed.done);
    EXPECT_EQ(routed.tool_calls, direct.tool_calls);
    EXPECT_EQ(routed.text, direct.text);
    EXPECT_EQ(routed.ids, direct.ids);
    EXPECT_EQ(routed.finish, direct.finish);
    EXPECT_EQ(Resumed(router), 1);
    break;
  }
}

// A stream of several choices (n, or a list of prompts) whose node dies goes
// again from the start on another node: each choice's tokens already sent
// are produced again, checked and dropped, so every choice's text, role and
// finish come once and usage counts the whole request.
TEST(FleetRouter, AStreamOfSeveralChoicesGoesOnWithEachChoicesText) {
  TestServerOptions two;
  two.devices = 2;
  struct Case {
    std::string path;
    json body;
  };
  json completions = Completion(false, 0.9, 30);
  completions["n"] = 3;
  json prompts = Completion(false, 0, 25);
  prompts["prompt"] = {"A first prompt", "and a second one"};
  prompts["n"] = 2;
  json chat = Completion(true, 0.8, 30);
  chat["n"] = 2;
  chat.erase("seed");  // the router gives it one
  for (const Case& k : {Case{"/v1/completions", completions}, Case{"/v1/completions", prompts},
                        Case{"/v1/chat/completions", chat}}) {
    const bool is_chat = k.path == "/v1/chat/completions";
    // Per choice index: text, roles, finishes; and the usage.
    auto collect = [&](const std::vector<std::string>& events) {
      std::map<int, std::string> text;
      std::map<int, int> roles, finishes;
      int tokens = -1;
      bool done = false;
      for (const std::string& e : events) {
        if (e == "[DONE]") {
          done = true;
          continue;
        }
        const json j = json::parse(e);
        EXPECT_FALSE(j.contains("error")) << e;
        if (j.contains("usage") && j["usage"].is_object()) tokens = j["usage"]["completion_tokens"];
        for (const json& c : j.value("choices", json::array())) {
          const int i = c["index"];
          if (is_chat) {
            roles[i] += c["delta"].contains("role");
            text[i] += c["delta"].value("content", "");
          } else {
            text[i] += c["text"].get<std::string>();
          }
          finishes[i] += !c["finish_reason"].is_null();
        }
      }
      return std::make_tuple(text, roles, finishes, tokens, done);
    };
    for (int attempt = 1;; ++attempt) {
      SCOPED_TRACE(testing::Message() << "attempt " << attempt);
      TestServer a(two), b(two);
      FleetRouter router(Options({&a, &b}));
      ASSERT_TRUE(router.Start().ok());
      // Through the router, the serving node stopped at the 25th event (an
      // unseeded body gets the router's own seed: only a seeded one is
      // compared with a node's answer, below).
      StrikeServing stop(router, a, b, 25, StopServer);
      const auto events = StreamEvents(router.port(), k.path, k.body, 0, stop.OnEvent());
      if (stop.missed() && attempt < StrikeServing::kTries) continue;
      const auto [text, roles, finishes, tokens, done] = collect(events);
      EXPECT_TRUE(done) << k.path;
      const bool listed = k.body.contains("prompt") && k.body["prompt"].is_array();
      const int choices = k.body["n"].get<int>() * (listed ? 2 : 1);
      ASSERT_EQ(static_cast<int>(text.size()), choices) << k.path;
      for (const auto& [i, f] : finishes) EXPECT_EQ(f, 1) << k.path << " choice " << i;
      if (is_chat) {
        for (const auto& [i, r] : roles) EXPECT_EQ(r, 1) << "choice " << i;
      }
      EXPECT_EQ(tokens, choices * k.body["max_tokens"].get<int>()) << k.path;
      EXPECT_EQ(Resumed(router), 1) << k.path;
      if (k.body.contains("seed")) {
        // The same request to a node directly: the same text for every choice.
        TestServer reference(two);
        const auto [want, r2, f2, t2, d2] = collect(StreamEvents(reference.port(), k.path, k.body));
        EXPECT_EQ(text, want) << k.path;
      }
      break;
    }
  }
}

}  // namespace
}  // namespace failsafe
