// A request as the scheduler sees it: its tokens and how far its KV reaches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace failsafe {

enum class SeqState { kWaiting, kRunning, kFinished };

enum class FinishReason { kNone, kLength, kStop, kAborted, kError };
const char* FinishReasonName(FinishReason r);

struct Sequence {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int prompt_len = 0;
  int max_new_tokens = 0;
  std::vector<int32_t> stop_token_ids;
  double arrival = 0;  // seconds on the caller's clock

  SeqState state = SeqState::kWaiting;
  FinishReason finish = FinishReason::kNone;
  int num_computed = 0;  // tokens whose KV is on the devices
  int dp_rank = -1;      // device owning its DP heads; -1: not routed yet
  int kv_blocks = 0;     // blocks of block_size tokens accounted on the devices
  int num_preemptions = 0;
  // Prefix cache: chained hashes of the leading full blocks of `tokens`,
  // computed once while the sequence waits (tokens are only appended, so a
  // block's hash never changes).
  std::vector<uint64_t> block_hashes;
  std::string error;  // when finish == kError

  int len() const { return static_cast<int>(tokens.size()); }
  int output_len() const { return len() - prompt_len; }
  // Tokens still to compute before the next sample.
  int pending() const { return len() - num_computed; }
  bool in_prefill() const { return pending() > 1 || num_computed == 0; }
};

}  // namespace failsafe
