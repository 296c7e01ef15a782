// A load client: opens N streaming completion requests at once against a
// running server (event-driven, one thread for all of them), holds them until
// each is served or refused, and meanwhile probes /health and /metrics on new
// connections to see whether the server still answers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/percentiles.h"
#include "common/status.h"

namespace failsafe {

struct LoadOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model;       // sent as "model"; empty: none
  int input_tokens = 32;   // random token-id prompt of this length
  int output_tokens = 32;  // max_tokens (ignore_eos: every request generates this many)
  int probe_interval_ms = 100;
  double timeout_s = 600;  // a level gives up on requests still open after this
  uint64_t seed = 0;
};

struct LoadResult {
  int clients = 0;
  int served = 0;  // 200 and the stream ended with [DONE]
  int refused_429 = 0;
  int failed = 0;  // anything else: another status, a broken stream, no answer
  std::string first_error;
  int peak_open = 0;  // requests open at once (sent, not yet answered whole), client view
  int64_t peak_server_connections = 0;  // failsafe_http_connections_open, from /metrics
  Percentiles ttft_ms;                  // request sent -> first token event
  Percentiles tbt_ms;                   // between token events of a stream
  Percentiles health_ms;                // GET /health on a new connection, while the level runs
  Percentiles metrics_ms;               // GET /metrics, likewise
  int probes_failed = 0;  // probes with no answer within 5 s or not 200 (/health 503 counts)
  double seconds = 0;     // the level's wall time
  struct Probe {
    double at_s = 0;        // since the level started
    double health_ms = -1;  // -1: no 200 within 5 s
    double metrics_ms = -1;
    int open = 0;  // requests open at that moment (client view)
  };
  std::vector<Probe> probes;
  int64_t tokens = 0;  // completion tokens reported by the streams' usage
};

// Runs one level of `clients` concurrent streams to its end.
Result<LoadResult> RunLoad(const LoadOptions& options, int clients);

}  // namespace failsafe
