// One HTTP request and its response, as route handlers see it: the request
// (read whole, within the server's limits), and a way to answer it once, either
// whole or as a stream of chunks.
//
// An exchange ends when the handler ends it (Reply, or EndStream after
// StartStream), or when it is aborted: the client went away (noticed at once,
// whatever the handler is doing: a read stays pending on the socket for as long
// as the exchange lasts) or the server stops. The abort callback runs once, on
// the connection's strand; a handler cancels its work there.
//
// Thread-safety: every method may be called from any thread; calls made from
// one thread keep their order. Calls after the exchange ended do nothing.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace failsafe {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query string
  std::string query;   // after '?', if any
  std::string body;
  std::string remote_address;
  bool remote_loopback = false;
  std::vector<std::string> path_params;  // the {params} of the matched route, in order
  // Header values by lower-case name (a header given twice keeps the last).
  std::vector<std::pair<std::string, std::string>> headers;
  // A header's value, or "" when absent.
  std::string_view Header(std::string_view lower_case_name) const;
};

enum class AbortCause {
  kClientGone,      // the client closed the connection or stopped reading
  kServerStopping,  // the server stops (drain timeout or shutdown)
};

class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  // Valid for the exchange's lifetime; read-only.
  virtual const HttpRequest& request() const = 0;

  // A whole response; ends the exchange. `extra_headers` are (name, value).
  virtual void Reply(int status, std::string body, std::string content_type = "application/json",
                     std::vector<std::pair<std::string, std::string>> extra_headers = {}) = 0;
  // Starts a chunked response (the status and headers go out now); then Write
  // any number of times and EndStream once.
  virtual void StartStream(int status, std::string content_type,
                           std::vector<std::pair<std::string, std::string>> extra_headers = {}) = 0;
  virtual void Write(std::string data) = 0;
  virtual void EndStream() = 0;

  // `fn` runs once if the exchange is aborted before it ends. Set it before
  // starting work that must be cancelled; on kServerStopping the handler may
  // still answer (Reply, or Write and EndStream) from inside `fn`.
  virtual void OnAbort(std::function<void(AbortCause)> fn) = 0;
  // Runs `fn` on the connection's strand (never inline), unless the exchange
  // is over by then: handlers hop back here from other threads.
  virtual void Post(std::function<void()> fn) = 0;
  // Runs `fn` on the server's work pool (for CPU-heavy work such as
  // tokenizing a prompt), never on an I/O thread.
  virtual void Offload(std::function<void()> fn) = 0;
};

using HttpHandler = std::function<void(const std::shared_ptr<HttpExchange>&)>;

}  // namespace failsafe
