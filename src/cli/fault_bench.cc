#include "cli/fault_bench.h"

#include "cli/model_cache.h"
#include "common/clock.h"

namespace failsafe {

void AddFaultServerFlags(CLI::App& app, FaultServerFlags* flags) {
  flags->dev.devices = 8;
  app.add_option("--model", flags->model, "model directory (default: the real stories260K)");
  app.add_option("--cache-dir", flags->cache_dir, "where the default model is kept");
  AddDeviceFlags(app, &flags->dev);
}

Result<FaultServerOptions> FaultServerFromFlags(const FaultServerFlags& flags) {
  FaultServerOptions fo;
  FS_ASSIGN_OR_RETURN(fo.model_dir, ResolveModelOrDefault(flags.model, flags.cache_dir));
  fo.dev = flags.dev;
  return fo;
}

FaultServer::~FaultServer() {
  server.reset();
  service.reset();
}

Result<std::unique_ptr<FaultServer>> StartFaultServer(const FaultServerOptions& o) {
  auto s = std::make_unique<FaultServer>();
  FS_ASSIGN_OR_RETURN(s->tok, Tokenizer::LoadDir(o.model_dir));
  FS_ASSIGN_OR_RETURN(auto config, ModelConfig::Load(o.model_dir));
  FS_ASSIGN_OR_RETURN(auto sc, MakeSchedulerConfig("load-aware", "adaptive", o.max_batch_tokens,
                                                   o.max_num_seqs, config.max_position_embeddings));
  FS_ASSIGN_OR_RETURN(auto mode, ParseDeviceRecoveryMode(o.dev.recovery));
  DeviceFlags dev = o.dev;
  dev.max_step_tokens = o.max_batch_tokens;
  dev.max_seqs = o.max_num_seqs;
  FS_ASSIGN_OR_RETURN(auto exec, MakeExecutor(o.model_dir, dev));
  EngineOptions eo;
  eo.recovery = mode;
  eo.rebalance_slow = o.dev.rebalance_slow;
  ServiceOptions so;
  so.max_queue = o.max_queue;
  s->service = std::make_unique<EngineService>(std::move(exec), sc, eo, so);
  ServerOptions opts;
  opts.host = "127.0.0.1";
  opts.port = 0;
  opts.model_name = "bench";
  s->server = std::make_unique<HttpServer>(s->service.get(), s->tok.get(), opts);
  FS_RETURN_IF_ERROR(s->server->Start());
  return s;
}

Result<FaultBench> StartFaultBench(const FaultServerOptions& options, LoadOptions load,
                                   int clients) {
  FaultBench b;
  FS_ASSIGN_OR_RETURN(b.server, StartFaultServer(options));
  load.port = b.server->server->port();
  load.probe_interval_ms = 0;
  load.keep_streams = true;
  b.load = load;
  FS_ASSIGN_OR_RETURN(b.reference, RunLoad(load, clients));
  if (b.reference.served != clients)
    return Internal("the fault-free run failed: {}", b.reference.first_error);
  b.want = ReferenceTexts(b.reference.streams, load.pool > 0 ? load.pool : clients);
  return b;
}

std::vector<LiveDevice> LiveDevices(EngineService& service) {
  std::vector<LiveDevice> out;
  for (const DeviceStatus& d : service.GetStatus().devices) {
    if (d.alive && d.pid > 0) out.push_back({d.device, static_cast<pid_t>(d.pid)});
  }
  return out;
}

std::vector<int> DeadDevices(EngineService& service) {
  std::vector<int> out;
  for (const DeviceStatus& d : service.GetStatus().devices) {
    if (!d.alive) out.push_back(d.device);
  }
  return out;
}

double StallAfter(const std::vector<StreamRecord>& streams, int64_t at_ns, int64_t window_ns) {
  int64_t worst = 0;
  for (const StreamRecord& s : streams) {
    for (size_t k = 1; k < s.token_ns.size(); ++k) {
      const int64_t prev = s.token_ns[k - 1], t = s.token_ns[k];
      if (t > at_ns && prev < at_ns + window_ns) worst = std::max(worst, t - prev);
    }
  }
  return worst * 1e-6;
}

double LongestGap(const std::vector<StreamRecord>& streams) {
  int64_t worst = 0;
  for (const StreamRecord& s : streams) {
    for (size_t k = 1; k < s.token_ns.size(); ++k)
      worst = std::max(worst, s.token_ns[k] - s.token_ns[k - 1]);
  }
  return worst * 1e-6;
}

std::vector<std::string> ReferenceTexts(const std::vector<StreamRecord>& streams, int pool) {
  std::vector<std::string> out(pool);
  for (const StreamRecord& s : streams) {
    if (s.ok && s.pool_index < pool) out[s.pool_index] = s.text;
  }
  return out;
}

std::vector<const StreamRecord*> ReferenceStreams(const std::vector<StreamRecord>& streams,
                                                  int pool) {
  std::vector<const StreamRecord*> out(pool, nullptr);
  for (const StreamRecord& s : streams) {
    if (s.ok && s.pool_index < pool) out[s.pool_index] = &s;
  }
  return out;
}

Divergence FindDivergence(const StreamRecord& got, const StreamRecord& want) {
  Divergence d;
  const size_t n = std::min(got.text.size(), want.text.size());
  size_t at = 0;
  while (at < n && got.text[at] == want.text[at]) ++at;
  d.first_char = static_cast<int>(at);
  d.got_events = static_cast<int>(got.text_ends.size());
  d.want_events = static_cast<int>(want.text_ends.size());
  d.first_event = d.got_events;
  for (int k = 0; k < d.got_events; ++k) {
    if (got.text_ends[k] > d.first_char) {
      d.first_event = k;
      break;
    }
  }
  return d;
}

}  // namespace failsafe
