#include "server/http_connection.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "common/log.h"

namespace failsafe {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

constexpr int64_t kLingerMs = 2000;       // reading what a client still sends after an early answer
constexpr size_t kLingerBytes = 1 << 20;  // ... and at most this much of it
constexpr size_t kWatchChunk = 4096;      // bytes per disconnect-watch read
constexpr size_t kMaxPipelined = 64 << 10;  // next-request bytes kept while one is in flight

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// application/json, or any type with a +json suffix (parameters ignored).
bool IsJsonContentType(std::string_view value) {
  std::string t = Lower(value.substr(0, value.find(';')));
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.erase(t.begin());
  return t == "application/json" || (t.rfind("application/", 0) == 0 && t.size() > 5 &&
                                     t.compare(t.size() - 5, 5, "+json") == 0);
}

// A timer's handler may run after the timer was set again: only a deadline
// that has passed counts.
bool Expired(const asio::steady_timer& t) {
  return t.expiry() <= asio::steady_timer::clock_type::now();
}

bool QuietError(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::operation_aborted ||
         ec == asio::error::broken_pipe || ec == asio::error::bad_descriptor;
}

}  // namespace

// The face of one exchange: forwards to its connection with the exchange's
// generation, so that a handler that outlives its exchange touches nothing.
class ConnectionExchange final : public HttpExchange {
 public:
  ConnectionExchange(std::shared_ptr<HttpConnection> conn, uint64_t gen, HttpRequest request)
      : conn_(std::move(conn)), gen_(gen), request_(std::move(request)) {}
  const HttpRequest& request() const override { return request_; }
  void Reply(int status, std::string body, std::string content_type,
             std::vector<std::pair<std::string, std::string>> extra) override {
    Run([c = conn_, g = gen_, status, body = std::move(body), ct = std::move(content_type),
         extra = std::move(extra)]() mutable {
      c->Reply(g, status, std::move(body), std::move(ct), std::move(extra));
    });
  }
  void StartStream(int status, std::string content_type,
                   std::vector<std::pair<std::string, std::string>> extra) override {
    Run([c = conn_, g = gen_, status, ct = std::move(content_type),
         extra = std::move(extra)]() mutable {
      c->StartStream(g, status, std::move(ct), std::move(extra));
    });
  }
  void Write(std::string data) override {
    Run([c = conn_, g = gen_, data = std::move(data)]() mutable { c->Write(g, std::move(data)); });
  }
  void EndStream() override {
    Run([c = conn_, g = gen_] { c->EndStream(g); });
  }
  void OnAbort(std::function<void(AbortCause)> fn) override {
    Run([c = conn_, g = gen_, fn = std::move(fn)]() mutable { c->OnAbort(g, std::move(fn)); });
  }
  void Post(std::function<void()> fn) override {
    asio::post(conn_->socket_.get_executor(),
               [c = conn_, g = gen_, path = request_.path, fn = std::move(fn)] {
                 if (!c->Current(g)) return;
                 try {
                   fn();
                 } catch (const std::exception& e) {
                   c->HandlerFailed(g, path, e.what());
                 }
               });
  }
  void Offload(std::function<void()> fn) override {
    asio::thread_pool* work = conn_->shared_->work.load();
    if (!work) return;
    asio::post(*work, [c = conn_, g = gen_, path = request_.path, fn = std::move(fn)] {
      try {
        fn();
      } catch (const std::exception& e) {
        std::string what = e.what();
        asio::post(c->socket_.get_executor(),
                   [c, g, path, what] { c->HandlerFailed(g, path, what.c_str()); });
      }
    });
  }

 private:
  // Runs `fn` (which holds what it needs) on the strand: inline when already
  // there, else posted, in order.
  template <typename Fn>
  void Run(Fn&& fn) {
    asio::dispatch(conn_->socket_.get_executor(), std::forward<Fn>(fn));
  }
  const std::shared_ptr<HttpConnection> conn_;
  const uint64_t gen_;
  const HttpRequest request_;
};

std::string_view HttpRequest::Header(std::string_view lower_case_name) const {
  for (auto it = headers.rbegin(); it != headers.rend(); ++it) {
    if (it->first == lower_case_name) return it->second;
  }
  return {};
}

HttpConnection::HttpConnection(asio::ip::tcp::socket socket, std::shared_ptr<ServerShared> shared,
                               uint64_t id, bool refuse)
    : shared_(std::move(shared)),
      socket_(std::move(socket)),
      read_timer_(socket_.get_executor()),
      write_timer_(socket_.get_executor()),
      id_(id),
      refuse_(refuse) {
  beast::error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  if (!ec) {
    auto addr = ep.address();
    if (addr.is_v6() && addr.to_v6().is_v4_mapped())
      addr = asio::ip::make_address_v4(asio::ip::v4_mapped, addr.to_v6());
    remote_address_ = addr.to_string();
    remote_loopback_ = addr.is_loopback();
  }
}

HttpConnection::~HttpConnection() = default;

void HttpConnection::Start() {
  asio::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->ReadHeader(); });
}

void HttpConnection::Drain() {
  asio::dispatch(socket_.get_executor(), [self = shared_from_this()] {
    if (self->phase_ == Phase::kReadingHeader && self->buffer_.size() == 0 && !self->in_exchange_)
      return self->Close();
    self->close_after_ = true;
  });
}

void HttpConnection::Stop() {
  asio::dispatch(socket_.get_executor(), [self = shared_from_this()] {
    if (self->phase_ == Phase::kClosed) return;
    self->close_after_ = true;
    if (!self->in_exchange_ || self->ended_) {
      // Nothing left to answer: close once what is queued is written.
      if (!self->writing_ && self->out_.empty()) self->Close();
      return;
    }
    if (auto fn = std::move(self->on_abort_)) fn(AbortCause::kServerStopping);
    if (self->ended_) return;                    // the handler answered
    if (self->streaming_) return self->Close();  // cut short: the client sees a broken stream
    self->Reply(self->gen_, 503,
                ErrorBody({503, "service_unavailable_error", "server_shutting_down", "",
                           "the server is shutting down"}),
                "application/json", {});
  });
}

void HttpConnection::ForceClose() {
  asio::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->Close(); });
}

void HttpConnection::ReadHeader() {
  phase_ = Phase::kReadingHeader;
  if (close_after_ || shared_->draining) return Close();
  // A client that half-closed after its requests gets their answers (those
  // still in the buffer are read from it) and then the close. A read of the
  // socket would wait for ever: its end of file was already reported to the
  // watch read, and the event loop is not told again.
  if (read_ended_ && buffer_.size() == 0) return Close();
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(shared_->options.max_header_bytes));
  parser_->body_limit(static_cast<uint64_t>(shared_->options.max_body_bytes));
  read_timer_.expires_after(std::chrono::milliseconds(shared_->options.idle_timeout_ms));
  read_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (!ec && self->phase_ == Phase::kReadingHeader && Expired(self->read_timer_)) self->Close();
  });
  http::async_read_header(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
}

void HttpConnection::OnHeader(beast::error_code ec) {
  read_timer_.cancel();
  if (phase_ != Phase::kReadingHeader) return;
  if (ec == http::error::header_limit) {
    return EarlyError(
        {431, "invalid_request_error", "headers_too_large", "",
         fmt::format("the request headers exceed {} bytes", shared_->options.max_header_bytes)},
        true);
  }
  if (ec == http::error::body_limit) {
    return EarlyError({413, "invalid_request_error", "request_too_large", "",
                       fmt::format("the request body exceeds {} bytes (--max-body)",
                                   shared_->options.max_body_bytes)},
                      true);
  }
  if (ec && QuietError(ec)) return Close();
  if (ec) {
    return EarlyError(BadRequest("malformed HTTP request: " + ec.message(), "", "bad_http"), true);
  }
  const auto& req = parser_->get();
  version_ = req.version();
  keep_alive_ = req.keep_alive();
  if (refuse_) {
    close_after_ = true;
    return EarlyError(TooManyRequests(fmt::format(
                          "the server holds its maximum of {} connections; try again later",
                          shared_->options.max_connections)),
                      !parser_->is_done());
  }
  const std::string target(req.target());
  const size_t q = target.find('?');
  const std::string path = target.substr(0, q);
  const std::string method(req.method_string());
  if (shared_->draining) {
    return EarlyError({503, "service_unavailable_error", "server_shutting_down", "",
                       "the server is shutting down"},
                      !parser_->is_done());
  }
  Router::Match m = shared_->router.Find(method, path);
  if (!m.route) {
    if (m.allow.empty()) {
      return EarlyError({404, "invalid_request_error", "unknown_url", "",
                         fmt::format("no such endpoint: {} {}", method, path)},
                        !parser_->is_done());
    }
    return EarlyError({405, "invalid_request_error", "method_not_allowed", "",
                       fmt::format("{} does not take {} (allowed: {})", path, method, m.allow)},
                      !parser_->is_done(), {{"Allow", m.allow}});
  }
  if (m.route->json_body) {
    auto ct = req.find(http::field::content_type);
    if (ct != req.end() && !IsJsonContentType(ct->value())) {
      return EarlyError({415, "invalid_request_error", "unsupported_media_type", "",
                         fmt::format("the body must be JSON (Content-Type: application/json), "
                                     "not {}",
                                     std::string(ct->value()))},
                        !parser_->is_done());
    }
  }
  // The body's memory, up front: what it announces, or the limit if chunked.
  const int64_t announced = parser_->content_length()
                                ? static_cast<int64_t>(*parser_->content_length())
                            : parser_->chunked() ? shared_->options.max_body_bytes
                                                 : 0;
  if (announced > 0 && !ReserveBody(announced)) {
    return EarlyError(TooManyRequests("too many large request bodies at once; try again later"),
                      true);
  }
  route_ = m.route;
  params_ = std::move(m.params);
  if (parser_->is_done()) return OnBody({});
  phase_ = Phase::kReadingBody;
  auto expect = req.find(http::field::expect);
  if (expect != req.end() && version_ >= 11 && Lower(expect->value()) == "100-continue") {
    Send("HTTP/1.1 100 Continue\r\n\r\n");
  }
  read_timer_.expires_after(std::chrono::milliseconds(shared_->options.read_timeout_ms));
  read_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (!ec && self->phase_ == Phase::kReadingBody && Expired(self->read_timer_)) self->Close();
  });
  http::async_read(socket_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
}

void HttpConnection::OnBody(beast::error_code ec) {
  read_timer_.cancel();
  if (phase_ != Phase::kReadingHeader && phase_ != Phase::kReadingBody) return;
  if (ec == http::error::body_limit) {
    return EarlyError({413, "invalid_request_error", "request_too_large", "",
                       fmt::format("the request body exceeds {} bytes (--max-body)",
                                   shared_->options.max_body_bytes)},
                      true);
  }
  if (ec && QuietError(ec)) return Close();
  if (ec) {
    return EarlyError(BadRequest("malformed HTTP request body: " + ec.message(), "", "bad_http"),
                      true);
  }
  auto& req = parser_->get();
  HttpRequest r;
  r.method = std::string(req.method_string());
  const std::string target(req.target());
  const size_t q = target.find('?');
  r.path = target.substr(0, q);
  if (q != std::string::npos) r.query = target.substr(q + 1);
  r.body = std::move(req.body());
  r.remote_address = remote_address_;
  r.remote_loopback = remote_loopback_;
  r.path_params = std::move(params_);
  for (const auto& f : req) r.headers.emplace_back(Lower(f.name_string()), std::string(f.value()));
  parser_.reset();
  phase_ = Phase::kHandling;
  BeginExchange();
  Watch();
  auto exchange = std::make_shared<ConnectionExchange>(shared_from_this(), gen_, std::move(r));
  try {
    route_->handler(exchange);
  } catch (const std::exception& e) {
    HandlerFailed(gen_, exchange->request().path, e.what());
  }
}

void HttpConnection::HandlerFailed(uint64_t gen, const std::string& path, const char* what) {
  FS_LOG_ERROR("handler for {} failed: {}", path, what);
  if (!Current(gen)) return;
  if (!streaming_) return Reply(gen, 500, ErrorBody(InternalError(what)), "application/json", {});
  Close();  // a stream cut short: the client sees it end without its last chunk
}

void HttpConnection::EarlyError(const ApiError& error, bool body_unread, Headers extra) {
  parser_.reset();
  if (body_unread) {
    lingering_ = true;
    keep_alive_ = false;
  }
  phase_ = Phase::kHandling;
  BeginExchange();
  Reply(gen_, error.status, ErrorBody(error), "application/json", std::move(extra));
}

void HttpConnection::BeginExchange() {
  ++gen_;
  in_exchange_ = true;
  ended_ = false;
  streaming_ = chunked_ = false;
  on_abort_ = nullptr;
  shared_->metrics.ExchangeStarted();
}

bool HttpConnection::ReserveBody(int64_t bytes) {
  if (shared_->body_budget.fetch_sub(bytes) < bytes) {
    shared_->body_budget.fetch_add(bytes);
    return false;
  }
  body_reserved_ = bytes;
  return true;
}

void HttpConnection::ReleaseBody() {
  shared_->body_budget.fetch_add(body_reserved_);
  body_reserved_ = 0;
}

void HttpConnection::EndExchange() {
  ReleaseBody();
  if (!in_exchange_) return;
  in_exchange_ = false;
  on_abort_ = nullptr;
  shared_->metrics.ExchangeEnded();
  // Under the lock, so that a drain that just found exchanges in flight is
  // already waiting when it is told.
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->changed.notify_all();
}

// Keeps a read pending while the exchange is in flight: end of file or an
// error means the client left. Bytes that arrive are the next request
// (pipelining) and wait in the buffer.
void HttpConnection::Watch() {
  if (watching_ || phase_ != Phase::kHandling || buffer_.size() >= kMaxPipelined) return;
  watching_ = true;
  socket_.async_read_some(
      buffer_.prepare(kWatchChunk),
      [self = shared_from_this()](beast::error_code ec, size_t n) { self->OnWatch(ec, n); });
}

void HttpConnection::OnWatch(beast::error_code ec, size_t n) {
  watching_ = false;
  if (!ec) buffer_.commit(n);
  if (ec && ec != asio::error::operation_aborted) read_ended_ = true;
  if (resume_read_) {  // the answer is out and the next request may be read
    resume_read_ = false;
    if (phase_ == Phase::kReadingHeader) ReadHeader();
    return;
  }
  if (!ec) return Watch();
  if (phase_ == Phase::kClosed) return;
  // Before the answer is complete the client is gone; after it, end of file
  // is a half-close and the write still finishes (a reset fails it).
  if (in_exchange_ && !ended_) ClientGone();
}

void HttpConnection::ClientGone() {
  if (phase_ == Phase::kClosed) return;
  shared_->metrics.ClientGone();
  FS_LOG_DEBUG("client {} left with its request in flight", remote_address_);
  close_after_ = true;
  if (auto fn = std::move(on_abort_)) fn(AbortCause::kClientGone);
  Close();
}

void HttpConnection::Reply(uint64_t gen, int status, std::string body, std::string content_type,
                           Headers extra) {
  if (!Current(gen) || streaming_) return;
  ended_ = true;
  shared_->metrics.Response(status);
  std::string bytes = Head(status, content_type, extra, static_cast<int64_t>(body.size()));
  bytes += body;
  Send(std::move(bytes));
}

void HttpConnection::StartStream(uint64_t gen, int status, std::string content_type,
                                 Headers extra) {
  if (!Current(gen) || streaming_) return;
  streaming_ = true;
  chunked_ = version_ >= 11;
  if (!chunked_) close_after_ = true;  // HTTP/1.0: the end of the body is the end of the stream
  shared_->metrics.Response(status);
  Send(Head(status, content_type, extra, -1));
}

void HttpConnection::Write(uint64_t gen, std::string data) {
  if (!Current(gen) || !streaming_ || data.empty()) return;
  if (chunked_) {
    std::string frame = fmt::format("{:x}\r\n", data.size());
    frame += data;
    frame += "\r\n";
    Send(std::move(frame));
  } else {
    Send(std::move(data));
  }
}

void HttpConnection::EndStream(uint64_t gen) {
  if (!Current(gen) || !streaming_) return;
  ended_ = true;
  Send(chunked_ ? "0\r\n\r\n" : "");
}

void HttpConnection::OnAbort(uint64_t gen, std::function<void(AbortCause)> fn) {
  if (Current(gen)) on_abort_ = std::move(fn);
}

std::string HttpConnection::Head(int status, const std::string& content_type, const Headers& extra,
                                 int64_t content_length) {
  http::response_header<> h;
  h.version(version_ >= 11 ? 11 : 10);
  h.result(static_cast<unsigned>(status));
  h.set(http::field::server, "failsafe");
  h.set(http::field::content_type, content_type);
  for (const auto& [name, value] : extra) h.set(name, value);
  if (content_length >= 0) {
    h.set(http::field::content_length, std::to_string(content_length));
  } else if (version_ >= 11) {
    h.set(http::field::transfer_encoding, "chunked");
  }
  const bool close = close_after_ || !keep_alive_ || shared_->draining;
  if (close) {
    close_after_ = true;
    h.set(http::field::connection, "close");
  } else if (version_ < 11) {
    h.set(http::field::connection, "keep-alive");
  }
  std::string out = fmt::format("HTTP/{}.{} {} {}\r\n", h.version() / 10, h.version() % 10, status,
                                std::string(http::obsolete_reason(h.result())));
  for (const auto& f : h) {
    out += std::string(f.name_string());
    out += ": ";
    out += std::string(f.value());
    out += "\r\n";
  }
  out += "\r\n";
  return out;
}

void HttpConnection::Send(std::string bytes) {
  if (phase_ == Phase::kClosed) return;
  out_ += bytes;
  Flush();
  if (!writing_ && ended_ && in_exchange_) OnWritten({});  // nothing left to write
}

void HttpConnection::Flush() {
  if (writing_ || out_.empty() || phase_ == Phase::kClosed) return;
  writing_ = true;
  sending_.swap(out_);
  out_.clear();
  write_timer_.expires_after(std::chrono::milliseconds(shared_->options.write_timeout_ms));
  write_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec || !self->writing_ || !Expired(self->write_timer_)) return;
    FS_LOG_INFO("client {} read nothing for {} ms: closing", self->remote_address_,
                self->shared_->options.write_timeout_ms);
    self->ClientGone();
  });
  asio::async_write(socket_, asio::buffer(sending_),
                    [self = shared_from_this()](beast::error_code ec, size_t) {
                      self->writing_ = false;
                      self->OnWritten(ec);
                    });
}

void HttpConnection::OnWritten(beast::error_code ec) {
  if (phase_ == Phase::kClosed) return;
  if (ec) {
    if (in_exchange_ && !ended_) return ClientGone();
    return Close();
  }
  sending_.clear();
  if (!out_.empty()) return Flush();
  write_timer_.cancel();
  if (!in_exchange_ || !ended_) {
    if (!in_exchange_ && close_after_ && phase_ != Phase::kReadingHeader &&
        phase_ != Phase::kReadingBody)
      Close();
    return;
  }
  // The answer is out.
  EndExchange();
  if (lingering_) return LingeringClose();
  if (close_after_ || !keep_alive_ || shared_->draining) {
    beast::error_code ignored;
    socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
    return Close();
  }
  phase_ = Phase::kReadingHeader;
  if (watching_) {
    resume_read_ = true;
    beast::error_code ignored;
    socket_.cancel(ignored);
    return;
  }
  ReadHeader();
}

// After answering a request whose body was not read: stop sending, read and
// drop what the client still sends for a while, then close, so that it reads
// the answer instead of a connection reset.
void HttpConnection::LingeringClose() {
  phase_ = Phase::kClosing;
  beast::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  read_timer_.expires_after(std::chrono::milliseconds(kLingerMs));
  read_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (!ec && Expired(self->read_timer_)) self->Close();
  });
  LingerRead(0);
}

void HttpConnection::LingerRead(size_t total) {
  socket_.async_read_some(asio::buffer(linger_buf_),
                          [self = shared_from_this(), total](beast::error_code ec, size_t n) {
                            if (ec || total + n > kLingerBytes) return self->Close();
                            self->LingerRead(total + n);
                          });
}

void HttpConnection::Close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  beast::error_code ignored;
  read_timer_.cancel();
  write_timer_.cancel();
  socket_.close(ignored);
  EndExchange();
  on_abort_ = nullptr;
  shared_->metrics.ConnectionClosed(refuse_);
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->connections.erase(id_);
  }
  shared_->changed.notify_all();
}

}  // namespace failsafe
