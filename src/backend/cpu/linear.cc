// Linear layers on the batch-invariant GEMM (gemm.h): a row's result is the
// same whatever else is in the batch.
#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"

namespace failsafe::cpu {

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

namespace {

// The operands every linear layer passes to the GEMM; nt: w is [n, k].
GemmArgs Args(const float* x, int64_t ldx, WeightsRef w, bool nt, int m, int n, int k,
              const LinearOptions& o) {
  GemmArgs a;
  a.x = x;
  a.ldx = ldx;
  a.w = w.data;
  a.wtype = w.dtype;
  a.w_blocked16 = w.blocked16;
  a.w_item_rows = w.blocked_rows;
  a.ldw = nt ? k : n;
  a.nt = nt;
  a.m = m;
  a.n = n;
  a.k = k;
  a.threads = o.threads;
  a.isa = o.isa;
  a.dpbf16 = o.dpbf16;
  return a;
}

}  // namespace

void LinearNT(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m, int n, int k,
              bool accumulate, const LinearOptions& o) {
  GemmArgs a = Args(x, ldx, w, /*nt=*/true, m, n, k, o);
  a.out = accumulate ? GemmOut::kAccumulate : GemmOut::kStore;
  a.y = y;
  a.ldy = ldy;
  Gemm(a);
}

void LinearNN(const float* x, int64_t ldx, WeightsRef w, float* y, int64_t ldy, int m, int n, int k,
              bool accumulate, const LinearOptions& o) {
  GemmArgs a = Args(x, ldx, w, /*nt=*/false, m, n, k, o);
  a.out = accumulate ? GemmOut::kAccumulate : GemmOut::kStore;
  a.y = y;
  a.ldy = ldy;
  Gemm(a);
}

void LinearNNFixed(const float* x, int64_t ldx, WeightsRef w, int64_t* acc, int64_t ldacc, int m,
                   int n, int k, int item_k, const LinearOptions& o) {
  GemmArgs a = Args(x, ldx, w, /*nt=*/false, m, n, k, o);
  a.out = GemmOut::kFixedItems;
  a.acc = acc;
  a.ldacc = ldacc;
  a.item_k = item_k;
  Gemm(a);
}

}  // namespace failsafe::cpu
