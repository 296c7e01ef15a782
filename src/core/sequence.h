// A request as the scheduler sees it: its tokens and how far its KV reaches.
#pragma once

#include <algorithm>
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
  // Prompt logprobs: the first position whose logits are still wanted
  // (position p's give the log-probability of prompt token p + 1); -1: none
  // (not asked for, or all delivered). Such a sequence computes its prompt
  // whole: it takes no cached prefix.
  int prompt_logits_from = -1;

  int len() const { return static_cast<int>(tokens.size()); }
  int output_len() const { return len() - prompt_len; }
  // Tokens still to compute before the next sample.
  int pending() const { return len() - num_computed; }
  bool in_prefill() const { return pending() > 1 || num_computed == 0; }
  // Rows of logits a chunk of positions [start, start + n) returns, for its
  // last positions: the last one's when the chunk ends the sequence (it
  // samples), and with prompt logprobs every position from
  // prompt_logits_from on that precedes a prompt token.
  int LogitsRows(int start, int n) const {
    const int end = start + n;
    if (prompt_logits_from >= 0) {
      const int first = std::max(start, prompt_logits_from);
      if (first < std::min(end, prompt_len - 1)) return end - first;
    }
    return end == len() ? 1 : 0;
  }
};

}  // namespace failsafe
