// Library SGEMMs for the engine benchmark's comparison, loaded at run time
// (dlopen) so that none is a build dependency and their BLAS symbols never
// clash with OpenBLAS's: oneDNN (libdnnl.so.2) and BLIS (libblis.so.4), each
// used only if installed. OpenBLAS is linked.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace failsafe::bench {

// y[m, n] = x[m, k] * w, w as [n, k] (nt) or [k, n], all row-major, f32.
class LibraryGemm {
 public:
  virtual ~LibraryGemm() = default;
  virtual std::string name() const = 0;
  virtual void SetThreads(int threads) = 0;
  virtual void Run(bool nt, int m, int n, int k, const float* x, const float* w, float* y) = 0;
};

// The libraries found on this machine, OpenBLAS first.
std::vector<std::unique_ptr<LibraryGemm>> FindLibraryGemms();

}  // namespace failsafe::bench
