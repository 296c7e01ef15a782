#include "trace/workload.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/rng.h"

namespace failsafe {

namespace {

int Scale(double v, double s) { return std::max(1, static_cast<int>(std::lround(v * s))); }

bool ValidHashIds(const nlohmann::json& ids) {
  if (!ids.is_array()) return false;
  for (const auto& id : ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) return false;
  }
  return true;
}

// Draws a log-normal matched to a median and mean, clipped to [1, max].
int LogNormal(Rng& rng, double median, double mean, double max) {
  const double mu = std::log(median);
  const double sigma = std::sqrt(2.0 * std::log(mean / median));
  double v = std::exp(mu + sigma * rng.Normal());
  return static_cast<int>(std::clamp(std::round(v), 1.0, max));
}

}  // namespace

Result<Workload> ReadJsonlWorkload(const std::string& path, const WorkloadOptions& o) {
  std::ifstream in(path);
  if (!in) return NotFound("{}: cannot open", path);
  Workload w;
  w.description = path;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (o.max_requests > 0 && static_cast<int>(w.requests.size()) >= o.max_requests) break;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto bad = [&](const std::string& why) -> Status {
      return InvalidArgument("{}:{}: {}", path, lineno, why);
    };
    Status problem;
    WorkloadRequest r;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      problem = bad("not a JSON object");
    } else if (!j.contains("input_length") || !j["input_length"].is_number_integer()) {
      problem = bad("field 'input_length' is missing or not an integer");
    } else if (!j.contains("output_length") || !j["output_length"].is_number_integer()) {
      problem = bad("field 'output_length' is missing or not an integer");
    } else if (j.contains("timestamp") && !j["timestamp"].is_number()) {
      problem = bad("field 'timestamp' is not a number");
    } else if (j.contains("hash_ids") && !ValidHashIds(j["hash_ids"])) {
      problem = bad("field 'hash_ids' is not an array of non-negative integers");
    } else {
      const int64_t in_len = j["input_length"], out_len = j["output_length"];
      const double ts = j.contains("timestamp") ? j["timestamp"].get<double>() : 0.0;
      if (in_len <= 0 || out_len <= 0) {
        problem =
            bad(fmt::format("lengths must be positive (input {}, output {})", in_len, out_len));
      } else if (static_cast<double>(in_len) * o.length_scale > kMaxTraceTokens ||
                 static_cast<double>(out_len) * o.length_scale > kMaxTraceTokens) {
        problem =
            bad(fmt::format("lengths (input {}, output {}) exceed {} tokens after scaling by {}",
                            in_len, out_len, kMaxTraceTokens, o.length_scale));
      } else if (ts < 0) {
        problem = bad("field 'timestamp' is negative");
      } else {
        if (j.contains("hash_ids")) r.hash_ids = j["hash_ids"].get<std::vector<int64_t>>();
        r.block_tokens = Scale(kTraceHashBlock, o.length_scale);
        r.input_len = Scale(static_cast<double>(in_len), o.length_scale);
        r.output_len = Scale(static_cast<double>(out_len), o.length_scale);
        r.arrival_s = ts / 1000.0 * o.time_scale;
        if (o.max_context > 0 && r.input_len + r.output_len > o.max_context) {
          problem = bad(fmt::format(
              "input {} + output {} tokens (after scaling) exceed the model's context of {} "
              "(see --length-scale and --skip-invalid)",
              r.input_len, r.output_len, o.max_context));
        }
      }
    }
    if (!problem.ok()) {
      if (!o.skip_invalid) return problem;
      ++w.skipped;
      continue;
    }
    w.requests.push_back(r);
  }
  if (w.requests.empty()) {
    return InvalidArgument("{}: no requests ({} lines, {} skipped as invalid)", path, lineno,
                           w.skipped);
  }
  // Requests run in arrival order: rows out of order are moved, not run late.
  double latest = 0;
  for (const WorkloadRequest& r : w.requests) {
    if (r.arrival_s < latest) ++w.reordered;
    latest = std::max(latest, r.arrival_s);
  }
  if (w.reordered > 0) {
    std::stable_sort(w.requests.begin(), w.requests.end(),
                     [](const WorkloadRequest& a, const WorkloadRequest& b) {
                       return a.arrival_s < b.arrival_s;
                     });
  }
  return w;
}

std::vector<int32_t> WorkloadPrompt(const WorkloadRequest& r, int index, uint64_t seed,
                                    int32_t first_token, int32_t num_tokens) {
  std::vector<int32_t> out(r.input_len);
  const uint64_t blocks_seed = HashCombine(seed, 0x4a54b10cULL);
  for (int i = 0; i < r.input_len; ++i) {
    const size_t block = static_cast<size_t>(i / r.block_tokens);
    const uint64_t draw =
        block < r.hash_ids.size()
            ? Mix64(HashCombine(HashCombine(blocks_seed, static_cast<uint64_t>(r.hash_ids[block])),
                                static_cast<uint64_t>(i % r.block_tokens)))
            : Mix64(HashCombine(seed, (static_cast<uint64_t>(index) << 24) + i));
    out[i] = first_token + static_cast<int32_t>(draw % static_cast<uint64_t>(num_tokens));
  }
  return out;
}

Workload OpenThoughtsWorkload(int requests, const WorkloadOptions& o) {
  Workload w;
  w.description =
      "openthoughts-like (log-normal fit to the paper's length statistics; the dataset is not "
      "reachable)";
  Rng rng(HashCombine(o.seed, 0x0be17));
  while (static_cast<int>(w.requests.size()) < requests) {
    WorkloadRequest r;
    r.input_len = Scale(LogNormal(rng, 352, 422, 7633), o.length_scale);
    r.output_len = Scale(LogNormal(rng, 5583, 7295, 37817), o.length_scale);
    if (o.max_context > 0 && r.input_len + r.output_len > o.max_context) {
      if (!o.skip_invalid) {
        r.output_len = std::max(1, o.max_context - r.input_len);  // clip to the context
        if (r.input_len >= o.max_context) continue;
      } else {
        ++w.skipped;
        continue;
      }
    }
    w.requests.push_back(r);
  }
  return w;
}

std::string FindDataDir(const std::string& flag) {
  if (!flag.empty()) return flag;
  for (std::string c :
       {std::string("../shared/data"), std::string("data"), std::string(FAILSAFE_DATA_DIR)}) {
    if (std::filesystem::exists(c + "/mooncake/conversation_trace.jsonl")) return c;
  }
  return "data";
}

Result<Workload> LoadWorkload(const std::string& name, const std::string& data_dir,
                              const WorkloadOptions& o) {
  if (name == "openthoughts")
    return OpenThoughtsWorkload(o.max_requests > 0 ? o.max_requests : 1000, o);
  std::string path = name == "mooncake" ? data_dir + "/mooncake/conversation_trace.jsonl" : name;
  FS_ASSIGN_OR_RETURN(Workload w, ReadJsonlWorkload(path, o));
  if (name == "mooncake") w.description = "mooncake conversation trace (" + path + ")";
  return w;
}

}  // namespace failsafe
