// The HTTP front end: OpenAI-compatible endpoints, health, metrics, and the
// admin API for failure injection, over event-driven I/O (Boost.Beast on
// Asio): a fixed number of I/O threads holds any number of connections, so a
// thousand open streams cost memory, not threads, and /health answers while
// they are open. CPU-heavy request work (parsing, tokenizing) runs on a small
// work pool, admin calls on a thread of their own; nothing on an I/O thread
// waits for the engine.
//
// Overload is answered, never dropped: a full engine queue gets 429, and so
// does a connection beyond max_connections (answered at once and closed).
// The open-file limit is raised as far as the hard limit allows; Start warns
// when it is too low for max_connections and lowers the maximum to fit.
//
// Thread-safety: Start first, from one thread. Drain and Stop may then be
// called from any thread, also together (a Stop cuts a Drain short), and while
// every I/O thread is busy: they never wait on one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "model/tokenizer.h"
#include "server/engine_service.h"
#include "server/router.h"

namespace boost::asio {
class io_context;
}

namespace failsafe {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port
  std::string model_name = "failsafe";
  bool enable_admin = false;  // /admin/* endpoints
  // If set, admin calls need "Authorization: Bearer TOKEN"; else loopback
  // clients only.
  std::string admin_token;
  int io_threads = 2;                // event loops; connections are spread over them
  int work_threads = 2;              // request parsing and tokenization
  int max_connections = 4096;        // open at once; more get 429 (lowered to fit the fd limit)
  int64_t max_body_bytes = 4 << 20;  // 413 beyond (checked before the body is read)
  // Request bodies held at once (announced lengths; a chunked body counts as
  // max_body_bytes) from the header until the answer: beyond, 429.
  int64_t max_body_bytes_in_flight = 256 << 20;
  int max_header_bytes = 16 << 10;   // 431 beyond
  int64_t idle_timeout_ms = 60000;   // a connection with no request in flight closes
  int64_t read_timeout_ms = 60000;   // for a request's body to arrive
  int64_t write_timeout_ms = 60000;  // a client that reads nothing this long has left
};

class HttpServer {
 public:
  // `service` and `tokenizer` must outlive the server. Without them (null)
  // the server has only the routes added with AddRoute.
  HttpServer(EngineService* service, const Tokenizer* tokenizer, const ServerOptions& options);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // More routes (an embedding program's own), before Start.
  void AddRoute(Route route);
  // The event loop the connections run on (io_threads threads from Start
  // until Stop): an embedding program may run its own I/O on it (the fleet
  // router's connections to its nodes), and must end that work before Stop.
  boost::asio::io_context& io_context();
  // Binds and starts serving on background threads.
  Status Start();
  int port() const;
  // The connection maximum in force (max_connections, or less to fit the
  // open-file limit).
  int max_connections() const;
  // Bytes of request bodies the connections hold now (reserved when a
  // body's headers are read, up to max_body_bytes_in_flight).
  int64_t body_bytes_in_flight() const;

  // Stops accepting (the listening socket closes), closes idle connections,
  // lets requests in flight finish for up to timeout_ms, then stops.
  // Returns how many requests were still in flight and had to be cut short.
  int Drain(int64_t timeout_ms);
  // Stops now: requests in flight are cancelled in the engine (a stream gets
  // no end, a waiting request 503), connections close, threads are joined.
  // Idempotent.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace failsafe
