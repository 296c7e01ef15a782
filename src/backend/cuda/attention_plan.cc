#include "backend/cuda/attention_plan.h"

#include <algorithm>

#include "common/check.h"

namespace failsafe::cuda {

void PlanAttention(const std::vector<AttentionArgs>& problems, GpuAttention mode, bool graphed,
                   AttentionPlan* plan) {
  AttentionPlan& p = *plan;
  const size_t n = problems.size();
  p.pages.clear();
  p.page_offset.assign(n, 0);
  p.max_tokens = 0;
  p.max_head_dim = 0;
  for (size_t i = 0; i < n; ++i) {
    const AttentionArgs& a = problems[i];
    const int positions = a.start_pos + a.num_tokens;
    const int pages = (positions + a.block_size - 1) / a.block_size;
    p.page_offset[i] = p.pages.size();
    p.pages.insert(p.pages.end(), a.pages, a.pages + pages);
    // (A problem of no positions has no pages to pad with.)
    if (pages > 0 && graphed) {
      p.pages.resize(p.page_offset[i] + (pages + 63) / 64 * 64, a.pages[pages - 1]);
    }
    p.max_tokens = std::max(p.max_tokens, a.num_tokens);
    p.max_head_dim = std::max(p.max_head_dim, a.head_dim);
  }
  // On tensor cores where asked and the head dim allows (one model's
  // problems share it, so a model always takes the same kernel).
  p.tensor = mode == GpuAttention::kTensor && AttentionTcSupported(p.max_head_dim);
  for (const AttentionArgs& a : problems) p.tensor = p.tensor && a.head_dim == p.max_head_dim;
  // Segments: a problem of one block of queries over two or more segments
  // (decode over a long context) has its segments split over blocks. Not
  // in a graphed step.
  p.segments = !p.tensor && mode == GpuAttention::kSegments;
  const bool may_split = p.segments && !graphed;
  p.problems.resize(n);
  p.first_block.assign(n + 1, 0);
  p.first_query.assign(n + 1, 0);
  p.state_floats = 0;
  p.split_queries = 0;
  p.blocks = 0;
  for (size_t i = 0; i < n; ++i) {
    const AttentionArgs& a = problems[i];
    AttentionProblem& k = p.problems[i];
    k.q = a.q;
    k.out = a.out;
    k.new_kv = a.new_kv;
    k.pages = nullptr;
    k.ldq = a.ldq;
    k.ldo = a.ldo;
    k.ld_new_kv = a.ld_new_kv;
    k.num_tokens = a.num_tokens;
    k.start_pos = a.start_pos;
    k.group_size = a.group_size;
    k.head_dim = a.head_dim;
    k.block_size = a.block_size;
    k.sliding_window = a.sliding_window;
    k.scale = a.scale;
    k.softcap = a.softcap;
    FS_CHECK_MSG(a.kv_dtype == DType::kF32 || a.kv_dtype == DType::kBF16,
                 "KV pages hold f32 or bf16, not {}", DTypeName(a.kv_dtype));
    k.kv_bf16 = a.kv_dtype == DType::kBF16 ? 1 : 0;
    k.split = 0;
    k.seg_first = 0;
    k.state0 = 0;
    p.first_block[i] = p.blocks;
    p.first_query[i] = p.split_queries;
    if (a.group_size <= 0) continue;
    if (p.tensor) {
      p.blocks += AttentionTcBlocks(a.num_tokens, a.group_size);
      continue;
    }
    const int own = AttentionBlocks(a.num_tokens, a.group_size);
    if (may_split && own == 1) {
      const int last = a.start_pos + a.num_tokens - 1;
      const int first_key =
          a.sliding_window > 0 ? std::max(0, a.start_pos - a.sliding_window + 1) : 0;
      const int seg_first = first_key / kAttentionSegment;
      const int segs = last / kAttentionSegment - seg_first + 1;
      if (segs >= 2) {
        const int queries = a.num_tokens * a.group_size;
        k.split = segs;
        k.seg_first = seg_first;
        k.state0 = p.state_floats;
        p.state_floats += static_cast<int64_t>(queries) * segs * (a.head_dim + 2);
        p.split_queries += queries;
        p.blocks += segs;
        continue;
      }
    }
    p.blocks += own;
  }
  p.first_block[n] = p.blocks;
  p.first_query[n] = p.split_queries;
}

}  // namespace failsafe::cuda
