// How a step's attention problems map onto the CUDA kernels (kernels.h,
// attention.cu): each problem's page table, its blocks and, for problems
// split into segments over blocks, where their states go. Host code only,
// shared by the backend and the kernels' emulated tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"

namespace failsafe::cuda {

struct AttentionPlan {
  // Every problem's page table, one after another: problem i's at
  // pages[page_offset[i]]. In a graphed step each is padded to runs of 64
  // pages (with its last), so that its uploads keep their sizes while its
  // context grows within a run.
  std::vector<const float*> pages;
  std::vector<size_t> page_offset;
  // The kernels' problems, their `pages` members null: the caller points
  // problem i's at its uploaded table.
  std::vector<AttentionProblem> problems;
  // Problem i's blocks are [first_block[i], first_block[i + 1]); its split
  // queries [first_query[i], first_query[i + 1]) of split_queries.
  std::vector<int> first_block, first_query;
  int blocks = 0, split_queries = 0;
  int64_t state_floats = 0;  // the split queries' segment states
  int max_tokens = 0, max_head_dim = 0;
  bool tensor = false;    // AttendTc
  bool segments = false;  // Attend in segments
};

// `mode`: the backend's choice (tensor cores where every problem's head dim
// allows it); `graphed`: a step recorded or replayed as a graph (page tables
// padded, no split: its grid and states would change with the context).
void PlanAttention(const std::vector<AttentionArgs>& problems, GpuAttention mode, bool graphed,
                   AttentionPlan* plan);

}  // namespace failsafe::cuda
