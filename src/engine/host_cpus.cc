#include "engine/host_cpus.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <string_view>
#include <vector>

#include "model/file_util.h"

namespace failsafe {

namespace {

// A file's text, or "" where it cannot be read (no such cgroup file).
std::string ReadText(const std::string& path) {
  Result<std::string> text = ReadFileToString(path);
  return text.ok() ? *text : std::string();
}

std::vector<std::string> Split(std::string_view text, char sep) {
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    const size_t end = text.find(sep, at);
    out.emplace_back(text.substr(at, end == std::string_view::npos ? end : end - at));
    if (end == std::string_view::npos) return out;
    at = end + 1;
  }
}

// mountinfo escapes a space, tab, newline and backslash in a path as \ooo.
std::string Unescape(const std::string& s) {
  auto octal = [](char c) { return c >= '0' && c <= '7'; };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && octal(s[i + 1]) && octal(s[i + 2]) && octal(s[i + 3])) {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

struct Mount {
  std::string root;                  // the hierarchy's directory mounted here
  std::string point;                 // where
  std::string type;                  // cgroup or cgroup2
  std::vector<std::string> options;  // super options (v1: its controllers among them)
};

std::vector<Mount> CgroupMounts(const std::string& mountinfo) {
  std::vector<Mount> mounts;
  std::istringstream lines(mountinfo);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string w; fields >> w;) f.push_back(w);
    // id parent major:minor root point options [optional...] - type source super
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 6 || dash == f.end() || f.end() - dash < 4) continue;
    Mount m;
    m.type = dash[1];
    if (m.type != "cgroup" && m.type != "cgroup2") continue;
    m.root = Unescape(f[3]);
    m.point = Unescape(f[4]);
    m.options = Split(dash[3], ',');
    mounts.push_back(std::move(m));
  }
  return mounts;
}

// The directory of cgroup `path` under mount `m`, or "" where the mount does
// not show it.
std::string CgroupDir(const Mount& m, const std::string& path) {
  if (m.root == "/") return path == "/" ? m.point : m.point + path;
  if (path == m.root) return m.point;
  if (path.compare(0, m.root.size() + 1, m.root + "/") == 0)
    return m.point + path.substr(m.root.size());
  return "";
}

// The tightest quota from `dir` up to the mount's point: quota(dir) gives a
// directory's CPUs, 0 for none.
template <typename Quota>
int TightestUpTo(std::string dir, const std::string& point, Quota quota) {
  int best = 0;
  for (;;) {
    const int q = quota(dir);
    if (q > 0 && (best == 0 || q < best)) best = q;
    if (dir.size() <= point.size()) return best;
    dir = dir.substr(0, dir.rfind('/'));
    if (dir.size() < point.size()) return best;
  }
}

int CeilDiv(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return 0;
  // A quota may be set far above any host's CPUs (up to about 2^44 us a
  // period of 1 ms).
  return static_cast<int>(std::clamp<int64_t>(quota / period + (quota % period != 0), 1,
                                              std::numeric_limits<int>::max()));
}

int64_t ParseInt(const std::string& s) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(s, &used);
    return used > 0 ? v : 0;
  } catch (...) {
    return 0;
  }
}

}  // namespace

int CgroupCpuQuota(const std::string& proc_cgroup, const std::string& mountinfo) {
  const std::vector<Mount> mounts = CgroupMounts(mountinfo);
  int best = 0;
  auto take = [&best](int q) {
    if (q > 0 && (best == 0 || q < best)) best = q;
  };
  std::istringstream lines(proc_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // hierarchy-id:controllers:path (v2: 0::path)
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (path.empty() || path[0] != '/') continue;
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      for (const Mount& m : mounts) {
        if (m.type != "cgroup2") continue;
        const std::string dir = CgroupDir(m, path);
        if (dir.empty()) continue;
        take(TightestUpTo(dir, m.point, [](const std::string& d) {
          const std::vector<std::string> f = Split(ReadText(d + "/cpu.max"), ' ');
          if (f.size() < 2 || f[0] == "max") return 0;
          return CeilDiv(ParseInt(f[0]), ParseInt(f[1]));
        }));
      }
      continue;
    }
    const std::vector<std::string> named = Split(controllers, ',');
    if (std::find(named.begin(), named.end(), "cpu") == named.end()) continue;
    for (const Mount& m : mounts) {
      if (m.type != "cgroup" ||
          std::find(m.options.begin(), m.options.end(), "cpu") == m.options.end())
        continue;
      const std::string dir = CgroupDir(m, path);
      if (dir.empty()) continue;
      take(TightestUpTo(dir, m.point, [](const std::string& d) {
        return CeilDiv(ParseInt(ReadText(d + "/cpu.cfs_quota_us")),
                       ParseInt(ReadText(d + "/cpu.cfs_period_us")));
      }));
    }
  }
  return best;
}

int HostCpus() {
  int cpus = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) cpus = std::max(1, CPU_COUNT(&set));
  const int quota = CgroupCpuQuota(ReadText("/proc/self/cgroup"), ReadText("/proc/self/mountinfo"));
  return quota > 0 ? std::min(cpus, quota) : cpus;
}

}  // namespace failsafe
