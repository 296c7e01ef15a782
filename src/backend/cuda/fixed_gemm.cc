#include "backend/cuda/fixed_gemm.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "common/log.h"

namespace failsafe::cuda {

namespace {

constexpr int kTimedRuns = 3;  // a candidate is timed over these, after one warm run
// A family takes the variant of one whose count of items is within this
// ratio of its own (fixed_gemm.h).
constexpr double kAdoptRatio = 1.5;

// Bands of m: first and last rows, the rows timed.
constexpr int kBandRows[FixedGemm::kBands][3] = {
    {1, 16, 16}, {17, 64, 64}, {65, 256, 256}, {257, INT_MAX, 1024}};

// Each band's candidates, by name (kernels.h: FixedItemsVariantName), for A
// of 16-bit values; for A of f32 (which decode's rows take), every band's.
const std::vector<const char*> kA32Candidates = {
    "a32 16x64 s2 b2", "a32 16x64 s4 b2", "a32 16x64 s3 b4", "a32 16x128 s3 b2", "a32 16x32 s4 b4"};
const std::vector<std::vector<const char*>>& CandidateNames() {
  static const auto* names = new std::vector<std::vector<const char*>>{
      {"16x64 s2 b2", "16x64 s4 b2", "16x64 s3 b4", "16x128 s3 b2", "16x32 s4 b4"},
      {"16x64 s2 b2", "16x64 s3 b4", "16x128 s3 b2", "32x64 s3 b2", "64x128 s2 b2", "64x64 s3 b4"},
      {"64x128 s2 b2", "32x64 s3 b2", "64x128 s3 b2", "128x64 s3 b2", "64x64 s3 b4"},
      {"64x128 s2 b2", "64x128 s3 b2", "128x128 s2 b1", "128x64 s3 b2", "64x64 s3 b4"},
  };
  return *names;
}

int VariantNamed(const char* name) {
  for (int v = 0; v < FixedItemsVariants(); ++v) {
    if (std::strcmp(FixedItemsVariantName(v), name) == 0) return v;
  }
  return -1;
}

std::string BandName(int band) {
  return kBandRows[band][1] == INT_MAX
             ? fmt::format("{}-", kBandRows[band][0])
             : fmt::format("{}-{}", kBandRows[band][0], kBandRows[band][1]);
}

}  // namespace

int FixedGemm::BandOf(int m) {
  for (int b = 0; b < kBands; ++b) {
    if (m <= kBandRows[b][1]) return b;
  }
  return kBands - 1;
}

std::vector<int> FixedGemm::Candidates(int band, bool a32) {
  FS_CHECK(band >= 0 && band < kBands);
  std::vector<int> out;
  for (const char* name : a32 ? kA32Candidates : CandidateNames()[band]) {
    const int v = VariantNamed(name);
    FS_CHECK_MSG(v >= 0 && FixedItemsTakesF32(v) == a32, "no fixed-point variant {}", name);
    out.push_back(v);
  }
  return out;
}

FixedGemm::FixedGemm(int sms, size_t shared_limit, cudaStream_t stream, int tune_rows, bool pools,
                     std::function<void()> busy, std::function<void()> before_wait)
    : sms_(sms),
      shared_limit_(shared_limit),
      stream_(stream),
      tune_rows_(tune_rows),
      pools_(pools),
      busy_(std::move(busy)),
      before_wait_(std::move(before_wait)) {
  if (const char* forced = std::getenv("FAILSAFE_FIXED_GEMM"); forced && *forced) {
    forced_ = VariantNamed(forced);
    std::string known;
    for (int v = 0; v < FixedItemsVariants(); ++v) {
      known += fmt::format("{}'{}'", v ? ", " : "", FixedItemsVariantName(v));
    }
    FS_CHECK_MSG(forced_ >= 0, "FAILSAFE_FIXED_GEMM='{}' names no variant (one of {})", forced,
                 known);
  }
}

bool FixedGemm::Fits(int variant, int item_k) const {
  return FixedItemsShared(variant, item_k) <= shared_limit_;
}

std::vector<int> FixedGemm::Fitting(int band, bool a32, int item_k) const {
  std::vector<int> fit;
  for (int v : Candidates(band, a32)) {
    if (Fits(v, item_k)) fit.push_back(v);
  }
  FS_CHECK_MSG(!fit.empty(), "no fixed-point variant fits items of {} in {} bytes of shared memory",
               item_k, shared_limit_);
  return fit;
}

int FixedGemm::Fallback(int m, bool a32, int item_k) const {
  const int v = FixedItemsDefault(m, a32);
  if (Fits(v, item_k)) return v;
  const std::vector<int> fit = Fitting(BandOf(m), a32, item_k);
  return *std::min_element(fit.begin(), fit.end(), [&](int a, int b) {
    return FixedItemsShared(a, item_k) < FixedItemsShared(b, item_k);
  });
}

void FixedGemm::Run(const FixedItems& g, bool may_time) {
  if (g.m <= 0 || g.n <= 0 || g.items <= 0) return;
  const bool a32 = g.a32 != nullptr;
  int variant = -1;
  if (forced_ >= 0) {
    if (Fits(forced_, g.item_k) && FixedItemsTakesF32(forced_) == a32) variant = forced_;
  } else {
    const int band = BandOf(g.m);
    Band& b = families_[Key{g.bf16, a32, g.n, g.item_k, g.items, g.lda}].bands[band];
    if (b.variant < 0 && !Adopt(g, band, b) && may_time) Choose(g, band, b);
    variant = b.variant;
  }
  if (variant < 0) variant = Fallback(g.m, a32, g.item_k);
  FixedItemsGemm(g, variant, sms_, stream_);
}

bool FixedGemm::Adopt(const FixedItems& g, int band, Band& out) const {
  const bool a32 = g.a32 != nullptr;
  const Band* from = nullptr;
  int from_items = 0;
  double nearest = 0;
  for (const auto& [key, f] : families_) {
    const Band& b = f.bands[band];
    const auto [bf16, f32, n, item_k, items, lda] = key;
    if (b.variant < 0 || b.adopted || bf16 != g.bf16 || f32 != a32 || n != g.n ||
        item_k != g.item_k || (items == g.items && lda == g.lda))
      continue;
    const double ratio = static_cast<double>(std::max(items, g.items)) / std::min(items, g.items);
    if (ratio <= kAdoptRatio && (!from || ratio < nearest)) {
      from = &b;
      from_items = items;
      nearest = ratio;
    }
  }
  if (!from) return false;
  out.variant = from->variant;
  out.adopted = true;
  out.how = fmt::format("{}, as for {} items", FixedItemsVariantName(out.variant), from_items);
  return true;
}

void FixedGemm::Choose(const FixedItems& g, int band, Band& out) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool a32 = g.a32 != nullptr;
  const std::vector<int> fit = Fitting(band, a32, g.item_k);
  if (tune_rows_ == 0) {  // drawn by the process and the family
    uint64_t h = static_cast<uint64_t>(getpid()) * 0x9e3779b97f4a7c15ull;
    for (int64_t x : {int64_t{g.bf16}, int64_t{a32}, int64_t{g.n}, int64_t{g.item_k},
                      int64_t{g.items}, g.lda, int64_t{band}}) {
      h = (h ^ static_cast<uint64_t>(x)) * 0x100000001b3ull;
    }
    out.variant = fit[(h >> 17) % fit.size()];
    out.how = fmt::format("{}, drawn (not timed)", FixedItemsVariantName(out.variant));
    return;
  }
  const int rows = std::max(1, std::min(kBandRows[band][2], tune_rows_));
  // The timing waits for the stream: nothing on it may be left that never
  // finishes.
  if (before_wait_) before_wait_();
  // Rows laid out as the family's (random 16-bit values; f32 zeros), and
  // sums to throw away.
  FixedItems t = g;
  t.m = rows;
  void* a = nullptr;
  void* acc = nullptr;
  const size_t a_bytes = (a32 ? 4 : 2) * static_cast<size_t>(rows) * g.lda;
  const size_t acc_bytes = sizeof(int64_t) * static_cast<size_t>(rows) * g.n;
  auto get = [&](void** p, size_t bytes) {
    const cudaError_t e = pools_ ? cudaMallocAsync(p, bytes, stream_) : cudaMalloc(p, bytes);
    if (!OutOfDeviceMemory(e)) return true;  // out of memory: the variant untimed
    *p = nullptr;
    return false;
  };
  // (Freed on stream_ after the timings' last wait: nothing waits for them.)
  auto put = [&](void* p) { FS_CUDA_CHECK(pools_ ? cudaFreeAsync(p, stream_) : cudaFree(p)); };
  if (!get(&a, a_bytes) || !get(&acc, acc_bytes)) {
    if (a) put(a);
    out.variant = Fallback(g.m, a32, g.item_k);
    out.how = fmt::format("{}, untimed: no device memory for the timing",
                          FixedItemsVariantName(out.variant));
    return;
  }
  if (a32) {
    FS_CUDA_CHECK(cudaMemsetAsync(a, 0, a_bytes, stream_));
    t.a32 = static_cast<const float*>(a);
  } else {
    FillRandom(a, g.bf16 ? WType::kBF16 : WType::kF16, static_cast<int64_t>(rows) * g.lda, 0xf1ced,
               stream_);
    t.a = static_cast<const uint16_t*>(a);
  }
  t.acc = static_cast<int64_t*>(acc);
  t.ldacc = g.n;
  cudaEvent_t start = nullptr, stop = nullptr;
  FS_CUDA_CHECK(cudaEventCreate(&start));
  FS_CUDA_CHECK(cudaEventCreate(&stop));
  double best = -1;
  std::string times;
  for (int v : fit) {
    FixedItemsGemm(t, v, sms_, stream_);  // warm
    FS_CUDA_CHECK(cudaEventRecord(start, stream_));
    for (int r = 0; r < kTimedRuns; ++r) FixedItemsGemm(t, v, sms_, stream_);
    FS_CUDA_CHECK(cudaEventRecord(stop, stream_));
    FS_CUDA_CHECK(cudaEventSynchronize(stop));
    if (busy_) busy_();
    float ms = 0;
    FS_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    const double s = ms * 1e-3 / kTimedRuns;
    times +=
        fmt::format("{}{} {:.1f} us", times.empty() ? "" : ", ", FixedItemsVariantName(v), s * 1e6);
    if (best < 0 || s < best) {
      best = s;
      out.variant = v;
    }
  }
  FS_CUDA_CHECK(cudaEventDestroy(start));
  FS_CUDA_CHECK(cudaEventDestroy(stop));
  put(a);
  put(acc);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  out.how = fmt::format("{}, timed at {} rows in {:.1f} ms: {}", FixedItemsVariantName(out.variant),
                        rows, ms, times);
  FS_LOG_INFO("fixed-point items n {} item_k {} items {} rows {}: {}", g.n, g.item_k, g.items,
              BandName(band), out.how);
}

std::vector<std::string> FixedGemm::Report() const {
  std::vector<std::string> out;
  if (forced_ >= 0) {
    out.push_back(
        fmt::format("fixed-point items: {} (FAILSAFE_FIXED_GEMM)", FixedItemsVariantName(forced_)));
  }
  for (const auto& [key, f] : families_) {
    for (int b = 0; b < kBands; ++b) {
      if (f.bands[b].variant < 0) continue;
      out.push_back(fmt::format("fixed-point items {}{} n {} item_k {} items {} rows {}: {}",
                                std::get<0>(key) ? "bf16" : "f16",
                                std::get<1>(key) ? " (A f32)" : "", std::get<2>(key),
                                std::get<3>(key), std::get<4>(key), BandName(b), f.bands[b].how));
    }
  }
  return out;
}

}  // namespace failsafe::cuda
