// Linear layers. Small batches (decode) are memory-bound: hand-written kernels
// stream each weight byte once. Larger batches are compute-bound: OpenBLAS.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernels.h"

namespace failsafe::cpu {

namespace {
// Batches up to this many rows use the streaming kernels.
constexpr int kMaxStreamRows = 4;
}  // namespace

float Dot(const float* a, const float* b, int n) {
  V16 acc0{}, acc1{};
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 += Load(a + i) * Load(b + i);
    acc1 += Load(a + i + 16) * Load(b + i + 16);
  }
  for (; i + 16 <= n; i += 16) acc0 += Load(a + i) * Load(b + i);
  float s = Sum(acc0 + acc1);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void Axpy(float a, const float* x, float* y, int n) {
  V16 av = Splat(a);
  int i = 0;
  for (; i + 16 <= n; i += 16) Store(y + i, Load(y + i) + av * Load(x + i));
  for (; i < n; ++i) y[i] += a * x[i];
}

namespace {

// y[i, j] (+)= dot(x[i], w[j]) for M rows of x, over w rows [j0, j1).
// One weight row at a time (a single sequential stream is what the hardware
// prefetcher serves best), with independent accumulator chains.
template <int M>
void StreamNT(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int j0, int j1,
              int k, bool accumulate) {
  constexpr int kChains = 2;
  for (int j = j0; j < j1; ++j) {
    const float* wr = w + static_cast<int64_t>(j) * k;
    V16 acc[M][kChains] = {};
    int kk = 0;
    for (; kk + 16 * kChains <= k; kk += 16 * kChains) {
      for (int c = 0; c < kChains; ++c) {
        V16 wv = Load(wr + kk + 16 * c);
        for (int i = 0; i < M; ++i) acc[i][c] += Load(x + i * ldx + kk + 16 * c) * wv;
      }
    }
    for (; kk + 16 <= k; kk += 16) {
      V16 wv = Load(wr + kk);
      for (int i = 0; i < M; ++i) acc[i][0] += Load(x + i * ldx + kk) * wv;
    }
    for (int i = 0; i < M; ++i) {
      V16 total = acc[i][0];
      for (int c = 1; c < kChains; ++c) total += acc[i][c];
      float r = Sum(total);
      for (int kt = kk; kt < k; ++kt) r += x[i * ldx + kt] * wr[kt];
      float* yr = y + i * ldy + j;
      *yr = accumulate ? *yr + r : r;
    }
  }
}

template <int M>
void StreamNTParallel(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int n,
                      int k, bool accumulate, int threads) {
  if (threads <= 1 || static_cast<int64_t>(n) * k < (1 << 16)) {
    StreamNT<M>(x, ldx, w, y, ldy, 0, n, k, accumulate);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    int per = (n + nt - 1) / nt;
    int j0 = std::min(n, t * per), j1 = std::min(n, j0 + per);
    if (j0 < j1) StreamNT<M>(x, ldx, w, y, ldy, j0, j1, k, accumulate);
  }
}

// y[i, :] += sum_{kk in [k0, k1)} x[i, kk] * w[kk, :] for M rows of x.
// Whole weight rows, R at a time: the weights stream sequentially and each
// output vector is loaded and stored once per R rows.
template <int M>
void StreamNNRows(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int k0,
                  int k1, int n) {
  constexpr int R = M == 1 ? 8 : 4;
  int kk = k0;
  for (; kk + R <= k1; kk += R) {
    const float* w0 = w + static_cast<int64_t>(kk) * n;
    V16 a[M][R];
    for (int i = 0; i < M; ++i) {
      for (int q = 0; q < R; ++q) a[i][q] = Splat(x[i * ldx + kk + q]);
    }
    int c = 0;
    for (; c + 16 <= n; c += 16) {
      V16 acc[M];
      for (int i = 0; i < M; ++i) acc[i] = Load(y + i * ldy + c);
      for (int q = 0; q < R; ++q) {
        V16 v = Load(w0 + static_cast<int64_t>(q) * n + c);
        for (int i = 0; i < M; ++i) acc[i] += a[i][q] * v;
      }
      for (int i = 0; i < M; ++i) Store(y + i * ldy + c, acc[i]);
    }
    for (; c < n; ++c) {
      for (int i = 0; i < M; ++i) {
        float s = 0;
        for (int q = 0; q < R; ++q) s += x[i * ldx + kk + q] * w0[static_cast<int64_t>(q) * n + c];
        y[i * ldy + c] += s;
      }
    }
  }
  for (; kk < k1; ++kk) {
    for (int i = 0; i < M; ++i)
      Axpy(x[i * ldx + kk], w + static_cast<int64_t>(kk) * n, y + i * ldy, n);
  }
}

template <int M>
void StreamNNParallel(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int n,
                      int k, bool accumulate, int threads) {
  if (!accumulate) {
    for (int i = 0; i < M; ++i) std::memset(y + i * ldy, 0, sizeof(float) * n);
  }
  if (threads <= 1 || static_cast<int64_t>(n) * k < (1 << 16)) {
    StreamNNRows<M>(x, ldx, w, y, ldy, 0, k, n);
    return;
  }
  // Threads take contiguous blocks of weight rows into private sums, added
  // into y in thread order afterwards.
  thread_local std::vector<float> partial;
  std::vector<float>* parts[64] = {};
  int used = 1;
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
#pragma omp single
    used = nt;
    int per = ((k + nt - 1) / nt + 7) / 8 * 8;
    int k0 = std::min(k, t * per), k1 = std::min(k, k0 + per);
    if (t == 0) {
      StreamNNRows<M>(x, ldx, w, y, ldy, k0, k1, n);
    } else if (t < 64) {
      partial.assign(static_cast<size_t>(M) * n, 0.0f);
      StreamNNRows<M>(x, ldx, w, partial.data(), n, k0, k1, n);
      parts[t] = &partial;
    }
  }
  for (int t = 1; t < std::min(used, 64); ++t) {
    if (!parts[t]) continue;
    for (int i = 0; i < M; ++i) {
      float* yr = y + i * ldy;
      const float* pr = parts[t]->data() + static_cast<int64_t>(i) * n;
      for (int c = 0; c < n; ++c) yr[c] += pr[c];
    }
  }
}

// Shapes with nothing to multiply: y is zeroed (or left, when
// accumulating). True when the call is done.
bool NothingToMultiply(float* y, int64_t ldy, int m, int n, int k, bool accumulate) {
  if (m <= 0 || n <= 0) return true;
  if (k > 0) return false;
  if (!accumulate) {
    for (int i = 0; i < m; ++i) std::memset(y + i * ldy, 0, sizeof(float) * n);
  }
  return true;
}

// Calls f(std::integral_constant<int, M>) for the streamed kernels' row count.
template <typename F>
void WithStreamRows(int m, F&& f) {
  switch (m) {
    case 1:
      return f(std::integral_constant<int, 1>());
    case 2:
      return f(std::integral_constant<int, 2>());
    case 3:
      return f(std::integral_constant<int, 3>());
    default:
      return f(std::integral_constant<int, 4>());
  }
}

}  // namespace

void LinearNT(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int m, int n,
              int k, bool accumulate, int threads) {
  if (NothingToMultiply(y, ldy, m, n, k, accumulate)) return;
  if (m <= kMaxStreamRows) {
    return WithStreamRows(m, [&](auto rows) {
      StreamNTParallel<decltype(rows)::value>(x, ldx, w, y, ldy, n, k, accumulate, threads);
    });
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, static_cast<int>(ldx), w,
              k, accumulate ? 1.0f : 0.0f, y, static_cast<int>(ldy));
}

void LinearNN(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int m, int n,
              int k, bool accumulate, int threads) {
  if (NothingToMultiply(y, ldy, m, n, k, accumulate)) return;
  if (m <= kMaxStreamRows) {
    return WithStreamRows(m, [&](auto rows) {
      StreamNNParallel<decltype(rows)::value>(x, ldx, w, y, ldy, n, k, accumulate, threads);
    });
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, x, static_cast<int>(ldx), w,
              n, accumulate ? 1.0f : 0.0f, y, static_cast<int>(ldy));
}

}  // namespace failsafe::cpu
