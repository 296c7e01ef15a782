#include "engine/faults.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "common/rng.h"
#include "common/units.h"

namespace failsafe {

namespace {

Result<int> ParseInt(const std::string& s, const std::string& what) {
  try {
    size_t pos = 0;
    int v = std::stoi(s, &pos);
    if (pos != s.size()) throw std::invalid_argument(s);
    return v;
  } catch (...) {
    return InvalidArgument("{}: '{}' is not an integer", what, s);
  }
}

Result<FaultEvent> ParseOne(const std::string& spec) {
  // kind=DEVICE@when
  const size_t eq = spec.find('='), at = spec.find('@');
  if (eq == std::string::npos || at == std::string::npos || at < eq) {
    return InvalidArgument(
        "--fail '{}': expected device=N@step=K, device=N@t=S, rejoin=N@... or trace=FILE", spec);
  }
  FaultEvent e;
  const std::string kind = spec.substr(0, eq);
  if (kind == "rejoin") {
    e.rejoin = true;
  } else if (kind != "device") {
    return InvalidArgument("--fail '{}': unknown event '{}' (device, rejoin or trace)", spec, kind);
  }
  FS_ASSIGN_OR_RETURN(e.device,
                      ParseInt(spec.substr(eq + 1, at - eq - 1), "--fail '" + spec + "': device"));
  const std::string when = spec.substr(at + 1);
  if (when.rfind("step=", 0) == 0) {
    FS_ASSIGN_OR_RETURN(e.at_step, ParseInt(when.substr(5), "--fail '" + spec + "': step"));
    if (e.at_step < 0) return InvalidArgument("--fail '{}': negative step", spec);
  } else if (when.rfind("t=", 0) == 0) {
    FS_ASSIGN_OR_RETURN(e.at_s, ParseDuration(when.substr(2)));
  } else {
    return InvalidArgument("--fail '{}': expected step=K or t=S after '@'", spec);
  }
  return e;
}

Result<std::vector<FaultEvent>> ReadTrace(const std::string& path, double time_scale) {
  std::ifstream in(path);
  if (!in) return NotFound("--fail trace={}: cannot open", path);
  std::vector<FaultEvent> out;
  std::map<std::string, int> ids;  // node name -> device, in order of appearance
  bool numbered = false;           // a node was named by its device number
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::stringstream ss(line);
    std::string ms, what, node;
    if (!std::getline(ss, ms, ',') || !std::getline(ss, what, ',') || !std::getline(ss, node)) {
      return InvalidArgument("{}:{}: expected 'ms,add|remove,node'", path, lineno);
    }
    while (!node.empty() && (node.back() == '\r' || node.back() == ' ')) node.pop_back();
    FaultEvent e;
    // The whole field, finite and not negative: "12abc" or "nan" would
    // otherwise fire at 12 ms or never.
    double at_ms = 0;
    const auto [end, ec] = std::from_chars(ms.data(), ms.data() + ms.size(), at_ms);
    if (ms.empty() || ec != std::errc() || end != ms.data() + ms.size() || !std::isfinite(at_ms) ||
        at_ms < 0) {
      return InvalidArgument("{}:{}: '{}' is not a time in ms", path, lineno, ms);
    }
    e.at_s = at_ms / 1000.0 * time_scale;
    if (what == "add") {
      e.rejoin = true;
    } else if (what != "remove") {
      return InvalidArgument("{}:{}: '{}' is neither add nor remove", path, lineno, what);
    }
    auto num = ParseInt(node, "node");
    // Device numbers and node names (numbered in order of appearance) would
    // name the same devices twice over.
    if ((num.ok() && !ids.empty()) || (!num.ok() && numbered)) {
      return InvalidArgument(
          "{}:{}: node '{}': a trace names its nodes either by device number or by name, not both",
          path, lineno, node);
    }
    if (num.ok()) {
      numbered = true;
      e.device = *num;
    } else {
      auto it = ids.find(node);
      e.device = it != ids.end() ? it->second : static_cast<int>(ids.size());
      ids.emplace(node, e.device);
    }
    out.push_back(e);
  }
  return out;
}

}  // namespace

std::vector<FaultEvent> ChaosSchedule(uint64_t seed, int num_devices, int min_alive, int events,
                                      int step_gap) {
  Rng rng(HashCombine(seed, 0xc4a05));
  std::vector<bool> alive(num_devices, true);
  std::vector<FaultEvent> out;
  int step = 1;
  auto pick = [&](bool want_alive) {
    std::vector<int> c;
    for (int d = 0; d < num_devices; ++d) {
      if (alive[d] == want_alive) c.push_back(d);
    }
    return c[rng.Below(c.size())];
  };
  for (int e = 0; e < events; ++e) {
    step += 1 + static_cast<int>(rng.Below(2 * step_gap));
    const int n_alive = static_cast<int>(std::count(alive.begin(), alive.end(), true));
    const bool kill = n_alive > min_alive && (n_alive == num_devices || rng.Below(3) != 0);
    const int d = pick(kill);
    alive[d] = !kill;
    out.push_back({!kill, d, step, -1});
  }
  for (int d = 0; d < num_devices; ++d) {
    if (!alive[d]) out.push_back({true, d, step += step_gap, -1});
  }
  return out;
}

Result<std::vector<FaultEvent>> ParseFaults(const std::vector<std::string>& specs, int num_devices,
                                            double time_scale) {
  std::vector<FaultEvent> events;
  for (const std::string& spec : specs) {
    if (spec.rfind("trace=", 0) == 0) {
      FS_ASSIGN_OR_RETURN(auto t, ReadTrace(spec.substr(6), time_scale));
      events.insert(events.end(), t.begin(), t.end());
    } else {
      FS_ASSIGN_OR_RETURN(FaultEvent e, ParseOne(spec));
      events.push_back(e);
    }
  }
  for (const FaultEvent& e : events) {
    if (e.device < 0 || e.device >= num_devices) {
      return OutOfRange("--fail: device {} does not exist (devices are 0..{})", e.device,
                        num_devices - 1);
    }
  }
  // Replay in order: every kill hits a live device, every rejoin a dead one.
  // Step-timed events come in step order; time-timed ones in time order;
  // the two kinds are checked separately.
  std::vector<bool> alive(num_devices, true);
  auto check = [&](std::vector<FaultEvent> seq, bool by_step) -> Status {
    std::stable_sort(seq.begin(), seq.end(), [&](const FaultEvent& a, const FaultEvent& b) {
      return by_step ? a.at_step < b.at_step : a.at_s < b.at_s;
    });
    for (const FaultEvent& e : seq) {
      if (!e.rejoin && !alive[e.device])
        return InvalidArgument("--fail: device {} is removed twice", e.device);
      if (e.rejoin && alive[e.device])
        return InvalidArgument("--fail: device {} rejoins while alive", e.device);
      alive[e.device] = e.rejoin;
    }
    return Status::Ok();
  };
  std::vector<FaultEvent> by_step, by_time;
  for (const FaultEvent& e : events) (e.at_step >= 0 ? by_step : by_time).push_back(e);
  FS_RETURN_IF_ERROR(check(by_step, true));
  std::fill(alive.begin(), alive.end(), true);
  FS_RETURN_IF_ERROR(check(by_time, false));
  return events;
}

}  // namespace failsafe
