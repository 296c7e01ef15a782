#include "sim/report.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
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

Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return Internal("{}: cannot create directory: {}", path, ec.message());
  return Status::Ok();
}

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

std::string GnuplotText(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\'') out += '\'';
    if (c != '\n') out += c;
  }
  return out;
}

std::string MonoStyle(int i, bool points, double width) {
  // Eight styles, distinct without colour: dash pattern, grey level, point shape.
  static const char* kGrey[] = {"#000000", "#000000", "#606060", "#000000",
                                "#909090", "#404040", "#000000", "#707070"};
  static const char* kDash[] = {"1", "2", "3", "4", "5", "(12,4,2,4,2,4)", "(2,6)", "(16,6)"};
  static const int kPoint[] = {7, 4, 5, 8, 6, 12, 1, 2};
  const int k = i % 8;
  std::string s = fmt::format("lc rgb '{}' dt {} lw {}", kGrey[k], kDash[k], width);
  if (points) s += fmt::format(" pt {} ps 1.2", kPoint[k]);
  return s;
}

bool RunGnuplot(const std::string& png, const std::string& script, int width, int height) {
  FILE* p = ::popen("gnuplot 2>/dev/null", "w");
  if (!p) return false;
  const std::string head =
      fmt::format("set terminal pngcairo size {},{} noenhanced font 'sans,10'\nset output '{}'\n",
                  width, height, GnuplotText(png));
  std::fputs(head.c_str(), p);
  std::fputs(script.c_str(), p);
  const int rc = ::pclose(p);
  if (rc != 0) FS_LOG_WARN("gnuplot failed for {} (is gnuplot with pngcairo installed?)", png);
  return rc == 0;
}

bool PlotPng(const std::string& png, const std::string& title, const std::string& xlabel,
             const std::string& ylabel, const std::vector<PlotSeries>& series, bool log_x,
             bool log_y, const std::vector<PlotLine>& lines) {
  std::string script = fmt::format(
      "set title '{}'\nset xlabel '{}'\nset ylabel '{}'\nset datafile separator ','\n"
      "set key outside right\nset grid\n{}{}",
      GnuplotText(title), GnuplotText(xlabel), GnuplotText(ylabel), log_x ? "set logscale x\n" : "",
      log_y ? "set logscale y\n" : "");
  // Room above the data for a reference line at its edge.
  if (!lines.empty()) script += "set offsets 0, 0, graph 0.08, graph 0.02\n";
  script += "plot ";
  int k = 0;
  for (const PlotSeries& s : series) {
    script += fmt::format("{}'{}' using {}:{} every ::1 with {} {} title '{}'", k ? ", " : "",
                          GnuplotText(s.csv), s.x_column, s.y_column, s.style, MonoStyle(k),
                          GnuplotText(s.title));
    ++k;
  }
  for (const PlotLine& l : lines) {
    script += fmt::format("{}{} with lines lc rgb '#000000' dt 3 lw 2 title '{}'", k ? ", " : "",
                          l.y, GnuplotText(l.title));
    ++k;
  }
  script += "\n";
  return RunGnuplot(png, script);
}

bool PlotBars(const std::string& png, const std::string& title, const std::string& csv,
              const std::vector<BarPanel>& panels) {
  const int n = static_cast<int>(panels.size());
  size_t most = 0;  // bars a group
  for (const BarPanel& p : panels) most = std::max(most, p.series.size());
  std::string script = fmt::format(
      "set datafile separator ','\nset datafile columnheaders\nset multiplot layout 1,{} title "
      "'{}'\n"
      "set style data histograms\nset style histogram clustered gap 1\n"
      "set style fill pattern border -1\nset boxwidth 0.9 relative\nset xtics rotate by -30 "
      "nomirror\nset grid ytics\nset yrange [0:*]\nset offsets 0,0,graph {},0\n"
      "set key top left\n",
      n, GnuplotText(title), most > 3 ? 0.25 : 0.12);
  for (const BarPanel& p : panels) {
    const int k = static_cast<int>(p.series.size());
    script += fmt::format("set title '{}'\nset ylabel '{}'\n{}plot ", GnuplotText(p.title),
                          GnuplotText(p.ylabel), k == 1 ? "unset key\n" : "set key\n");
    // gnuplot's fill patterns in an order that tells neighbours apart in
    // grey: cross-hatched, solid, diagonal, empty, dense cross-hatched, the
    // other diagonals.
    constexpr int kPatterns[] = {1, 3, 4, 0, 2, 5, 6, 7};
    for (int i = 0; i < k; ++i) {
      const BarSeries& s = p.series[i];
      script += fmt::format("{}'{}' using {}{} title '{}' fs pattern {} lc rgb '#000000'",
                            i ? ", " : "", GnuplotText(csv), s.column, i == 0 ? ":xtic(1)" : "",
                            GnuplotText(s.title), kPatterns[i % 8]);
    }
    // Each bar's value above it: bar i of k in group x sits at x + (i - (k - 1) / 2) / (k + 1).
    // Ratios (under 10) with two decimals; past three bars a group, upright.
    const char* placed = k > 3 ? "rotate by 90 left offset 0,0.3" : "offset 0,0.6";
    for (int i = 0; i < k; ++i) {
      const double dx = (i - (k - 1) / 2.0) / (k + 1);
      const int c = p.series[i].column;
      script += fmt::format(
          ", '{}' using ($0 + {}):{}:(${} >= 1e4 ? sprintf('%.1fk', ${} / 1e3) : ${} >= 10 ? "
          "sprintf('%.0f', ${}) : sprintf('%.2f', ${})) with labels {} font 'sans,8' notitle",
          GnuplotText(csv), dx, c, c, c, c, c, c, placed);
    }
    script += "\n";
  }
  script += "unset multiplot\n";
  return RunGnuplot(png, script, 500 * n + 100, 560);
}

std::string Num(double v, int precision) { return fmt::format("{:.{}g}", v, precision); }

}  // namespace failsafe
