// Request workloads: the Mooncake conversation trace, an OpenThoughts-like
// length distribution, or a JSONL file of the same form.
//
// JSONL form, one request per line: {"timestamp": ms (optional, default 0),
// "input_length": tokens, "output_length": tokens, "hash_ids": [ids]
// (optional)}. Lengths are scaled by `length_scale` (rounded, at least 1
// token) and timestamps by `time_scale`.
//
// hash_ids (the Mooncake trace's): one id per block of kTraceHashBlock prompt
// tokens (ids past the prompt's last block are not used); two requests
// with the same first k ids share their first k blocks of prompt. Scaled, a
// block is round(kTraceHashBlock * length_scale) tokens (at least 1), so a
// shared block stays shared by the same requests (WorkloadPrompt).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace failsafe {

// Prompt tokens per hash id in the Mooncake trace.
constexpr int kTraceHashBlock = 512;
// The longest input or output a trace row may ask for, after scaling.
constexpr int kMaxTraceTokens = 1 << 24;

struct WorkloadRequest {
  double arrival_s = 0;
  int input_len = 0;
  int output_len = 0;
  // Block ids of the prompt, block_tokens tokens each (the last block may be
  // short); empty: the prompt shares nothing.
  std::vector<int64_t> hash_ids = {};
  int block_tokens = kTraceHashBlock;
};

struct WorkloadOptions {
  int max_requests = 0;  // 0: all
  double length_scale = 1.0;
  double time_scale = 1.0;
  int max_context = 0;        // input + output must fit; 0: no limit
  bool skip_invalid = false;  // skip (and count) bad lines instead of failing
  uint64_t seed = 0;          // for generated workloads
};

struct Workload {
  std::vector<WorkloadRequest> requests;
  int skipped = 0;    // invalid lines skipped
  int reordered = 0;  // rows with an earlier timestamp than a row above them (requests are
                      // sorted by arrival, stably)
  std::string description;
};

// The prompt of the request at `index`: token j of hash block k is drawn from
// (seed, hash_ids[k], j), so requests with equal hash ids have equal blocks;
// tokens past the hashed blocks are drawn from (seed, index, position), the
// request's own. Tokens lie in [first_token, first_token + num_tokens).
std::vector<int32_t> WorkloadPrompt(const WorkloadRequest& r, int index, uint64_t seed,
                                    int32_t first_token, int32_t num_tokens);

// Reads a JSONL trace; errors name the file and line. The requests come back
// sorted by arrival (rows out of order are counted in `reordered`); a trace
// with no valid request is an error.
Result<Workload> ReadJsonlWorkload(const std::string& path, const WorkloadOptions& options);

// OpenThoughts-114k stand-in: log-normal lengths matched to the paper's mean and
// median (input 422 / 352, max 7,633; output 7,295 / 5,583, max 37,817), every
// request arriving at time 0. The dataset itself is not reachable here.
Workload OpenThoughtsWorkload(int requests, const WorkloadOptions& options);

// "mooncake" (the trace in `data_dir`), "openthoughts", or a file path.
Result<Workload> LoadWorkload(const std::string& name, const std::string& data_dir,
                              const WorkloadOptions& options);

// Where the traces live: `flag` if given, else the first of ../shared/data,
// ./data and the copy in the source tree that exists.
std::string FindDataDir(const std::string& flag);

}  // namespace failsafe
