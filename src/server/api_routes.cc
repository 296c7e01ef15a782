#include "server/api_routes.h"

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace failsafe {

using nlohmann::json;

namespace {

void ReplyJson(const std::shared_ptr<HttpExchange>& ex, int status, const json& body) {
  ex->Reply(status, body.dump(-1, ' ', false, json::error_handler_t::replace));
}

void ReplyError(const std::shared_ptr<HttpExchange>& ex, const ApiError& e,
                std::vector<std::pair<std::string, std::string>> extra = {}) {
  ex->Reply(e.status, ErrorBody(e), "application/json", std::move(extra));
}

// Runs an admin call off the I/O threads; a failure is answered 500.
void RunAdmin(const ApiContext& ctx, const std::shared_ptr<HttpExchange>& ex,
              std::function<void()> fn) {
  ctx.run_admin([ex, fn = std::move(fn)] {
    try {
      fn();
    } catch (const std::exception& e) {
      ReplyError(ex, InternalError(e.what()));
    }
  });
}

// Compares without stopping at the first difference (no timing hint).
bool SameSecret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

// Admin calls need the token when one is set, else a loopback client.
bool AdminAllowed(const ServerOptions& o, const std::shared_ptr<HttpExchange>& ex) {
  const HttpRequest& req = ex->request();
  if (!o.admin_token.empty()) {
    if (SameSecret(req.Header("authorization"), "Bearer " + o.admin_token)) return true;
    ReplyError(ex,
               {401, "authentication_error", "invalid_admin_token", "",
                "admin calls need the header \"Authorization: Bearer <admin token>\""},
               {{"WWW-Authenticate", "Bearer"}});
    return false;
  }
  if (req.remote_loopback) return true;
  ReplyError(ex, {403, "permission_error", "admin_loopback_only", "",
                  "admin calls are taken from loopback clients only (no admin token is set)"});
  return false;
}

// A device action the engine refused: a wrong id or state is the caller's
// (400); devices that cannot serve are 503; anything else is ours (500).
ApiError AdminError(const Status& st) {
  switch (st.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kNotFound:
      return BadRequest(st.message(), "device");
    default:
      return ErrorFromStatus(st, false);
  }
}

json StatusJson(const ServiceStatus& st) {
  json devs = json::array();
  for (const DeviceStatus& d : st.devices) {
    devs.push_back({{"device", d.device},
                    {"pid", d.pid},
                    {"alive", d.alive},
                    {"active", d.active},
                    {"kv_used_pages", d.kv_used_pages},
                    {"kv_capacity_pages", d.kv_capacity_pages},
                    {"dp_load_tokens", d.dp_load_tokens},
                    {"speed",
                     {{"measured", d.speed.measured},
                      {"relative_speed", d.speed.relative_speed},
                      {"slow", d.speed.slow},
                      {"share", d.speed.share},
                      {"work_fraction", d.speed.work_fraction},
                      {"gflops_per_s", d.speed.gflops_per_s}}},
                    {"respawn",
                     {{"deaths", d.respawn.deaths},
                      {"respawns", d.respawn.respawns},
                      {"failed_starts", d.respawn.failed_starts},
                      {"pending", d.respawn.pending},
                      {"crash_looping", d.respawn.crash_looping},
                      {"last_error", d.respawn.last_error}}}});
  }
  json recs = json::array();
  for (const RecoveryReport& r : st.recoveries) recs.push_back(json::parse(r.ToJson()));
  return json{{"plan", json::parse(st.plan_json)},
              {"devices", devs},
              {"running", st.running},
              {"waiting", st.waiting},
              {"degraded", st.degraded},
              {"degraded_reason", st.degraded_reason},
              {"recoveries", recs}};
}

}  // namespace

void AddApiRoutes(const ApiContext& ctx, Router* router) {
  router->Add({"GET", "/health", [ctx](const std::shared_ptr<HttpExchange>& ex) {
                 std::string reason;
                 if (ctx.service->Healthy(&reason)) return ReplyJson(ex, 200, {{"status", "ok"}});
                 json body = json::parse(ErrorBody(ServiceUnavailable(reason)));
                 body["status"] = "unavailable";
                 body["reason"] = reason;
                 ReplyJson(ex, 503, body);
               }});

  router->Add({"GET", "/v1/models", [ctx](const std::shared_ptr<HttpExchange>& ex) {
                 json m = {{"id", ctx.options->model_name},
                           {"object", "model"},
                           {"created", 0},
                           {"owned_by", "failsafe"},
                           {"max_model_len", ctx.service->max_model_len()}};
                 ReplyJson(ex, 200, {{"object", "list"}, {"data", json::array({m})}});
               }});

  router->Add({"GET", "/metrics", [ctx](const std::shared_ptr<HttpExchange>& ex) {
                 std::string text = ctx.service->metrics().Render(ctx.options->model_name);
                 ctx.http_metrics->Render(&text);
                 ex->Reply(200, std::move(text), "text/plain; version=0.0.4");
               }});

  router->Add({"POST", "/tokenize",
               [ctx](const std::shared_ptr<HttpExchange>& ex) {
                 ex->Offload([ctx, ex] {
                   json j = json::parse(ex->request().body, nullptr, false);
                   const json* text = nullptr;
                   if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
                     text = &j["prompt"];
                   } else if (j.is_object() && j.contains("text") && j["text"].is_string()) {
                     text = &j["text"];
                   } else {
                     return ReplyError(ex, BadRequest("expected {\"prompt\": \"...\"}", "prompt"));
                   }
                   bool special = true;
                   if (j.contains("add_special_tokens") && !j["add_special_tokens"].is_null()) {
                     if (!j["add_special_tokens"].is_boolean()) {
                       return ReplyError(ex, BadRequest("add_special_tokens must be true or false",
                                                        "add_special_tokens"));
                     }
                     special = j["add_special_tokens"].get<bool>();
                   }
                   auto ids = ctx.tokenizer->Encode(text->get_ref<const std::string&>(), special);
                   ReplyJson(ex, 200,
                             {{"tokens", ids},
                              {"count", ids.size()},
                              {"max_model_len", ctx.service->max_model_len()}});
                 });
               },
               /*json_body=*/true});

  router->Add({"POST", "/detokenize",
               [ctx](const std::shared_ptr<HttpExchange>& ex) {
                 ex->Offload([ctx, ex] {
                   json j = json::parse(ex->request().body, nullptr, false);
                   if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_array()) {
                     return ReplyError(ex, BadRequest("expected {\"tokens\": [...]}", "tokens"));
                   }
                   std::vector<int> ids;
                   for (const json& t : j["tokens"]) {
                     if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
                         t.get<int64_t>() >= ctx.tokenizer->vocab_size()) {
                       return ReplyError(
                           ex,
                           BadRequest("token ids must be integers in the vocabulary", "tokens"));
                     }
                     ids.push_back(t.get<int>());
                   }
                   ReplyJson(ex, 200, {{"prompt", ctx.tokenizer->Decode(ids)}});
                 });
               },
               /*json_body=*/true});

  if (!ctx.options->enable_admin) return;
  router->Add({"GET", "/admin/status", [ctx](const std::shared_ptr<HttpExchange>& ex) {
                 if (!AdminAllowed(*ctx.options, ex)) return;
                 RunAdmin(ctx, ex,
                          [ctx, ex] { ReplyJson(ex, 200, StatusJson(ctx.service->GetStatus())); });
               }});
  auto device_action = [ctx](bool fail) {
    return [ctx, fail](const std::shared_ptr<HttpExchange>& ex) {
      if (!AdminAllowed(*ctx.options, ex)) return;
      const std::string& arg = ex->request().path_params.at(0);
      int device = -1;
      if (arg.size() <= 4 && arg.find_first_not_of("0123456789") == std::string::npos)
        device = std::stoi(arg);
      if (device < 0) {
        return ReplyError(ex, BadRequest("the device id must be a non-negative integer", "device"));
      }
      RunAdmin(ctx, ex, [ctx, ex, fail, device] {
        Status st = fail ? ctx.service->FailDevice(device) : ctx.service->RestoreDevice(device);
        if (!st.ok()) return ReplyError(ex, AdminError(st));
        ReplyJson(ex, 200, {{"device", device}, {"action", fail ? "failed" : "restored"}});
      });
    };
  };
  router->Add({"POST", "/admin/devices/{id}/fail", device_action(true)});
  router->Add({"POST", "/admin/devices/{id}/restore", device_action(false)});
}

}  // namespace failsafe
