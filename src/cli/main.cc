// failsafe: a resilient LLM serving engine.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>

#include "cli/commands.h"
#include "common/log.h"

namespace failsafe {

int Fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

}  // namespace failsafe

int main(int argc, char** argv) {
  using namespace failsafe;
  CLI::App app{"FailSafe: LLM serving that keeps going when devices fail"};
  app.require_subcommand(1);
  app.fallthrough();
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "debug, info, warn, error or off")
      ->capture_default_str();

  std::map<CLI::App*, CommandFn> commands;
  auto add = [&](const char* name, const char* help, CommandFn (*reg)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(name, help);
    commands[sub] = reg(*sub);
  };
  add("make-model", "write a synthetic model (config.json, model.safetensors, tokenizer.json)",
      RegisterMakeModel);
  add("convert-llama2c",
      "convert a llama2.c checkpoint and its SentencePiece tokenizer to Hugging Face layout",
      RegisterConvertLlama2c);
  add("serve", "serve an OpenAI-compatible API", RegisterServe);
  add("router",
      "an OpenAI-compatible front over several serve nodes that resumes a request on "
      "another node when its node fails",
      RegisterRouter);
  add("bench", "replay a trace against a running server and report latency percentiles",
      RegisterBench);
  add("generate", "generate text for one prompt", RegisterGenerate);
  add("logits", "print the logits of a prefill and greedy decode as JSON (for numerical checks)",
      RegisterLogits);
  add("tokenize", "encode and decode text with a model's tokenizer (one text or JSON Lines)",
      RegisterTokenize);
  add("chat-template", "render conversations with a chat template (one JSON object per line)",
      RegisterChatTemplate);
  add("plan", "print the placement plan and per-device costs for a device set", RegisterPlan);
  add("run", "run a workload to completion offline and print a summary", RegisterRun);
  add("ablation",
      "the paper's ablation (TP4 -> nonuniform -> cyclic -> FailSafe, and TP8) on this engine",
      RegisterAblation);
  add("chaos",
      "soak test: random device failures and rejoins, outputs checked against a fault-free run",
      RegisterChaos);
  add("recovery-bench",
      "the paper's recovery experiment: one failure mid-run under each recovery mode",
      RegisterRecoveryBench);
  add("slow-bench",
      "a device throttled to a fraction of its speed: throughput without and with "
      "rebalancing",
      RegisterSlowBench);
  add("stall-bench",
      "over HTTP on the serve configuration: the stall a SIGSTOPped device causes, per trial",
      RegisterStallBench);
  add("soak",
      "over HTTP on the serve configuration: random SIGKILL, SIGSTOP/SIGCONT and rejoins under "
      "concurrent streams, every text checked",
      RegisterSoak);
  add("simulate",
      "the paper's experiments on the cluster simulator (8xH100 scale), or its validation against "
      "this engine",
      RegisterSimulate);
  add("worker", "run one device (started by the coordinator)", RegisterWorker);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  LogLevel level;
  if (!ParseLogLevel(log_level, &level))
    return Fail("--log-level: unknown level '" + log_level + "'");
  SetLogLevel(level);
  for (auto& [sub, fn] : commands) {
    if (sub->parsed()) return fn();
  }
  return 1;
}
