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
  std::string model;            // sent as "model"; empty: none
  int input_tokens = 32;        // random token-id prompt of this length
  int output_tokens = 32;       // max_tokens (ignore_eos: every request generates this many)
  int probe_interval_ms = 100;  // 0: no probes
  double timeout_s = 600;       // a level gives up on requests still open after this
  uint64_t seed = 0;
  // Output lengths vary per request in [output_tokens, output_tokens_max]
  // when output_tokens_max > output_tokens.
  int output_tokens_max = 0;
  // > 0: requests with an odd pool index are sampled at this temperature with
  // a `seed` of their own (the pool index); the others are greedy.
  double sampled_temperature = 0;
  // Closed loop: each finished stream is replaced by the next request until
  // `closed_loop_s` have passed, so that `clients` streams stay open. Request
  // k uses pool entry k mod `pool` (prompt, length, sampling): a run with
  // faults can be compared with a fault-free run of the pool. 0: one request
  // per client, pool entry = client index.
  double closed_loop_s = 0;
  int pool = 0;
  bool keep_streams = false;  // fill LoadResult::streams
};

// One request as its client saw it.
struct StreamRecord {
  int pool_index = 0;
  int status = 0;                 // HTTP status; 0: no answer
  bool ok = false;                // 200, ended with [DONE], no error event
  std::string error;              // what went wrong, when not ok
  std::string text;               // the streamed text, concatenated
  int64_t sent_ns = 0;            // MonotonicNanos
  std::vector<int64_t> token_ns;  // arrival of each token event, MonotonicNanos
  std::vector<int> text_ends;     // text.size() after each token event (kept streams only)
  int64_t completion_tokens = 0;  // the usage chunk's count (0: none came)
  int max_tokens = 0;             // what the request asked for
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
  int64_t tokens = 0;                 // completion tokens reported by the streams' usage
  std::vector<StreamRecord> streams;  // with LoadOptions::keep_streams, in sending order
};

// Runs one level of `clients` concurrent streams to its end (or, in a closed
// loop, for its duration and until the last stream ends).
Result<LoadResult> RunLoad(const LoadOptions& options, int clients);

}  // namespace failsafe
