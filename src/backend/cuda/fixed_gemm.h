// Fixed-point item products (kernels.h: FixedItemsGemm), each family run by
// the variant that runs it fastest.
//
// Every variant gives the same bits (an item's chain is the same
// instructions whatever the tile, the pipeline or the split of items over
// blocks), so which one runs is a matter of speed alone, and two processes
// that time differently still agree on every bit. Each family of problems
// (element types, n, item size, items, row stride) gets a variant per band
// of m: the fastest of the band's candidates, timed at the band's size on the
// family's own weights and random rows, the first time a problem of the band
// runs outside a graph capture (inside one, the default runs untimed). The
// environment's FAILSAFE_FIXED_GEMM, a variant's name, runs that variant
// wherever it fits. Where kernels are emulated on the CPU, whose timings say
// nothing of a GPU's and take long, a band's variant is drawn by the
// process and the family instead: processes then run the variants side by
// side, and their outputs must still agree. A family whose band is
// unchosen takes the band's variant of a family that differs only in its
// count of items (and so its row stride), by at most half, the nearest
// such: a recovery's survivors gain a few items, and their first step
// after it should not time kernels.
//
// Thread-safety: one thread (the backend's).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/kernels.h"

namespace failsafe::cuda {

class FixedGemm {
 public:
  static constexpr int kBands = 4;
  // sms: the GPU's multiprocessors; shared_limit: the dynamic shared memory
  // a block may be given; tune_rows: the most rows a timing runs (INT_MAX:
  // the band's); 0: drawn, not timed; pools: a timing's buffers from the
  // device's stream-ordered pool (else cudaMalloc's, whose free waits for
  // the whole device: a recovery's KV restore beside it); busy: called
  // after each timing's wait (a sign of life; may be empty); before_wait:
  // called before a timing waits for the stream (Backend::SetBeforeWait).
  FixedGemm(int sms, size_t shared_limit, cudaStream_t stream, int tune_rows, bool pools,
            std::function<void()> busy = {}, std::function<void()> before_wait = {});

  // acc += the items' fixed-point products. may_time: false while a graph
  // is being captured (nothing may wait for the device).
  void Run(const FixedItems& g, bool may_time);

  // How the families' bands were chosen: one line per family and band, each
  // candidate's time.
  std::vector<std::string> Report() const;

  // The band of m rows, and the variants it chooses among for A of 16-bit
  // values or (a32) of f32.
  static int BandOf(int m);
  static std::vector<int> Candidates(int band, bool a32);
  // What runs where nothing was chosen (inside a graph capture; no memory
  // to time): the default for m rows where it fits this GPU's shared
  // memory, else the band's candidate that takes the least.
  int Fallback(int m, bool a32, int item_k) const;

 private:
  struct Band {
    int variant = -1;  // unchosen
    bool adopted = false;
    std::string how;
  };
  struct Family {
    Band bands[kBands];
  };
  // bf16, A f32, n, item_k, items, lda
  using Key = std::tuple<bool, bool, int, int, int, int64_t>;

  bool Fits(int variant, int item_k) const;
  // The band's candidates that fit (at least one, or a stop).
  std::vector<int> Fitting(int band, bool a32, int item_k) const;
  void Choose(const FixedItems& g, int band, Band& out);
  // The band's variant of the nearest family with other items (see above).
  bool Adopt(const FixedItems& g, int band, Band& out) const;

  int sms_;
  size_t shared_limit_;
  cudaStream_t stream_;
  int tune_rows_;
  bool pools_;
  std::function<void()> busy_;
  std::function<void()> before_wait_;  // Backend::SetBeforeWait's, before a timing waits
  int forced_ = -1;
  std::map<Key, Family> families_;
};

}  // namespace failsafe::cuda
