// The nodes behind the router: their health, their own load gauges, the gap
// between tokens each one is measured at, and the choice of a node for a
// request.
//
// Health: every node gets GET /health every health_interval_ms. A node that
// refuses connections, or does not answer health_fall checks in a row within
// health_timeout_ms, is down; a node that answers 503 (below its
// --min-devices, or draining) is unavailable for new requests but its
// streams go on; a node that answers 200 is up. A node going down fails
// over every request in flight on it at once (the watchers it was given).
// Gauges: GET /metrics every metrics_interval_ms (requests running and
// waiting, capacity, KV-cache use).
//
// Choice: among up nodes not excluded, the one with the least load, where
// load = (requests this router has on it, plus what its gauges showed beyond
// those at the last scrape: other routers' and clients') over its capacity,
// plus its KV-cache use; the request's prefix affinity
// (rendezvous hashing on the prompt's start) takes one node's load down by
// affinity_weight, so requests that share a prefix meet its cache unless that
// node is busier than the others by more than that.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <boost/asio.hpp>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "router/upstream.h"

namespace failsafe {

struct NodePoolOptions {
  int64_t health_interval_ms = 250;
  int64_t health_timeout_ms = 750;
  int health_fall = 2;  // checks in a row without an answer: down
  int64_t metrics_interval_ms = 1000;
  int64_t connect_timeout_ms = 1000;
  double affinity_weight = 2.0;  // in requests
};

enum class NodeState { kUnknown, kUp, kUnavailable, kDown };
const char* NodeStateName(NodeState s);

struct NodeSnapshot {
  std::string address;
  NodeState state = NodeState::kUnknown;
  int in_flight = 0;                                            // the router's requests on it
  double running = 0, waiting = 0, capacity = 1, kv_usage = 0;  // its gauges
  double token_gap_s = 0;  // measured time between tokens (moving average; 0: none yet)
  int64_t downs = 0;       // times it went down
};

class NodePool {
 public:
  NodePool(boost::asio::io_context* io, std::vector<std::string> addresses,
           std::vector<boost::asio::ip::tcp::endpoint> endpoints, const NodePoolOptions& options);
  ~NodePool();  // Stop()
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;

  void Start();
  void Stop();
  // Blocks until every node was checked once (or timeout_ms passed).
  void WaitForFirstChecks(int64_t timeout_ms);

  int size() const { return static_cast<int>(nodes_.size()); }
  const boost::asio::ip::tcp::endpoint& endpoint(int node) const { return nodes_[node]->endpoint; }
  const std::string& address(int node) const { return nodes_[node]->address; }

  // A node for a request, not in `exclude`; -1 when none is up (nodes that
  // answer 503 are taken only when no node is up). Counts the request on it
  // until Release.
  int Acquire(uint64_t affinity, const std::vector<int>& exclude);
  void Release(int node);

  // A stream's tokens came `gap_s` apart on `node`; returns the node's
  // measured time between tokens with it.
  double ObserveGap(int node, double gap_s);
  // The node's measured time between tokens (0 until measured).
  double TokenGap(int node) const;

  // `fn` runs (on no particular thread) if `node` goes down; returns a ticket
  // for Unwatch, or 0 when the node is down already (`fn` will not run).
  uint64_t Watch(int node, std::function<void()> fn);
  void Unwatch(int node, uint64_t ticket);

  std::vector<NodeSnapshot> Snapshot() const;
  int Healthy() const;  // nodes up

 private:
  // A GET repeated every interval_ms on a node's strand; `done` gets the
  // status (0: no whole answer), whether the connection was refused, and
  // the body.
  struct Poller {
    explicit Poller(RouterStrand& strand) : timer(strand) {}
    const char* target = "";
    int64_t timeout_ms = 0, interval_ms = 0;
    std::function<void(int node, int status, bool refused, const std::string& body)> done;
    boost::asio::steady_timer timer;
    std::shared_ptr<UpstreamCall> call;
  };
  // What Snapshot shows (guarded by NodePool::mu_, but the address), and
  // the rest.
  struct Node : NodeSnapshot {
    boost::asio::ip::tcp::endpoint endpoint;
    RouterStrand strand;
    Poller health, metrics;
    // Guarded by NodePool::mu_.
    int misses = 0;
    bool checked = false;
    double others = 0;  // running + waiting less this router's, at the last scrape
    std::map<uint64_t, std::function<void()>> watchers;
    Node(boost::asio::io_context* io, std::string a, boost::asio::ip::tcp::endpoint e);
  };

  void Poll(int node, Poller* p);
  void OnHealth(int node, int status, bool answered, bool refused);
  void OnMetrics(int node, const std::string& text);

  boost::asio::io_context* io_;
  const NodePoolOptions options_;
  std::vector<std::unique_ptr<Node>> nodes_;
  mutable std::mutex mu_;
  std::condition_variable checked_;
  uint64_t next_ticket_ = 1;
  bool stopped_ = false;
};

// A hash of the start of a request's prompt (its prefix-affinity key).
uint64_t AffinityKey(std::string_view prompt_start);

}  // namespace failsafe
