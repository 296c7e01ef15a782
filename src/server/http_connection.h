// One client connection of the HTTP front end (Boost.Beast over Asio): reads
// requests one at a time within the server's limits, routes them, writes the
// answers, and notices a client that leaves while its request is in flight.
//
// A request's header is checked before its body is read: unknown route (404),
// wrong method (405), content type (415), body size (413, from Content-Length
// or as a chunked body arrives), header size (431), and 503 while the server
// drains. A request answered before its body was read closes the connection
// after a lingering read, so the client sees the answer rather than a reset.
//
// While an exchange is in flight a read stays pending on the socket: end of
// file or an error there means the client left, and the exchange is aborted at
// once (also while the handler waits for the engine). A client that does not
// read what is written for write_timeout_ms is gone too.
//
// Thread-safety: everything runs on the connection's strand; the HttpExchange
// methods and Drain/Stop may be called from any thread (they hop onto it).
#pragma once

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "server/api_error.h"
#include "server/http_exchange.h"
#include "server/http_metrics.h"
#include "server/http_server.h"
#include "server/router.h"

namespace failsafe {

class HttpConnection;

// What the connections of one server share, the event loop included. The
// server and every connection hold it, so a connection that outlives the
// server (kept by a request the engine has not finished) stays valid: its
// handlers simply never run again.
struct ServerShared {
  explicit ServerShared(int io_threads) : io(io_threads) {}
  boost::asio::io_context io;
  ServerOptions options;  // constant after start
  Router router;          // constant after start
  HttpMetrics metrics;
  // CPU-heavy handler work; null once the server stopped.
  std::atomic<boost::asio::thread_pool*> work{nullptr};
  std::atomic<bool> draining{false};
  // Bytes of request bodies that may still be taken in (max_body_bytes_in_flight
  // less what connections hold).
  std::atomic<int64_t> body_budget{0};

  std::mutex mu;
  std::condition_variable changed;  // an exchange ended or a connection closed
  std::unordered_map<uint64_t, std::weak_ptr<HttpConnection>> connections;  // guarded by mu
};

class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  // `socket` is connected and bound to a strand of its own. `refuse`: the
  // server is full; the request gets 429 and the connection closes.
  HttpConnection(boost::asio::ip::tcp::socket socket, std::shared_ptr<ServerShared> shared,
                 uint64_t id, bool refuse);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  void Start();
  // Drain: an idle connection closes now, a busy one after its exchange.
  void Drain();
  // Server stop: aborts the exchange in flight (kServerStopping; the handler
  // may still answer), then closes.
  void Stop();
  // Closes now (from any thread).
  void ForceClose();

 private:
  friend class ConnectionExchange;
  using Headers = std::vector<std::pair<std::string, std::string>>;
  enum class Phase { kReadingHeader, kReadingBody, kHandling, kClosing, kClosed };

  void ReadHeader();
  void OnHeader(boost::beast::error_code ec);
  void OnBody(boost::beast::error_code ec);
  // Answers before the handler runs (the body may be unread).
  void EarlyError(const ApiError& error, bool body_unread, Headers extra = {});
  void Watch();
  void OnWatch(boost::beast::error_code ec, size_t n);
  void ClientGone();

  // The exchange in flight, by generation (a late call from a finished
  // exchange's handler does nothing).
  void Reply(uint64_t gen, int status, std::string body, std::string content_type, Headers extra);
  void StartStream(uint64_t gen, int status, std::string content_type, Headers extra);
  void Write(uint64_t gen, std::string data);
  void EndStream(uint64_t gen);
  void OnAbort(uint64_t gen, std::function<void(AbortCause)> fn);
  // A handler threw: 500, or a stream cut short.
  void HandlerFailed(uint64_t gen, const std::string& path, const char* what);
  bool Current(uint64_t gen) const { return in_exchange_ && gen == gen_ && !ended_; }

  void BeginExchange();
  void EndExchange();
  // Takes `bytes` of the server's body budget for the request in flight;
  // false if it is spent.
  bool ReserveBody(int64_t bytes);
  void ReleaseBody();
  std::string Head(int status, const std::string& content_type, const Headers& extra,
                   int64_t content_length);
  void Send(std::string bytes);
  void Flush();
  void OnWritten(boost::beast::error_code ec);
  void LingeringClose();
  void LingerRead(size_t total);
  void Close();

  const std::shared_ptr<ServerShared> shared_;  // destroyed after the socket
  boost::asio::ip::tcp::socket socket_;
  boost::asio::steady_timer read_timer_, write_timer_;
  const uint64_t id_;
  const bool refuse_;
  std::string remote_address_;
  bool remote_loopback_ = false;

  // Strand-only state.
  Phase phase_ = Phase::kReadingHeader;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  const Route* route_ = nullptr;
  std::vector<std::string> params_;
  unsigned version_ = 11;  // HTTP version of the request in flight (11: 1.1)
  bool keep_alive_ = true;
  bool close_after_ = false;  // close once the exchange in flight is answered
  bool lingering_ = false;    // answered with the body unread: linger, then close
  uint64_t gen_ = 0;          // exchanges so far
  bool in_exchange_ = false;  // counted in flight (answering, or handler working)
  bool ended_ = false;        // the answer is complete (maybe not yet written)
  bool streaming_ = false, chunked_ = false;
  std::function<void(AbortCause)> on_abort_;
  int64_t body_reserved_ = 0;  // of shared_->body_budget
  bool watching_ = false;      // the disconnect-watch read is pending
  bool resume_read_ = false;   // read the next request once the watch read is cancelled
  // The watch read met the client's end of file (or an error) after the answer
  // ended: no read may follow, since the event that would end it has passed.
  bool read_ended_ = false;
  std::string out_, sending_;
  bool writing_ = false;
  std::array<char, 16384> linger_buf_;
};

}  // namespace failsafe
