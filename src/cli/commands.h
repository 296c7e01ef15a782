// Subcommands of the `failsafe` program. Each Register* adds its options to
// the app and returns the function to run when it is chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace failsafe {

using CommandFn = std::function<int()>;

CommandFn RegisterMakeModel(CLI::App& app);
CommandFn RegisterGenerate(CLI::App& app);
CommandFn RegisterLogits(CLI::App& app);
CommandFn RegisterWorker(CLI::App& app);
CommandFn RegisterPlan(CLI::App& app);
CommandFn RegisterRun(CLI::App& app);
CommandFn RegisterAblation(CLI::App& app);
CommandFn RegisterChaos(CLI::App& app);
CommandFn RegisterRecoveryBench(CLI::App& app);
CommandFn RegisterSlowBench(CLI::App& app);
CommandFn RegisterStallBench(CLI::App& app);
CommandFn RegisterSoak(CLI::App& app);
CommandFn RegisterServe(CLI::App& app);
CommandFn RegisterRouter(CLI::App& app);
CommandFn RegisterBench(CLI::App& app);
CommandFn RegisterSimulate(CLI::App& app);
CommandFn RegisterTokenize(CLI::App& app);
CommandFn RegisterChatTemplate(CLI::App& app);
CommandFn RegisterConvertLlama2c(CLI::App& app);

// Prints "error: <message>" to stderr and returns exit code 1.
int Fail(const std::string& message);

}  // namespace failsafe
