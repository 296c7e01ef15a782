#include "router/upstream.h"

#include <fmt/format.h>

#include <utility>

namespace failsafe {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

UpstreamCall::UpstreamCall(RouterStrand strand, tcp::endpoint node, UpstreamRequest request,
                           UpstreamHandlers handlers)
    : strand_(std::move(strand)),
      node_(std::move(node)),
      socket_(strand_),
      timer_(strand_),
      request_(std::move(request)),
      handlers_(std::move(handlers)) {}

void UpstreamCall::Start() {
  wire_.method_string(request_.method);
  wire_.target(request_.target);
  wire_.version(11);
  wire_.set(http::field::host, request_.host_header);
  wire_.set(http::field::connection, "close");
  if (!request_.body.empty() || request_.method == "POST") {
    wire_.set(http::field::content_type, "application/json");
    wire_.body() = std::move(request_.body);
    wire_.prepare_payload();
  }
  const int64_t first_ms =
      request_.total_timeout_ms > 0 ? request_.total_timeout_ms : request_.connect_timeout_ms;
  timer_.expires_after(std::chrono::milliseconds(
      request_.total_timeout_ms > 0 ? std::min(first_ms, request_.connect_timeout_ms) : first_ms));
  timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec || self->over_) return;
    self->timed_out_ = true;
    self->End(false, self->connected_ ? "timeout" : "connect timeout");
  });
  socket_.async_connect(node_,
                        [self = shared_from_this()](beast::error_code ec) { self->OnConnect(ec); });
}

void UpstreamCall::Cancel() {
  if (over_) return;
  over_ = true;
  // Cancel may be called from inside a handler: they are destroyed later.
  asio::post(strand_, [h = std::move(handlers_)] {});
  handlers_ = {};
  timer_.cancel();
  beast::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
}

void UpstreamCall::OnConnect(beast::error_code ec) {
  if (over_) return;
  if (ec) return End(false, ec.message());
  connected_ = true;
  socket_.set_option(tcp::no_delay(true), ec);
  // From here only the whole exchange's limit holds.
  timer_.cancel();
  if (request_.total_timeout_ms > 0) {
    timer_.expires_after(std::chrono::milliseconds(request_.total_timeout_ms));
    timer_.async_wait([self = shared_from_this()](beast::error_code e) {
      if (e || self->over_) return;
      self->timed_out_ = true;
      self->End(false, "timeout");
    });
  }
  http::async_write(socket_, wire_,
                    [self = shared_from_this()](beast::error_code e, size_t) { self->OnWrite(e); });
}

void UpstreamCall::OnWrite(beast::error_code ec) {
  if (over_) return;
  if (ec) return End(false, ec.message());
  parser_.emplace();
  parser_->body_limit(boost::none);
  http::async_read_header(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code e, size_t) { self->OnHeader(e); });
}

void UpstreamCall::OnHeader(beast::error_code ec) {
  if (over_) return;
  if (ec)
    return End(false, ec == http::error::end_of_stream ? "closed before answering" : ec.message());
  const auto& head = parser_->get();
  if (handlers_.on_head) {
    handlers_.on_head(static_cast<int>(head.result_int()),
                      std::string(head[http::field::content_type]));
  }
  if (over_) return;
  Deliver();
  if (parser_->is_done()) return End(true, "");
  ReadBody();
}

void UpstreamCall::ReadBody() {
  http::async_read_some(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code e, size_t) { self->OnBody(e); });
}

void UpstreamCall::OnBody(beast::error_code ec) {
  if (over_) return;
  Deliver();
  if (over_) return;
  if (ec) {
    return End(false, ec == http::error::end_of_stream || ec == http::error::partial_message
                          ? "the node closed the connection mid-answer"
                          : ec.message());
  }
  if (parser_->is_done()) return End(true, "");
  ReadBody();
}

void UpstreamCall::Deliver() {
  std::string& body = parser_->get().body();
  if (body.empty()) return;
  // The body reader appends at the string's end: taking what came is safe.
  std::string data = std::move(body);
  body.clear();
  if (handlers_.on_data) handlers_.on_data(data);
}

void UpstreamCall::End(bool complete, std::string error) {
  if (over_) return;
  over_ = true;
  timer_.cancel();
  beast::error_code ignored;
  socket_.close(ignored);
  auto on_end = std::move(handlers_.on_end);
  handlers_ = {};
  if (on_end) on_end(complete, connected_, std::move(error));
}

std::optional<tcp::endpoint> ResolveNode(std::string_view address, std::string* error) {
  std::string a(address);
  if (a.rfind("http://", 0) == 0) a.erase(0, 7);
  if (!a.empty() && a.back() == '/') a.pop_back();
  const size_t colon = a.rfind(':');
  if (a.empty() || colon == std::string::npos || colon + 1 == a.size() ||
      a.find('/') != std::string::npos) {
    *error = fmt::format("node '{}': expected host:port or http://host:port", address);
    return std::nullopt;
  }
  std::string host = a.substr(0, colon), port = a.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
      std::stoi(port) == 0 || std::stoi(port) > 65535) {
    *error = fmt::format("node '{}': the port must be 1 to 65535", address);
    return std::nullopt;
  }
  asio::io_context io;
  tcp::resolver resolver(io);
  beast::error_code ec;
  auto found = resolver.resolve(host, port, tcp::resolver::numeric_service, ec);
  if (ec || found.empty()) {
    *error = fmt::format("node '{}': cannot resolve {} ({})", address, host, ec.message());
    return std::nullopt;
  }
  return found.begin()->endpoint();
}

}  // namespace failsafe
