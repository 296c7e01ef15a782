// Output helpers for experiments: CSV files and gnuplot PNGs, drawn to read
// in black and white (dash patterns, point shapes and fill patterns, not
// colours alone).
//
// Thread-safety: plain functions; each plot runs its own gnuplot process.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace failsafe {

// Creates `path` and its missing parents.
Status MakeDirs(const std::string& path);

Status WriteCsv(const std::string& path, const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows);

struct PlotSeries {
  std::string title;
  std::string csv;  // file
  int x_column;     // 1-based
  int y_column;
  std::string style = "linespoints";
};

// A horizontal reference line (an SLO, a mean).
struct PlotLine {
  std::string title;
  double y;
};

// Renders a PNG with gnuplot if it is installed; returns false if not.
bool PlotPng(const std::string& png, const std::string& title, const std::string& xlabel,
             const std::string& ylabel, const std::vector<PlotSeries>& series, bool log_x = false,
             bool log_y = false, const std::vector<PlotLine>& lines = {});

// Bars from one CSV: a group per data row, labelled by its first column, and
// in each group a bar per series (column), each with its value on top.
struct BarSeries {
  std::string title;
  int column;  // 1-based
};
struct BarPanel {
  std::string title;
  std::string ylabel;
  std::vector<BarSeries> series;
};
// The panels side by side under one title.
bool PlotBars(const std::string& png, const std::string& title, const std::string& csv,
              const std::vector<BarPanel>& panels);

// Runs a gnuplot script body after setting a PNG terminal of `width` x
// `height` pixels writing to `png`; false if gnuplot is missing or fails.
bool RunGnuplot(const std::string& png, const std::string& script, int width = 900,
                int height = 560);
// The line style of the i-th series: black or grey, its own dash pattern
// and (with `points`) point shape.
std::string MonoStyle(int i, bool points = true, double width = 2);
// `s` inside a single-quoted gnuplot string.
std::string GnuplotText(const std::string& s);

std::string Num(double v, int precision = 4);

}  // namespace failsafe
