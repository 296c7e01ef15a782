// Linear layers. Small batches (decode) are memory-bound: hand-written kernels
// stream each weight byte once. Larger batches are compute-bound: OpenBLAS.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

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
template <int M>
void StreamNT(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int j0, int j1, int k,
              bool accumulate) {
  int j = j0;
  for (; j + 4 <= j1; j += 4) {
    V16 acc[M][4] = {};
    const float* w0 = w + static_cast<int64_t>(j) * k;
    const float* w1 = w0 + k;
    const float* w2 = w1 + k;
    const float* w3 = w2 + k;
    int kk = 0;
    for (; kk + 16 <= k; kk += 16) {
      V16 a = Load(w0 + kk), b = Load(w1 + kk), c = Load(w2 + kk), d = Load(w3 + kk);
      for (int i = 0; i < M; ++i) {
        V16 xv = Load(x + i * ldx + kk);
        acc[i][0] += xv * a;
        acc[i][1] += xv * b;
        acc[i][2] += xv * c;
        acc[i][3] += xv * d;
      }
    }
    for (int i = 0; i < M; ++i) {
      float r[4] = {Sum(acc[i][0]), Sum(acc[i][1]), Sum(acc[i][2]), Sum(acc[i][3])};
      for (int kt = kk; kt < k; ++kt) {
        float xv = x[i * ldx + kt];
        r[0] += xv * w0[kt];
        r[1] += xv * w1[kt];
        r[2] += xv * w2[kt];
        r[3] += xv * w3[kt];
      }
      float* yr = y + i * ldy + j;
      for (int q = 0; q < 4; ++q) yr[q] = accumulate ? yr[q] + r[q] : r[q];
    }
  }
  for (; j < j1; ++j) {
    for (int i = 0; i < M; ++i) {
      float r = Dot(x + i * ldx, w + static_cast<int64_t>(j) * k, k);
      y[i * ldy + j] = accumulate ? y[i * ldy + j] + r : r;
    }
  }
}

template <int M>
void StreamNTParallel(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int n, int k,
                      bool accumulate, int threads) {
  if (threads <= 1 || n < 64) {
    StreamNT<M>(x, ldx, w, y, ldy, 0, n, k, accumulate);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    int per = ((n + nt - 1) / nt + 3) / 4 * 4;
    int j0 = std::min(n, t * per), j1 = std::min(n, j0 + per);
    if (j0 < j1) StreamNT<M>(x, ldx, w, y, ldy, j0, j1, k, accumulate);
  }
}

// y[i, c0:c1] (+)= sum_kk x[i, kk] * w[kk, c0:c1] for M rows of x.
template <int M>
void StreamNN(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int c0, int c1, int n, int k,
              bool accumulate) {
  // Column tiles small enough that M output rows stay in L1.
  constexpr int kTile = 1024;
  for (int t0 = c0; t0 < c1; t0 += kTile) {
    int t1 = std::min(c1, t0 + kTile);
    int len = t1 - t0;
    if (!accumulate) {
      for (int i = 0; i < M; ++i) std::memset(y + i * ldy + t0, 0, sizeof(float) * len);
    }
    for (int kk = 0; kk < k; ++kk) {
      const float* wr = w + static_cast<int64_t>(kk) * n + t0;
      for (int i = 0; i < M; ++i) Axpy(x[i * ldx + kk], wr, y + i * ldy + t0, len);
    }
  }
}

template <int M>
void StreamNNParallel(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int n, int k,
                      bool accumulate, int threads) {
  if (threads <= 1 || n < 256) {
    StreamNN<M>(x, ldx, w, y, ldy, 0, n, n, k, accumulate);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    int per = ((n + nt - 1) / nt + 15) / 16 * 16;
    int c0 = std::min(n, t * per), c1 = std::min(n, c0 + per);
    if (c0 < c1) StreamNN<M>(x, ldx, w, y, ldy, c0, c1, n, k, accumulate);
  }
}

}  // namespace

void LinearNT(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int m, int n, int k,
              bool accumulate, int threads) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate) {
      for (int i = 0; i < m; ++i) std::memset(y + i * ldy, 0, sizeof(float) * n);
    }
    return;
  }
  if (m <= kMaxStreamRows) {
    switch (m) {
      case 1: return StreamNTParallel<1>(x, ldx, w, y, ldy, n, k, accumulate, threads);
      case 2: return StreamNTParallel<2>(x, ldx, w, y, ldy, n, k, accumulate, threads);
      case 3: return StreamNTParallel<3>(x, ldx, w, y, ldy, n, k, accumulate, threads);
      default: return StreamNTParallel<4>(x, ldx, w, y, ldy, n, k, accumulate, threads);
    }
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, static_cast<int>(ldx), w, k,
              accumulate ? 1.0f : 0.0f, y, static_cast<int>(ldy));
}

void LinearNN(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int m, int n, int k,
              bool accumulate, int threads) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate) {
      for (int i = 0; i < m; ++i) std::memset(y + i * ldy, 0, sizeof(float) * n);
    }
    return;
  }
  if (m <= kMaxStreamRows) {
    switch (m) {
      case 1: return StreamNNParallel<1>(x, ldx, w, y, ldy, n, k, accumulate, threads);
      case 2: return StreamNNParallel<2>(x, ldx, w, y, ldy, n, k, accumulate, threads);
      case 3: return StreamNNParallel<3>(x, ldx, w, y, ldy, n, k, accumulate, threads);
      default: return StreamNNParallel<4>(x, ldx, w, y, ldy, n, k, accumulate, threads);
    }
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, x, static_cast<int>(ldx), w, n,
              accumulate ? 1.0f : 0.0f, y, static_cast<int>(ldy));
}

}  // namespace failsafe::cpu
