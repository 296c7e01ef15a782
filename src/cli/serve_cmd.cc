#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/default_model.h"
#include "cli/engine_flags.h"
#include "cli/model_cache.h"
#include "model/tokenizer.h"
#include "server/http_server.h"

namespace failsafe {

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }
}  // namespace

CommandFn RegisterServe(CLI::App& app) {
  struct Opts {
    std::string model, cache_dir, host = "127.0.0.1", served_name, admin_token;
    std::string router = "load-aware", prefill = "adaptive";
    int port = 8000, max_queue = 256, max_batch_tokens = 1024, max_num_seqs = 128,
        max_model_len = 0;
    bool enable_admin = false;
    DeviceFlags dev;
  };
  auto o = std::make_shared<Opts>();
  // The default model has 4 KV head groups, the most devices the planner
  // gives work to today.
  o->dev.devices = 4;
  app.add_option("--model", o->model,
                 "model directory (default: the real stories260K model, written to the cache on "
                 "first use)");
  app.add_option("--cache-dir", o->cache_dir, "where the default model is kept");
  AddDeviceFlags(app, &o->dev);
  app.add_option("--router", o->router, "round-robin or load-aware")->capture_default_str();
  app.add_option("--prefill", o->prefill, "fifo or adaptive")->capture_default_str();
  app.add_option("--host", o->host, "address to bind")->capture_default_str();
  app.add_option("--port", o->port, "port (0: any free port)")->capture_default_str();
  app.add_option("--served-model-name", o->served_name,
                 "model name in the API (default: the directory name)");
  app.add_option("--max-queue", o->max_queue, "waiting requests before answering 429")
      ->capture_default_str();
  app.add_option("--max-batch-tokens", o->max_batch_tokens, "tokens per step")
      ->capture_default_str();
  app.add_option("--max-num-seqs", o->max_num_seqs, "running sequences")->capture_default_str();
  app.add_option("--max-model-len", o->max_model_len, "context length (default: the model's)");
  app.add_flag("--enable-admin", o->enable_admin, "enable /admin/* (failure injection, status)");
  app.add_option("--admin-token", o->admin_token,
                 "admin calls need this bearer token (default: loopback only)");
  return [o] {
    auto dir = ResolveModelOrDefault(o->model, o->cache_dir);
    if (!dir.ok()) return Fail(dir.status().ToString());
    auto tok = Tokenizer::LoadDir(*dir);
    if (!tok.ok()) return Fail(tok.status().ToString());
    auto config = ModelConfig::Load(*dir);
    if (!config.ok()) return Fail(config.status().ToString());
    auto sc = MakeSchedulerConfig(o->router, o->prefill, o->max_batch_tokens, o->max_num_seqs,
                                  o->max_model_len > 0
                                      ? std::min(o->max_model_len, config->max_position_embeddings)
                                      : config->max_position_embeddings);
    if (!sc.ok()) return Fail(sc.status().message());
    auto mode = ParseRecoveryMode(o->dev.recovery);
    if (!mode.ok()) return Fail("--recovery: " + mode.status().message());
    o->dev.max_step_tokens = o->max_batch_tokens;
    o->dev.max_seqs = o->max_num_seqs;
    auto exec = MakeExecutor(*dir, o->dev);
    if (!exec.ok()) return Fail(exec.status().ToString());
    EngineOptions eo;
    eo.recovery = *mode;
    ServiceOptions so;
    so.max_queue = o->max_queue;
    EngineService service(std::move(*exec), *sc, eo, so);
    ServerOptions opts;
    opts.host = o->host;
    opts.port = o->port;
    opts.model_name = !o->served_name.empty() ? o->served_name
                      : o->model.empty()      ? std::string(kDefaultModelName)
                                              : std::filesystem::path(*dir).filename().string();
    opts.enable_admin = o->enable_admin;
    opts.admin_token = o->admin_token;
    HttpServer server(&service, tok->get(), opts);
    Status st = server.Start();
    if (!st.ok()) return Fail(st.ToString());
    std::printf("serving %s on http://%s:%d (%d devices, placement %s, recovery %s%s)\n",
                opts.model_name.c_str(), opts.host.c_str(), server.port(), o->dev.devices,
                o->dev.placement.c_str(), o->dev.recovery.c_str(),
                opts.enable_admin ? ", admin enabled" : "");
    std::fflush(stdout);
    std::signal(SIGINT, OnSignal);
    std::signal(SIGTERM, OnSignal);
    while (!g_stop) ::usleep(100000);
    server.Stop();
    return 0;
  };
}

}  // namespace failsafe
