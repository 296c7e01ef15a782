// Test support for the server tests: a real server (worker processes, engine
// service, HTTP front end on a free loopback port) over a tiny synthetic
// model, an HTTP client on a raw socket for tests that need control over the
// bytes, and Prometheus text lookups.
#pragma once

#include <httplib.h>
#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/http_server.h"

namespace failsafe {

// The tiny-llama model the tests share (made once per test process).
const std::string& TestModelDir();

struct TestServerOptions {
  int devices = 4;
  int max_queue = 64;
  int max_num_seqs = 64;
  int max_batch_tokens = 256;
  int max_model_len = 1024;
  bool prefix_cache = false;
  int64_t outage_timeout_ms = 30000;  // ServiceOptions::outage_timeout_ms
  RespawnOptions respawn;             // off unless a test turns it on
  ServerOptions server;               // port 0, model "tiny", admin enabled unless changed
  TestServerOptions() {
    server.port = 0;
    server.model_name = "tiny";
    server.enable_admin = true;
  }
};

class TestServer {
 public:
  explicit TestServer(const TestServerOptions& options = {});
  ~TestServer();
  int port() const { return server->port(); }
  // A client with a generous read timeout.
  std::unique_ptr<httplib::Client> Client() const;
  httplib::Result Post(const std::string& path, const nlohmann::json& body) const;
  // GET /metrics.
  std::string Metrics() const;
  // GET /admin/status.
  nlohmann::json Status() const;

  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<EngineService> service;
  std::unique_ptr<HttpServer> server;
  std::vector<pid_t> worker_pids;  // by device id, as started
};

// The value of a metric line "name value" (name with labels, exactly), or -1.
double MetricValue(const std::string& metrics_text, const std::string& name);

// Polls `done` every 10 ms until it holds or `timeout_ms` passes; returns the
// milliseconds it took, or -1 on timeout.
double WaitFor(const std::function<bool()>& done, int timeout_ms);

// Streams a request to the server on `port`; returns the SSE data payloads
// ("[DONE]" included). stop_after > 0 drops the connection after that many
// events; `on_event` sees the count so far after each.
std::vector<std::string> StreamEvents(int port, const std::string& path, const nlohmann::json& body,
                                      int stop_after = 0,
                                      const std::function<void(int)>& on_event = {});

struct RawResponse {
  int status = 0;                              // 0: no (whole) response
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
};

// One connection on a raw socket: send any bytes, read what comes back.
class RawClient {
 public:
  explicit RawClient(int port);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;
  bool connected() const { return fd_ >= 0; }
  bool Send(const std::string& bytes);
  // Reads one whole response (Content-Length, chunked, or up to EOF).
  RawResponse Read(int timeout_ms = 10000);
  // Reads what arrives until `until` appears in everything read so far, EOF,
  // or the timeout; returns everything read so far.
  std::string ReadUntil(const std::string& until, int timeout_ms);
  // Waits for more bytes; false on EOF or timeout.
  bool ReadSome(int timeout_ms) { return Fill(timeout_ms); }
  // true once the server closed the connection (EOF seen by a read).
  bool closed_by_server() const { return eof_; }
  void Close();
  // Half-closes: the server reads end of file, this side can still read.
  void ShutdownWrite();

 private:
  bool Fill(int timeout_ms);  // reads more into buf_; false on EOF or timeout
  int fd_ = -1;
  std::string buf_;
  bool eof_ = false;
};

// A POST with a JSON body, as bytes on the wire.
std::string JsonPost(const std::string& path, const std::string& body,
                     const std::string& extra_headers = "");

}  // namespace failsafe
