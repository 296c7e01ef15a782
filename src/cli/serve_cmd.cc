#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <thread>

#include "cli/admin_token.h"
#include "cli/commands.h"
#include "cli/default_model.h"
#include "cli/engine_flags.h"
#include "cli/model_cache.h"
#include "cli/signal_wait.h"
#include "common/log.h"
#include "common/units.h"
#include "model/tokenizer.h"
#include "server/http_server.h"

namespace failsafe {

namespace {

// The engine stops with its devices. A step on a hung device may not end for
// a long time: past a bound, exit anyway; the devices go with this process
// (each dies with its parent: PR_SET_PDEATHSIG).
constexpr int kEngineStopSeconds = 5;

void StopEngine(std::unique_ptr<EngineService> service) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> stopped = done->get_future();
  std::thread([service = std::move(service), done]() mutable {
    service.reset();
    done->set_value();
  }).detach();
  if (stopped.wait_for(std::chrono::seconds(kEngineStopSeconds)) == std::future_status::ready)
    return;
  FS_LOG_WARN("the engine did not stop within {} s (a device hangs?); exiting without it",
              kEngineStopSeconds);
  std::fflush(stdout);
  ::_exit(0);
}

bool IsLoopbackHost(const std::string& host) {
  return host == "127.0.0.1" || host == "::1" || host == "localhost" || host.rfind("127.", 0) == 0;
}

}  // namespace

CommandFn RegisterServe(CLI::App& app) {
  struct Opts {
    std::string model, cache_dir, host = "127.0.0.1", served_name, admin_token, admin_token_file;
    std::string router = "load-aware", prefill = "adaptive", max_body = "4MiB";
    std::string outage_timeout = "30s", respawn_backoff = "250ms", crash_loop_window = "60s";
    bool respawn = true;
    int crash_loop_limit = 5;
    int port = 8000, max_queue = 256, max_batch_tokens = 1024, max_num_seqs = 128,
        max_model_len = 0, max_connections = 4096, http_threads = 2, min_devices = 1;
    double drain_timeout = 30;
    bool enable_admin = false;
    DeviceFlags dev;
    std::string prefix_cache = "on";
  };
  auto o = std::make_shared<Opts>();
  // A scale-up domain of 8 devices; the default model's 4 KV head groups are
  // replicated over them (or its heads made DP), see docs/ARCHITECTURE.md.
  o->dev.devices = 8;
  app.add_option("--model", o->model,
                 "model directory (default: the real stories260K model, written to the cache on "
                 "first use)");
  app.add_option("--cache-dir", o->cache_dir, "where the default model is kept");
  AddDeviceFlags(app, &o->dev);
  app.add_option("--router", o->router, "round-robin or load-aware")->capture_default_str();
  app.add_option("--prefill", o->prefill, "fifo or adaptive")->capture_default_str();
  AddPrefixCacheFlag(app, &o->prefix_cache);
  app.add_option("--host", o->host, "address to bind")->capture_default_str();
  app.add_option("--port", o->port, "port (0: any free port)")->capture_default_str();
  app.add_option("--served-model-name", o->served_name,
                 "model name in the API (default: the directory name)");
  app.add_option("--max-queue", o->max_queue, "waiting requests before answering 429")
      ->capture_default_str();
  app.add_option("--outage-timeout", o->outage_timeout,
                 "while too few devices can serve, new requests get 503 at once; accepted ones "
                 "wait this long for a device to come back, then fail")
      ->capture_default_str();
  app.add_flag("--respawn,!--no-respawn", o->respawn,
               "start a device that died again on its own, after a backoff that doubles with "
               "each death (up to 30 s); a device on another host comes back once a worker "
               "joins to be it")
      ->capture_default_str();
  app.add_option("--respawn-backoff", o->respawn_backoff, "the first backoff")
      ->capture_default_str();
  app.add_option("--crash-loop-limit", o->crash_loop_limit,
                 "a device that dies or fails to start more often than this within "
                 "--crash-loop-window is left dead until restored by hand")
      ->capture_default_str();
  app.add_option("--crash-loop-window", o->crash_loop_window, "see --crash-loop-limit")
      ->capture_default_str();
  app.add_option("--min-devices", o->min_devices,
                 "below this many alive devices /health answers 503 (the node still serves): a "
                 "load balancer's health check moves new work to other nodes")
      ->capture_default_str();
  app.add_option("--max-batch-tokens", o->max_batch_tokens, "tokens per step")
      ->capture_default_str();
  app.add_option("--max-num-seqs", o->max_num_seqs, "running sequences")->capture_default_str();
  app.add_option("--max-model-len", o->max_model_len, "context length (default: the model's)");
  app.add_option("--max-connections", o->max_connections,
                 "open HTTP connections; more are answered 429 and closed")
      ->capture_default_str();
  app.add_option("--max-body", o->max_body,
                 "largest request body (413 beyond, refused before it is read)")
      ->capture_default_str();
  app.add_option("--http-threads", o->http_threads, "HTTP event-loop threads")
      ->capture_default_str();
  app.add_option("--drain-timeout", o->drain_timeout,
                 "seconds that requests in flight get to finish after SIGTERM")
      ->capture_default_str();
  app.add_flag("--enable-admin", o->enable_admin, "enable /admin/* (failure injection, status)");
  app.add_option("--admin-token-file", o->admin_token_file,
                 "admin calls need the bearer token in this file (or in FAILSAFE_ADMIN_TOKEN); "
                 "default: loopback clients only");
  app.add_option("--admin-token", o->admin_token,
                 "the admin token itself (visible to `ps`: prefer --admin-token-file)");
  return [o] {
    if (o->max_connections < 1) return Fail("--max-connections must be at least 1");
    if (o->http_threads < 1) return Fail("--http-threads must be at least 1");
    if (o->drain_timeout < 0) return Fail("--drain-timeout must not be negative");
    if (o->min_devices < 1 || o->min_devices > o->dev.devices)
      return Fail("--min-devices must be between 1 and --devices");
    auto max_body = ParseBytes(o->max_body);
    if (!max_body.ok() || *max_body < 1) return Fail("--max-body: expected a size such as 4MiB");
    auto token = ResolveAdminToken(o->admin_token, o->admin_token_file);
    if (!token.ok()) return Fail(token.status().message());
    if (o->enable_admin && token->empty() && !IsLoopbackHost(o->host)) {
      FS_LOG_WARN(
          "the admin API is enabled on {} without a token: it answers loopback clients only, and "
          "any proxy on this host passes as one; set --admin-token-file or FAILSAFE_ADMIN_TOKEN",
          o->host);
    }
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
    if (Status st = ApplyPrefixCacheFlag(o->prefix_cache, &*sc); !st.ok())
      return Fail(st.message());
    auto mode = ParseDeviceRecoveryMode(o->dev.recovery);
    if (!mode.ok()) return Fail("--recovery: " + mode.status().message());
    Status signals = InstallSignalPipe();
    if (!signals.ok()) return Fail(signals.ToString());
    o->dev.max_step_tokens = o->max_batch_tokens;
    o->dev.max_seqs = o->max_num_seqs;
    auto exec = MakeExecutor(*dir, o->dev);
    if (!exec.ok()) return Fail(exec.status().ToString());
    if (Status st = CheckPrefixCacheTier(o->prefix_cache, **exec); !st.ok())
      return Fail(st.ToString());
    EngineOptions eo;
    eo.recovery = *mode;
    eo.rebalance_slow = o->dev.rebalance_slow;
    ServiceOptions so;
    so.max_queue = o->max_queue;
    so.min_devices = o->min_devices;
    auto outage = ParseDuration(o->outage_timeout);
    if (!outage.ok()) return Fail("--outage-timeout: " + outage.status().message());
    so.outage_timeout_ms = static_cast<int64_t>(*outage * 1e3);
    so.respawn.enabled = o->respawn;
    auto backoff = ParseDuration(o->respawn_backoff);
    if (!backoff.ok() || *backoff <= 0) return Fail("--respawn-backoff: a positive duration");
    so.respawn.backoff_ms = std::max<int64_t>(1, static_cast<int64_t>(*backoff * 1e3));
    so.respawn.max_backoff_ms = std::max<int64_t>(so.respawn.backoff_ms, 30000);
    auto window = ParseDuration(o->crash_loop_window);
    if (!window.ok() || *window <= 0) return Fail("--crash-loop-window: a positive duration");
    so.respawn.crash_loop_window_ms = static_cast<int64_t>(*window * 1e3);
    if (o->crash_loop_limit < 1) return Fail("--crash-loop-limit: at least 1");
    so.respawn.crash_loop_limit = o->crash_loop_limit;
    auto service = std::make_unique<EngineService>(std::move(*exec), *sc, eo, so);
    ServerOptions opts;
    opts.host = o->host;
    opts.port = o->port;
    opts.model_name = !o->served_name.empty() ? o->served_name
                      : o->model.empty()      ? std::string(kDefaultModelName)
                                              : std::filesystem::path(*dir).filename().string();
    opts.enable_admin = o->enable_admin;
    opts.admin_token = *token;
    opts.max_connections = o->max_connections;
    opts.max_body_bytes = *max_body;
    opts.io_threads = o->http_threads;
    auto server = std::make_unique<HttpServer>(service.get(), tok->get(), opts);
    Status st = server->Start();
    if (!st.ok()) return Fail(st.ToString());
    std::printf("serving %s on http://%s:%d (%d devices, placement %s, recovery %s%s)\n",
                opts.model_name.c_str(), opts.host.c_str(), server->port(), o->dev.devices,
                o->dev.placement.c_str(), o->dev.recovery.c_str(),
                opts.enable_admin ? ", admin enabled" : "");
    if (config->vision_language)
      std::printf(
          "%s is a vision-language checkpoint: its language model serves text; the vision tower "
          "is not loaded and image inputs are refused\n",
          opts.model_name.c_str());
    std::fflush(stdout);
    const int cut = DrainOnSignal(
        o->drain_timeout, [&](int64_t ms) { return server->Drain(ms); }, [&] { server->Stop(); });
    server.reset();
    std::printf("HTTP stopped (%d requests cut short); stopping the devices\n", cut);
    std::fflush(stdout);
    StopEngine(std::move(service));
    return 0;
  };
}

}  // namespace failsafe
