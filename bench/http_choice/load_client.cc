// Opens N streaming connections (POST /stream), probes GET /health every 100 ms on a new
// connection while they are open, then tests disconnect detection on a held request (POST /wait).
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <thread>
#include <vector>
#include "common.h"
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
struct Conn {
  tcp::socket s;
  char buf[8192];
  size_t bytes = 0;
  bool ok = false;
  Conn(asio::io_context& io) : s(io) {}
};
int main(int argc, char** argv) {
  int port = atoi(argv[1]), n = atoi(argv[2]);
  double secs = argc > 3 ? atof(argv[3]) : 10;
  asio::io_context io;
  tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), port);
  std::vector<std::unique_ptr<Conn>> conns;
  static const char kReq[] = "POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
  std::function<void(Conn*)> read = [&](Conn* c) {
    c->s.async_read_some(asio::buffer(c->buf), [&, c](boost::system::error_code ec, size_t k) {
      if (ec) return;
      if (!c->ok && k >= 12 && std::string(c->buf, 12) == "HTTP/1.1 200") c->ok = true;
      c->bytes += k;
      read(c);
    });
  };
  for (int i = 0; i < n; ++i) {
    conns.push_back(std::make_unique<Conn>(io));
    Conn* c = conns.back().get();
    c->s.async_connect(ep, [&, c](boost::system::error_code ec) {
      if (ec) return;
      asio::async_write(c->s, asio::buffer(kReq, sizeof(kReq) - 1),
                        [&, c](boost::system::error_code ec, size_t) {
                          if (!ec) read(c);
                        });
    });
  }
  std::thread t([&] { io.run(); });
  std::this_thread::sleep_for(std::chrono::seconds(2));
  auto get = [&](const char* path) {
    asio::io_context io2;
    tcp::socket s(io2);
    s.connect(ep);
    std::string r =
        std::string("GET ") + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    asio::write(s, asio::buffer(r));
    timeval tv{5, 0};  // a probe that gets no answer in 5 s has failed
    setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string out;
    char b[4096];
    boost::system::error_code ec;
    size_t k;
    while ((k = s.read_some(asio::buffer(b), ec)) > 0) {
      out.append(b, k);
      size_t h = out.find("\r\n\r\n");
      if (h == std::string::npos) continue;
      size_t cl = out.find("ontent-Length: ");
      if (cl == std::string::npos) cl = out.find("ontent-length: ");
      if (cl != std::string::npos && out.size() >= h + 4 + atoi(out.c_str() + cl + 15)) break;
    }
    return out;
  };
  std::vector<double> lat;
  int failed = 0;
  size_t b0 = 0;
  for (auto& c : conns) b0 += c->bytes;
  int64_t t0 = NowNs();
  while ((NowNs() - t0) * 1e-9 < secs) {
    int64_t a = NowNs();
    if (get("/health").find(" 200 ") == std::string::npos) {
      ++failed;
    } else {
      lat.push_back((NowNs() - a) * 1e-6);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  size_t b1 = 0;
  int held = 0;
  for (auto& c : conns) {
    b1 += c->bytes;
    held += c->ok;
  }
  std::sort(lat.begin(), lat.end());
  if (lat.empty()) lat.push_back(-1);
  printf(
      "streams held %d/%d  stream MB/s %.2f  /health ms p50 %.2f p99 %.2f max %.2f (%zu probes, %d "
      "unanswered in 5 s)\n",
      held, n, (b1 - b0) / 1e6 / ((NowNs() - t0) * 1e-9), lat[lat.size() / 2],
      lat[lat.size() * 99 / 100], lat.back(), lat.size(), failed);
  // Disconnect while held.
  {
    asio::io_context io2;
    tcp::socket s(io2);
    s.connect(ep);
    static const char kW[] = "POST /wait HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    asio::write(s, asio::buffer(kW, sizeof(kW) - 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    int64_t closed = NowNs();
    s.close();
    std::this_thread::sleep_for(std::chrono::milliseconds(3000));
    std::string st = get("/stats");
    if (st.find(" 200 ") == std::string::npos) {
      printf("held request's client left: /stats unanswered\n");
      fflush(stdout);
      _exit(0);
    }
    size_t body = st.find("\r\n\r\n");
    long long det = atoll(st.c_str() + body + 4);
    if (det > closed)
      printf("held request's client left: noticed after %.1f ms\n", (det - closed) * 1e-6);
    else
      printf("held request's client left: not noticed within 3 s\n");
  }
  fflush(stdout);
  _exit(0);
}
