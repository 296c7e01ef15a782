#include "gemm_libs.h"

#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>

#include <cstdint>
#include <memory>
#include <vector>

extern "C" void openblas_set_num_threads(int num_threads);
extern "C" char* openblas_get_corename();

namespace failsafe::bench {

namespace {

class OpenBlas final : public LibraryGemm {
 public:
  std::string name() const override { return std::string("OpenBLAS ") + openblas_get_corename(); }
  void SetThreads(int threads) override { openblas_set_num_threads(threads); }
  void Run(bool nt, int m, int n, int k, const float* x, const float* w, float* y) override {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, nt ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, x, k, w,
                nt ? k : n, 0.0f, y, n);
  }
};

// dnnl_sgemm: row-major, OpenMP threads.
class OneDnn final : public LibraryGemm {
 public:
  using Fn = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                     const float*, int64_t, float, float*, int64_t);
  explicit OneDnn(Fn fn) : fn_(fn) {}
  std::string name() const override { return "oneDNN"; }
  void SetThreads(int threads) override { omp_set_num_threads(threads); }
  void Run(bool nt, int m, int n, int k, const float* x, const float* w, float* y) override {
    fn_('N', nt ? 'T' : 'N', m, n, k, 1.0f, x, k, w, nt ? k : n, 0.0f, y, n);
  }

 private:
  Fn fn_;
};

// bli_sgemm with general strides (w^T by strides, no transpose flags).
class Blis final : public LibraryGemm {
 public:
  using Fn = void (*)(int, int, int64_t, int64_t, int64_t, const float*, const float*, int64_t,
                      int64_t, const float*, int64_t, int64_t, const float*, float*, int64_t,
                      int64_t);
  using ThreadsFn = void (*)(int64_t);
  Blis(Fn fn, ThreadsFn threads) : fn_(fn), threads_(threads) {}
  std::string name() const override { return "BLIS"; }
  void SetThreads(int threads) override { threads_(threads); }
  void Run(bool nt, int m, int n, int k, const float* x, const float* w, float* y) override {
    const float one = 1.0f, zero = 0.0f;
    // w[kk, j] at w + kk * rs + j * cs.
    const int64_t rs = nt ? 1 : n, cs = nt ? k : 1;
    fn_(0, 0, m, n, k, &one, x, k, 1, w, rs, cs, &zero, y, n, 1);
  }

 private:
  Fn fn_;
  ThreadsFn threads_;
};

}  // namespace

std::vector<std::unique_ptr<LibraryGemm>> FindLibraryGemms() {
  std::vector<std::unique_ptr<LibraryGemm>> out;
  out.push_back(std::make_unique<OpenBlas>());
  if (void* h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL)) {
    if (void* fn = dlsym(h, "dnnl_sgemm")) out.push_back(std::make_unique<OneDnn>(OneDnn::Fn(fn)));
  }
  if (void* h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL)) {
    void* fn = dlsym(h, "bli_sgemm");
    void* threads = dlsym(h, "bli_thread_set_num_threads");
    if (fn && threads)
      out.push_back(std::make_unique<Blis>(Blis::Fn(fn), Blis::ThreadsFn(threads)));
  }
  return out;
}

}  // namespace failsafe::bench
