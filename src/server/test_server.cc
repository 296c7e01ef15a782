#include "server/test_server.h"

#include "common/scratch_dir.h"
#include "common/sse.h"
#include "engine/test_support.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "common/clock.h"
#include "engine/worker_group.h"
#include "model/synthetic.h"

namespace failsafe {

using nlohmann::json;

const std::string& TestModelDir() { return TestModelDir("tiny-llama", 31); }

TestServer::TestServer(const TestServerOptions& options) {
  tok = std::move(Tokenizer::LoadDir(TestModelDir())).value();
  WorkerGroupOptions o;
  o.model_dir = TestModelDir();
  o.worker_binary = TestBinary();
  o.num_devices = options.devices;
  o.backup_bytes = 64 << 20;
  o.max_logits_rows = std::max(64, options.max_num_seqs);
  o.max_seqs = std::max(64, options.max_num_seqs + options.max_queue);
  o.max_step_tokens = std::max(options.max_batch_tokens, 256);
  auto group = WorkerGroup::Start(o);
  EXPECT_TRUE(group.ok()) << group.status().ToString();
  for (int d = 0; d < options.devices; ++d) worker_pids.push_back((*group)->device_pid(d));
  SchedulerConfig sc;
  sc.max_num_seqs = options.max_num_seqs;
  sc.max_batch_tokens = options.max_batch_tokens;
  sc.max_model_len = options.max_model_len;
  sc.prefix_cache = options.prefix_cache;
  ServiceOptions so;
  so.max_queue = options.max_queue;
  so.outage_timeout_ms = options.outage_timeout_ms;
  so.respawn = options.respawn;
  service = std::make_unique<EngineService>(std::move(group).value(), sc, EngineOptions{}, so);
  server = std::make_unique<HttpServer>(service.get(), tok.get(), options.server);
  ::failsafe::Status st = server->Start();
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TestServer::~TestServer() {
  server.reset();
  service.reset();
}

std::unique_ptr<httplib::Client> TestServer::Client() const {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port());
  c->set_read_timeout(60, 0);
  return c;
}

httplib::Result TestServer::Post(const std::string& path, const json& body) const {
  return Client()->Post(path.c_str(), body.dump(), "application/json");
}

std::string TestServer::Metrics() const {
  auto r = Client()->Get("/metrics");
  return r && r->status == 200 ? r->body : std::string();
}

json TestServer::Status() const {
  auto r = Client()->Get("/admin/status");
  return r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
}

double MetricValue(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = ("\n" + text).find(key);
  if (at == std::string::npos) return -1;
  return std::atof(text.c_str() + at + key.size() - 1);
}

double WaitFor(const std::function<bool()>& done, int timeout_ms) {
  const int64_t start = MonotonicNanos();
  while (true) {
    if (done()) return (MonotonicNanos() - start) * 1e-6;
    if ((MonotonicNanos() - start) * 1e-6 > timeout_ms) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::vector<std::string> StreamEvents(int port, const std::string& path, const json& body,
                                      int stop_after, const std::function<void(int)>& on_event) {
  std::vector<std::string> events;
  std::string buf;
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    for (std::string& ev : TakeSseData(&buf)) {
      events.push_back(std::move(ev));
      if (on_event) on_event(static_cast<int>(events.size()));
      if (stop_after > 0 && static_cast<int>(events.size()) >= stop_after) return false;
    }
    return true;
  };
  c.send(req);
  return events;
}

RawClient::RawClient(int port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

RawClient::~RawClient() { Close(); }

void RawClient::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RawClient::ShutdownWrite() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

bool RawClient::Send(const std::string& bytes) {
  size_t sent = 0;
  while (fd_ >= 0 && sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += n;
  }
  return fd_ >= 0;
}

bool RawClient::Fill(int timeout_ms) {
  if (fd_ < 0 || eof_) return false;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return false;
  char tmp[65536];
  const ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
  if (n <= 0) {
    eof_ = true;
    return false;
  }
  buf_.append(tmp, n);
  return true;
}

std::string RawClient::ReadUntil(const std::string& until, int timeout_ms) {
  const int64_t deadline = MonotonicNanos() + int64_t{timeout_ms} * 1000000;
  while (buf_.find(until) == std::string::npos) {
    const int64_t left = (deadline - MonotonicNanos()) / 1000000;
    if (left <= 0 || !Fill(static_cast<int>(left))) break;
  }
  return buf_;
}

RawResponse RawClient::Read(int timeout_ms) {
  RawResponse r;
  const int64_t deadline = MonotonicNanos() + int64_t{timeout_ms} * 1000000;
  auto more = [&] {
    const int64_t left = (deadline - MonotonicNanos()) / 1000000;
    return left > 0 && Fill(static_cast<int>(left));
  };
  size_t head_end;
  while ((head_end = buf_.find("\r\n\r\n")) == std::string::npos) {
    if (!more()) return r;
  }
  const std::string head = buf_.substr(0, head_end);
  size_t pos = head.find("\r\n");
  const std::string status_line = head.substr(0, pos);
  while (pos != std::string::npos && pos < head.size()) {
    const size_t next = head.find("\r\n", pos + 2);
    const std::string line =
        head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
    }
    pos = next;
  }
  size_t at = head_end + 4;
  if (r.headers.count("content-length")) {
    const size_t len = std::stoul(r.headers["content-length"]);
    while (buf_.size() < at + len) {
      if (!more()) return r;
    }
    r.body = buf_.substr(at, len);
    buf_.erase(0, at + len);
  } else if (r.headers["transfer-encoding"] == "chunked") {
    while (true) {
      size_t line_end;
      while ((line_end = buf_.find("\r\n", at)) == std::string::npos) {
        if (!more()) return r;
      }
      const size_t size = std::stoul(buf_.substr(at, line_end - at), nullptr, 16);
      while (buf_.size() < line_end + 2 + size + 2) {
        if (!more()) return r;
      }
      r.body += buf_.substr(line_end + 2, size);
      at = line_end + 2 + size + 2;
      if (size == 0) break;
    }
    buf_.erase(0, at);
  } else {
    while (more()) {
    }
    r.body = buf_.substr(at);
    buf_.clear();
  }
  r.status = std::atoi(status_line.c_str() + 9);
  return r;
}

std::string JsonPost(const std::string& path, const std::string& body,
                     const std::string& extra_headers) {
  return "POST " + path +
         " HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n" + extra_headers + "\r\n" + body;
}

}  // namespace failsafe
