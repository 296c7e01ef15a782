#include <cstdio>

#include "cli/commands.h"
#include "model/llama2c.h"

namespace failsafe {

CommandFn RegisterConvertLlama2c(CLI::App& app) {
  auto o = std::make_shared<Llama2cConversion>();
  app.add_option("--checkpoint", o->checkpoint, "the llama2.c checkpoint (.bin)")->required();
  app.add_option("--tokenizer", o->tokenizer_model, "its SentencePiece tokenizer.model")
      ->required();
  app.add_option("--out", o->out_dir, "output directory (Hugging Face layout)")->required();
  return [o] {
    Status st = ConvertLlama2c(*o);
    if (!st.ok()) return Fail(st.ToString());
    std::printf("wrote %s\n", o->out_dir.c_str());
    return 0;
  };
}

}  // namespace failsafe
