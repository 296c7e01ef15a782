#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/engine_flags.h"

namespace failsafe {

CommandFn RegisterLogits(CLI::App& app) {
  struct Opts {
    std::string model, prompt_ids;
    int decode = 16, prefill_chunk = 512;
    DeviceFlags dev;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "model directory")->required();
  app.add_option("--prompt-ids", o->prompt_ids, "comma-separated prompt token ids")->required();
  app.add_option("--decode", o->decode, "greedy decode steps")->capture_default_str();
  app.add_option("--prefill-chunk", o->prefill_chunk, "prefill chunk size")->capture_default_str();
  AddDeviceFlags(app, &o->dev);
  return [o] {
    std::vector<int> prompt;
    std::stringstream ss(o->prompt_ids);
    for (std::string item; std::getline(ss, item, ',');) {
      // The whole item: "1 2" or "1.5" is not token 1.
      int id = 0;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
      if (item.empty() || ec != std::errc() || end != item.data() + item.size())
        return Fail("--prompt-ids: '" + item + "' is not a token id");
      prompt.push_back(id);
    }
    auto exec = MakeExecutor(o->model, o->dev);
    if (!exec.ok()) return Fail(exec.status().ToString());
    GenerateOptions g;
    g.max_tokens = o->decode + 1;
    g.prefill_chunk = o->prefill_chunk;
    g.record_logits = true;
    auto sampler = MakeCpuBackend(1);
    auto r = GenerateOne(**exec, *sampler, prompt, g);
    if (!r.ok()) return Fail(r.status().ToString());
    nlohmann::json j = {{"prompt_ids", prompt},
                        {"output_ids", r->output_ids},
                        {"positions", r->logits_positions},
                        {"logits", r->logits}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  };
}

}  // namespace failsafe
