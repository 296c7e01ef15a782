// Status codes that mean what they say, over real HTTP on loopback: each
// error with the OpenAI body {message, type, param, code (a string)}, and the
// limits checked before a body is read.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "common/clock.h"
#include "server/test_server.h"

namespace failsafe {
namespace {

using nlohmann::json;

// The OpenAI error body, with its code as a string.
json ErrorOf(const RawResponse& r) {
  json j = json::parse(r.body, nullptr, false);
  EXPECT_TRUE(j.is_object() && j.contains("error")) << r.status << " " << r.body;
  if (!j.is_object() || !j.contains("error")) return json::object();
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << r.body;
  EXPECT_TRUE(e["type"].is_string()) << r.body;
  EXPECT_TRUE(e.contains("param")) << r.body;
  EXPECT_TRUE(e["code"].is_string()) << r.body;
  return e;
}

RawResponse Exchange(int port, const std::string& bytes) {
  RawClient c(port);
  EXPECT_TRUE(c.connected());
  EXPECT_TRUE(c.Send(bytes));
  return c.Read();
}

TEST(StatusCodes, RouteMethodAndModel) {
  TestServer s;
  // 404: no such endpoint.
  RawResponse r = Exchange(s.port(), "GET /v1/nothing HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(ErrorOf(r)["code"], "unknown_url");
  // 405: a known path, the wrong method; Allow names the right one.
  r = Exchange(s.port(), "POST /health HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(ErrorOf(r)["code"], "method_not_allowed");
  EXPECT_EQ(r.headers["allow"], "GET");
  r = Exchange(s.port(), "GET /v1/completions HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers["allow"], "POST");
  // 404 model_not_found for a model this server does not serve; its own name works.
  r = Exchange(s.port(), JsonPost("/v1/completions",
                                  R"({"model": "gpt-4", "prompt": "x", "max_tokens": 2})"));
  EXPECT_EQ(r.status, 404);
  json e = ErrorOf(r);
  EXPECT_EQ(e["code"], "model_not_found");
  EXPECT_EQ(e["param"], "model");
  r = Exchange(s.port(),
               JsonPost("/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 2})"));
  EXPECT_EQ(r.status, 200) << r.body;
  // 400 for bad input only.
  r = Exchange(s.port(), JsonPost("/v1/completions", R"({"prompt": "x", "top_p": 7})"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(ErrorOf(r)["param"], "top_p");
}

TEST(StatusCodes, ContentTypeBodyAndHeaderLimits) {
  TestServerOptions o;
  o.server.max_body_bytes = 64 << 10;
  o.server.max_header_bytes = 8 << 10;
  TestServer s(o);
  // 415: a body that says it is not JSON.
  const std::string body = R"({"prompt": "x", "max_tokens": 2})";
  RawResponse r = Exchange(s.port(),
                           "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: "
                           "application/x-www-form-urlencoded\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(r.status, 415);
  EXPECT_EQ(ErrorOf(r)["code"], "unsupported_media_type");
  // JSON with a charset, or no content type at all, is fine.
  r = Exchange(s.port(), JsonPost("/v1/completions", body));  // application/json
  EXPECT_EQ(r.status, 200);
  r = Exchange(s.port(), "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: " +
                             std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(r.status, 200);
  r = Exchange(s.port(),
               "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: "
               "application/json; charset=utf-8\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(r.status, 200);

  // 413 before the body is read: the client announces 100 MB and sends none
  // of it; the answer comes anyway, and the connection closes.
  {
    RawClient c(s.port());
    const int64_t t0 = MonotonicNanos();
    ASSERT_TRUE(
        c.Send("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: "
               "application/json\r\nContent-Length: 100000000\r\n\r\n"));
    r = c.Read(5000);
    EXPECT_EQ(r.status, 413);
    EXPECT_EQ(ErrorOf(r)["code"], "request_too_large");
    EXPECT_LT((MonotonicNanos() - t0) * 1e-9, 3.0);
    EXPECT_EQ(r.headers["connection"], "close");
  }
  // ... and a chunked body (no length up front) is cut off where it passes the limit.
  {
    RawClient c(s.port());
    ASSERT_TRUE(
        c.Send("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: "
               "application/json\r\nTransfer-Encoding: chunked\r\n\r\n"));
    const std::string piece(16 << 10, 'a');
    bool answered = false;
    for (int i = 0; i < 16 && !answered; ++i) {
      c.Send(fmt::format("{:x}\r\n{}\r\n", piece.size(), piece));
      answered = c.ReadUntil("\r\n\r\n", 50).find("HTTP/1.1 413") != std::string::npos;
    }
    EXPECT_TRUE(answered) << "no 413 after 256 KiB of a 64 KiB limit";
  }
  // 431: headers over the limit.
  r = Exchange(s.port(),
               "GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + std::string(12000, 'b') + "\r\n\r\n");
  EXPECT_EQ(r.status, 431);
  EXPECT_EQ(ErrorOf(r)["code"], "headers_too_large");
  // The server is none the worse.
  EXPECT_EQ(Exchange(s.port(), "GET /health HTTP/1.1\r\nHost: t\r\n\r\n").status, 200);
}

// The context check does not tokenize a huge prompt whole: a prompt of a
// megabyte of text against a 1024-token context is refused quickly.
TEST(StatusCodes, ContextCheckBeforeFullTokenization) {
  TestServer s;
  std::string text;
  for (int i = 0; text.size() < (1 << 20); ++i) text += "word" + std::to_string(i % 977) + " ";
  // The whole text needs far more time than the check.
  const int64_t t0 = MonotonicNanos();
  const size_t all = s.tok->Encode(text, true).size();
  const double whole_ms = (MonotonicNanos() - t0) * 1e-6;
  ASSERT_GT(all, 100000u);
  double bounded_ms = 1e9;  // the best of three: a loaded machine may pause one
  for (int i = 0; i < 3; ++i) {
    const int64_t t1 = MonotonicNanos();
    const size_t bounded = s.tok->Encode(text, true, 1024).size();
    bounded_ms = std::min(bounded_ms, (MonotonicNanos() - t1) * 1e-6);
    EXPECT_GT(bounded, 1024u);
    EXPECT_LT(bounded, 1100u);
  }
  EXPECT_LT(bounded_ms * 4, whole_ms) << "bounded " << bounded_ms << " ms, whole " << whole_ms;
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    json body = std::string(path) == "/v1/completions"
                    ? json{{"prompt", text}}
                    : json{{"messages", {{{"role", "user"}, {"content", text}}}}};
    RawResponse r = Exchange(s.port(), JsonPost(path, body.dump()));
    EXPECT_EQ(r.status, 400) << path;
    json e = ErrorOf(r);
    EXPECT_EQ(e["code"], "context_length_exceeded") << path;
    EXPECT_NE(e["message"].get<std::string>().find("more than 1024"), std::string::npos)
        << e.dump();
  }
}

// 429 at the connection limit: answered, not dropped.
TEST(StatusCodes, ConnectionLimitAnswers429) {
  TestServerOptions o;
  o.server.max_connections = 3;
  TestServer s(o);
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<RawClient>(s.port()));
    ASSERT_TRUE(held.back()->connected());
  }
  ASSERT_EQ(s.server->max_connections(), 3);
  // The server has accepted the three (a request on each proves it).
  for (auto& c : held) {
    ASSERT_TRUE(c->Send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n"));
    EXPECT_EQ(c->Read().status, 200);
  }
  RawResponse r = Exchange(s.port(), "GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(ErrorOf(r)["code"], "rate_limit_exceeded");
  held.pop_back();  // one leaves: a new client gets in
  EXPECT_GE(WaitFor(
                [&] {
                  return Exchange(s.port(), "GET /health HTTP/1.1\r\nHost: t\r\n\r\n").status ==
                         200;
                },
                3000),
            0);
}

// The memory of request bodies is bounded across connections: once the bodies
// being received reach the limit, the next large one gets 429 until one ends.
TEST(StatusCodes, BodiesInFlightAreBounded) {
  TestServerOptions o;
  o.server.max_body_bytes = 64 << 10;
  o.server.max_body_bytes_in_flight = 128 << 10;
  TestServer s(o);
  // (The waits are generous: on a loaded 2-core machine the server's threads
  // may wait seconds for a core.)
  // A valid request body of exactly 60 KiB.
  std::string body = R"({"prompt": "x", "max_tokens": 2, "user": ")";
  body += std::string((60 << 10) - body.size() - 2, 'u') + "\"}";
  ASSERT_EQ(body.size(), 60u << 10);
  const std::string request = JsonPost("/v1/completions", body);
  const size_t head = request.find("\r\n\r\n") + 4;
  RawClient a(s.port()), b(s.port());
  ASSERT_TRUE(a.Send(request.substr(0, head + 100)));  // headers and a little of the body
  ASSERT_TRUE(b.Send(request.substr(0, head + 100)));
  // Both bodies reserved before a third comes: else the third could take
  // a's place, and a, not it, would get 429.
  const int64_t held = 2 * static_cast<int64_t>(body.size());
  ASSERT_GE(WaitFor([&] { return s.server->body_bytes_in_flight() == held; }, 10000), 0);
  EXPECT_GE(WaitFor([&] { return Exchange(s.port(), request).status == 429; }, 10000), 0);
  ASSERT_TRUE(a.Send(request.substr(head + 100)));  // one body completes and is answered
  EXPECT_EQ(a.Read().status, 200);
  EXPECT_GE(WaitFor([&] { return Exchange(s.port(), request).status == 200; }, 10000), 0);
}

// 500 for a bug: a handler that throws answers 500 and the server carries on.
TEST(StatusCodes, InternalErrorIs500) {
  TestServerOptions o;
  TestServer s(o);
  // Routes can only be added before Start: a second server shares the engine.
  HttpServer extra(s.service.get(), s.tok.get(), o.server);
  extra.AddRoute({"GET", "/boom", [](const std::shared_ptr<HttpExchange>&) {
                    throw std::runtime_error("a bug in a handler");
                  }});
  ASSERT_TRUE(extra.Start().ok());
  RawResponse r = Exchange(extra.port(), "GET /boom HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(ErrorOf(r)["code"], "internal_error");
  EXPECT_EQ(Exchange(extra.port(), "GET /health HTTP/1.1\r\nHost: t\r\n\r\n").status, 200);
}

// The admin API: a token when one is set (401 without it), else loopback only.
TEST(StatusCodes, AdminToken) {
  TestServerOptions o;
  o.server.admin_token = "s3cret-token";
  TestServer s(o);
  RawResponse r = Exchange(s.port(), "GET /admin/status HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(ErrorOf(r)["type"], "authentication_error");
  r = Exchange(s.port(),
               "GET /admin/status HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer wrong\r\n\r\n");
  EXPECT_EQ(r.status, 401);
  r = Exchange(
      s.port(),
      "GET /admin/status HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer s3cret-token\r\n\r\n");
  EXPECT_EQ(r.status, 200) << r.body;
  // A bad device id is the caller's error.
  r = Exchange(s.port(),
               "POST /admin/devices/99/fail HTTP/1.1\r\nHost: t\r\nAuthorization: "
               "Bearer s3cret-token\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(r.status, 400);
}

}  // namespace
}  // namespace failsafe
