// Tensor-core products through cuBLASLt, batch-invariant by a fixed
// algorithm per shape.
//
// cuBLASLt's heuristics pick a kernel for each problem size, and two
// kernels may add a row's products in different orders (split-K, stream-K,
// other tiles), so a row's result could depend on how many rows share its
// batch. Here each family of problems (every parameter but the row count m)
// gets its algorithms once: one for each band of m, the largest band's
// (the reference) checked to give a row the same bits at 7 rows and at the
// band's size, every other band's chosen among the heuristic's candidates
// whose rows equal the reference's, bit for bit, at the band's ends, the
// rows beside them, its middle and the powers of two inside it, as the
// fastest of them (and the reference) at the band's
// smallest m, timed on the family's weights. A band without such a
// candidate takes the reference; a family without a reference is not
// cuBLASLt's (Run: false). The checks run once per family, on the family's
// own weights and random activations.
//
// A family that differs from one already chosen only in its width (n, its
// batch count, and the strides that go with them) by at most half takes
// that one's algorithms, where cuBLASLt accepts them for its shape and
// they give a row the reference's bits on its own weights at the rows a
// choice checks (tens of launches): a recovery's survivors gain a few
// shards, so each meets products a little wider than before, and a choice
// (hundreds of launches, each waited for) inside the first step after it
// would cost the recovery tenths of a second.
//
// Thread-safety: one thread (the backend's).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace failsafe::cuda {

// D[b][m, n] (f32, row-major, ldd) (+)= X[b][m, k] W[b][n, k]^T, b < batch:
// X and W row-major of `type` (CUDA_R_16BF or CUDA_R_16F), batch entries
// stride_* elements apart.
struct LtProblem {
  cudaDataType_t type = CUDA_R_16BF;
  const void* x = nullptr;
  int64_t ldx = 0;
  const void* w = nullptr;
  int64_t ldw = 0;
  float* d = nullptr;
  int64_t ldd = 0;
  int m = 0, n = 0, k = 0;
  int batch = 1;
  int64_t stride_x = 0, stride_w = 0, stride_d = 0;
  bool accumulate = false;
};

class LtGemm {
 public:
  // pools: probe buffers from the device's stream-ordered pool (else
  // cudaMalloc's, whose free waits for the whole device). busy: called
  // after each wait of a choice (a sign of life; may be empty);
  // before_wait: called before a choice outside a capture waits for the
  // stream (Backend::SetBeforeWait).
  LtGemm(cudaStream_t stream, bool pools, std::function<void()> busy = {},
         std::function<void()> before_wait = {});
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // False, doing nothing, for a family cuBLASLt cannot run batch-invariant
  // (no algorithm, or none that keeps a row's bits): the caller's own
  // kernels take it.
  bool Run(const LtProblem& p);
  // How the families' bands were chosen: one line per family.
  std::vector<std::string> Report() const;

 private:
  struct Family;
  using Key = std::tuple<int, int, int, int64_t, int64_t, int64_t, int, int64_t, int64_t, int64_t,
                         int, int, int>;
  Family& FamilyOf(const LtProblem& p);
  // Random activations laid out as a family's, and two outputs (of the
  // reference, of a candidate), for up to `rows` rows, on stream s: false
  // (nothing held) where the device has no memory for them.
  struct Probe {
    void* x = nullptr;
    float* ref = nullptr;
    float* cand = nullptr;
    int* mismatches = nullptr;
    int rows = 0;
    cudaStream_t stream = nullptr;
  };
  bool MakeProbe(const Family& f, const LtProblem& p, int rows, cudaStream_t s, Probe* pr);
  // Elements of the first `rows` rows where the candidate's output differs
  // from the reference's (waits for the probe's stream).
  int Differs(const Probe& pr, const LtProblem& p, int rows);
  void FreeProbe(Probe& pr);
  static std::vector<int> CheckedRows(int band, int cap);
  // Gives f the algorithms of the chosen family of its choice key nearest
  // its width, if within kAdoptRatio of it, cuBLASLt takes them for f's
  // shape, and they keep a row's bits on f's weights (checked on s).
  bool Adopt(Family& f, const LtProblem& p, const std::vector<Family*>& chosen, cudaStream_t s);
  // Checks and times the family's candidates on stream s.
  void Choose(Family& f, const LtProblem& p, cudaStream_t s);
  bool Launch(Family& f, const cublasLtMatmulAlgo_t& algo, const LtProblem& p, int m, const void* x,
              float* d, bool accumulate, cudaStream_t s);
  // Frees deferred_frees_ once stream_ is not being captured.
  void FreeDeferred();

  cudaStream_t stream_;
  bool pools_;
  std::function<void()> busy_;
  std::function<void()> before_wait_;
  // Where a family first met while stream_ is being captured is chosen
  // (made at the first such).
  cudaStream_t choose_stream_ = nullptr;
  // Probe buffers of a choice made during a capture, freed after it.
  std::vector<void*> deferred_frees_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Family>> families_;
  // The families chosen (not adopted), by what their algorithms depend on:
  // the element type, k, W's row stride and the operands' alignments.
  using ChoiceKey = std::tuple<int, int, int64_t, int, int, int>;  // type, k, ldw, alignments
  std::map<ChoiceKey, std::vector<Family*>> chosen_;
};

}  // namespace failsafe::cuda
