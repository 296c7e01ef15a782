// The HTTP front end's own metrics (Prometheus text), beside the engine's.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace failsafe {

class HttpMetrics {
 public:
  // `refusing`: the connection is only answered 429 and closed; it does not
  // take one of the connections the server serves.
  void ConnectionOpened(bool refusing) {
    ++connections_open_;
    if (refusing) ++connections_refusing_;
  }
  void ConnectionClosed(bool refusing) {
    --connections_open_;
    if (refusing) --connections_refusing_;
  }
  // A connection answered 429 at once because the server holds its maximum.
  void ConnectionRefused() { ++connections_refused_; }
  void ExchangeStarted() { ++in_flight_; }
  void ExchangeEnded() { --in_flight_; }
  // A client that left before its response ended.
  void ClientGone() { ++client_gone_; }
  void Response(int status);

  int64_t connections_open() const { return connections_open_; }
  int64_t connections_refusing() const { return connections_refusing_; }
  int64_t in_flight() const { return in_flight_; }
  int64_t client_gone() const { return client_gone_; }
  void Render(std::string* out) const;

 private:
  std::atomic<int64_t> connections_open_{0}, connections_refusing_{0}, connections_refused_{0},
      in_flight_{0}, client_gone_{0};
  mutable std::mutex mu_;
  std::map<int, int64_t> responses_;  // by HTTP status, guarded by mu_
};

}  // namespace failsafe
