// The API's routes: the OpenAI endpoints, health, metrics, tokenizer, admin.
#pragma once

#include <functional>

#include "model/tokenizer.h"
#include "server/engine_service.h"
#include "server/grammar.h"
#include "server/http_metrics.h"
#include "server/http_server.h"
#include "server/router.h"

namespace failsafe {

// What the handlers use; everything outlives the server's routes.
struct ApiContext {
  EngineService* service = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ServerOptions* options = nullptr;
  const HttpMetrics* http_metrics = nullptr;
  // Compiled grammars of structured outputs, by schema.
  std::shared_ptr<GrammarCache> grammars;
  // Runs a call that may wait for the engine (admin) off the I/O threads.
  std::function<void(std::function<void()>)> run_admin;
};

// /health, /v1/models, /metrics, /tokenize, /detokenize and, if enabled,
// /admin/status and /admin/devices/{id}/fail|restore.
void AddApiRoutes(const ApiContext& ctx, Router* router);
// /v1/completions and /v1/chat/completions (completion_handler.cc).
void AddCompletionRoutes(const ApiContext& ctx, Router* router);

}  // namespace failsafe
