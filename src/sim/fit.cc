#include "sim/fit.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlopt.hpp>

#include "sim/cost_model.h"

namespace failsafe {

namespace {

// The fitted parameters, in the optimiser's coordinates (logs, so that every
// one is positive and scales evenly).
constexpr int kParams = 6;

HardwareProfile Apply(const HardwareProfile& base, const std::vector<double>& x) {
  HardwareProfile p = base;
  p.gemm_efficiency = std::exp(x[0]);
  p.attention_efficiency = std::exp(x[1]);
  p.bandwidth_efficiency = std::exp(x[2]);
  p.gemm_half_rows = std::exp(x[3]);
  p.segment_overhead_s = std::exp(x[4]);
  p.gemv_efficiency = std::exp(x[5]);
  return p;
}

struct Problem {
  const std::vector<StepSample>* samples;
  std::vector<std::unique_ptr<ClusterCostModel>> models;
  HardwareProfile base;
  int evaluations = 0;

  double Error(const std::vector<double>& x) {
    ++evaluations;
    const HardwareProfile hw = Apply(base, x);
    for (auto& m : models) m->SetHardware(hw);
    double sum = 0;
    for (const StepSample& s : *samples) {
      const double e = std::log(models[s.plan]->StepSeconds(s.step) / s.seconds);
      sum += e * e;
    }
    return sum / samples->size();
  }
};

double Objective(const std::vector<double>& x, std::vector<double>& /*grad*/, void* data) {
  return static_cast<Problem*>(data)->Error(x);
}

}  // namespace

std::vector<double> PredictionRatios(const ModelConfig& model, const HardwareProfile& hw,
                                     const std::vector<Plan>& plans,
                                     const std::vector<StepSample>& samples) {
  std::vector<std::unique_ptr<ClusterCostModel>> models;
  for (const Plan& p : plans) models.push_back(std::make_unique<ClusterCostModel>(p, model, hw));
  std::vector<double> out;
  for (const StepSample& s : samples)
    out.push_back(models[s.plan]->StepSeconds(s.step) / s.seconds);
  return out;
}

Result<FitReport> FitProfile(const ModelConfig& model, const HardwareProfile& start,
                             const std::vector<Plan>& plans,
                             const std::vector<StepSample>& samples) {
  if (samples.size() < kParams * 2)
    return InvalidArgument("{} samples are too few to fit a profile", samples.size());
  Problem p;
  p.samples = &samples;
  p.base = start;
  for (const StepSample& s : samples) {
    if (s.plan < 0 || s.plan >= static_cast<int>(plans.size()))
      return InvalidArgument("sample of an unknown plan");
    if (!(s.seconds > 0)) return InvalidArgument("a sample has no measured time");
  }
  for (const Plan& pl : plans)
    p.models.push_back(std::make_unique<ClusterCostModel>(pl, model, start));
  std::vector<double> x = {std::log(start.gemm_efficiency),
                           std::log(start.attention_efficiency),
                           std::log(start.bandwidth_efficiency),
                           std::log(std::max(1.0, start.gemm_half_rows)),
                           std::log(std::max(1e-6, start.segment_overhead_s)),
                           std::log(std::max(0.01, start.gemv_efficiency))};
  // Bounds: efficiencies up to 2x the nominal peak (peaks are nominal),
  // half-performance rows 1..4096, overhead 1 us..50 ms.
  const std::vector<double> lower = {std::log(0.01), std::log(0.01), std::log(0.05), 0.0,
                                     std::log(1e-6), std::log(0.01)};
  const std::vector<double> upper = {std::log(2.0),    std::log(2.0),  std::log(2.0),
                                     std::log(4096.0), std::log(0.05), std::log(2.0)};
  for (int i = 0; i < kParams; ++i) x[i] = std::clamp(x[i], lower[i], upper[i]);
  double best = 0;
  try {
    // A global pass then a local polish: the max() terms make the surface
    // piecewise smooth, with plateaus a local method alone can stall on.
    nlopt::srand(1);  // the global pass is randomised: the same samples, the same fit
    for (auto [algorithm, xtol] : {std::pair{nlopt::GN_CRS2_LM, 1e-4}, {nlopt::LN_SBPLX, 1e-6}}) {
      nlopt::opt opt(algorithm, kParams);
      opt.set_lower_bounds(lower);
      opt.set_upper_bounds(upper);
      opt.set_min_objective(Objective, &p);
      opt.set_maxeval(3000);
      opt.set_xtol_rel(xtol);
      opt.optimize(x, best);
    }
  } catch (const std::exception& e) {
    return Internal("profile fit failed: {}", e.what());
  }
  FitReport r;
  r.profile = Apply(start, x);
  r.samples = static_cast<int>(samples.size());
  r.rms_log_error = std::sqrt(best);
  r.evaluations = p.evaluations;
  double abs = 0;
  for (double ratio : PredictionRatios(model, r.profile, plans, samples))
    abs += std::fabs(ratio - 1);
  r.mean_abs_error = abs / samples.size();
  return r;
}

}  // namespace failsafe
