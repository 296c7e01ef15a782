#include "sim/report.h"

#include <fmt/format.h>

#include <cstdio>
#include <fstream>

#include "common/log.h"

namespace failsafe {

namespace {

// A field as CSV (RFC 4180): quoted when it holds a comma, quote or newline.
std::string Field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

}  // namespace

Status WriteCsv(const std::string& path, const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows) {
  std::ofstream out(path);
  if (!out) return Internal("{}: cannot write", path);
  for (size_t i = 0; i < header.size(); ++i) out << (i ? "," : "") << Field(header[i]);
  out << "\n";
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) out << (i ? "," : "") << Field(r[i]);
    out << "\n";
  }
  return out ? Status::Ok() : Internal("{}: write failed", path);
}

bool PlotPng(const std::string& png, const std::string& title, const std::string& xlabel,
             const std::string& ylabel, const std::vector<PlotSeries>& series, bool log_x,
             bool log_y) {
  FILE* p = ::popen("gnuplot 2>/dev/null", "w");
  if (!p) return false;
  std::string script = fmt::format(
      "set terminal pngcairo size 900,560 noenhanced\nset output '{}'\nset title '{}'\nset xlabel "
      "'{}'\n"
      "set ylabel '{}'\nset datafile separator ','\nset key outside right\nset grid\n{}{}",
      png, title, xlabel, ylabel, log_x ? "set logscale x\n" : "", log_y ? "set logscale y\n" : "");
  script += "plot ";
  for (size_t i = 0; i < series.size(); ++i) {
    const PlotSeries& s = series[i];
    script += fmt::format("{}'{}' using {}:{} every ::1 with {} title '{}'", i ? ", " : "", s.csv,
                          s.x_column, s.y_column, s.style, s.title);
  }
  script += "\n";
  std::fputs(script.c_str(), p);
  const int rc = ::pclose(p);
  if (rc != 0) FS_LOG_WARN("gnuplot failed for {} (is gnuplot with pngcairo installed?)", png);
  return rc == 0;
}

std::string Num(double v, int precision) { return fmt::format("{:.{}g}", v, precision); }

}  // namespace failsafe
