#include "server/http_server.h"

#include <httplib.h>

#include <atomic>
#include <ctime>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "server/openai_api.h"

namespace failsafe {

using nlohmann::json;

namespace {

std::atomic<uint64_t> g_next_id{1};

void Reply(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json");
}

const char* FinishName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAborted:
      return "abort";
    default:
      return "error";
  }
}

// Writes an SSE event; false if the client is gone.
bool Sse(httplib::DataSink& sink, const std::string& data) {
  std::string frame = "data: " + data + "\n\n";
  return sink.write(frame.data(), frame.size());
}

}  // namespace

HttpServer::HttpServer(EngineService* service, const Tokenizer* tokenizer,
                       const ServerOptions& options)
    : service_(service),
      tokenizer_(tokenizer),
      options_(options),
      server_(std::make_unique<httplib::Server>()) {
  const int threads = options.http_threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  Routes();
}

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Start() {
  if (options_.port == 0) {
    port_ = server_->bind_to_any_port(options_.host);
    if (port_ <= 0) return Unavailable("cannot bind to {}", options_.host);
  } else {
    if (!server_->bind_to_port(options_.host, options_.port)) {
      return Unavailable("cannot bind to {}:{} (in use?)", options_.host, options_.port);
    }
    port_ = options_.port;
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return Status::Ok();
}

void HttpServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpServer::Wait() {
  if (thread_.joinable()) thread_.join();
}

void HttpServer::Routes() {
  httplib::Server& s = *server_;
  // Errors without a body (unknown route, malformed HTTP) get an OpenAI-style one.
  s.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    const char* type = res.status == 404 ? "not_found_error" : "invalid_request_error";
    const std::string message = res.status == 404 ? "no such endpoint"
                                : res.status == 400
                                    ? "malformed HTTP request (a body needs a Content-Length)"
                                    : "HTTP error " + std::to_string(res.status);
    res.set_content(ErrorBody(message, type, "", res.status), "application/json");
  });
  const std::string model_name = options_.model_name;

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    std::string reason;
    if (service_->Healthy(&reason)) {
      Reply(res, 200, json{{"status", "ok"}}.dump());
    } else {
      Reply(res, 503, json{{"status", "unavailable"}, {"reason", reason}}.dump());
    }
  });

  s.Get("/v1/models", [this, model_name](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", model_name},
              {"object", "model"},
              {"created", 0},
              {"owned_by", "failsafe"},
              {"max_model_len", service_->max_model_len()}};
    Reply(res, 200, json{{"object", "list"}, {"data", json::array({m})}}.dump());
  });

  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(service_->metrics().Render(), "text/plain; version=0.0.4");
  });

  s.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    json j = json::parse(req.body, nullptr, false);
    std::string text;
    if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
      text = j["prompt"];
    } else if (j.is_object() && j.contains("text") && j["text"].is_string()) {
      text = j["text"];
    } else {
      return Reply(res, 400,
                   ErrorBody("expected {\"prompt\": \"...\"}", "invalid_request_error", "prompt"));
    }
    const bool special = j.value("add_special_tokens", true);
    auto ids = tokenizer_->Encode(text, special);
    Reply(res, 200,
          json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", service_->max_model_len()}}
              .dump());
  });

  s.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    json j = json::parse(req.body, nullptr, false);
    if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_array()) {
      return Reply(res, 400,
                   ErrorBody("expected {\"tokens\": [...]}", "invalid_request_error", "tokens"));
    }
    std::vector<int> ids;
    for (const json& t : j["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() >= tokenizer_->vocab_size()) {
        return Reply(res, 400,
                     ErrorBody("token ids must be integers in the vocabulary",
                               "invalid_request_error", "tokens"));
      }
      ids.push_back(t);
    }
    Reply(res, 200,
          json{{"prompt", tokenizer_->Decode(ids)}}.dump(-1, ' ', false,
                                                         json::error_handler_t::replace));
  });

  auto completion = [this, model_name](bool chat) {
    return [this, model_name, chat](const httplib::Request& req, httplib::Response& res) {
      CompletionRequest r;
      RequestError err;
      if (!ParseCompletionRequest(req.body, chat, *tokenizer_, service_->max_model_len(), &r,
                                  &err)) {
        return Reply(res, 400, ErrorBody(err.message, "invalid_request_error", err.param));
      }
      std::string reason;
      RequestSpec spec;
      spec.prompt = r.prompt;
      spec.max_new_tokens = r.max_tokens;
      spec.sampling = r.sampling;
      if (!r.ignore_eos) {
        spec.stop_token_ids.assign(tokenizer_->stop_token_ids().begin(),
                                   tokenizer_->stop_token_ids().end());
        if (service_->config().eos_token_id >= 0)
          spec.stop_token_ids.push_back(service_->config().eos_token_id);
      }
      auto handle = service_->Submit(std::move(spec));
      if (!handle.ok()) {
        return Reply(res, 429,
                     ErrorBody(handle.status().message(), "rate_limit_exceeded", "", 429));
      }
      std::shared_ptr<RequestHandle> h = *handle;
      // Wait for the first event so that a refused request gets a proper status.
      TokenEvent first;
      while (!h->Next(&first, 1000)) {
        if (!service_->Healthy(&reason)) continue;  // requests wait for devices to come back
      }
      if (first.finished && first.token < 0 && first.reason == FinishReason::kError) {
        return Reply(res, 400,
                     ErrorBody(h->error().empty() ? "the request could not be served" : h->error(),
                               "invalid_request_error"));
      }
      const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(g_next_id++);
      const int64_t created = static_cast<int64_t>(std::time(nullptr));
      auto text = std::make_shared<TextStream>(tokenizer_, r.stop, r.skip_special_tokens, r.prompt);
      auto service = service_;
      // Consumes one event: appends its text; true when the request is over.
      auto consume = [h, text, service](const TokenEvent& e, std::string* piece, int* generated,
                                        FinishReason* finish) {
        if (e.token >= 0) {
          ++*generated;
          *piece += text->Add(e.token);
          if (text->stopped() && !e.finished) {
            service->Cancel(h, FinishReason::kStop);
            *finish = FinishReason::kStop;
            return true;
          }
        }
        if (e.finished) {
          *piece += text->Finish();
          *finish = text->stopped() ? FinishReason::kStop : e.reason;
          return true;
        }
        return false;
      };
      const int prompt_tokens = static_cast<int>(r.prompt.size());
      json usage_base = {{"prompt_tokens", prompt_tokens}};
      if (!r.stream) {
        // Whole response at the end; spaces keep the connection checked (a
        // failed write means the client left: the request is cancelled).
        res.set_chunked_content_provider(
            "application/json", [=](size_t, httplib::DataSink& sink) mutable {
              std::string all;
              int generated = 0;
              FinishReason finish = FinishReason::kNone;
              bool over = consume(first, &all, &generated, &finish);
              TokenEvent e;
              while (!over) {
                if (!h->Next(&e, 1000)) {
                  if (!sink.write(" ", 1)) {
                    service->Cancel(h);
                    return false;
                  }
                  continue;
                }
                over = consume(e, &all, &generated, &finish);
              }
              json usage = {{"prompt_tokens", prompt_tokens},
                            {"completion_tokens", generated},
                            {"total_tokens", prompt_tokens + generated}};
              json choice = {
                  {"index", 0}, {"logprobs", nullptr}, {"finish_reason", FinishName(finish)}};
              if (chat) {
                choice["message"] = {{"role", "assistant"}, {"content", all}};
              } else {
                choice["text"] = all;
              }
              json body = {{"id", id},
                           {"object", chat ? "chat.completion" : "text_completion"},
                           {"created", created},
                           {"model", model_name},
                           {"choices", json::array({choice})},
                           {"usage", usage}};
              std::string out = body.dump(-1, ' ', false, json::error_handler_t::replace);
              sink.write(out.data(), out.size());
              sink.done();
              return true;
            });
        return;
      }
      const bool include_usage = r.include_usage;
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider("text/event-stream", [=](size_t,
                                                                httplib::DataSink& sink) mutable {
        auto chunk = [&](const json& delta_or_text, const json& finish) {
          json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}};
          if (chat) {
            choice["delta"] = delta_or_text;
          } else {
            choice["text"] = delta_or_text;
          }
          json c = {{"id", id},
                    {"object", chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", created},
                    {"model", model_name},
                    {"choices", json::array({choice})}};
          return Sse(sink, c.dump(-1, ' ', false, json::error_handler_t::replace));
        };
        if (chat && !chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr)) {
          service->Cancel(h);
          return false;
        }
        int generated = 0;
        FinishReason finish = FinishReason::kNone;
        TokenEvent e = first;
        bool have = true;
        while (true) {
          if (!have) {
            if (!h->Next(&e, 1000)) {
              // Comments keep the connection checked.
              if (!sink.write(": keep-alive\n\n", 14)) {
                service->Cancel(h);
                return false;
              }
              continue;
            }
          }
          have = false;
          std::string piece;
          const bool over = consume(e, &piece, &generated, &finish);
          if (!piece.empty()) {
            const bool ok = chat ? chunk(json{{"content", piece}}, nullptr) : chunk(piece, nullptr);
            if (!ok) {
              service->Cancel(h);
              return false;
            }
          }
          if (over) break;
        }
        if (!chunk(chat ? json::object() : json(""), FinishName(finish))) return false;
        if (include_usage) {
          json c = {{"id", id},
                    {"object", chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", created},
                    {"model", model_name},
                    {"choices", json::array()},
                    {"usage",
                     {{"prompt_tokens", prompt_tokens},
                      {"completion_tokens", generated},
                      {"total_tokens", prompt_tokens + generated}}}};
          if (!Sse(sink, c.dump())) return false;
        }
        Sse(sink, "[DONE]");
        sink.done();
        return true;
      });
    };
  };
  s.Post("/v1/completions", completion(false));
  s.Post("/v1/chat/completions", completion(true));

  if (!options_.enable_admin) return;
  auto allowed = [this](const httplib::Request& req, httplib::Response& res) {
    if (!options_.admin_token.empty()) {
      if (req.get_header_value("Authorization") == "Bearer " + options_.admin_token) return true;
    } else if (req.remote_addr == "127.0.0.1" || req.remote_addr == "::1") {
      return true;
    }
    Reply(res, 403,
          ErrorBody("admin calls need a loopback client or the admin token", "permission_error", "",
                    403));
    return false;
  };
  s.Get("/admin/status", [this, allowed](const httplib::Request& req, httplib::Response& res) {
    if (!allowed(req, res)) return;
    ServiceStatus st = service_->GetStatus();
    json devs = json::array();
    for (const DeviceStatus& d : st.devices) {
      devs.push_back({{"device", d.device},
                      {"alive", d.alive},
                      {"active", d.active},
                      {"kv_used_pages", d.kv_used_pages},
                      {"kv_capacity_pages", d.kv_capacity_pages},
                      {"dp_load_tokens", d.dp_load_tokens}});
    }
    json recs = json::array();
    for (const RecoveryReport& r : st.recoveries) {
      recs.push_back({{"mode", RecoveryModeName(r.mode)},
                      {"failed_devices", r.failed_devices},
                      {"joined_devices", r.joined_devices},
                      {"total_ms", r.total_ms()}});
    }
    Reply(res, 200,
          json{{"plan", json::parse(st.plan_json)},
               {"devices", devs},
               {"running", st.running},
               {"waiting", st.waiting},
               {"degraded", st.degraded},
               {"degraded_reason", st.degraded_reason},
               {"recoveries", recs}}
              .dump());
  });
  auto device_action = [this, allowed](bool fail) {
    return [this, allowed, fail](const httplib::Request& req, httplib::Response& res) {
      if (!allowed(req, res)) return;
      int device = -1;
      try {
        device = std::stoi(req.matches[1]);
      } catch (...) {
        return Reply(res, 400, ErrorBody("bad device id", "invalid_request_error", "device"));
      }
      Status st = fail ? service_->FailDevice(device) : service_->RestoreDevice(device);
      if (!st.ok())
        return Reply(res, 400, ErrorBody(st.message(), "invalid_request_error", "device"));
      Reply(res, 200, json{{"device", device}, {"action", fail ? "failed" : "restored"}}.dump());
    };
  };
  s.Post(R"(/admin/devices/(\d+)/fail)", device_action(true));
  s.Post(R"(/admin/devices/(\d+)/restore)", device_action(false));
}

}  // namespace failsafe
