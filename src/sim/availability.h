// GPU availability traces: how many GPUs a cluster has, over time.
//
// Two text formats, told apart by the first data row:
// - samples, `YYYY-MM-DD, HH:MM:SS, count` (Bamboo's GCP traces, UTC): the
//   count holds from its row's time until the next row's (of rows with one
//   time, the last counts);
// - events, `ms,add|remove,node` (Bamboo's AWS and Oobleck's traces): `ms`
//   since the trace's start; the count is the nodes added and not yet
//   removed, and the events of one millisecond form one point.
// Blank lines and lines starting with '#' are skipped. Rows out of time
// order are sorted (stably: rows of equal time keep the file's order) and
// counted in `reordered`. Anything else wrong is rejected with the file and
// line: a malformed row, a negative count, a node removed that is not there
// or added twice, a trace with fewer than two distinct times.
//
// The trace starts at its first row (time 0) and ends at its last: the last
// point only marks the end.
//
// Thread-safety: plain functions and values.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "common/status.h"

namespace failsafe {

struct AvailabilityPoint {
  double t_s = 0;  // seconds since the trace's first row
  int count = 0;   // GPUs (samples) or nodes (events) available from t_s on
};

enum class AvailabilityFormat { kSamples, kEvents };
const char* AvailabilityFormatName(AvailabilityFormat f);

struct AvailabilityTrace {
  std::string source;  // file name, for messages
  AvailabilityFormat format = AvailabilityFormat::kSamples;
  std::vector<AvailabilityPoint> points;  // times strictly increasing, first 0
  int rows = 0;                           // data rows read
  int reordered = 0;                      // rows that were out of time order

  double span_s() const { return points.empty() ? 0 : points.back().t_s; }
  int peak() const;  // the largest count
  // Time-weighted mean count over the span.
  double mean() const;
};

Result<AvailabilityTrace> ParseAvailabilityTrace(std::istream& in, const std::string& source);
Result<AvailabilityTrace> ReadAvailabilityTrace(const std::string& path);

// How a trace's counts become GPUs of a cluster of `capacity` GPUs.
enum class AvailabilityScale {
  kPeak,  // the trace's peak is the whole cluster: count * capacity / peak, rounded
  kNone,  // counts are GPUs; a count above the capacity is an error
};
Result<AvailabilityScale> ParseAvailabilityScale(const std::string& name);

struct ScaledAvailability {
  std::vector<AvailabilityPoint> points;  // counts in GPUs, 0..capacity
  double factor = 1;                      // GPUs per trace unit
  int capacity = 0;
};

// Fails (never clamps) when a count would exceed `capacity`.
Result<ScaledAvailability> ScaleAvailability(const AvailabilityTrace& trace, int capacity,
                                             AvailabilityScale scale);

}  // namespace failsafe
