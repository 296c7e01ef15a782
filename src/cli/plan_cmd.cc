#include <cstdio>
#include <sstream>

#include "cli/commands.h"
#include "model/synthetic.h"
#include "placement/plan_stats.h"

namespace failsafe {

CommandFn RegisterPlan(CLI::App& app) {
  struct Opts {
    std::string model, preset, policy = "hybrid", alive;
    int devices = 8, total = 0;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "model directory (its config.json)");
  app.add_option("--preset", o->preset, "a synthetic preset instead of --model");
  app.add_option("--devices", o->devices, "alive devices (ids 0..N-1)")->capture_default_str();
  app.add_option("--alive", o->alive,
                 "explicit alive device ids, e.g. 0,1,2,4 (overrides --devices)");
  app.add_option("--total-devices", o->total,
                 "device ids range over [0, T) (default: max(8, devices))");
  app.add_option("--policy,--placement", o->policy, "standard, nonuniform, cyclic or hybrid")
      ->capture_default_str();
  app.add_flag("--json", o->json, "print the plan and per-device costs as JSON");
  return [o] {
    Result<ModelConfig> c =
        o->model.empty()
            ? (o->preset.empty()
                   ? Result<ModelConfig>(InvalidArgument("give --model DIR or --preset NAME"))
                   : SyntheticPresetConfig(o->preset))
            : ModelConfig::Load(o->model);
    if (!c.ok()) return Fail(c.status().ToString());
    auto policy = ParsePolicy(o->policy);
    if (!policy.ok()) return Fail(policy.status().ToString());
    std::vector<int> alive;
    if (!o->alive.empty()) {
      std::stringstream ss(o->alive);
      for (std::string item; std::getline(ss, item, ',');) {
        try {
          alive.push_back(std::stoi(item));
        } catch (...) {
          return Fail("--alive: '" + item + "' is not a device id");
        }
      }
    } else {
      if (o->devices < 1) return Fail("--devices must be at least 1");
      for (int d = 0; d < o->devices; ++d) alive.push_back(d);
    }
    int total = o->total > 0 ? o->total : std::max(8, o->alive.empty() ? o->devices : 0);
    for (int d : alive) total = std::max(total, o->total > 0 ? o->total : d + 1);
    auto plan = MakePlan(*c, *policy, total, alive);
    if (!plan.ok()) return Fail(plan.status().ToString());
    std::printf("%s\n",
                o->json ? PlanReportJson(*plan, *c).c_str() : PlanReport(*plan, *c).c_str());
    return 0;
  };
}

}  // namespace failsafe
