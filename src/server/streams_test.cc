// Many streams at once on a fixed set of threads, overload answered with 429
// (never a dropped connection), and an orderly stop: a drain lets requests in
// flight finish, and cuts them short with an error event at its deadline.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "common/clock.h"
#include "server/test_server.h"

namespace failsafe {
namespace {

using nlohmann::json;

int ThreadCount() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

std::string StreamRequest(int max_tokens, int i) {
  return JsonPost("/v1/completions", json{{"prompt", "stream number " + std::to_string(i)},
                                          {"max_tokens", max_tokens},
                                          {"temperature", 0},
                                          {"ignore_eos", true},
                                          {"stream", true},
                                          {"stream_options", {{"include_usage", true}}}}
                                         .dump());
}

// Completion tokens a finished SSE body reports, or -1 if it did not end well.
int StreamTokens(const RawResponse& r) {
  if (r.status != 200 || r.body.find("data: [DONE]") == std::string::npos) return -1;
  const size_t at = r.body.find("\"completion_tokens\":");
  return at == std::string::npos ? -1 : std::atoi(r.body.c_str() + at + 20);
}

// Milliseconds for GET /health on a new connection; -1 if it did not answer 200.
double HealthMs(int port) {
  const int64_t t0 = MonotonicNanos();
  RawClient c(port);
  if (!c.Send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n") || c.Read(10000).status != 200) return -1;
  return (MonotonicNanos() - t0) * 1e-6;
}

// Hundreds of streams at once: all held and served on the server's threads,
// with /health and /metrics answering while they are open.
TEST(Streams, HundredsAtOnceOnAFixedSetOfThreads) {
  constexpr int kStreams = 300;
  TestServerOptions o;
  o.devices = 2;
  o.max_num_seqs = 16;
  o.max_queue = kStreams;
  TestServer s(o);
  const int threads = ThreadCount();
  // A device holds still while the streams open, so that all are open at
  // once (the first step stalls; the rest queue behind it).
  ASSERT_GT(s.worker_pids[0], 0);
  ASSERT_EQ(::kill(s.worker_pids[0], SIGSTOP), 0);
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.push_back(std::make_unique<RawClient>(s.port()));
    ASSERT_TRUE(clients.back()->connected());
    ASSERT_TRUE(clients.back()->Send(StreamRequest(12, i)));
  }
  // (/metrics counts itself in flight too.)
  const double open_ms = WaitFor(
      [&] { return MetricValue(s.Metrics(), "failsafe_http_requests_in_flight") >= kStreams + 1; },
      5000);
  double worst_ms = 0;
  for (int i = 0; i < 5; ++i) {
    const double ms = HealthMs(s.port());
    worst_ms = std::max(worst_ms, ms < 0 ? 1e9 : ms);  // no answer: worst of all
  }
  const int threads_open = ThreadCount();
  ::kill(s.worker_pids[0], SIGCONT);
  EXPECT_GE(open_ms, 0) << "the server never held all " << kStreams << " streams at once";
  EXPECT_EQ(threads_open, threads);
  EXPECT_LT(worst_ms, 500) << "/health while " << kStreams << " streams are open";
  // Every stream is served whole.
  int served = 0;
  for (auto& c : clients) served += StreamTokens(c->Read(60000)) == 12;
  EXPECT_EQ(served, kStreams);
  EXPECT_EQ(ThreadCount(), threads);
}

// More clients than running slots and queue: every one gets an answer, 200
// or 429 with an error body; none is dropped.
TEST(Streams, OverloadIsAnswered429NeverDropped) {
  constexpr int kClients = 120;
  TestServerOptions o;
  o.devices = 2;
  o.max_num_seqs = 4;
  o.max_queue = 8;
  TestServer s(o);
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<RawClient>(s.port()));
    ASSERT_TRUE(clients.back()->Send(StreamRequest(40, i)));
  }
  int ok = 0, refused = 0, other = 0;
  for (auto& c : clients) {
    RawResponse r = c->Read(60000);
    if (StreamTokens(r) == 40) {
      ++ok;
    } else if (r.status == 429 &&
               json::parse(r.body, nullptr, false)["error"]["code"] == "rate_limit_exceeded") {
      ++refused;
    } else {
      ++other;
    }
  }
  EXPECT_EQ(other, 0);
  EXPECT_GE(ok, 4);
  EXPECT_GE(refused, kClients - 4 - 8 - 8);  // a step may free slots while they arrive
  EXPECT_EQ(ok + refused, kClients);
}

// A drain stops accepting and lets streams in flight finish whole.
TEST(Streams, DrainLetsStreamsFinish) {
  TestServer s;
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(std::make_unique<RawClient>(s.port()));
    ASSERT_TRUE(clients.back()->Send(StreamRequest(150, i)));
    ASSERT_NE(clients.back()->ReadUntil("data: ", 10000).find("data: "), std::string::npos);
  }
  RawClient idle(s.port());  // a keep-alive connection with nothing in flight
  ASSERT_TRUE(idle.Send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_EQ(idle.Read().status, 200);
  int cut = -1;
  std::thread drain([&] { cut = s.server->Drain(30000); });
  // New connections are refused; the idle one is closed.
  EXPECT_GE(WaitFor([&] { return !RawClient(s.port()).connected(); }, 2000), 0);
  EXPECT_FALSE(idle.ReadSome(2000));
  EXPECT_TRUE(idle.closed_by_server());
  for (auto& c : clients) EXPECT_EQ(StreamTokens(c->Read(30000)), 150);
  drain.join();
  EXPECT_EQ(cut, 0);
}

// At the drain deadline a stream still going ends with an error event, and
// its request is cancelled in the engine.
TEST(Streams, DrainDeadlineCutsStreamsShort) {
  TestServer s;
  RawClient c(s.port());
  ASSERT_TRUE(c.Send(StreamRequest(1000, 0)));
  ASSERT_NE(c.ReadUntil("data: ", 10000).find("data: "), std::string::npos);
  const int64_t t0 = MonotonicNanos();
  EXPECT_EQ(s.server->Drain(200), 1);
  EXPECT_LT((MonotonicNanos() - t0) * 1e-9, 5.0);
  RawResponse r = c.Read(5000);
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("server_shutting_down"), std::string::npos) << r.body.substr(0, 300);
  EXPECT_NE(r.body.find("data: [DONE]"), std::string::npos);
  EXPECT_GE(WaitFor(
                [&] {
                  return MetricValue(s.service->metrics().Render("failsafe"),
                                     "failsafe_requests_total{finish_reason=\"abort\"}") == 1;
                },
                5000),
            0);
}

}  // namespace
}  // namespace failsafe
