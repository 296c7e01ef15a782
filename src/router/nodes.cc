#include "router/nodes.h"

#include <algorithm>
#include <cstdlib>
#include <future>
#include <limits>
#include <utility>

namespace failsafe {

namespace asio = boost::asio;

namespace {

// Moving average of the time between tokens: each gap weighs this much.
constexpr double kGapWeight = 0.05;

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// The value of an unlabelled Prometheus sample "name value", if present.
bool Sample(std::string_view text, std::string_view name, double* value) {
  size_t at = 0;
  while ((at = text.find(name, at)) != std::string_view::npos) {
    const bool line_start = at == 0 || text[at - 1] == '\n';
    const size_t after = at + name.size();
    if (line_start && after < text.size() && text[after] == ' ') {
      const size_t end = text.find('\n', after);
      std::string v(text.substr(after + 1, end == std::string_view::npos ? end : end - after - 1));
      char* stop = nullptr;
      const double d = std::strtod(v.c_str(), &stop);
      if (stop != v.c_str()) {
        *value = d;
        return true;
      }
    }
    at = after;
  }
  return false;
}

}  // namespace

const char* NodeStateName(NodeState s) {
  switch (s) {
    case NodeState::kUnknown:
      return "unknown";
    case NodeState::kUp:
      return "up";
    case NodeState::kUnavailable:
      return "unavailable";
    case NodeState::kDown:
      return "down";
  }
  return "?";
}

uint64_t AffinityKey(std::string_view prompt_start) {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (unsigned char c : prompt_start) h = Mix(h ^ c) + 0x9e3779b97f4a7c15ULL;
  return h;
}

NodePool::Node::Node(asio::io_context* io, std::string a, asio::ip::tcp::endpoint e)
    : endpoint(std::move(e)), strand(asio::make_strand(*io)), health(strand), metrics(strand) {
  address = std::move(a);
}

NodePool::NodePool(asio::io_context* io, std::vector<std::string> addresses,
                   std::vector<asio::ip::tcp::endpoint> endpoints, const NodePoolOptions& options)
    : io_(io), options_(options) {
  for (size_t i = 0; i < addresses.size(); ++i)
    nodes_.push_back(std::make_unique<Node>(io, std::move(addresses[i]), std::move(endpoints[i])));
}

NodePool::~NodePool() { Stop(); }

void NodePool::Start() {
  for (int i = 0; i < size(); ++i) {
    Node& n = *nodes_[i];
    n.health.target = "/health";
    n.health.timeout_ms = options_.health_timeout_ms;
    n.health.interval_ms = options_.health_interval_ms;
    n.health.done = [this](int node, int status, bool refused, const std::string&) {
      OnHealth(node, status, status > 0, refused);
    };
    n.metrics.target = "/metrics";
    n.metrics.timeout_ms = std::max<int64_t>(options_.metrics_interval_ms, 1000);
    n.metrics.interval_ms = options_.metrics_interval_ms;
    n.metrics.done = [this](int node, int status, bool, const std::string& text) {
      if (status == 200) OnMetrics(node, text);
    };
    asio::post(n.strand, [this, i] {
      Poll(i, &nodes_[i]->health);
      Poll(i, &nodes_[i]->metrics);
    });
  }
}

void NodePool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  // Cancel on each node's strand and wait for it, so no handler touches a
  // node after this returns.
  for (auto& n : nodes_) {
    std::promise<void> done;
    asio::post(n->strand, [&n, &done] {
      for (Poller* p : {&n->health, &n->metrics}) {
        p->timer.cancel();
        if (p->call) p->call->Cancel();
      }
      done.set_value();
    });
    if (io_->stopped()) break;
    done.get_future().wait_for(std::chrono::seconds(2));
  }
}

void NodePool::WaitForFirstChecks(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  checked_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    return std::all_of(nodes_.begin(), nodes_.end(), [](const auto& n) { return n->checked; });
  });
}

void NodePool::Poll(int i, Poller* p) {
  Node& n = *nodes_[i];
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
  }
  UpstreamRequest req;
  req.target = p->target;
  req.host_header = n.address;
  req.connect_timeout_ms = std::min(options_.connect_timeout_ms, p->timeout_ms);
  req.total_timeout_ms = p->timeout_ms;
  auto status = std::make_shared<int>(0);
  auto body = std::make_shared<std::string>();
  UpstreamHandlers h;
  h.on_head = [status](int s, std::string) { *status = s; };
  h.on_data = [body](std::string_view d) { body->append(d); };
  h.on_end = [this, i, p, status, body](bool complete, bool connected, std::string error) {
    const bool refused = !connected && error.find("refused") != std::string::npos;
    p->done(i, complete ? *status : 0, refused, *body);
    p->call.reset();
    p->timer.expires_after(std::chrono::milliseconds(p->interval_ms));
    p->timer.async_wait([this, i, p](boost::system::error_code ec) {
      if (!ec) Poll(i, p);
    });
  };
  p->call = std::make_shared<UpstreamCall>(n.strand, n.endpoint, req, std::move(h));
  p->call->Start();
}

void NodePool::OnHealth(int i, int status, bool answered, bool refused) {
  std::map<uint64_t, std::function<void()>> fail;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Node& n = *nodes_[i];
    const NodeState before = n.state;
    if (answered) {
      n.misses = 0;
      n.state = status == 200 ? NodeState::kUp : NodeState::kUnavailable;
    } else {
      ++n.misses;
      // A refused connection: nothing listens any more (the process died).
      if (refused || n.misses >= options_.health_fall || before == NodeState::kUnknown)
        n.state = NodeState::kDown;
    }
    if (n.state == NodeState::kDown && before != NodeState::kDown) {
      if (before != NodeState::kUnknown) ++n.downs;
      // Its gauges are gone with it (a restarted node starts empty).
      n.running = n.waiting = n.others = n.kv_usage = 0;
      n.capacity = 1;
      fail.swap(n.watchers);
    }
    if (!n.checked) {
      n.checked = true;
      checked_.notify_all();
    }
  }
  for (auto& [ticket, fn] : fail) fn();
}

void NodePool::OnMetrics(int i, const std::string& text) {
  double running = 0, waiting = 0, capacity = 1, kv = 0;
  Sample(text, "failsafe_num_requests_running", &running);
  Sample(text, "failsafe_num_requests_waiting", &waiting);
  Sample(text, "failsafe_capacity_fraction", &capacity);
  Sample(text, "failsafe_kv_cache_usage_fraction", &kv);
  std::lock_guard<std::mutex> lock(mu_);
  Node& n = *nodes_[i];
  n.running = running;
  n.waiting = waiting;
  // What other routers (or clients) have on it, as of this scrape.
  n.others = std::max(0.0, running + waiting - n.in_flight);
  n.capacity = capacity;
  n.kv_usage = kv;
}

int NodePool::Acquire(uint64_t affinity, const std::vector<int>& exclude) {
  std::lock_guard<std::mutex> lock(mu_);
  // The prefix's node: highest rendezvous weight among those not excluded.
  int preferred = -1;
  uint64_t best_weight = 0;
  auto allowed = [&](int i) {
    return std::find(exclude.begin(), exclude.end(), i) == exclude.end();
  };
  for (int i = 0; i < size(); ++i) {
    if (!allowed(i) || nodes_[i]->state != NodeState::kUp) continue;
    const uint64_t w = Mix(affinity ^ Mix(static_cast<uint64_t>(i) + 1));
    if (preferred < 0 || w > best_weight) {
      preferred = i;
      best_weight = w;
    }
  }
  int chosen = -1;
  double best = std::numeric_limits<double>::infinity();
  for (NodeState wanted : {NodeState::kUp, NodeState::kUnavailable}) {
    for (int i = 0; i < size(); ++i) {
      const Node& n = *nodes_[i];
      if (!allowed(i) || n.state != wanted) continue;
      const double requests = n.in_flight + n.others;
      double load = requests / std::max(n.capacity, 0.05) + n.kv_usage;
      if (i == preferred) load -= options_.affinity_weight;
      if (load < best) {
        best = load;
        chosen = i;
      }
    }
    if (chosen >= 0) break;
  }
  if (chosen >= 0) ++nodes_[chosen]->in_flight;
  return chosen;
}

void NodePool::Release(int node) {
  std::lock_guard<std::mutex> lock(mu_);
  --nodes_[node]->in_flight;
}

double NodePool::ObserveGap(int node, double gap_s) {
  std::lock_guard<std::mutex> lock(mu_);
  double& g = nodes_[node]->token_gap_s;
  g = g == 0 ? gap_s : g + kGapWeight * (gap_s - g);
  return g;
}

double NodePool::TokenGap(int node) const {
  std::lock_guard<std::mutex> lock(mu_);
  return nodes_[node]->token_gap_s;
}

uint64_t NodePool::Watch(int node, std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (nodes_[node]->state == NodeState::kDown) return 0;
  const uint64_t t = next_ticket_++;
  nodes_[node]->watchers.emplace(t, std::move(fn));
  return t;
}

void NodePool::Unwatch(int node, uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  nodes_[node]->watchers.erase(ticket);
}

std::vector<NodeSnapshot> NodePool::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<NodeSnapshot> out;
  for (const auto& n : nodes_) out.push_back(*n);
  return out;
}

int NodePool::Healthy() const {
  std::lock_guard<std::mutex> lock(mu_);
  int k = 0;
  for (const auto& n : nodes_) k += n->state == NodeState::kUp;
  return k;
}

}  // namespace failsafe
