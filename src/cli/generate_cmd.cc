#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/model_cache.h"
#include "model/tokenizer.h"

namespace failsafe {

CommandFn RegisterGenerate(CLI::App& app) {
  struct Opts {
    std::string model, cache_dir, prompt;
    int max_tokens = 128, top_k = 0;
    DeviceFlags dev;
    float temperature = 0.0f, top_p = 1.0f;
    uint64_t seed = 0;
    bool json = false, ignore_eos = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model,
                 "model directory (default: the real stories260K model, written to the cache on "
                 "first use)");
  app.add_option("--cache-dir", o->cache_dir,
                 "where the default model is kept (default: ~/.cache/failsafe)");
  app.add_option("--prompt", o->prompt, "prompt text (default: none, the model starts from BOS)");
  app.add_option("--max-tokens", o->max_tokens, "tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--temperature", o->temperature, "0 for greedy")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--top-k", o->top_k, "0 for off")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", o->top_p, "1 for off")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", o->seed, "sampling seed")->capture_default_str();
  AddDeviceFlags(app, &o->dev);
  app.add_flag("--ignore-eos", o->ignore_eos, "do not stop at the end-of-sequence token");
  app.add_flag("--json", o->json, "print {prompt_ids, output_ids, text} as JSON");
  return [o] {
    auto dir = ResolveModelOrDefault(o->model, o->cache_dir);
    if (!dir.ok()) return Fail(dir.status().ToString());
    auto tok = Tokenizer::LoadDir(*dir);
    if (!tok.ok()) return Fail(tok.status().ToString());
    auto exec = MakeExecutor(*dir, o->dev);
    if (!exec.ok()) return Fail(exec.status().ToString());
    std::vector<int> prompt = (*tok)->Encode(o->prompt, /*add_special=*/true);
    GenerateOptions g;
    g.max_tokens = o->max_tokens;
    g.sampling = {o->temperature, o->top_k, o->top_p, o->seed};
    if (!o->ignore_eos) {
      g.stop_token_ids = (*tok)->stop_token_ids();
      if ((*exec)->config().eos_token_id >= 0)
        g.stop_token_ids.push_back((*exec)->config().eos_token_id);
    }
    auto sampler = MakeCpuBackend(1);
    auto r = GenerateOne(**exec, *sampler, prompt, g);
    if (!r.ok()) return Fail(r.status().ToString());
    // The output's text as it reads after the prompt (a leading space stays).
    StreamDecoder decoder(tok->get(), /*skip_special=*/true, prompt);
    std::string text;
    for (int id : r->output_ids) text += decoder.Add(id);
    text += decoder.Finish();
    if (o->json) {
      nlohmann::json j = {{"prompt_ids", prompt}, {"output_ids", r->output_ids}, {"text", text}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("%s%s\n", o->prompt.c_str(), text.c_str());
    }
    return 0;
  };
}

}  // namespace failsafe
