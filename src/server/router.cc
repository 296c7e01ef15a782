#include "server/router.h"

namespace failsafe {

namespace {

// Splits "/a/b" into {"a", "b"}; an empty segment ("//", a trailing "/") is kept.
std::vector<std::string_view> Segments(std::string_view path) {
  std::vector<std::string_view> out;
  if (!path.empty() && path[0] == '/') path.remove_prefix(1);
  while (true) {
    const size_t slash = path.find('/');
    out.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return out;
}

bool MatchPattern(std::string_view pattern, std::string_view path,
                  std::vector<std::string>* params) {
  const auto want = Segments(pattern), got = Segments(path);
  if (want.size() != got.size()) return false;
  std::vector<std::string> found;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool is_param = want[i].size() > 2 && want[i].front() == '{' && want[i].back() == '}';
    if (is_param) {
      if (got[i].empty()) return false;
      found.emplace_back(got[i]);
    } else if (want[i] != got[i]) {
      return false;
    }
  }
  *params = std::move(found);
  return true;
}

}  // namespace

void Router::Add(Route route) { routes_.push_back(std::move(route)); }

Router::Match Router::Find(std::string_view method, std::string_view path) const {
  Match m;
  for (const Route& r : routes_) {
    std::vector<std::string> params;
    if (!MatchPattern(r.pattern, path, &params)) continue;
    if (r.method == method) {
      m.route = &r;
      m.params = std::move(params);
      m.allow.clear();
      return m;
    }
    if (m.allow.find(r.method) == std::string::npos)
      m.allow += (m.allow.empty() ? "" : ", ") + r.method;
  }
  return m;
}

}  // namespace failsafe
