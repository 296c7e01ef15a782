// Percentiles of a sample (nearest rank), for latency reports.
#pragma once

#include <vector>

namespace failsafe {

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;
};

Percentiles ComputePercentiles(std::vector<double> values);

}  // namespace failsafe
