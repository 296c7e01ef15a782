// /v1/completions and /v1/chat/completions: a request is parsed and tokenized
// on the work pool, submitted to the engine on its connection's strand, and
// answered from the engine's events as they come (the engine thread only posts
// a wake-up; no thread waits for tokens). The status line goes out with the
// first event, so a request the engine refuses gets its proper status. A client
// that leaves, or a server that stops, cancels the request in the engine
// whatever state it is in: being parsed, queued, prefilling, or streaming.
#include <atomic>
#include <ctime>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "server/api_routes.h"
#include "server/openai_api.h"

namespace failsafe {

using nlohmann::json;

namespace {

std::atomic<uint64_t> g_next_id{1};

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

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string SseFrame(const std::string& data) { return "data: " + data + "\n\n"; }

// One completion request, from its body to its last byte. Strand-only state
// unless noted.
class CompletionCall : public std::enable_shared_from_this<CompletionCall> {
 public:
  CompletionCall(const ApiContext& ctx, std::shared_ptr<HttpExchange> ex, bool chat)
      : ctx_(ctx), ex_(std::move(ex)), chat_(chat) {}
  ~CompletionCall() {
    if (handle_) handle_->SetNotify(nullptr);
  }

  void Start() {
    std::string reason;
    if (!ctx_.service->Healthy(&reason)) return Fail(ServiceUnavailable(reason));
    ex_->OnAbort([self = shared_from_this()](AbortCause cause) { self->OnAbort(cause); });
    ex_->Offload([self = shared_from_this()] { self->Parse(); });
  }

 private:
  // Work pool: parse, validate, tokenize; then back to the strand.
  void Parse() {
    CompletionLimits limits;
    limits.max_model_len = ctx_.service->max_model_len();
    limits.served_model = ctx_.options->model_name;
    CompletionRequest r;
    if (auto err = ParseCompletionRequest(ex_->request().body, chat_, *ctx_.tokenizer, limits, &r))
      return ex_->Post([self = shared_from_this(), e = *err] { self->Fail(e); });
    RequestSpec spec;
    spec.prompt = r.prompt;
    spec.max_new_tokens = r.max_tokens;
    spec.sampling = r.sampling;
    if (!r.ignore_eos) {
      for (const char* t : {"<|eot_id|>", "<|end_of_text|>"}) {
        if (ctx_.tokenizer->TokenId(t) >= 0)
          spec.stop_token_ids.push_back(ctx_.tokenizer->TokenId(t));
      }
      if (ctx_.service->config().eos_token_id >= 0)
        spec.stop_token_ids.push_back(ctx_.service->config().eos_token_id);
    }
    ex_->Post([self = shared_from_this(), r = std::move(r), spec = std::move(spec)]() mutable {
      self->Submit(std::move(r), std::move(spec));
    });
  }

  void Submit(CompletionRequest r, RequestSpec spec) {
    if (over_) return;
    req_ = std::move(r);
    text_ = std::make_unique<TextStream>(ctx_.tokenizer, req_.stop);
    auto handle = ctx_.service->Submit(std::move(spec));
    if (!handle.ok()) return Fail(ErrorFromStatus(handle.status(), false));
    handle_ = *handle;
    // The engine thread only posts a wake-up, at most one at a time.
    handle_->SetNotify([ex = ex_, posted = posted_, weak = weak_from_this()] {
      if (posted->exchange(true)) return;
      ex->Post([weak] {
        if (auto self = weak.lock()) self->Pump();
      });
    });
    posted_->store(true);
    Pump();  // events that came before the callback was in place
  }

  void Pump() {
    posted_->store(false);
    if (over_ || !handle_) return;
    std::vector<TokenEvent> events;
    handle_->TakeEvents(&events);
    for (const TokenEvent& e : events) {
      if (Consume(e)) return;
    }
  }

  // Handles one event; true when the request is over.
  bool Consume(const TokenEvent& e) {
    if (!started_) {
      if (e.finished && e.token < 0 && e.reason == FinishReason::kError) {
        Fail(ErrorFromStatus(handle_->error(), /*refused_at_admission=*/true));
        return true;
      }
      started_ = true;
      id_ = (chat_ ? "chatcmpl-" : "cmpl-") + std::to_string(g_next_id++);
      created_ = static_cast<int64_t>(std::time(nullptr));
      if (req_.stream) {
        ex_->StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
        if (chat_) ex_->Write(Chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr));
      }
    }
    std::string piece;
    FinishReason finish = FinishReason::kNone;
    if (e.token >= 0) {
      ++generated_;
      piece = text_->Add(e.token);
      if (text_->stopped() && !e.finished) {
        ctx_.service->Cancel(handle_, FinishReason::kStop);
        finish = FinishReason::kStop;
      }
    }
    if (e.finished) {
      piece += text_->Finish();
      finish = text_->stopped() ? FinishReason::kStop : e.reason;
    }
    if (req_.stream && !piece.empty())
      ex_->Write(chat_ ? Chunk(json{{"content", piece}}, nullptr) : Chunk(piece, nullptr));
    if (!req_.stream) text_all_ += piece;
    if (finish == FinishReason::kNone) return false;
    Finish(finish);
    return true;
  }

  void Finish(FinishReason finish) {
    over_ = true;
    handle_->SetNotify(nullptr);
    const json usage = {{"prompt_tokens", req_.prompt.size()},
                        {"completion_tokens", generated_},
                        {"total_tokens", static_cast<int>(req_.prompt.size()) + generated_}};
    if (finish == FinishReason::kError) {
      const ApiError err = ErrorFromStatus(handle_->error(), false);
      if (!req_.stream) return Fail(err);
      // Headers are out: the error is an event of its own.
      ex_->Write(SseFrame(ErrorBody(err)));
      ex_->Write(SseFrame("[DONE]"));
      return ex_->EndStream();
    }
    if (req_.stream) {
      ex_->Write(Chunk(chat_ ? json::object() : json(""), FinishName(finish)));
      if (req_.include_usage) {
        json c = Envelope();
        c["choices"] = json::array();
        c["usage"] = usage;
        ex_->Write(SseFrame(Dump(c)));
      }
      ex_->Write(SseFrame("[DONE]"));
      return ex_->EndStream();
    }
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", FinishName(finish)}};
    if (chat_) {
      choice["message"] = {{"role", "assistant"}, {"content", text_all_}};
    } else {
      choice["text"] = text_all_;
    }
    json body = Envelope();
    body["object"] = chat_ ? "chat.completion" : "text_completion";
    body["choices"] = json::array({choice});
    body["usage"] = usage;
    ex_->Reply(200, Dump(body));
  }

  // The client left or the server stops: the engine drops the request (and
  // its KV) at its next step, whether it is queued or running.
  void OnAbort(AbortCause cause) {
    if (over_) return;
    over_ = true;
    if (handle_) {
      handle_->SetNotify(nullptr);
      ctx_.service->Cancel(handle_);
    }
    if (cause != AbortCause::kServerStopping) return;
    const ApiError err{503, "service_unavailable_error", "server_shutting_down", "",
                       "the server is shutting down"};
    if (!started_ || !req_.stream) return ex_->Reply(err.status, ErrorBody(err));
    ex_->Write(SseFrame(ErrorBody(err)));
    ex_->Write(SseFrame("[DONE]"));
    ex_->EndStream();
  }

  void Fail(const ApiError& e) {
    over_ = true;
    ex_->Reply(e.status, ErrorBody(e));
  }

  json Envelope() const {
    return {{"id", id_},
            {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", ctx_.options->model_name}};
  }

  std::string Chunk(const json& delta_or_text, const json& finish) const {
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}};
    choice[chat_ ? "delta" : "text"] = delta_or_text;
    json c = Envelope();
    c["choices"] = json::array({choice});
    return SseFrame(Dump(c));
  }

  const ApiContext ctx_;
  const std::shared_ptr<HttpExchange> ex_;
  const bool chat_;
  // Set by the engine's callback when a wake-up is on its way (any thread).
  const std::shared_ptr<std::atomic<bool>> posted_ = std::make_shared<std::atomic<bool>>(false);
  CompletionRequest req_;
  std::unique_ptr<TextStream> text_;
  std::shared_ptr<RequestHandle> handle_;
  bool over_ = false;     // answered, failed or aborted
  bool started_ = false;  // the first event came
  std::string id_;
  int64_t created_ = 0;
  int generated_ = 0;
  std::string text_all_;  // non-streaming: the whole text
};

}  // namespace

void AddCompletionRoutes(const ApiContext& ctx, Router* router) {
  for (bool chat : {false, true}) {
    router->Add({"POST", chat ? "/v1/chat/completions" : "/v1/completions",
                 [ctx, chat](const std::shared_ptr<HttpExchange>& ex) {
                   std::make_shared<CompletionCall>(ctx, ex, chat)->Start();
                 },
                 /*json_body=*/true});
  }
}

}  // namespace failsafe
