// A client that leaves is noticed at once whatever its request is doing
// (queued, waiting for a first token on a hung device, generating a
// non-streaming answer, streaming), and its request is cancelled in the engine,
// which frees its KV within a step.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/clock.h"
#include "server/test_server.h"

namespace failsafe {
namespace {

using nlohmann::json;

double Disconnects(const TestServer& s) {
  return MetricValue(s.Metrics(), "failsafe_http_client_disconnects_total");
}

double Aborted(const TestServer& s) {
  return std::max(0.0,
                  MetricValue(s.Metrics(), "failsafe_requests_total{finish_reason=\"abort\"}"));
}

// No request running or waiting, and no KV held on any device.
bool EngineIdle(const TestServer& s) {
  json st = s.Status();
  if (!st.is_object() || st["running"] != 0 || st["waiting"] != 0) return false;
  for (const json& d : st["devices"]) {
    if (d["kv_used_pages"] != 0) return false;
  }
  return true;
}

std::string Completion(int max_tokens, bool stream) {
  return JsonPost("/v1/completions", json{{"prompt", "The engine keeps serving"},
                                          {"max_tokens", max_tokens},
                                          {"ignore_eos", true},
                                          {"stream", stream}}
                                         .dump());
}

// Closes `c` and returns how long the server took to count the client gone.
double CloseAndTimeNotice(RawClient& c, const TestServer& s, double before) {
  const int64_t t0 = MonotonicNanos();
  c.Close();
  const double waited = WaitFor([&] { return Disconnects(s) >= before + 1; }, 5000);
  return waited < 0 ? -1 : (MonotonicNanos() - t0) * 1e-6;
}

TEST(Disconnect, WhileQueued) {
  TestServerOptions o;
  o.max_num_seqs = 1;  // one runs, the next waits
  TestServer s(o);
  RawClient running(s.port());
  ASSERT_TRUE(running.Send(Completion(1000, true)));
  ASSERT_NE(running.ReadUntil("data: ", 10000).find("data: "), std::string::npos);
  RawClient queued(s.port());
  ASSERT_TRUE(queued.Send(Completion(50, true)));
  ASSERT_GE(WaitFor([&] { return s.Status()["waiting"] == 1; }, 5000), 0);
  const double noticed_ms = CloseAndTimeNotice(queued, s, 0);
  EXPECT_GE(noticed_ms, 0);
  EXPECT_LT(noticed_ms, 1000);
  // Gone from the queue; the running request carries on.
  EXPECT_GE(WaitFor([&] { return s.Status()["waiting"] == 0 && Aborted(s) == 1; }, 2000), 0);
  EXPECT_EQ(s.Status()["running"], 1);
  EXPECT_TRUE(running.ReadSome(2000));  // still streaming
  running.Close();
  EXPECT_GE(WaitFor([&] { return EngineIdle(s); }, 5000), 0);
  EXPECT_EQ(Aborted(s), 2);
}

// A device hangs (SIGSTOP): the step stalls and the request waits for its
// first token. The client's departure is noticed while the engine is stuck;
// once the device continues, the request is dropped within a step.
TEST(Disconnect, WhileWaitingForTheFirstTokenOnAHungDevice) {
  TestServer s;
  ASSERT_GT(s.worker_pids[1], 0);
  ASSERT_EQ(::kill(s.worker_pids[1], SIGSTOP), 0);
  RawClient c(s.port());
  ASSERT_TRUE(c.Send(Completion(50, true)));
  // Nothing comes back: no first token, so not even the status line yet.
  EXPECT_EQ(c.ReadUntil("HTTP/1.1", 300).find("HTTP/1.1"), std::string::npos);
  const double noticed_ms = CloseAndTimeNotice(c, s, 0);
  ::kill(s.worker_pids[1], SIGCONT);
  EXPECT_GE(noticed_ms, 0);
  EXPECT_LT(noticed_ms, 1000);
  EXPECT_GE(WaitFor([&] { return EngineIdle(s) && Aborted(s) == 1; }, 5000), 0);
  // The engine serves the next request.
  auto r = s.Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 3}, {"ignore_eos", true}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(Disconnect, WhileGeneratingANonStreamingAnswer) {
  TestServer s;
  RawClient c(s.port());
  ASSERT_TRUE(c.Send(Completion(1000, false)));
  ASSERT_GE(WaitFor([&] { return s.Status()["running"] == 1; }, 5000), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double noticed_ms = CloseAndTimeNotice(c, s, 0);
  EXPECT_GE(noticed_ms, 0);
  EXPECT_LT(noticed_ms, 1000);
  EXPECT_GE(WaitFor([&] { return EngineIdle(s) && Aborted(s) == 1; }, 2000), 0);
  // It was cut short: fewer tokens than asked for were generated.
  EXPECT_LT(MetricValue(s.Metrics(), "failsafe_generation_tokens_total"), 1000);
}

TEST(Disconnect, WhileStreaming) {
  TestServer s;
  RawClient c(s.port());
  ASSERT_TRUE(c.Send(Completion(1000, true)));
  const std::string got = c.ReadUntil("data: ", 10000);
  ASSERT_NE(got.find("HTTP/1.1 200"), std::string::npos);
  const double noticed_ms = CloseAndTimeNotice(c, s, 0);
  EXPECT_GE(noticed_ms, 0);
  EXPECT_LT(noticed_ms, 1000);
  EXPECT_GE(WaitFor([&] { return EngineIdle(s) && Aborted(s) == 1; }, 2000), 0);
}

// A client that half-closes once it has read its answer, while the server's
// event loop is still busy with that exchange, is closed by the server at once
// rather than at the idle timeout: its end of file reached the server's watch
// read, and a later read of the socket would never be told of it again.
TEST(Disconnect, HalfCloseAfterTheAnswerIsNoticed) {
  TestServerOptions o;
  o.server.idle_timeout_ms = 60000;
  TestServer s(o);
  HttpServer slow(s.service.get(), s.tok.get(), o.server);
  slow.AddRoute({"GET", "/slow", [](const std::shared_ptr<HttpExchange>& ex) {
                   ex->Reply(200, "done", "text/plain");
                   // The answer is on the wire; its completion waits behind this.
                   std::this_thread::sleep_for(std::chrono::milliseconds(300));
                 }});
  ASSERT_TRUE(slow.Start().ok());
  RawClient c(slow.port());
  ASSERT_TRUE(c.Send("GET /slow HTTP/1.1\r\nHost: t\r\n\r\n"));
  RawResponse r = c.Read(10000);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "done");
  c.ShutdownWrite();
  const int64_t t0 = MonotonicNanos();
  while (!c.closed_by_server() && (MonotonicNanos() - t0) < int64_t{20} * 1000000000) {
    c.ReadSome(1000);
  }
  EXPECT_TRUE(c.closed_by_server());
  EXPECT_LT((MonotonicNanos() - t0) * 1e-9, 10.0) << "closed only by the idle timeout";
}

}  // namespace
}  // namespace failsafe
