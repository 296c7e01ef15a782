#include "model/token_matcher.h"

#include <algorithm>

namespace failsafe {

void TokenMatcher::Add(const std::string& text, int value) {
  if (text.empty()) return;
  auto& v = by_first_byte_[static_cast<unsigned char>(text[0])];
  for (const auto& e : v) {
    if (e.first == text) return;  // the first value added for a text wins
  }
  v.emplace_back(text, value);
  std::stable_sort(v.begin(), v.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

std::vector<TokenMatcher::Piece> TokenMatcher::Split(std::string_view text) const {
  std::vector<Piece> out;
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    const std::pair<std::string, int>* hit = nullptr;
    if (auto it = by_first_byte_.find(static_cast<unsigned char>(text[i]));
        it != by_first_byte_.end()) {
      for (const auto& cand : it->second) {
        if (text.compare(i, cand.first.size(), cand.first) == 0) {
          hit = &cand;
          break;
        }
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > start) out.push_back({start, i, -1});
    out.push_back({i, i + hit->first.size(), hit->second});
    i += hit->first.size();
    start = i;
  }
  if (start < text.size()) out.push_back({start, text.size(), -1});
  return out;
}

}  // namespace failsafe
