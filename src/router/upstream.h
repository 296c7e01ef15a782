// One HTTP request from the router to a node (Boost.Beast over Asio): connect,
// send, then hand the response's status and its body bytes to the caller as
// they arrive, so a stream is forwarded chunk by chunk. Everything runs on
// the strand the call is given; so do its callbacks, which never run after
// Cancel.
//
// Thread-safety: Start and Cancel on the call's strand.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace failsafe {

using RouterStrand = boost::asio::strand<boost::asio::io_context::executor_type>;

struct UpstreamRequest {
  std::string method = "GET";
  std::string target;  // "/v1/completions"
  std::string body;    // sent as application/json when not empty
  std::string host_header;
  // No connection within this: the call fails ("connect timeout").
  int64_t connect_timeout_ms = 1000;
  // The whole exchange must end within this (0: no limit), e.g. a health check.
  int64_t total_timeout_ms = 0;
};

struct UpstreamHandlers {
  // The response's status line and content type came.
  std::function<void(int status, std::string content_type)> on_head;
  // Body bytes (de-chunked), as they arrive.
  std::function<void(std::string_view data)> on_data;
  // The end: `complete` when the whole response was read; otherwise why not
  // ("connection refused", "timeout", "end of stream", ...) and whether the
  // node was reached at all (`connected`).
  std::function<void(bool complete, bool connected, std::string error)> on_end;
};

class UpstreamCall : public std::enable_shared_from_this<UpstreamCall> {
 public:
  UpstreamCall(RouterStrand strand, boost::asio::ip::tcp::endpoint node, UpstreamRequest request,
               UpstreamHandlers handlers);
  UpstreamCall(const UpstreamCall&) = delete;
  UpstreamCall& operator=(const UpstreamCall&) = delete;

  void Start();
  // Closes the connection (the node sees its client leave and cancels the
  // request); no callback runs after.
  void Cancel();

 private:
  void OnConnect(boost::beast::error_code ec);
  void OnWrite(boost::beast::error_code ec);
  void OnHeader(boost::beast::error_code ec);
  void ReadBody();
  void OnBody(boost::beast::error_code ec);
  void Deliver();  // body bytes parsed so far go to on_data
  void End(bool complete, std::string error);

  RouterStrand strand_;
  boost::asio::ip::tcp::endpoint node_;
  boost::asio::ip::tcp::socket socket_;
  boost::asio::steady_timer timer_;
  UpstreamRequest request_;
  UpstreamHandlers handlers_;
  boost::beast::http::request<boost::beast::http::string_body> wire_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::response_parser<boost::beast::http::string_body>> parser_;
  bool connected_ = false;
  bool timed_out_ = false;
  bool over_ = false;
};

// Parses "host:port", "http://host:port" or "http://host:port/"; the host is
// resolved now (numeric, or a name such as localhost).
std::optional<boost::asio::ip::tcp::endpoint> ResolveNode(std::string_view address,
                                                          std::string* error);

}  // namespace failsafe
