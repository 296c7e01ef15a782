#include <cstdio>

#include "cli/commands.h"
#include "model/synthetic.h"

namespace failsafe {

CommandFn RegisterMakeModel(CLI::App& app) {
  struct Opts {
    std::string preset;
    std::string out;
    uint64_t seed = 0;
    std::string dtype = "f32";
    int shards = 1;
    int heads = 0, kv_heads = 0;
    int vocab_size = 0;
    std::string vision_language;
  };
  auto o = std::make_shared<Opts>();
  std::string presets;
  for (auto& n : SyntheticPresetNames()) presets += (presets.empty() ? "" : ", ") + n;
  app.add_option("--preset", o->preset, "one of: " + presets)->required();
  app.add_option("--out", o->out, "output directory")->required();
  app.add_option("--seed", o->seed, "random seed")->capture_default_str();
  app.add_option("--dtype", o->dtype, "f32, f16 or bf16")->capture_default_str();
  app.add_option("--shards", o->shards, "number of safetensors files (with an index when > 1)")
      ->capture_default_str();
  app.add_option("--heads", o->heads, "query heads instead of the preset's")
      ->check(CLI::Range(1, 4096));
  app.add_option("--kv-heads", o->kv_heads, "KV heads (head groups) instead of the preset's")
      ->check(CLI::Range(1, 4096));
  app.add_option("--vocab-size", o->vocab_size,
                 "the preset's shape with this vocabulary (e.g. to pair with a real tokenizer)");
  app.add_option("--vision-language", o->vision_language,
                 "Gemma 3 presets: write a Gemma3ForConditionalGeneration checkpoint, its language "
                 "model under this prefix (language_model.model. as published, or "
                 "model.language_model.) beside a small vision tower")
      ->check(CLI::IsMember({"language_model.model.", "model.language_model."}));
  return [o] {
    SyntheticModelOptions opts;
    opts.preset = o->preset;
    opts.num_heads = o->heads;
    opts.num_kv_heads = o->kv_heads;
    opts.seed = o->seed;
    opts.num_shards = o->shards;
    opts.vocab_size = o->vocab_size;
    opts.vision_language_prefix = o->vision_language;
    if (o->dtype == "f32")
      opts.dtype = DType::kF32;
    else if (o->dtype == "f16")
      opts.dtype = DType::kF16;
    else if (o->dtype == "bf16")
      opts.dtype = DType::kBF16;
    else
      return Fail("--dtype: unknown dtype '" + o->dtype + "' (known: f32, f16, bf16)");
    Status st = WriteSyntheticModel(o->out, opts);
    if (!st.ok()) return Fail(st.ToString());
    std::printf("wrote %s model to %s\n", o->preset.c_str(), o->out.c_str());
    return 0;
  };
}

}  // namespace failsafe
