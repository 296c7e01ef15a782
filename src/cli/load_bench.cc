#include "cli/load_bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "common/clock.h"
#include "common/fd_limit.h"
#include "common/rng.h"
#include "common/sse.h"

namespace failsafe {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

// One streaming request on its own connection.
struct Client : std::enable_shared_from_this<Client> {
  explicit Client(asio::io_context& io) : socket(io) {}
  tcp::socket socket;
  beast::flat_buffer buffer;
  std::optional<http::response_parser<http::string_body>> parser;
  std::function<uint64_t(uint64_t, std::string_view, beast::error_code&)> on_chunk;
  std::string request, sse;
  bool keep_text = false;  // collect the streamed text (only kept streams need it)
  std::string text;
  int pool_index = 0;
  int64_t sent_ns = 0;
  std::vector<int64_t> token_ns;  // arrival of each token event
  std::vector<int> text_ends;     // text.size() after each token event (keep_text only)
  int max_tokens = 0;
  int status = 0;
  bool done = false;  // [DONE] seen
  std::string error;
  int64_t usage_tokens = 0;
};

// Level-wide counters, on the client thread.
struct Level {
  std::atomic<int> open{0};  // read by the prober too
  int peak_open = 0, finished = 0;
  std::function<void()> refill;  // closed loop: sends the next request
};

void ParseSse(Client& c) {
  for (const std::string& ev : TakeSseData(&c.sse)) {
    if (ev == "[DONE]") {
      c.done = true;
    } else if (ev.find("\"error\":{") != std::string::npos) {
      c.error = ev.substr(0, 200);
    } else if (ev.find("\"usage\":{") != std::string::npos) {
      auto j = nlohmann::json::parse(ev, nullptr, false);
      if (!j.is_discarded()) c.usage_tokens = j["usage"].value("completion_tokens", 0);
    } else if (ev.find("\"finish_reason\":null") != std::string::npos) {
      c.token_ns.push_back(MonotonicNanos());
      if (c.keep_text) {
        auto j = nlohmann::json::parse(ev, nullptr, false);
        if (!j.is_discarded() && j.contains("choices") && !j["choices"].empty() &&
            j["choices"][0]["text"].is_string()) {
          c.text += j["choices"][0]["text"].get<std::string>();
        }
        c.text_ends.push_back(static_cast<int>(c.text.size()));
      }
    }
  }
}

void Finish(const std::shared_ptr<Client>& c, Level* level) {
  if (c->sent_ns > 0) --level->open;
  ++level->finished;
  beast::error_code ignored;
  c->socket.close(ignored);
  if (level->refill) level->refill();
}

void ReadBody(const std::shared_ptr<Client>& c, Level* level) {
  http::async_read_some(c->socket, c->buffer, *c->parser, [c, level](beast::error_code ec, size_t) {
    if (ec) {
      if (c->error.empty()) c->error = "stream broken: " + ec.message();
      return Finish(c, level);
    }
    if (c->parser->is_done()) return Finish(c, level);
    ReadBody(c, level);
  });
}

void OnHeader(const std::shared_ptr<Client>& c, Level* level, beast::error_code ec) {
  if (ec) {
    c->error = "no answer: " + ec.message();
    return Finish(c, level);
  }
  c->status = c->parser->get().result_int();
  if (c->status == 200 && c->parser->chunked()) {
    c->on_chunk = [raw = c.get()](uint64_t, std::string_view body, beast::error_code&) {
      raw->sse.append(body.data(), body.size());
      ParseSse(*raw);
      return body.size();
    };
    c->parser->on_chunk_body(c->on_chunk);
  }
  ReadBody(c, level);
}

void Launch(asio::io_context& io, const tcp::endpoint& ep, const std::shared_ptr<Client>& c,
            Level* level) {
  c->socket.async_connect(ep, [c, level](beast::error_code ec) {
    if (ec) {
      c->error = "connect: " + ec.message();
      return Finish(c, level);
    }
    asio::async_write(c->socket, asio::buffer(c->request),
                      [c, level](beast::error_code ec, size_t) {
                        if (ec) {
                          c->error = "send: " + ec.message();
                          return Finish(c, level);
                        }
                        c->sent_ns = MonotonicNanos();
                        level->peak_open = std::max(level->peak_open, ++level->open);
                        c->parser.emplace();
                        c->parser->body_limit(boost::none);
                        http::async_read_header(
                            c->socket, c->buffer, *c->parser,
                            [c, level](beast::error_code ec, size_t) { OnHeader(c, level, ec); });
                      });
  });
}

// A GET on a new connection with blocking I/O and a deadline: status and body,
// or status 0.
int ProbeGet(const std::string& host, int port, const std::string& path, int timeout_ms,
             std::string* body) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  const int64_t deadline = MonotonicNanos() + int64_t{timeout_ms} * 1000000;
  std::string in;
  int status = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req =
        "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      while (true) {
        const int64_t left_ms = (deadline - MonotonicNanos()) / 1000000;
        pollfd p{fd, POLLIN, 0};
        if (left_ms <= 0 || ::poll(&p, 1, static_cast<int>(left_ms)) <= 0) break;
        const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) {
          if (in.size() > 12) status = std::atoi(in.c_str() + 9);
          break;
        }
        in.append(buf, n);
      }
    }
  }
  ::close(fd);
  const size_t head = in.find("\r\n\r\n");
  if (body && head != std::string::npos) *body = in.substr(head + 4);
  return status;
}

}  // namespace

Result<LoadResult> RunLoad(const LoadOptions& o, int clients) {
  const FileLimit limit = RaiseOpenFileLimit(clients + 64);
  if (limit.soft < clients + 16) {
    return ResourceExhausted(
        "the open-file limit ({}, hard {}) is too low for {} clients; raise it (ulimit -n)",
        limit.soft, limit.hard, clients);
  }
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(o.host, ec);
  if (ec) return InvalidArgument("{}: not an IP address", o.host);
  const tcp::endpoint ep(address, static_cast<unsigned short>(o.port));

  asio::io_context io(1);
  Level level;
  std::vector<std::shared_ptr<Client>> all;
  const int pool = o.pool > 0 ? o.pool : clients;
  auto make = [&](int k) {
    auto c = std::make_shared<Client>(io);
    const int p = k % pool;
    c->pool_index = p;
    c->keep_text = o.keep_streams;
    const uint64_t key = HashCombine(o.seed, uint64_t(p) << 24);
    nlohmann::json prompt = nlohmann::json::array();
    for (int t = 0; t < o.input_tokens; ++t) prompt.push_back(32 + Mix64(key + t) % 200);
    int max_tokens = o.output_tokens;
    if (o.output_tokens_max > o.output_tokens)
      max_tokens +=
          static_cast<int>(Mix64(key ^ 0x6f7574) % (o.output_tokens_max - o.output_tokens + 1));
    c->max_tokens = max_tokens;
    nlohmann::json body = {{"prompt", prompt}, {"max_tokens", max_tokens},
                           {"temperature", 0}, {"ignore_eos", true},
                           {"stream", true},   {"stream_options", {{"include_usage", true}}}};
    if (o.sampled_temperature > 0 && p % 2 == 1) {
      body["temperature"] = o.sampled_temperature;
      body["seed"] = p;
    }
    if (!o.model.empty()) body["model"] = o.model;
    const std::string b = body.dump();
    c->request =
        "POST /v1/completions HTTP/1.1\r\nHost: " + o.host +
        "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(b.size()) +
        "\r\n\r\n" + b;
    all.push_back(c);
    return c;
  };
  for (int i = 0; i < clients; ++i) make(i);

  // Probes on their own thread, on new connections, while the level runs.
  std::atomic<bool> stop{false};
  std::vector<double> health_ms, metrics_ms;
  std::vector<LoadResult::Probe> probes;
  int probes_failed = 0;
  int64_t peak_server = 0;
  const int64_t start = MonotonicNanos();
  std::thread prober([&] {
    while (!stop && o.probe_interval_ms > 0) {
      const int64_t t0 = MonotonicNanos();
      const int hs = ProbeGet(o.host, o.port, "/health", 5000, nullptr);
      const int64_t t1 = MonotonicNanos();
      std::string text;
      const int ms = ProbeGet(o.host, o.port, "/metrics", 5000, &text);
      const int64_t t2 = MonotonicNanos();
      if (hs == 200) health_ms.push_back((t1 - t0) * 1e-6);
      if (ms == 200) metrics_ms.push_back((t2 - t1) * 1e-6);
      probes.push_back({(t0 - start) * 1e-9, hs == 200 ? (t1 - t0) * 1e-6 : -1,
                        ms == 200 ? (t2 - t1) * 1e-6 : -1, level.open.load()});
      probes_failed += (hs != 200) + (ms != 200);
      const std::string key = "\nfailsafe_http_connections_open ";
      const size_t at = text.find(key);
      if (at != std::string::npos)
        peak_server = std::max<int64_t>(peak_server, std::atoll(text.c_str() + at + key.size()));
      const int64_t next = t0 + int64_t{o.probe_interval_ms} * 1000000;
      if (next > MonotonicNanos())
        ::usleep(static_cast<useconds_t>((next - MonotonicNanos()) / 1000));
    }
  });

  if (o.closed_loop_s > 0) {
    const int64_t until = start + static_cast<int64_t>(o.closed_loop_s * 1e9);
    level.refill = [&] {
      if (MonotonicNanos() < until) Launch(io, ep, make(static_cast<int>(all.size())), &level);
    };
  }
  for (int i = 0; i < clients; ++i) Launch(io, ep, all[i], &level);
  io.run_for(std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000)));
  const double seconds = (MonotonicNanos() - start) * 1e-9;
  stop = true;
  prober.join();
  // Requests still open at the timeout: close them, and let their handlers
  // run out before the event loop goes.
  level.refill = nullptr;
  for (auto& c : all) {
    beast::error_code ignored;
    c->socket.close(ignored);
  }
  io.restart();
  io.run_for(std::chrono::seconds(5));

  LoadResult r;
  r.clients = clients;
  r.seconds = seconds;
  r.peak_open = level.peak_open;
  r.peak_server_connections = peak_server;
  std::vector<double> ttft, tbt;
  for (auto& c : all) {
    const bool ok = c->status == 200 && c->done && c->error.empty();
    if (o.keep_streams) {
      r.streams.push_back({c->pool_index, c->status, ok,
                           ok ? std::string() : (c->error.empty() ? "no [DONE]" : c->error),
                           std::move(c->text), c->sent_ns, c->token_ns, std::move(c->text_ends),
                           c->usage_tokens, c->max_tokens});
    }
    if (ok) {
      ++r.served;
      r.tokens += c->usage_tokens;
      if (!c->token_ns.empty()) ttft.push_back((c->token_ns[0] - c->sent_ns) * 1e-6);
      for (size_t k = 1; k < c->token_ns.size(); ++k)
        tbt.push_back((c->token_ns[k] - c->token_ns[k - 1]) * 1e-6);
    } else if (c->status == 429) {
      ++r.refused_429;
    } else {
      ++r.failed;
      if (r.first_error.empty()) {
        r.first_error = c->status ? "HTTP " + std::to_string(c->status) : std::string();
        if (!c->error.empty()) r.first_error += (r.first_error.empty() ? "" : ": ") + c->error;
        if (r.first_error.empty()) r.first_error = "still open at the timeout";
      }
    }
  }
  r.ttft_ms = ComputePercentiles(ttft);
  r.tbt_ms = ComputePercentiles(tbt);
  r.health_ms = ComputePercentiles(health_ms);
  r.metrics_ms = ComputePercentiles(metrics_ms);
  r.probes_failed = probes_failed;
  r.probes = std::move(probes);
  return r;
}

}  // namespace failsafe
