// `failsafe router`: an OpenAI-compatible front over several FailSafe nodes
// (separate `serve` processes, on this host or others). It routes each
// request by the nodes' own gauges with prefix affinity (router/nodes.h),
// forwards streams chunk by chunk, and when a node fails mid-request
// (connection refused or reset, a 5xx, an error event, a node that stops
// answering its health checks, or no token within a deadline derived from
// that node's measured time between tokens) it resumes the request on
// another node.
//
// A stream is resumed token for token: the router asks each node for the ids
// of the tokens it sends (return_token_ids), gives every sampled request a
// seed when it has none, and on a failure sends the prompt again with the ids
// already sent (resume_token_ids) to another node. The node's numerics are the
// same on any placement and its draw is keyed by position, so it goes on with
// the tokens the failed node would have produced; the router holds back the
// last token sent and checks that the new node produces it again (so a node
// that died after its last token but before its finish chunk still ends the
// stream as it would have). The client sees one stream, one response id, no
// text repeated or missing. A request that is not streamed is sent again from
// the start (the same tokens, greedy or seeded). A stream with several
// choices is sent again whole: each choice's tokens already sent are produced
// again, checked and dropped. A stream with echo is sent again only while
// nothing of it reached the client.
//
// A request never goes back to a node that failed it; after max_attempts
// nodes it ends with a clear error (503, or an error event in a stream). The
// router keeps no state beyond the requests it proxies: several routers can
// run side by side behind a load balancer.
//
// Thread-safety: Start once; Stop from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "router/nodes.h"
#include "server/http_server.h"

namespace failsafe {

struct RouterOptions {
  std::vector<std::string> nodes;  // host:port or http://host:port
  ServerOptions server;            // the front end (host, port, limits)
  NodePoolOptions pool;
  int max_attempts = 3;  // nodes a request may be tried on
  // Stream deadlines: the first token within first_token_timeout_ms; each next
  // one within max(stall_floor_ms, stall_factor x the node's time between
  // tokens).
  int64_t first_token_timeout_ms = 60000;
  int64_t stall_floor_ms = 5000;
  double stall_factor = 20;
  // A non-streamed request's whole answer within this (0: no limit).
  int64_t request_timeout_ms = 0;
};

// Why a request left a node for another one.
enum class ResumeCause {
  kRefused,      // no connection
  kReset,        // the connection closed before the answer ended
  kServerError,  // a 5xx answer
  kStreamError,  // an error event inside the stream
  kStall,        // no token within the deadline
  kNodeDown,     // the node stopped answering its health checks
  kBusy,         // 429: the node's queue was full
  kCount
};
const char* ResumeCauseName(ResumeCause c);

struct RouterCounters {
  std::atomic<int64_t> requests{0};   // proxied requests taken
  std::atomic<int64_t> completed{0};  // answered by a node (any status)
  std::atomic<int64_t> failed{0};     // ended by the router with an error
  std::atomic<int64_t> resumed[static_cast<int>(ResumeCause::kCount)] = {};
  std::atomic<int64_t> in_flight{0};
};

class FleetRouter {
 public:
  explicit FleetRouter(const RouterOptions& options);
  ~FleetRouter();  // Stop()
  FleetRouter(const FleetRouter&) = delete;
  FleetRouter& operator=(const FleetRouter&) = delete;

  // Resolves the nodes, starts their health checks and the front end.
  Status Start();
  int port() const;
  // Stops accepting and lets requests in flight finish for up to timeout_ms;
  // returns how many were cut short.
  int Drain(int64_t timeout_ms);
  void Stop();

  const RouterCounters& counters() const;
  std::vector<NodeSnapshot> Nodes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace failsafe
