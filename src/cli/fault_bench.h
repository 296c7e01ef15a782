// What the device-fault benchmarks share (`failsafe stall-bench`, `failsafe
// soak`): the `serve` configuration started in this process (real worker
// processes, the engine service, the HTTP front end on a free loopback port),
// signals sent to a device's worker by its current pid, and the stall a fault
// caused as streaming clients saw it.
//
// Thread-safety: a FaultServer is used from one thread; its service and
// server are thread-safe as documented in their headers. The functions below
// are safe from any thread.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "cli/engine_flags.h"
#include "cli/load_bench.h"
#include "model/tokenizer.h"
#include "server/http_server.h"

namespace failsafe {

struct FaultServerOptions {
  std::string model_dir;        // resolved model directory
  DeviceFlags dev;              // devices, placement, recovery, timeouts (as `serve`)
  int max_batch_tokens = 1024;  // `serve`'s defaults
  int max_num_seqs = 128;
  int max_queue = 256;
};

// The flags both fault benchmarks take to start the server: the model (the
// real stories260K by default) and the devices as `serve` has them (8).
struct FaultServerFlags {
  std::string model, cache_dir;
  DeviceFlags dev;
};
void AddFaultServerFlags(CLI::App& app, FaultServerFlags* flags);
// Resolves the model (creating the default one in the cache if needed).
Result<FaultServerOptions> FaultServerFromFlags(const FaultServerFlags& flags);

// The server and everything under it; destroyed in order (HTTP, engine,
// devices).
struct FaultServer {
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<EngineService> service;
  std::unique_ptr<HttpServer> server;
  ~FaultServer();
};

Result<std::unique_ptr<FaultServer>> StartFaultServer(const FaultServerOptions& options);

// A started server and a fault-free run of `clients` requests of `load`
// against it, all at once (pool entries 0..clients-1), to compare with.
struct FaultBench {
  std::unique_ptr<FaultServer> server;
  LoadOptions load;               // `load` with the server's port; streams kept, no probes
  LoadResult reference;           // the fault-free run
  std::vector<std::string> want;  // its texts by pool index
};
// Fails if the server does not start or any fault-free request fails.
Result<FaultBench> StartFaultBench(const FaultServerOptions& options, LoadOptions load,
                                   int clients);

// The devices the engine counts alive, with their worker pids (> 0 only).
struct LiveDevice {
  int device = 0;
  pid_t pid = -1;
};
std::vector<LiveDevice> LiveDevices(EngineService& service);
// Devices the engine has declared dead (candidates for a rejoin).
std::vector<int> DeadDevices(EngineService& service);

// The stall a fault at `at_ns` (MonotonicNanos) caused, in milliseconds: the
// longest gap between consecutive token events of any stream (not the wait
// for a first token, which a full queue lengthens), among gaps that end after
// `at_ns` and begin
// before `at_ns + window_ns`. A step already under way when a device stops
// may still finish, so the stall can begin a step after the stop. 0: no
// stream was open then.
double StallAfter(const std::vector<StreamRecord>& streams, int64_t at_ns,
                  int64_t window_ns = 250'000'000);
// The longest gap between consecutive tokens of any stream, milliseconds.
double LongestGap(const std::vector<StreamRecord>& streams);

// Texts of a fault-free run by pool index; "" where the reference failed.
std::vector<std::string> ReferenceTexts(const std::vector<StreamRecord>& streams, int pool);
// The fault-free run's streams by pool index (null where it failed);
// pointers into `streams`.
std::vector<const StreamRecord*> ReferenceStreams(const std::vector<StreamRecord>& streams,
                                                  int pool);

// Where a stream's text first differs from the fault-free one's.
struct Divergence {
  int first_char = 0;                   // byte offset of the first difference
  int first_event = 0;                  // the token event (of `got`) that carried it
  int got_events = 0, want_events = 0;  // token events of each
};
Divergence FindDivergence(const StreamRecord& got, const StreamRecord& want);

}  // namespace failsafe
