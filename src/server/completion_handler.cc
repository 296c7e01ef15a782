// /v1/completions and /v1/chat/completions: a request is parsed and tokenized
// on the work pool, submitted to the engine on its connection's strand, and
// answered from the engine's events as they come (the engine thread only posts
// a wake-up; no thread waits for tokens). The status line goes out with the
// first event, so a request the engine refuses gets its proper status. A client
// that leaves, or a server that stops, cancels the request in the engine
// whatever state it is in: being parsed, queued, prefilling, or streaming.
#include <atomic>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/rng.h"
#include "server/api_routes.h"
#include "server/json_schema_grammar.h"
#include "server/openai_api.h"

namespace failsafe {

using nlohmann::json;

namespace {

std::atomic<uint64_t> g_next_id{1};
std::atomic<uint64_t> g_next_call{1};

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

// A choice's log-probabilities in its endpoint's shape: chat's `content`
// entries, or the completions endpoint's columns. Entries accumulate until
// Take (a stream sends each chunk's own).
class LogprobsOut {
 public:
  LogprobsOut(bool chat, const Tokenizer* tok, const std::vector<int32_t>& context)
      : chat_(chat), texts_(tok, context) {}

  // A position's entry: `lp` null for a prompt's first token.
  void Add(int32_t token, const PositionLogprobs* lp) {
    const std::string text = texts_.Next(token);
    json top = json::array();
    if (lp) {
      for (const TokenLogprob& t : lp->top) {
        const std::string alt = t.token == token ? text : texts_.Peek(t.token);
        top.push_back({alt, t.logprob});
      }
    }
    if (chat_) {
      json alternatives = json::array();
      for (auto& t : top) alternatives.push_back(Entry(t[0], t[1], nullptr));
      content_.push_back(Entry(text, lp ? json(lp->logprob) : json(nullptr), alternatives));
    } else {
      tokens_.push_back(text);
      token_logprobs_.push_back(lp ? json(lp->logprob) : json(nullptr));
      if (lp) {
        // As vLLM: the chosen token is always among them. Tokens of one
        // text share a key, which keeps the likeliest's figure: the top
        // entry stays the position's best (a harness's greedy check).
        json dict = json::object();
        auto put = [&](const std::string& key, float v) {
          if (!dict.contains(key) || dict[key].get<float>() < v) dict[key] = v;
        };
        for (auto& t : top) put(t[0].get<std::string>(), t[1].get<float>());
        put(text, lp->logprob);
        top_logprobs_.push_back(std::move(dict));
      } else {
        top_logprobs_.push_back(nullptr);
      }
      text_offset_.push_back(offset_);
    }
    offset_ += static_cast<int64_t>(text.size());
  }

  bool empty() const { return chat_ ? content_.empty() : tokens_.empty(); }

  json Take() {
    json out;
    if (chat_) {
      out = {{"content", std::move(content_)}, {"refusal", nullptr}};
      content_ = json::array();
    } else {
      out = {{"tokens", std::move(tokens_)},
             {"token_logprobs", std::move(token_logprobs_)},
             {"top_logprobs", std::move(top_logprobs_)},
             {"text_offset", std::move(text_offset_)}};
      tokens_ = token_logprobs_ = top_logprobs_ = text_offset_ = json::array();
    }
    return out;
  }

 private:
  static json Entry(const json& text, const json& logprob, const json& top) {
    const std::string& s = text.get_ref<const std::string&>();
    json e = {{"token", s}, {"logprob", logprob}, {"bytes", std::vector<int>(s.begin(), s.end())}};
    for (auto& b : e["bytes"]) b = static_cast<int>(static_cast<unsigned char>(b.get<int>()));
    if (!top.is_null()) e["top_logprobs"] = top;
    return e;
  }

  const bool chat_;
  TokenTexts texts_;
  int64_t offset_ = 0;
  json content_ = json::array();
  json tokens_ = json::array(), token_logprobs_ = json::array(), top_logprobs_ = json::array(),
       text_offset_ = json::array();
};

// One completion request, from its body to its last byte: one or more
// choices (n, best_of, a list of prompts), each an engine request of its
// own. Strand-only state unless noted.
class CompletionCall : public std::enable_shared_from_this<CompletionCall> {
 public:
  CompletionCall(const ApiContext& ctx, std::shared_ptr<HttpExchange> ex, bool chat)
      : ctx_(ctx), ex_(std::move(ex)), chat_(chat) {}
  ~CompletionCall() {
    for (Choice& c : choices_) {
      if (c.handle) c.handle->SetNotify(nullptr);
    }
  }

  void Start() {
    std::string reason;
    if (!ctx_.service->Healthy(&reason)) return Fail(ServiceUnavailable(reason));
    ex_->OnAbort([self = shared_from_this()](AbortCause cause) { self->OnAbort(cause); });
    ex_->Offload([self = shared_from_this()] { self->Parse(); });
  }

 private:
  struct Choice {
    int prompt = 0;  // index into the request's prompts
    int draw = 0;    // its draw for that prompt (0 .. best_of - 1)
    RequestSpec spec;
    std::shared_ptr<RequestHandle> handle;
    std::unique_ptr<TextStream> text;
    std::unique_ptr<LogprobsOut> logprobs;
    bool started = false;  // its first event came
    int generated = 0;
    double cum_logprob = 0;
    std::string text_all;  // non-streaming: the whole text
    FinishReason finish = FinishReason::kNone;
    std::string finish_name;  // as answered
    int index = 0;            // in the response
    // Tools: output held back while it may be a tool call (streams), and
    // the calls found in it.
    bool holding = false;
    std::string held;
    json tool_calls;
    std::vector<int32_t> token_ids;  // not yet sent (return_token_ids)
  };

  // Work pool: parse, validate, tokenize; then back to the strand.
  void Parse() {
    CompletionLimits limits;
    limits.max_model_len = ctx_.service->max_model_len();
    limits.served_model = ctx_.options->model_name;
    CompletionRequest r;
    if (auto err = ParseCompletionRequest(ex_->request().body, chat_, *ctx_.tokenizer, limits, &r))
      return ex_->Post([self = shared_from_this(), e = *err] { self->Fail(e); });
    // Structured outputs: the schema's grammar, compiled once for every
    // request that names it.
    std::shared_ptr<const CompiledGrammar> grammar;
    if (r.json_object || !r.json_schema.empty()) {
      const std::string key = r.json_object ? std::string("json_object") : r.json_schema;
      auto compiled = ctx_.grammars->Get(key, [&]() -> Result<Grammar> {
        if (r.json_object) return JsonObjectGrammar();
        return JsonSchemaGrammar(nlohmann::ordered_json::parse(r.json_schema));
      });
      if (!compiled.ok()) {
        const ApiError e = BadRequest("response_format: " + compiled.status().message(),
                                      "response_format", "invalid_value");
        return ex_->Post([self = shared_from_this(), e] { self->Fail(e); });
      }
      grammar = *compiled;
    }
    auto choices = std::make_shared<std::vector<Choice>>();
    for (size_t p = 0; p < r.prompts.size(); ++p) {
      for (int k = 0; k < r.best_of; ++k) {
        Choice c;
        c.prompt = static_cast<int>(p);
        c.draw = k;
        c.index = static_cast<int>(p) * r.n + k;
        RequestSpec& spec = c.spec;
        spec.prompt = r.prompts[p];
        spec.resumed_output = r.resume_token_ids;
        // max_tokens 0 (echo): one token is drawn and dropped.
        spec.max_new_tokens = std::max(1, r.max_tokens);
        spec.sampling = r.sampling;
        // Each draw of a prompt is seeded from the request's seed and its index.
        if (k > 0) spec.sampling.seed = HashCombine(r.sampling.seed, static_cast<uint64_t>(k));
        spec.controls = r.controls;
        // Ranking best_of draws needs each token's log-probability.
        spec.logprobs = r.best_of > r.n ? std::max(r.logprobs, 0) : r.logprobs;
        // A prompt's log-probabilities come from its first draw.
        if (r.echo && r.logprobs >= 0 && k == 0) spec.prompt_logprobs = r.logprobs;
        if (!r.ignore_eos) {
          spec.stop_token_ids.assign(ctx_.tokenizer->stop_token_ids().begin(),
                                     ctx_.tokenizer->stop_token_ids().end());
          if (ctx_.service->config().eos_token_id >= 0)
            spec.stop_token_ids.push_back(ctx_.service->config().eos_token_id);
        }
        if (grammar) {
          // A whole JSON text ends the request, ignore_eos or not.
          if (spec.stop_token_ids.empty())
            spec.stop_token_ids.push_back(ctx_.service->config().eos_token_id);
          spec.constraint = std::make_shared<GrammarConstraint>(grammar, spec.stop_token_ids);
        }
        choices->push_back(std::move(c));
      }
    }
    ex_->Post([self = shared_from_this(), r = std::move(r), choices]() mutable {
      self->Submit(std::move(r), std::move(*choices));
    });
  }

  void Submit(CompletionRequest r, std::vector<Choice> choices) {
    if (over_) return;
    req_ = std::move(r);
    choices_ = std::move(choices);
    const int resumed = static_cast<int>(req_.resume_token_ids.size());
    for (Choice& c : choices_) {
      std::vector<int32_t> prompt = req_.prompts[c.prompt];
      c.generated = resumed;
      c.text = std::make_unique<TextStream>(ctx_.tokenizer, req_.stop, req_.skip_special_tokens,
                                            prompt, req_.controls.min_tokens);
      c.holding = chat_ && req_.tool_choice != "none";
      // A resumed request's tokens go through the text stream as the first
      // node's did, unsent: bytes it held back (a character cut between
      // tokens, a possible stop string, a possible tool call) are held here
      // too, and the text goes on exactly where the text already sent ends.
      if (resumed > 0) {
        std::string replayed;
        for (int32_t t : req_.resume_token_ids) replayed += c.text->Add(t);
        if (req_.stream && c.holding) {
          c.held = std::move(replayed);
          if (req_.tool_choice == "auto" && !MayBeToolCall(c.held)) {
            c.holding = false;
            c.held.clear();
          }
        }
      }
      prompt.insert(prompt.end(), req_.resume_token_ids.begin(), req_.resume_token_ids.end());
      if (req_.logprobs >= 0) {
        c.logprobs = std::make_unique<LogprobsOut>(chat_, ctx_.tokenizer,
                                                   req_.echo ? std::vector<int32_t>{} : prompt);
      }
    }
    // With the prefix cache, a prompt's other draws wait for its first draw's
    // first token: its prompt KV is cached by then, and they take it rather
    // than compute it again (and they take its prompt logprobs).
    const bool stagger = ctx_.service->prefix_cache() || (req_.echo && req_.logprobs >= 0);
    for (Choice& c : choices_) {
      if (c.draw == 0 || !stagger) {
        if (!SubmitChoice(c)) return;
      }
    }
    posted_->store(true);
    Pump();  // events that came before the callbacks were in place
  }

  // False when the engine refused it (the request is answered).
  bool SubmitChoice(Choice& c) {
    auto handle = ctx_.service->Submit(c.spec);
    if (!handle.ok()) {
      Fail(ErrorFromStatus(handle.status(), false));
      return false;
    }
    c.handle = *handle;
    // The engine thread only posts a wake-up, at most one at a time.
    c.handle->SetNotify([ex = ex_, posted = posted_, weak = weak_from_this()] {
      if (posted->exchange(true)) return;
      ex->Post([weak] {
        if (auto self = weak.lock()) self->Pump();
      });
    });
    return true;
  }

  void Pump() {
    posted_->store(false);
    std::vector<TokenEvent> events;
    for (size_t i = 0; i < choices_.size() && !over_; ++i) {
      if (!choices_[i].handle || choices_[i].finish != FinishReason::kNone) continue;
      events.clear();
      choices_[i].handle->TakeEvents(&events);
      for (const TokenEvent& e : events) {
        if (over_ || Consume(choices_[i], e)) break;
      }
    }
  }

  // Handles one event of a choice; true when the choice is over.
  bool Consume(Choice& c, const TokenEvent& e) {
    std::string piece;
    if (!c.started) {
      if (e.finished && e.token < 0 && e.reason == FinishReason::kError) {
        const ApiError err = ErrorFromStatus(c.handle->error(), /*refused_at_admission=*/true);
        if (started_ && req_.stream) {
          FailStream(err);
        } else {
          Fail(err);
        }
        return true;
      }
      c.started = true;
      StartResponse();
      if (c.draw == 0) {
        prompt_logprobs_[c.prompt] = e.prompt_logprobs;
        // Its prompt is computed (and cached): the prompt's other draws start.
        for (Choice& o : choices_) {
          if (o.prompt == c.prompt && !o.handle && !SubmitChoice(o)) return true;
        }
      }
      if (chat_ && req_.stream) ex_->Write(Chunk(c, json{{"role", "assistant"}, {"content", ""}}));
      if (req_.echo) piece = Echo(c);
    }
    FinishReason finish = FinishReason::kNone;
    // max_tokens 0 (echo): the one token drawn is not part of the answer.
    if (e.token >= 0 && req_.max_tokens > 0) {
      ++c.generated;
      c.token_ids.push_back(e.token);
      piece += c.text->Add(e.token);
      if (e.logprobs) c.cum_logprob += e.logprobs->logprob;
      if (c.logprobs && e.logprobs) c.logprobs->Add(e.token, &*e.logprobs);
      if (c.text->stopped() && !e.finished) {
        ctx_.service->Cancel(c.handle, FinishReason::kStop);
        finish = FinishReason::kStop;
      }
    }
    if (e.finished && finish == FinishReason::kNone) {
      piece += c.text->Finish();
      finish = c.text->stopped() ? FinishReason::kStop : e.reason;
    }
    if (finish == FinishReason::kError) {
      const ApiError err = ErrorFromStatus(c.handle->error(), false);
      if (req_.stream) {
        FailStream(err);
      } else {
        Fail(err);
      }
      return true;
    }
    // A text that may be a tool call is held back until it is known.
    if (req_.stream && c.holding) {
      c.held += piece;
      piece.clear();
      if (req_.tool_choice == "auto" && !MayBeToolCall(c.held)) {
        c.holding = false;
        piece = std::move(c.held);
        c.held.clear();
      }
    }
    if (req_.stream && (!piece.empty() || (c.logprobs && !c.logprobs->empty()) ||
                        (req_.return_token_ids && !c.token_ids.empty()))) {
      if (chat_) {
        ex_->Write(Chunk(c, json{{"content", piece}}));
      } else {
        ex_->Write(Chunk(c, piece));
      }
    }
    if (!req_.stream) c.text_all += piece;
    if (finish == FinishReason::kNone) return false;
    c.finish = finish;
    c.finish_name = FinishName(finish);
    c.handle->SetNotify(nullptr);
    if (chat_ && req_.tool_choice != "none") TakeToolCalls(c);
    if (req_.stream) {
      if (!c.tool_calls.is_null()) {
        json delta = {{"tool_calls", c.tool_calls}};
        if (!c.held.empty()) delta["content"] = c.held;
        ex_->Write(Chunk(c, delta));
      } else if (!c.held.empty()) {
        ex_->Write(Chunk(c, json{{"content", c.held}}));
      }
      ex_->Write(Chunk(c, chat_ ? json::object() : json(""), c.finish_name));
    }
    for (const Choice& o : choices_) {
      if (o.finish == FinishReason::kNone) return true;
    }
    Finish();
    return true;
  }

  // Tool calls out of a finished choice's text (a forced call's text is its
  // arguments, or {"name", "arguments"} objects); what is left is content.
  void TakeToolCalls(Choice& c) {
    std::string& text = req_.stream ? c.held : c.text_all;
    std::vector<ToolCall> calls;
    std::string content;
    if (req_.tool_choice == "named") {
      calls.push_back({req_.tool_name, text});
    } else if (auto parsed = ParseToolCalls(text, &content)) {
      calls = std::move(*parsed);
    } else {
      return;  // plain content (or a forced call cut short: its text as it is)
    }
    c.tool_calls = json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      c.tool_calls.push_back(
          {{"index", i},
           {"id", "call_" + std::to_string(g_next_call++)},
           {"type", "function"},
           {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
    }
    text = content;
    // As OpenAI: a named function's call ends as stop, others as tool_calls.
    if (req_.tool_choice != "named" && c.finish == FinishReason::kStop)
      c.finish_name = "tool_calls";
  }

  // The prompt before the output (echo), with its log-probabilities.
  std::string Echo(Choice& c) {
    const std::vector<int32_t>& prompt = req_.prompts[c.prompt];
    if (c.logprobs) {
      const std::vector<PositionLogprobs>& lps = prompt_logprobs_[c.prompt];
      for (size_t i = 0; i < prompt.size(); ++i) {
        // The first token has none; the others come from the prompt's first draw.
        const PositionLogprobs* lp = i > 0 && i - 1 < lps.size() ? &lps[i - 1] : nullptr;
        c.logprobs->Add(prompt[i], lp);
      }
    }
    if (!req_.prompt_texts[c.prompt].empty()) return req_.prompt_texts[c.prompt];
    return ctx_.tokenizer->Decode(prompt, req_.skip_special_tokens);
  }

  void StartResponse() {
    if (started_) return;
    started_ = true;
    id_ = (chat_ ? "chatcmpl-" : "cmpl-") + std::to_string(g_next_id++);
    created_ = static_cast<int64_t>(std::time(nullptr));
    if (req_.stream) ex_->StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
  }

  void Finish() {
    over_ = true;
    int prompt_tokens = 0, completion_tokens = 0;
    for (const auto& p : req_.prompts) prompt_tokens += static_cast<int>(p.size());
    for (const Choice& c : choices_) completion_tokens += c.generated;
    const json usage = {{"prompt_tokens", prompt_tokens},
                        {"completion_tokens", completion_tokens},
                        {"total_tokens", prompt_tokens + completion_tokens}};
    if (req_.stream) {
      if (req_.include_usage) {
        json c = Envelope();
        c["choices"] = json::array();
        c["usage"] = usage;
        ex_->Write(SseFrame(Dump(c)));
      }
      ex_->Write(SseFrame("[DONE]"));
      return ex_->EndStream();
    }
    // best_of: each prompt's n draws of the highest total log-probability
    // (equal ones in draw order).
    std::vector<const Choice*> kept;
    for (size_t p = 0; p < req_.prompts.size(); ++p) {
      std::vector<const Choice*> draws;
      for (const Choice& c : choices_) {
        if (c.prompt == static_cast<int>(p)) draws.push_back(&c);
      }
      if (req_.best_of > req_.n) {
        std::stable_sort(draws.begin(), draws.end(), [](const Choice* a, const Choice* b) {
          return a->cum_logprob > b->cum_logprob;
        });
      }
      draws.resize(req_.n);
      kept.insert(kept.end(), draws.begin(), draws.end());
    }
    json list = json::array();
    for (size_t i = 0; i < kept.size(); ++i) {
      const Choice& c = *kept[i];
      json choice = {{"index", i},
                     {"logprobs", c.logprobs ? c.logprobs->Take() : json(nullptr)},
                     {"finish_reason", c.finish_name}};
      if (req_.return_token_ids) choice["token_ids"] = c.token_ids;
      if (chat_) {
        choice["message"] = {{"role", "assistant"}, {"content", c.text_all}};
        if (!c.tool_calls.is_null()) {
          // Non-streamed tool calls carry no index.
          json calls = c.tool_calls;
          for (json& call : calls) call.erase("index");
          choice["message"]["tool_calls"] = std::move(calls);
          if (c.text_all.empty()) choice["message"]["content"] = nullptr;
        }
      } else {
        choice["text"] = c.text_all;
      }
      list.push_back(std::move(choice));
    }
    json body = Envelope();
    body["object"] = chat_ ? "chat.completion" : "text_completion";
    body["choices"] = std::move(list);
    body["usage"] = usage;
    ex_->Reply(200, Dump(body));
  }

  // Headers are out: the error is an event of its own, and every choice ends.
  void FailStream(const ApiError& err) {
    CancelAll();
    ex_->Write(SseFrame(ErrorBody(err)));
    ex_->Write(SseFrame("[DONE]"));
    ex_->EndStream();
  }

  void CancelAll() {
    over_ = true;
    for (Choice& c : choices_) {
      if (!c.handle) continue;
      c.handle->SetNotify(nullptr);
      if (c.finish == FinishReason::kNone) ctx_.service->Cancel(c.handle);
    }
  }

  // The client left or the server stops: the engine drops the requests (and
  // their KV) at its next step, whether they are queued or running.
  void OnAbort(AbortCause cause) {
    if (over_) return;
    CancelAll();
    if (cause != AbortCause::kServerStopping) return;
    const ApiError err{503, "service_unavailable_error", "server_shutting_down", "",
                       "the server is shutting down"};
    if (!started_ || !req_.stream) return ex_->Reply(err.status, ErrorBody(err));
    ex_->Write(SseFrame(ErrorBody(err)));
    ex_->Write(SseFrame("[DONE]"));
    ex_->EndStream();
  }

  void Fail(const ApiError& e) {
    CancelAll();
    ex_->Reply(e.status, ErrorBody(e));
  }

  json Envelope() const {
    return {{"id", id_},
            {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", ctx_.options->model_name}};
  }

  // A stream chunk of one choice, with the log-probabilities of its tokens
  // since the last.
  std::string Chunk(Choice& c, const json& delta_or_text, const json& finish = nullptr) {
    json choice = {{"index", c.index},
                   {"logprobs", c.logprobs ? c.logprobs->Take() : json(nullptr)},
                   {"finish_reason", finish}};
    choice[chat_ ? "delta" : "text"] = delta_or_text;
    if (req_.return_token_ids) choice["token_ids"] = std::exchange(c.token_ids, {});
    json chunk = Envelope();
    chunk["choices"] = json::array({choice});
    return SseFrame(Dump(chunk));
  }

  const ApiContext ctx_;
  const std::shared_ptr<HttpExchange> ex_;
  const bool chat_;
  // Set by the engine's callbacks when a wake-up is on its way (any thread).
  const std::shared_ptr<std::atomic<bool>> posted_ = std::make_shared<std::atomic<bool>>(false);
  CompletionRequest req_;
  std::vector<Choice> choices_;
  // Per prompt: its log-probabilities, from its first draw (echo).
  std::map<int, std::vector<PositionLogprobs>> prompt_logprobs_;
  bool over_ = false;     // answered, failed or aborted
  bool started_ = false;  // the first event came
  std::string id_;
  int64_t created_ = 0;
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
