#include "backend/cuda/gemm_lt.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "common/log.h"

namespace failsafe::cuda {

namespace {

#define FS_LT_CHECK(expr)                                                        \
  do {                                                                           \
    const cublasStatus_t fs_lt_st_ = (expr);                                     \
    FS_CHECK_MSG(fs_lt_st_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt status {} in {}", \
                 static_cast<int>(fs_lt_st_), #expr);                            \
  } while (0)

constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr int kProbeRows = 1024;      // the reference band's probe
constexpr int kAdoptProbeRows = 256;  // an adoption's (LtGemm::Adopt)
constexpr int kSmallProbe = 7;
constexpr int kCandidates = 16;
constexpr int kTimedRuns = 3;  // a band's candidates are timed over these, after one warm run
// A family adopts a chosen one's algorithms (gemm_lt.h) whose width (n
// times the batch count) is within this ratio of its own.
constexpr double kAdoptRatio = 1.5;

// Bands of m, ascending; the last is the reference.
constexpr int kBands[][2] = {{1, 8}, {9, 32}, {33, 128}, {129, 512}, {513, INT_MAX}};
constexpr int kNumBands = 5;

// The largest power of two up to 256 dividing every value.
int Alignment(std::initializer_list<int64_t> values) {
  int a = 256;
  for (int64_t v : values) {
    while (a > 1 && v % a != 0) a /= 2;
  }
  return a;
}

int ElementBytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

template <typename T>
T AlgoAttr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
  return v;
}

std::string Describe(const cublasLtMatmulAlgo_t& algo) {
  return fmt::format("algo {} tile {} stages {} splitK {}",
                     AlgoAttr<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID),
                     AlgoAttr<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                     AlgoAttr<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                     AlgoAttr<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM));
}

}  // namespace

struct LtGemm::Family {
  LtProblem shape;  // m, pointers of the first call
  int align_x = 0, align_w = 0, align_d = 0;
  int max_rows = INT_MAX;  // batched: the rows stride_d leaves room for
  bool usable = false;     // a reference was found that keeps a row's bits
  std::string adopted;     // whose algorithms it took, if it did not choose its own
  double choose_ms = 0;    // the wall time its choice took
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // W
  struct Layouts {
    cublasLtMatrixLayout_t b = nullptr, c = nullptr;
  };
  std::map<int, Layouts> by_m;
  struct Band {
    cublasLtMatmulAlgo_t algo{};
    std::string how;
  };
  Band bands[kNumBands];

  ~Family() {
    for (auto& [m, l] : by_m) {
      cublasLtMatrixLayoutDestroy(l.b);
      cublasLtMatrixLayoutDestroy(l.c);
    }
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }

  void SetBatch(cublasLtMatrixLayout_t l, int64_t stride) const {
    if (shape.batch <= 1) return;
    const int32_t count = shape.batch;
    FS_LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                 sizeof(count)));
    FS_LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                 &stride, sizeof(stride)));
  }

  const Layouts& For(int m) {
    auto it = by_m.find(m);
    if (it != by_m.end()) return it->second;
    Layouts l;
    // Column-major views: X^T [k, m], D^T [n, m].
    FS_LT_CHECK(cublasLtMatrixLayoutCreate(&l.b, shape.type, shape.k, m, shape.ldx));
    FS_LT_CHECK(cublasLtMatrixLayoutCreate(&l.c, CUDA_R_32F, shape.n, m, shape.ldd));
    SetBatch(l.b, shape.stride_x);
    SetBatch(l.c, shape.stride_d);
    return by_m.emplace(m, l).first->second;
  }

  int BandOf(int m) const {
    for (int i = 0; i < kNumBands; ++i) {
      if (m <= kBands[i][1]) return i;
    }
    return kNumBands - 1;
  }
};

LtGemm::LtGemm(cudaStream_t stream, bool pools, std::function<void()> busy,
               std::function<void()> before_wait)
    : stream_(stream), pools_(pools), busy_(std::move(busy)), before_wait_(std::move(before_wait)) {
  FS_LT_CHECK(cublasLtCreate(&handle_));
  workspace_bytes_ = kWorkspaceBytes;
  FS_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

LtGemm::~LtGemm() {
  families_.clear();
  for (void* p : deferred_frees_) cudaFree(p);
  if (choose_stream_) cudaStreamDestroy(choose_stream_);
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

LtGemm::Family& LtGemm::FamilyOf(const LtProblem& p) {
  const int eb = ElementBytes(p.type);
  const int ax = Alignment({reinterpret_cast<int64_t>(p.x), p.ldx * eb, p.stride_x * eb});
  const int aw = Alignment({reinterpret_cast<int64_t>(p.w), p.ldw * eb, p.stride_w * eb});
  const int ad = Alignment({reinterpret_cast<int64_t>(p.d), p.ldd * 4, p.stride_d * 4});
  const Key key{static_cast<int>(p.type),
                p.n,
                p.k,
                p.ldx,
                p.ldw,
                p.ldd,
                p.batch,
                p.stride_x,
                p.stride_w,
                p.stride_d,
                ax,
                aw,
                ad};
  auto it = families_.find(key);
  if (it != families_.end()) return *it->second;
  auto f = std::make_unique<Family>();
  f->shape = p;
  f->align_x = ax;
  f->align_w = aw;
  f->align_d = ad;
  if (p.batch > 1) f->max_rows = static_cast<int>(p.stride_d / p.ldd);
  FS_LT_CHECK(cublasLtMatmulDescCreate(&f->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  FS_LT_CHECK(cublasLtMatmulDescSetAttribute(f->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  FS_LT_CHECK(cublasLtMatmulDescSetAttribute(f->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  // W [n, k] row-major is the column-major [k, n]; op T makes it [n, k].
  FS_LT_CHECK(cublasLtMatrixLayoutCreate(&f->a, p.type, p.k, p.n, p.ldw));
  f->SetBatch(f->a, p.stride_w);
  Family& ref = *families_.emplace(key, std::move(f)).first->second;
  // Met first in a step being captured (its graph keeps the band's
  // algorithm, so it is chosen now, not later): the checks and the timing
  // go on a stream of their own, outside the graph, with this thread's
  // capture rules relaxed for their allocations and waits. Nothing else
  // runs meanwhile: a capture starts with the stream idle
  // (CudaBackend::BeginGraph), so the workspace is free.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FS_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  const bool captured = capture != cudaStreamCaptureStatusNone;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (captured) {
    FS_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    if (!choose_stream_)
      FS_CUDA_CHECK(cudaStreamCreateWithFlags(&choose_stream_, cudaStreamNonBlocking));
  }
  const cudaStream_t s = captured ? choose_stream_ : stream_;
  // On the stream, the choice waits for it: nothing may be left on it that
  // never finishes. (A capture's stream is idle.)
  if (!captured && before_wait_) before_wait_();
  const auto t0 = std::chrono::steady_clock::now();
  // Strides and the activations' row stride change a family's alignment
  // (in the key) and its width, not how a column's sum is ordered.
  std::vector<Family*>& chosen =
      chosen_[ChoiceKey{static_cast<int>(p.type), p.k, p.ldw, ax, aw, ad}];
  const bool adopted = Adopt(ref, p, chosen, s);
  if (!adopted) {
    chosen.push_back(&ref);
    Choose(ref, p, s);
  }
  if (captured) {
    // Nothing of the choice left running on its stream (a check that
    // failed part way leaves launches unwaited): the captured graph's
    // products use the same workspace.
    FS_CUDA_CHECK(cudaStreamSynchronize(choose_stream_));
    FS_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  }
  ref.choose_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  FS_LOG_INFO("cuBLASLt n {} k {} batch {}: {} in {:.1f} ms{}", p.n, p.k, p.batch,
              adopted ? "the algorithms of " + ref.adopted + " checked" : "algorithms chosen",
              ref.choose_ms, captured ? " (in a capture)" : "");
  return ref;
}

bool LtGemm::MakeProbe(const Family& f, const LtProblem& p, int rows, cudaStream_t s, Probe* pr) {
  *pr = Probe();
  pr->rows = std::min(rows, f.max_rows);
  pr->stream = s;
  const int eb = ElementBytes(p.type);
  const int64_t x_elems = static_cast<int64_t>(pr->rows) * p.ldx + (p.batch - 1) * p.stride_x + p.k;
  const int64_t d_elems = static_cast<int64_t>(pr->rows) * p.ldd + (p.batch - 1) * p.stride_d + p.n;
  // From the device's pool where the backend allocates from it: cudaFree
  // would wait for the whole device (a recovery's KV restore beside it),
  // and the pool's free is ordered on s, which is not being captured.
  auto get = [&](void** out, size_t bytes) {
    const cudaError_t e = pools_ ? cudaMallocAsync(out, bytes, s) : cudaMalloc(out, bytes);
    if (!OutOfDeviceMemory(e)) return true;
    *out = nullptr;
    return false;
  };
  const bool ok = get(&pr->x, x_elems * eb) &&
                  get(reinterpret_cast<void**>(&pr->ref), d_elems * 4) &&
                  get(reinterpret_cast<void**>(&pr->cand), d_elems * 4) &&
                  get(reinterpret_cast<void**>(&pr->mismatches), sizeof(int));
  if (!ok) {
    FreeProbe(*pr);
    return false;
  }
  FillRandom(pr->x, p.type == CUDA_R_16BF ? WType::kBF16 : WType::kF16, x_elems, 0x5eed, s);
  return true;
}

int LtGemm::Differs(const Probe& pr, const LtProblem& p, int rows) {
  const cudaStream_t s = pr.stream;
  FS_CUDA_CHECK(cudaMemsetAsync(pr.mismatches, 0, sizeof(int), s));
  CountMismatches(pr.ref, pr.cand, rows, p.n, p.ldd, p.batch, p.stride_d, pr.mismatches, s);
  int host = 0;
  FS_CUDA_CHECK(cudaMemcpyAsync(&host, pr.mismatches, sizeof(int), cudaMemcpyDeviceToHost, s));
  FS_CUDA_CHECK(cudaStreamSynchronize(s));
  if (busy_) busy_();
  return host;
}

void LtGemm::FreeProbe(Probe& pr) {
  const cudaStream_t s = pr.stream;
  if (!pools_ && s == stream_) FS_CUDA_CHECK(cudaStreamSynchronize(s));
  for (void* b : {pr.x, static_cast<void*>(pr.ref), static_cast<void*>(pr.cand),
                  static_cast<void*>(pr.mismatches)}) {
    if (!b) continue;
    if (pools_) {
      FS_CUDA_CHECK(cudaFreeAsync(b, s));
    } else if (s == stream_) {
      cudaFree(b);
    } else {
      // Inside a capture a free may wait for the device, which the capture
      // refuses: the probes go once it has ended (FreeDeferred).
      deferred_frees_.push_back(b);
    }
  }
  pr = Probe();
}

// The rows a band's candidate is checked at for the reference's bits: the
// band's ends, the rows beside them, its middle and the powers of two
// inside it (the row counts where tiles change), up to `cap` rows; none
// where the band begins past it.
std::vector<int> LtGemm::CheckedRows(int band, int cap) {
  const int lo = kBands[band][0], hi = std::min(kBands[band][1], cap);
  if (lo > hi) return {};
  std::vector<int> at = {hi, lo};
  for (int m : {lo + 1, (lo + hi) / 2, hi - 1}) {
    if (m > lo && m < hi) at.push_back(m);
  }
  for (int m = 2; m < hi; m *= 2) {
    if (m > lo) at.push_back(m);
  }
  std::sort(at.begin() + 2, at.end());
  at.erase(std::unique(at.begin() + 2, at.end()), at.end());
  at.erase(std::unique(at.begin(), at.end()), at.end());
  return at;
}

bool LtGemm::Adopt(Family& f, const LtProblem& p, const std::vector<Family*>& chosen,
                   cudaStream_t s) {
  const double width = static_cast<double>(f.shape.n) * f.shape.batch;
  Family* from = nullptr;
  double nearest = 0;
  for (Family* c : chosen) {
    if (!c->usable) continue;
    const double w = static_cast<double>(c->shape.n) * c->shape.batch;
    const double ratio = std::max(w, width) / std::min(w, width);
    if (ratio <= kAdoptRatio && (!from || ratio < nearest)) {
      from = c;
      nearest = ratio;
    }
  }
  if (!from) return false;
  const std::string whose = fmt::format("n {} batch {}", from->shape.n, from->shape.batch);
  // cuBLASLt must take each band's algorithm at the band's ends for this
  // shape (its reference at the family's last row too, where a batched
  // family's rows end before the last band begins: Run falls back to it).
  const int cap = std::min(kProbeRows, f.max_rows);
  for (int b = 0; b < kNumBands; ++b) {
    std::vector<int> ends;
    if (kBands[b][0] <= cap) {
      ends = {kBands[b][0], std::min(kBands[b][1], cap)};
    } else if (b == kNumBands - 1) {
      ends = {cap};
    }
    for (int m : ends) {
      const auto& l = f.For(m);
      cublasLtMatmulHeuristicResult_t result{};
      if (cublasLtMatmulAlgoCheck(handle_, f.op, f.a, l.b, l.c, l.c, &from->bands[b].algo,
                                  &result) != CUBLAS_STATUS_SUCCESS ||
          result.workspaceSize > workspace_bytes_) {
        FS_LOG_INFO("cuBLASLt n {} k {} batch {}: {}'s algorithms refused at m {}", f.shape.n,
                    f.shape.k, f.shape.batch, whose, m);
        return false;
      }
    }
  }
  // And give a row the reference's bits where a choice checks them, up to
  // kAdoptProbeRows (the reference there and at kSmallProbe rows), on this
  // family's own weights: tens of launches, where a choice is hundreds, and
  // probes a quarter of a choice's size (a recovery's device has little
  // memory to spare: without it the family chooses its own).
  Probe pr;
  if (!MakeProbe(f, p, kAdoptProbeRows, s, &pr)) {
    FS_LOG_WARN("cuBLASLt n {} k {} batch {}: no device memory to check {}'s algorithms", f.shape.n,
                f.shape.k, f.shape.batch, whose);
    return false;
  }
  const cublasLtMatmulAlgo_t& reference = from->bands[kNumBands - 1].algo;
  const int small = std::min(kSmallProbe, pr.rows);
  bool keeps = Launch(f, reference, p, pr.rows, pr.x, pr.ref, false, s) &&
               Launch(f, reference, p, small, pr.x, pr.cand, false, s) &&
               Differs(pr, p, small) == 0;
  for (int b = 0; keeps && b < kNumBands - 1; ++b) {
    for (int m : CheckedRows(b, pr.rows)) {
      keeps = keeps && Launch(f, from->bands[b].algo, p, m, pr.x, pr.cand, false, s) &&
              Differs(pr, p, m) == 0;
    }
  }
  FreeProbe(pr);
  if (!keeps) {
    FS_LOG_WARN("cuBLASLt n {} k {} batch {}: {}'s algorithms do not keep a row's bits here",
                f.shape.n, f.shape.k, f.shape.batch, whose);
    return false;
  }
  for (int b = 0; b < kNumBands; ++b) f.bands[b] = from->bands[b];
  f.usable = true;
  f.adopted = whose;
  return true;
}

bool LtGemm::Launch(Family& f, const cublasLtMatmulAlgo_t& algo, const LtProblem& p, int m,
                    const void* x, float* d, bool accumulate, cudaStream_t s) {
  const auto& l = f.For(m);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if (cublasLtMatmul(handle_, f.op, &alpha, p.w, f.a, x, l.b, &beta, d, l.c, d, l.c, &algo,
                     workspace_, workspace_bytes_, s) == CUBLAS_STATUS_SUCCESS)
    return true;
  // A candidate refused may leave a launch error behind, which the next
  // check of the runtime's last error would take for its own.
  (void)cudaGetLastError();
  return false;
}

void LtGemm::Choose(Family& f, const LtProblem& p, cudaStream_t s) {
  cublasLtMatmulPreference_t pref = nullptr;
  FS_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes_;
  FS_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &ws, sizeof(ws)));
  const uint32_t ax = f.align_x, aw = f.align_w, ad = f.align_d;
  FS_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                   &aw, sizeof(aw)));
  FS_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                   &ax, sizeof(ax)));
  FS_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                   &ad, sizeof(ad)));
  FS_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                   &ad, sizeof(ad)));
  // Candidates at m rows, without split-K (whose partial sums change a
  // row's order with the problem's size).
  auto candidates = [&](int m) {
    std::vector<cublasLtMatmulAlgo_t> out;
    cublasLtMatmulHeuristicResult_t results[kCandidates];
    int returned = 0;
    const auto& l = f.For(m);
    if (cublasLtMatmulAlgoGetHeuristic(handle_, f.op, f.a, l.b, l.c, l.c, pref, kCandidates,
                                       results, &returned) != CUBLAS_STATUS_SUCCESS)
      return out;
    for (int i = 0; i < returned; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
      if (AlgoAttr<uint32_t>(results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) > 1) continue;
      out.push_back(results[i].algo);
    }
    return out;
  };

  // The reference's candidates, at the probe's rows (MakeProbe's).
  const int probe = std::min(kProbeRows, f.max_rows);
  const std::vector<cublasLtMatmulAlgo_t> refs = candidates(probe);
  const int small = std::min(kSmallProbe, probe);
  auto unusable = [&](const char* why) {
    f.usable = false;
    FS_LOG_WARN("cuBLASLt {} for n {} k {} batch {}: the engine's own kernels take these products",
                why, p.n, p.k, p.batch);
  };
  if (refs.empty()) {  // nothing to check, no probes
    unusable("offers no algorithm");
    cublasLtMatmulPreferenceDestroy(pref);
    return;
  }

  // Probe buffers: random activations laid out as the family's, and two
  // outputs.
  Probe pr;
  FS_CHECK_MSG(MakeProbe(f, p, probe, s, &pr),
               "no device memory to choose cuBLASLt's algorithms for n {} k {} batch {}", p.n, p.k,
               p.batch);
  auto differs = [&](int rows) { return Differs(pr, p, rows); };

  // The reference: a row's bits the same at kSmallProbe rows as at `probe`.
  Family::Band& last = f.bands[kNumBands - 1];
  bool found = false;
  for (const auto& algo : refs) {
    if (!Launch(f, algo, p, probe, pr.x, pr.ref, false, s)) continue;
    if (!Launch(f, algo, p, small, pr.x, pr.cand, false, s)) continue;
    if (differs(small) == 0) {
      last.algo = algo;
      last.how = "reference, checked";
      found = true;
      break;
    }
  }
  // Without a reference that keeps its rows, the family is not cuBLASLt's
  // (the caller takes its own kernels: other bits than cuBLASLt's, which a
  // placement that cuts this weight otherwise may not share).
  f.usable = found;
  if (!found) unusable("keeps no row's bits");
  // A band's own: of the candidates that give the reference's bits at its
  // smallest and largest m, the fastest at its smallest (decode's one row
  // reads the whole weight: an algorithm whose tiles leave most
  // multiprocessors idle reads it at a fraction of the bandwidth).
  cudaEvent_t start = nullptr, stop = nullptr;
  FS_CUDA_CHECK(cudaEventCreate(&start));
  FS_CUDA_CHECK(cudaEventCreate(&stop));
  auto seconds = [&](const cublasLtMatmulAlgo_t& algo, int m) {
    if (!Launch(f, algo, p, m, pr.x, pr.cand, false, s)) return -1.0;  // warm
    FS_CUDA_CHECK(cudaEventRecord(start, s));
    for (int r = 0; r < kTimedRuns; ++r) {
      if (!Launch(f, algo, p, m, pr.x, pr.cand, false, s)) return -1.0;
    }
    FS_CUDA_CHECK(cudaEventRecord(stop, s));
    FS_CUDA_CHECK(cudaEventSynchronize(stop));
    if (busy_) busy_();
    float ms = 0;
    FS_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms * 1e-3 / kTimedRuns;
  };
  for (int b = 0; found && b < kNumBands - 1; ++b) {
    Family::Band& band = f.bands[b];
    band.algo = last.algo;
    band.how = "reference";
    const int lo = kBands[b][0], hi = std::min(kBands[b][1], probe);
    if (lo > probe) continue;
    double best = seconds(last.algo, lo);
    int checked = 0;
    bool own = false;
    // Where a candidate must give the reference's bits (CheckedRows), so
    // that the fastest is as m-invariant as the first that passed,
    // whichever a process finds fastest.
    const std::vector<int> at = CheckedRows(b, probe);
    for (const auto& algo : candidates(hi)) {
      bool keeps = true;
      for (int m : at) {
        if (!Launch(f, algo, p, m, pr.x, pr.cand, false, s) || differs(m) != 0) {
          keeps = false;
          break;
        }
      }
      if (!keeps) continue;
      ++checked;
      const double t = seconds(algo, lo);
      if (t < 0 || (best >= 0 && t >= best)) continue;
      best = t;
      band.algo = algo;
      own = true;
    }
    band.how = fmt::format("{}, the fastest of {} checked and the reference: {:.1f} us at m {}",
                           own ? "own" : "reference", checked, best * 1e6, lo);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  FreeProbe(pr);
  cublasLtMatmulPreferenceDestroy(pref);
}

void LtGemm::FreeDeferred() {
  if (deferred_frees_.empty()) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FS_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  if (capture != cudaStreamCaptureStatusNone) return;
  for (void* p : deferred_frees_) cudaFree(p);
  deferred_frees_.clear();
}

bool LtGemm::Run(const LtProblem& p) {
  FreeDeferred();
  if (p.m <= 0 || p.n <= 0) return true;
  Family& f = FamilyOf(p);
  if (!f.usable) return false;
  FS_CHECK_MSG(p.m <= f.max_rows, "{} rows over the batched family's {}", p.m, f.max_rows);
  if (Launch(f, f.bands[f.BandOf(p.m)].algo, p, p.m, p.x, p.d, p.accumulate, stream_)) return true;
  FS_CHECK_MSG(Launch(f, f.bands[kNumBands - 1].algo, p, p.m, p.x, p.d, p.accumulate, stream_),
               "cuBLASLt cannot run n {} k {} m {}", p.n, p.k, p.m);
  return true;
}

std::vector<std::string> LtGemm::Report() const {
  std::vector<std::string> out;
  for (const auto& [key, f] : families_) {
    std::string line = fmt::format("n {} k {} batch {} ldd {}", f->shape.n, f->shape.k,
                                   f->shape.batch, f->shape.ldd);
    line += f->adopted.empty()
                ? fmt::format(" (chosen in {:.1f} ms):", f->choose_ms)
                : fmt::format(" (as {}, checked in {:.2f} ms):", f->adopted, f->choose_ms);
    if (!f->usable) line += " not cuBLASLt's (no algorithm keeps a row's bits)";
    for (int b = 0; f->usable && b < kNumBands; ++b) {
      line += fmt::format(" [{}-{}] {} ({})", kBands[b][0],
                          kBands[b][1] == INT_MAX ? std::string("") : std::to_string(kBands[b][1]),
                          Describe(f->bands[b].algo), f->bands[b].how);
    }
    out.push_back(line);
  }
  return out;
}

}  // namespace failsafe::cuda
