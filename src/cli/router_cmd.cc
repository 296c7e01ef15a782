// `failsafe router`: the OpenAI-compatible front over several nodes
// (router/router.h).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/signal_wait.h"
#include "common/units.h"
#include "router/router.h"

namespace failsafe {

namespace {

struct RouterFlags {
  std::vector<std::string> nodes;
  std::string host = "127.0.0.1";
  int port = 8000;
  int http_threads = 2;
  int max_connections = 4096;
  int max_attempts = 3;
  std::string health_interval = "250ms", health_timeout = "750ms";
  int health_fall = 2;
  std::string metrics_interval = "1s";
  std::string first_token_timeout = "60s", stall_floor = "5s";
  double stall_factor = 20;
  std::string request_timeout = "0s";
  double affinity_weight = 2;
  double drain_timeout = 30;
};

}  // namespace

CommandFn RegisterRouter(CLI::App& app) {
  auto o = std::make_shared<RouterFlags>();
  app.add_option("--node", o->nodes,
                 "a FailSafe node (host:port or http://host:port of its `serve`); repeat for each")
      ->required();
  app.add_option("--host", o->host, "address to listen on")->capture_default_str();
  app.add_option("--port", o->port, "port to listen on (0: any free port)")->capture_default_str();
  app.add_option("--http-threads", o->http_threads,
                 "event loops (for the clients and the connections to the nodes)")
      ->capture_default_str();
  app.add_option("--max-connections", o->max_connections, "open client connections (429 beyond)")
      ->capture_default_str();
  app.add_option("--max-attempts", o->max_attempts,
                 "nodes a request may be tried on before it ends with an error")
      ->capture_default_str();
  app.add_option("--health-interval", o->health_interval, "time between GET /health of a node")
      ->capture_default_str();
  app.add_option("--health-timeout", o->health_timeout,
                 "a health check unanswered this long failed")
      ->capture_default_str();
  app.add_option("--health-fall", o->health_fall,
                 "failed health checks in a row that make a node down (a refused connection: one)")
      ->capture_default_str();
  app.add_option("--metrics-interval", o->metrics_interval,
                 "time between scrapes of a node's /metrics (its load gauges)")
      ->capture_default_str();
  app.add_option("--first-token-timeout", o->first_token_timeout,
                 "a stream's first token must come within this, or it moves to another node")
      ->capture_default_str();
  app.add_option("--stall-floor", o->stall_floor,
                 "the least time a stream waits for its next token before it moves")
      ->capture_default_str();
  app.add_option("--stall-factor", o->stall_factor,
                 "or this many times the node's measured time between tokens, if longer")
      ->capture_default_str();
  app.add_option("--request-timeout", o->request_timeout,
                 "a request that is not streamed must be answered within this (0s: no limit)")
      ->capture_default_str();
  app.add_option("--affinity-weight", o->affinity_weight,
                 "how many requests of extra load a prompt's own node may carry before "
                 "another node takes it")
      ->capture_default_str();
  app.add_option("--drain-timeout", o->drain_timeout,
                 "seconds that requests in flight get to finish after SIGTERM")
      ->capture_default_str();
  return [o] {
    RouterOptions ro;
    ro.nodes = o->nodes;
    ro.server.host = o->host;
    ro.server.port = o->port;
    ro.server.model_name = "router";
    ro.server.io_threads = o->http_threads;
    ro.server.max_connections = o->max_connections;
    ro.max_attempts = o->max_attempts;
    ro.stall_factor = o->stall_factor;
    ro.pool.health_fall = o->health_fall;
    ro.pool.affinity_weight = o->affinity_weight;
    if (o->http_threads < 1) return Fail("--http-threads must be at least 1");
    if (o->health_fall < 1) return Fail("--health-fall must be at least 1");
    if (o->stall_factor <= 0) return Fail("--stall-factor must be positive");
    if (o->drain_timeout < 0) return Fail("--drain-timeout must not be negative");
    struct Duration {
      const char* flag;
      const std::string* text;
      int64_t* ms;
      bool zero_ok;
    };
    for (const Duration& d :
         {Duration{"--health-interval", &o->health_interval, &ro.pool.health_interval_ms, false},
          {"--health-timeout", &o->health_timeout, &ro.pool.health_timeout_ms, false},
          {"--metrics-interval", &o->metrics_interval, &ro.pool.metrics_interval_ms, false},
          {"--first-token-timeout", &o->first_token_timeout, &ro.first_token_timeout_ms, false},
          {"--stall-floor", &o->stall_floor, &ro.stall_floor_ms, false},
          {"--request-timeout", &o->request_timeout, &ro.request_timeout_ms, true}}) {
      auto v = ParseDuration(*d.text);
      if (!v.ok() || *v < 0 || (*v == 0 && !d.zero_ok))
        return Fail(std::string(d.flag) + ": expected a positive duration such as 500ms or 2s");
      *d.ms = static_cast<int64_t>(*v * 1e3);
    }
    Status signals = InstallSignalPipe();
    if (!signals.ok()) return Fail(signals.ToString());
    FleetRouter router(ro);
    Status st = router.Start();
    if (!st.ok()) return Fail(st.ToString());
    int up = 0;
    for (const NodeSnapshot& n : router.Nodes()) up += n.state == NodeState::kUp;
    std::printf("routing on http://%s:%d over %zu nodes (%d up)\n", o->host.c_str(), router.port(),
                o->nodes.size(), up);
    std::fflush(stdout);
    const int cut = DrainOnSignal(
        o->drain_timeout, [&](int64_t ms) { return router.Drain(ms); }, [&] { router.Stop(); });
    router.Stop();
    std::printf("router stopped (%d requests cut short)\n", cut);
    return 0;
  };
}

}  // namespace failsafe
