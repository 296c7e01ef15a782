// Fitting a hardware profile to measured steps: the efficiencies, the GEMM
// half-performance rows and the per-segment overhead that make the cost model
// predict a set of measured step times best (least squares on the log of the
// ratio, so short and long steps weigh alike).
#pragma once

#include <vector>

#include "common/status.h"
#include "core/scheduler.h"
#include "sim/profiles.h"

namespace failsafe {

struct StepSample {
  int plan = 0;  // index into the plans given to FitProfile
  StepPlan step;
  double seconds = 0;  // measured
};

struct FitReport {
  HardwareProfile profile;
  int samples = 0;
  double rms_log_error = 0;   // of the fitted model over the samples
  double mean_abs_error = 0;  // |predicted - measured| / measured, averaged
  int evaluations = 0;
};

Result<FitReport> FitProfile(const ModelConfig& model, const HardwareProfile& start,
                             const std::vector<Plan>& plans,
                             const std::vector<StepSample>& samples);

// Predicted over measured, per sample, under `hw`.
std::vector<double> PredictionRatios(const ModelConfig& model, const HardwareProfile& hw,
                                     const std::vector<Plan>& plans,
                                     const std::vector<StepSample>& samples);

}  // namespace failsafe
