// Asio/Beast: 2 I/O threads; /stream gets a chunk per tick from a producer thread via post;
// /wait is held with a read pending to detect the client leaving; /health, /stats answer at once.
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <mutex>
#include <set>
#include <thread>
#include "common.h"
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
std::atomic<int64_t> g_last_detect{0};
std::atomic<int> g_streams{0};
struct Session;
std::mutex g_mu;
std::set<std::shared_ptr<Session>> g_live;
struct Session : std::enable_shared_from_this<Session> {
  tcp::socket sock;
  beast::flat_buffer buf;
  http::request<http::string_body> req;
  std::string out;
  bool writing = false;
  char probe[64];
  asio::strand<asio::any_io_executor> strand;
  explicit Session(tcp::socket s)
      : sock(std::move(s)), strand(asio::make_strand(sock.get_executor())) {}
  void Read() {
    req = {};
    http::async_read(
        sock, buf, req,
        asio::bind_executor(strand, [self = shared_from_this()](beast::error_code ec, size_t) {
          if (!ec) self->Handle();
        }));
  }
  void Reply(std::string body) {
    auto r = std::make_shared<http::response<http::string_body>>(http::status::ok, 11);
    r->body() = std::move(body);
    r->prepare_payload();
    http::async_write(
        sock, *r,
        asio::bind_executor(strand, [self = shared_from_this(), r](beast::error_code ec, size_t) {
          if (!ec) self->Read();
        }));
  }
  void Watch() {
    sock.async_read_some(
        asio::buffer(probe),
        asio::bind_executor(strand, [self = shared_from_this()](beast::error_code ec, size_t) {
          if (ec) {
            g_last_detect = NowNs();
            std::lock_guard<std::mutex> l(g_mu);
            g_live.erase(self);
            g_streams--;
            return;
          }
          self->Watch();
        }));
  }
  void Handle() {
    if (req.target() == "/health") return Reply("{\"status\":\"ok\"}");
    if (req.target() == "/stats")
      return Reply(std::to_string(g_last_detect.load()) + " " + std::to_string(g_streams.load()));
    if (req.target() == "/wait") {
      g_streams++;
      Watch();
      return;
    }
    if (req.target() == "/stream") {
      g_streams++;
      out =
          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
          "chunked\r\n\r\n";
      Flush();
      Watch();
      std::lock_guard<std::mutex> l(g_mu);
      g_live.insert(shared_from_this());
      return;
    }
    Reply("?");
  }
  void Push(const char* frame, size_t n) {
    char h[16];
    int k = snprintf(h, sizeof h, "%zx\r\n", n);
    out.append(h, k);
    out.append(frame, n);
    out += "\r\n";
    Flush();
  }
  std::string sending;
  void Flush() {
    if (writing || out.empty()) return;
    writing = true;
    sending.swap(out);
    out.clear();
    asio::async_write(
        sock, asio::buffer(sending),
        asio::bind_executor(strand, [self = shared_from_this()](beast::error_code ec, size_t) {
          self->writing = false;
          if (!ec) self->Flush();
        }));
  }
};
void Accept(tcp::acceptor& a) {
  a.async_accept([&a](beast::error_code ec, tcp::socket s) {
    if (!ec) std::make_shared<Session>(std::move(s))->Read();
    Accept(a);
  });
}
int main(int argc, char** argv) {
  int port = atoi(argv[1]);
  int tick_ms = argc > 2 ? atoi(argv[2]) : 20;
  asio::io_context io;
  tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), (unsigned short)port});
  a.listen(4096);
  Accept(a);
  std::thread prod([&] {
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(tick_ms));
      std::vector<std::shared_ptr<Session>> v;
      {
        std::lock_guard<std::mutex> l(g_mu);
        v.assign(g_live.begin(), g_live.end());
      }
      for (auto& s : v) asio::post(s->strand, [s] { s->Push(kFrame, sizeof(kFrame) - 1); });
    }
  });
  std::thread t2([&] { io.run(); });
  io.run();
}
