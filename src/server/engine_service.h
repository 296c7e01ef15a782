// The engine behind the server: one thread drives the Engine; HTTP threads
// submit requests, cancel them, and read their tokens through handles.
//
// Thread-safety: every public method may be called from any thread. The
// Engine and its executor are touched only by the engine thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"
#include "server/respawn.h"

namespace failsafe {

// One request's stream of events, filled by the engine thread. A reader
// either blocks in Next, or registers a notify callback and takes events as
// they come (an event loop).
class RequestHandle {
 public:
  // Waits up to timeout_ms for the next event; false on timeout.
  bool Next(TokenEvent* event, int64_t timeout_ms);
  // Appends every event queued so far to `out` without waiting.
  void TakeEvents(std::vector<TokenEvent>* out);
  // `notify` runs on the engine thread after each event is queued, under the
  // handle's lock: it must be quick and must not call back into the handle
  // (post to an event loop). Replaces the previous callback; after
  // SetNotify(nullptr) returns, the old one is not running and never runs.
  void SetNotify(std::function<void()> notify);
  int64_t arrival_ns() const { return arrival_ns_; }
  int prompt_tokens() const { return prompt_tokens_; }
  // Why the request failed (finish reason kError), once it has: the engine's
  // Status (kUnavailable: the devices cannot serve; kInvalidArgument,
  // kOutOfRange, kResourceExhausted: the request was refused).
  Status error();

 private:
  friend class EngineService;
  void Push(const TokenEvent& e, const Status& error = Status::Ok());
  std::mutex mu_;
  Status error_;                  // guarded by mu_
  std::function<void()> notify_;  // guarded by mu_
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;  // guarded by mu_
  int64_t arrival_ns_ = 0;
  int prompt_tokens_ = 0;
  int64_t engine_id_ = -1;     // engine thread only
  int64_t last_token_ns_ = 0;  // engine thread only
  int generated_ = 0;          // engine thread only
};

struct ServiceOptions {
  // Requests waiting for a running slot beyond which Submit fails (429).
  // Requests that free running slots will take at the next step do not count.
  int max_queue = 256;
  int64_t heartbeat_ms = 500;        // device health checks while idle
  int64_t heartbeat_timeout_ms = 0;  // 0: the executor's own deadline
  // While the engine cannot serve (too few devices), new requests fail at
  // once with kUnavailable; requests already accepted wait this long for a
  // device to come back, then fail the same way.
  int64_t outage_timeout_ms = 30000;
  // Below this many alive devices /health answers 503 although the node
  // still serves what it is sent: a load balancer's health check then sends
  // new work to fuller nodes.
  int min_devices = 1;
  // Dead devices started again on their own (server/respawn.h).
  RespawnOptions respawn;
};

struct DeviceStatus {
  int device = 0;
  int pid = -1;  // its worker process
  bool alive = false;
  bool active = false;
  int64_t kv_used_pages = 0;
  int64_t kv_capacity_pages = 0;
  int64_t dp_load_tokens = 0;
  MeasuredSpeed speed;  // speed on its work relative to its peers, and its share
  RespawnRecord respawn;
};

struct ServiceStatus {
  std::string plan_json;
  std::vector<DeviceStatus> devices;
  int running = 0;
  int waiting = 0;
  bool degraded = false;
  std::string degraded_reason;
  std::vector<RecoveryReport> recoveries;
};

class EngineService {
 public:
  EngineService(std::unique_ptr<Executor> executor, const SchedulerConfig& config,
                const EngineOptions& options, const ServiceOptions& service);
  ~EngineService();

  // Queues a request. Fails with kResourceExhausted when the queue is full.
  // While the engine cannot serve, the handle's first event is already the
  // error (kUnavailable, with the reason).
  Result<std::shared_ptr<RequestHandle>> Submit(RequestSpec spec);
  // The request is no longer wanted (client gone, or a stop string matched).
  void Cancel(const std::shared_ptr<RequestHandle>& handle,
              FinishReason why = FinishReason::kAborted);

  // Administration, run on the engine thread.
  Status FailDevice(int device);
  Status RestoreDevice(int device);
  ServiceStatus GetStatus();

  // Serving is possible (enough devices); otherwise `reason` says why.
  bool Healthy(std::string* reason) const;
  const ModelConfig& config() const { return config_; }
  const Metrics& metrics() const { return metrics_; }
  int max_model_len() const { return max_model_len_; }
  // Requests share the KV of common prompt prefixes.
  bool prefix_cache() const { return prefix_cache_; }

 private:
  using Task = std::function<void()>;
  void Loop();
  void Dispatch(const std::vector<TokenEvent>& events);
  // Engine thread: the engine cannot step; fails requests once the outage
  // has lasted outage_timeout_ms.
  void DuringOutage();
  void UpdateGauges();
  void UpdateGauges(const EngineSnapshot& snap);
  // Engine thread: notes deaths and starts the devices whose time has come.
  void Respawn();
  // Runs `task` on the engine thread and waits for it.
  void RunOnEngine(Task task);

  std::unique_ptr<Executor> executor_;
  Engine engine_;
  const ServiceOptions service_;
  const ModelConfig config_;
  const int max_model_len_;
  const bool prefix_cache_;
  const int max_num_seqs_;
  const DeviceSpeed speed_;
  double fault_free_step_s_ = 0;  // the reference step on every device (core/step_cost.h)
  Plan capacity_plan_;            // the plan capacity_ was computed for, engine thread only
  double capacity_ = 1;           // fraction of fault-free throughput, engine thread only
  Metrics metrics_;
  RespawnPolicy respawn_;  // engine thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<RequestSpec, std::shared_ptr<RequestHandle>>>
      submissions_;                                                               // guarded by mu_
  std::vector<std::pair<std::shared_ptr<RequestHandle>, FinishReason>> cancels_;  // guarded by mu_
  std::deque<Task> tasks_;                                                        // guarded by mu_
  int queued_ = 0;                // requests submitted and not yet running, guarded by mu_
  int free_slots_ = 0;            // running slots free at the last step, guarded by mu_
  bool healthy_ = true;           // guarded by mu_
  std::string unhealthy_reason_;  // guarded by mu_
  bool stop_ = false;             // guarded by mu_

  std::unordered_map<int64_t, std::shared_ptr<RequestHandle>> live_;  // engine thread only
  size_t recoveries_seen_ = 0;   // reports already in the metrics, engine thread only
  int64_t outage_since_ns_ = 0;  // the engine has not been able to serve since, engine thread only
  std::thread thread_;
};

}  // namespace failsafe
