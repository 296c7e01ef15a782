#include "server/openai_api.h"

#include <algorithm>
#include <atomic>
#include <set>

#include "model/chat_template.h"

namespace failsafe {

using nlohmann::json;

namespace {

// Parameters accepted: (name, allowed in chat, allowed in completions).
struct Param {
  const char* name;
  bool chat, completion;
};
const Param kParams[] = {
    {"model", true, true},
    {"prompt", false, true},
    {"messages", true, false},
    {"max_tokens", true, true},
    {"max_completion_tokens", true, false},
    {"temperature", true, true},
    {"top_p", true, true},
    {"top_k", true, true},
    {"seed", true, true},
    {"stop", true, true},
    {"n", true, true},
    {"stream", true, true},
    {"stream_options", true, true},
    {"ignore_eos", true, true},
    {"skip_special_tokens", true, true},
    {"user", true, true},
    {"logprobs", true, true},
    {"top_logprobs", true, false},
    {"echo", false, true},
    {"presence_penalty", true, true},
    {"frequency_penalty", true, true},
    {"logit_bias", true, true},
    {"best_of", false, true},
    {"suffix", false, true},
};

std::optional<ApiError> Fail(const std::string& param, const std::string& message,
                             const std::string& code = "invalid_value") {
  return BadRequest(message, param, code);
}

// A prompt of `tokens` that leaves no room for output. Prompts encoded with a
// limit stop just past it: more than the context is all that is known.
std::optional<ApiError> ContextExceeded(bool chat, size_t tokens, int max_model_len) {
  const std::string count = tokens > static_cast<size_t>(max_model_len)
                                ? "more than " + std::to_string(max_model_len)
                                : std::to_string(tokens);
  return BadRequest(
      "the prompt has " + count + " tokens; the context length is " + std::to_string(max_model_len),
      chat ? "messages" : "prompt", "context_length_exceeded");
}

// The body's JSON, or why it is not JSON (nlohmann's reason and byte
// position, e.g. a lone UTF-16 surrogate in a \u escape).
std::optional<ApiError> ParseBody(const std::string& body, json* out) {
  try {
    *out = json::parse(body);
    return std::nullopt;
  } catch (const json::parse_error& e) {
    std::string why = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..."
    if (size_t at = why.find("] "); at != std::string::npos) why = why.substr(at + 2);
    return Fail("", "the request body is not valid JSON: " + why);
  }
}

// A message's content as the chat template sees it: a string, or the text
// parts of an OpenAI content array joined by newlines (what vLLM does for
// templates that expect strings). Other part types are refused.
std::optional<ApiError> MessageText(const nlohmann::ordered_json& content, std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array() || content.empty()) {
    return Fail("messages", "each message needs a string content or a list of text parts");
  }
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const nlohmann::ordered_json& part = content[i];
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return Fail("messages", "each content part needs a type");
    }
    if (part["type"] != "text") {
      return Fail("messages", "content parts of type '" + part["type"].get<std::string>() +
                                  "' are not supported (only text)");
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return Fail("messages", "a text content part needs a string text");
    }
    if (i > 0) text += "\n";
    text += part["text"].get<std::string>();
  }
  *out = std::move(text);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseCompletionRequest(const std::string& body, bool chat,
                                               const Tokenizer& tok, const CompletionLimits& limits,
                                               CompletionRequest* out) {
  const int max_model_len = limits.max_model_len;
  json j;
  if (auto err = ParseBody(body, &j)) return err;
  if (!j.is_object()) return Fail("", "the request body must be a JSON object");
  for (auto& [key, value] : j.items()) {
    bool known = false;
    for (const Param& p : kParams) {
      if (key == p.name && (chat ? p.chat : p.completion)) known = true;
    }
    if (!known)
      return Fail(key, "Unrecognized request argument supplied: " + key, "unknown_parameter");
  }
  // Accepted only at their defaults.
  auto at_default = [&](const char* name, const json& ok) {
    return !j.contains(name) || j[name].is_null() || j[name] == ok;
  };
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    if (!at_default(name, 0) && !at_default(name, 0.0))
      return Fail(name, std::string(name) + " is not supported");
  }
  if (!at_default("logprobs", false)) return Fail("logprobs", "logprobs are not supported");
  if (!at_default("echo", false)) return Fail("echo", "echo is not supported");
  if (!at_default("best_of", 1)) return Fail("best_of", "best_of must be 1");
  if (!at_default("logit_bias", json::object()))
    return Fail("logit_bias", "logit_bias is not supported");
  if (!at_default("suffix", "")) return Fail("suffix", "suffix is not supported");
  if (!at_default("top_logprobs", 0)) return Fail("top_logprobs", "top_logprobs are not supported");
  if (j.contains("user") && !j["user"].is_null() && !j["user"].is_string())
    return Fail("user", "user must be a string");

  CompletionRequest r;
  r.chat = chat;
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) return Fail("model", "model must be a string");
    r.model = j["model"];
    if (!limits.served_model.empty() && r.model != limits.served_model) {
      return ApiError{404, "invalid_request_error", "model_not_found", "model",
                      "The model '" + r.model + "' does not exist; this server serves '" +
                          limits.served_model + "'"};
    }
  }
  // The prompt.
  if (chat) {
    if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
      return Fail("messages", "messages must be a non-empty list");
    }
    static const std::set<std::string> kRoles = {"system", "user", "assistant", "developer",
                                                 "tool"};
    // The model's chat template sees the messages with their keys in order
    // and every content as a string; a prompt past the context stops there.
    nlohmann::ordered_json messages =
        nlohmann::ordered_json::parse(body, nullptr, false)["messages"];
    for (auto& m : messages) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
          !kRoles.count(m["role"].get<std::string>())) {
        return Fail("messages",
                    "each message needs a role: system, user, assistant, developer or tool");
      }
      if (!m.contains("content")) {
        return Fail("messages", "each message needs a string content or a list of text parts");
      }
      std::string text;
      if (auto err = MessageText(m["content"], &text)) return err;
      m["content"] = std::move(text);
    }
    auto prompt = ApplyChatTemplate(tok, messages, /*add_generation_prompt=*/true, max_model_len);
    if (!prompt.ok()) return Fail("messages", prompt.status().message());
    r.prompt.assign(prompt->begin(), prompt->end());
  } else {
    if (!j.contains("prompt")) return Fail("prompt", "prompt is required");
    const json& p = j["prompt"];
    if (p.is_string()) {
      r.prompt = tok.Encode(p.get_ref<const std::string&>(), /*add_special=*/true, max_model_len);
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      if (p.size() >= static_cast<size_t>(max_model_len))
        return ContextExceeded(false, p.size(), max_model_len);
      for (const json& t : p) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
            t.get<int64_t>() >= tok.vocab_size()) {
          return Fail("prompt", "token ids must be integers in [0, " +
                                    std::to_string(tok.vocab_size()) + ")");
        }
        r.prompt.push_back(t.get<int32_t>());
      }
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt = tok.Encode(p[0].get_ref<const std::string&>(), true, max_model_len);
    } else {
      return Fail("prompt",
                  "prompt must be a string or a list of token ids (one prompt per request)");
    }
    if (r.prompt.empty()) return Fail("prompt", "the prompt is empty");
  }
  // Numbers.
  const char* max_key =
      chat && j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (r.prompt.size() >= static_cast<size_t>(max_model_len))
    return ContextExceeded(chat, r.prompt.size(), max_model_len);
  const int room = max_model_len - static_cast<int>(r.prompt.size());
  r.max_tokens = chat ? std::min(room, 1024) : 16;
  if (j.contains(max_key) && !j[max_key].is_null()) {
    if (!j[max_key].is_number_integer() || j[max_key].get<int64_t>() < 1) {
      return Fail(max_key, std::string(max_key) + " must be a positive integer");
    }
    const int64_t m = j[max_key];
    if (m > room) {
      return Fail(max_key,
                  "the prompt (" + std::to_string(r.prompt.size()) + " tokens) plus " + max_key +
                      " (" + std::to_string(m) + ") exceeds the context length " +
                      std::to_string(max_model_len),
                  "context_length_exceeded");
    }
    r.max_tokens = static_cast<int>(m);
  }
  r.sampling.temperature = 1.0f;
  if (j.contains("temperature") && !j["temperature"].is_null()) {
    if (!j["temperature"].is_number() || j["temperature"].get<double>() < 0 ||
        j["temperature"].get<double>() > 2) {
      return Fail("temperature", "temperature must be a number in [0, 2]");
    }
    r.sampling.temperature = j["temperature"].get<float>();
  }
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    if (!j["top_p"].is_number() || j["top_p"].get<double>() <= 0 || j["top_p"].get<double>() > 1) {
      return Fail("top_p", "top_p must be a number in (0, 1]");
    }
    r.sampling.top_p = j["top_p"].get<float>();
  }
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    if (!j["top_k"].is_number_integer() || j["top_k"].get<int64_t>() < -1 ||
        j["top_k"].get<int64_t>() > (1 << 24)) {
      return Fail("top_k", "top_k must be an integer >= -1 (-1 or 0: off)");
    }
    r.sampling.top_k = std::max(0, j["top_k"].get<int>());
  }
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (!j["seed"].is_number_integer()) return Fail("seed", "seed must be an integer");
    r.sampling.seed = static_cast<uint64_t>(j["seed"].get<int64_t>());
  } else {
    static std::atomic<uint64_t> next{0x5eed};
    r.sampling.seed = next++;
  }
  if (j.contains("n") && !j["n"].is_null() && j["n"] != 1)
    return Fail("n", "only n = 1 is supported");
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s);
    } else if (s.is_array() && s.size() <= 4) {
      for (const json& x : s) {
        if (!x.is_string() || x.get<std::string>().empty())
          return Fail("stop", "stop strings must be non-empty");
        r.stop.push_back(x);
      }
    } else {
      return Fail("stop", "stop must be a string or a list of up to 4 strings");
    }
    for (auto& x : r.stop) {
      if (x.empty()) return Fail("stop", "stop strings must be non-empty");
    }
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) return Fail("stream", "stream must be true or false");
    r.stream = j["stream"];
  }
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const json& so = j["stream_options"];
    if (!r.stream) return Fail("stream_options", "stream_options needs stream: true");
    if (!so.is_object()) return Fail("stream_options", "stream_options must be an object");
    for (auto& [k, v] : so.items()) {
      if (k != "include_usage") return Fail("stream_options", "unknown stream option " + k);
      if (!v.is_boolean()) return Fail("stream_options", "include_usage must be true or false");
      r.include_usage = v;
    }
  }
  if (j.contains("ignore_eos") && !j["ignore_eos"].is_null()) {
    if (!j["ignore_eos"].is_boolean())
      return Fail("ignore_eos", "ignore_eos must be true or false");
    r.ignore_eos = j["ignore_eos"];
  }
  if (j.contains("skip_special_tokens") && !j["skip_special_tokens"].is_null()) {
    if (!j["skip_special_tokens"].is_boolean())
      return Fail("skip_special_tokens", "skip_special_tokens must be true or false");
    r.skip_special_tokens = j["skip_special_tokens"];
  }
  *out = std::move(r);
  return std::nullopt;
}

std::string TextStream::Add(int32_t token) {
  if (stopped_) return {};
  pending_ += decoder_.Add(token);
  return Release();
}

std::string TextStream::Release() {
  for (const std::string& s : stop_) {
    size_t at = pending_.find(s);
    if (at != std::string::npos) {
      stopped_ = true;
      std::string out = pending_.substr(0, at);
      pending_.clear();
      return out;
    }
  }
  // Hold back what could still become a stop string.
  size_t safe = pending_.size();
  for (const std::string& s : stop_) {
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > 0; --k) {
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        safe = std::min(safe, pending_.size() - k);
        break;
      }
    }
  }
  std::string out = pending_.substr(0, safe);
  pending_.erase(0, safe);
  return out;
}

std::string TextStream::Finish() {
  if (stopped_) return {};
  pending_ += decoder_.Finish();
  std::string out = Release();
  if (stopped_) return out;
  out += pending_;
  pending_.clear();
  return out;
}

}  // namespace failsafe
