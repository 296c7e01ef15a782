// Output helpers for experiments: CSV files and gnuplot PNGs.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace failsafe {

Status WriteCsv(const std::string& path, const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows);

struct PlotSeries {
  std::string title;
  std::string csv;  // file
  int x_column;     // 1-based
  int y_column;
  std::string style = "linespoints";
};

// Renders a PNG with gnuplot if it is installed; returns false if not.
bool PlotPng(const std::string& png, const std::string& title, const std::string& xlabel,
             const std::string& ylabel, const std::vector<PlotSeries>& series, bool log_x = false,
             bool log_y = false);

std::string Num(double v, int precision = 4);

}  // namespace failsafe
