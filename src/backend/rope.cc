#include <cmath>

#include "backend/backend.h"

namespace failsafe {

std::vector<float> RopeInvFreq(const ModelConfig& c, bool local) {
  const int half = c.head_dim / 2;
  std::vector<float> out(half);
  for (int i = 0; i < half; ++i) {
    double freq = 1.0 / std::pow(local ? c.rope_local_theta : c.rope_theta, (2.0 * i) / c.head_dim);
    if (!local) freq /= c.rope_linear_factor;
    if (c.longrope.enabled()) freq /= c.longrope.factors()[i];
    if (!local && c.rope_scaling.enabled) {
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

void ExtendRopeTable(const std::vector<float>& inv_freq, int positions, std::vector<float>* table,
                     double scale) {
  const int half = static_cast<int>(inv_freq.size()), width = 2 * half;
  if (width == 0) return;
  const int have = static_cast<int>(table->size() / width);
  if (positions <= have) return;
  table->resize(static_cast<size_t>(positions) * width);
  for (int p = have; p < positions; ++p) {
    float* row = table->data() + static_cast<size_t>(p) * width;
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * static_cast<double>(inv_freq[i]);
      row[i] = static_cast<float>(std::cos(angle) * scale);
      row[half + i] = static_cast<float>(std::sin(angle) * scale);
    }
  }
}

}  // namespace failsafe
