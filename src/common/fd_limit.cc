#include "common/fd_limit.h"

#include <sys/resource.h>

#include <algorithm>

namespace failsafe {

FileLimit RaiseOpenFileLimit(int64_t wanted) {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return {};
  const rlim_t target = r.rlim_max == RLIM_INFINITY
                            ? static_cast<rlim_t>(wanted)
                            : std::min<rlim_t>(r.rlim_max, static_cast<rlim_t>(wanted));
  if (r.rlim_cur != RLIM_INFINITY && target > r.rlim_cur) {
    rlimit raised = r;
    raised.rlim_cur = target;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) r = raised;
  }
  auto value = [](rlim_t v) { return v == RLIM_INFINITY ? INT64_MAX : static_cast<int64_t>(v); };
  return {value(r.rlim_cur), value(r.rlim_max)};
}

}  // namespace failsafe
