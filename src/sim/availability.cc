#include "sim/availability.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <istream>
#include <set>

namespace failsafe {

namespace {

struct Row {
  double t_s;
  int line;
  int count;         // samples
  bool add = false;  // events
  std::string node;  // events
};

std::string Trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r");
  return s.substr(a, b - a + 1);
}

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t c = s.find(',', start);
    out.push_back(Trim(s.substr(start, c == std::string::npos ? std::string::npos : c - start)));
    if (c == std::string::npos) return out;
    start = c + 1;
  }
}

// A whole field as a number, or false.
bool ParseNumber(const std::string& s, double* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(*v);
}

// `YYYY-MM-DD`, `HH:MM:SS` as seconds since the epoch (UTC), or false.
bool ParseDateTime(const std::string& date, const std::string& time, double* t) {
  int Y, M, D, h, mi, s, used = 0;
  if (std::sscanf(date.c_str(), "%4d-%2d-%2d%n", &Y, &M, &D, &used) != 3 ||
      used != static_cast<int>(date.size()))
    return false;
  if (std::sscanf(time.c_str(), "%2d:%2d:%2d%n", &h, &mi, &s, &used) != 3 ||
      used != static_cast<int>(time.size()))
    return false;
  if (M < 1 || M > 12 || D < 1 || D > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || s < 0 || s > 60)
    return false;
  std::tm tm{};
  tm.tm_year = Y - 1900;
  tm.tm_mon = M - 1;
  tm.tm_mday = D;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = s;
  *t = static_cast<double>(timegm(&tm));
  // timegm normalises what does not exist (30 February becomes 2 March):
  // such a date is malformed, not a date to sort.
  return tm.tm_year == Y - 1900 && tm.tm_mon == M - 1 && tm.tm_mday == D;
}

}  // namespace

const char* AvailabilityFormatName(AvailabilityFormat f) {
  return f == AvailabilityFormat::kSamples ? "samples" : "events";
}

int AvailabilityTrace::peak() const {
  int p = 0;
  for (const AvailabilityPoint& a : points) p = std::max(p, a.count);
  return p;
}

double AvailabilityTrace::mean() const {
  double sum = 0;
  for (size_t i = 0; i + 1 < points.size(); ++i)
    sum += points[i].count * (points[i + 1].t_s - points[i].t_s);
  return span_s() > 0 ? sum / span_s() : 0;
}

Result<AvailabilityTrace> ParseAvailabilityTrace(std::istream& in, const std::string& source) {
  AvailabilityTrace trace;
  trace.source = source;
  std::vector<Row> rows;
  std::string line;
  int lineno = 0;
  bool known = false;  // format decided
  while (std::getline(in, line)) {
    ++lineno;
    // A UTF-8 byte order mark, as some spreadsheets write, opens the file.
    if (lineno == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
    const std::string t = Trim(line);
    if (t.empty() || t[0] == '#') continue;
    const std::vector<std::string> f = SplitCommas(t);
    if (!known) {
      if (f.size() == 3 && (f[1] == "add" || f[1] == "remove")) {
        trace.format = AvailabilityFormat::kEvents;
      } else if (f.size() == 3 && f[0].find('-') != std::string::npos &&
                 f[1].find(':') != std::string::npos) {
        trace.format = AvailabilityFormat::kSamples;
      } else {
        return InvalidArgument(
            "{}:{}: not an availability trace row: expected 'YYYY-MM-DD, HH:MM:SS, count' "
            "(samples) or 'ms,add|remove,node' (events), got '{}'",
            source, lineno, t);
      }
      known = true;
    }
    Row r{0, lineno, 0, false, ""};
    if (trace.format == AvailabilityFormat::kSamples) {
      double count;
      if (f.size() != 3 || !ParseDateTime(f[0], f[1], &r.t_s) || !ParseNumber(f[2], &count) ||
          count != std::floor(count)) {
        return InvalidArgument("{}:{}: expected 'YYYY-MM-DD, HH:MM:SS, count', got '{}'", source,
                               lineno, t);
      }
      if (count < 0 || count > 1e9)
        return InvalidArgument("{}:{}: count {} is out of range", source, lineno, f[2]);
      r.count = static_cast<int>(count);
    } else {
      if (f.size() != 3 || !ParseNumber(f[0], &r.t_s) || (f[1] != "add" && f[1] != "remove") ||
          f[2].empty()) {
        return InvalidArgument("{}:{}: expected 'ms,add|remove,node', got '{}'", source, lineno, t);
      }
      if (r.t_s < 0) return InvalidArgument("{}:{}: negative time {}", source, lineno, f[0]);
      r.t_s /= 1000.0;
      r.add = f[1] == "add";
      r.node = f[2];
    }
    if (!rows.empty() && r.t_s < rows.back().t_s) ++trace.reordered;
    rows.push_back(std::move(r));
  }
  if (in.bad()) return Internal("{}: read failed", source);
  trace.rows = static_cast<int>(rows.size());
  if (rows.empty()) return InvalidArgument("{}: no availability rows", source);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& b) { return a.t_s < b.t_s; });
  const double t0 = rows.front().t_s;
  std::set<std::string> up;  // events: nodes present
  for (const Row& r : rows) {
    int count = r.count;
    if (trace.format == AvailabilityFormat::kEvents) {
      if (r.add && !up.insert(r.node).second)
        return InvalidArgument("{}:{}: node '{}' added while already present", source, r.line,
                               r.node);
      if (!r.add && up.erase(r.node) == 0)
        return InvalidArgument("{}:{}: node '{}' removed but not present", source, r.line, r.node);
      count = static_cast<int>(up.size());
    }
    const double t = r.t_s - t0;
    // Rows of one time: the last one (samples) or all events together.
    if (!trace.points.empty() && trace.points.back().t_s == t) {
      trace.points.back().count = count;
    } else {
      trace.points.push_back({t, count});
    }
  }
  if (trace.points.size() < 2)
    return InvalidArgument("{}: every row has the same time; a trace needs a span", source);
  return trace;
}

Result<AvailabilityTrace> ReadAvailabilityTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("{}: cannot open availability trace", path);
  return ParseAvailabilityTrace(in, path);
}

Result<AvailabilityScale> ParseAvailabilityScale(const std::string& name) {
  if (name == "peak") return AvailabilityScale::kPeak;
  if (name == "none") return AvailabilityScale::kNone;
  return InvalidArgument("unknown availability scale '{}' (peak or none)", name);
}

Result<ScaledAvailability> ScaleAvailability(const AvailabilityTrace& trace, int capacity,
                                             AvailabilityScale scale) {
  if (capacity <= 0) return InvalidArgument("cluster capacity must be positive, not {}", capacity);
  const int peak = trace.peak();
  if (peak == 0) return InvalidArgument("{}: the trace never has a GPU available", trace.source);
  ScaledAvailability out;
  out.capacity = capacity;
  out.factor = scale == AvailabilityScale::kPeak ? static_cast<double>(capacity) / peak : 1.0;
  for (const AvailabilityPoint& p : trace.points) {
    const int gpus = static_cast<int>(std::lround(p.count * out.factor));
    if (gpus > capacity) {
      return InvalidArgument(
          "{}: {} GPUs available at {:.0f} s exceed the cluster's {} (scale the trace to the "
          "cluster with --availability-scale peak, or give more --nodes/--gpus-per-node)",
          trace.source, gpus, p.t_s, capacity);
    }
    out.points.push_back({p.t_s, gpus});
  }
  return out;
}

}  // namespace failsafe
