#include <cmath>

#include "backend/backend.h"

namespace failsafe {

std::vector<float> RopeInvFreq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> out(half);
  for (int i = 0; i < half; ++i) {
    double freq = 1.0 / std::pow(c.rope_theta, (2.0 * i) / c.head_dim);
    if (c.rope_scaling.enabled) {
      const auto& s = c.rope_scaling;
      const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
      const double low_wavelen = old_ctx / s.low_freq_factor;
      const double high_wavelen = old_ctx / s.high_freq_factor;
      const double wavelen = 2.0 * M_PI / freq;
      if (wavelen > low_wavelen) {
        freq = freq / s.factor;
      } else if (wavelen >= high_wavelen) {
        double smooth =
            (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        freq = (1.0 - smooth) * freq / s.factor + smooth * freq;
      }
    }
    out[i] = static_cast<float>(freq);
  }
  return out;
}

}  // namespace failsafe
