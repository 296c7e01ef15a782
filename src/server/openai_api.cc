#include "server/openai_api.h"

#include <algorithm>
#include <atomic>
#include <set>

namespace failsafe {

using nlohmann::json;

std::vector<int32_t> ApplyChatTemplate(const json& messages, const Tokenizer& tok) {
  const int bos = tok.TokenId("<|begin_of_text|>"), start = tok.TokenId("<|start_header_id|>"),
            end = tok.TokenId("<|end_header_id|>"), eot = tok.TokenId("<|eot_id|>");
  std::vector<int32_t> out;
  auto append = [&](const std::string& text) {
    auto ids = tok.Encode(text);
    out.insert(out.end(), ids.begin(), ids.end());
  };
  if (bos >= 0 && start >= 0 && end >= 0 && eot >= 0) {
    out.push_back(bos);
    for (const json& m : messages) {
      out.push_back(start);
      append(m["role"].get<std::string>());
      out.push_back(end);
      append("\n\n" + m["content"].get<std::string>());
      out.push_back(eot);
    }
    out.push_back(start);
    append("assistant");
    out.push_back(end);
    append("\n\n");
    return out;
  }
  std::string text;
  for (const json& m : messages)
    text += m["role"].get<std::string>() + ": " + m["content"].get<std::string>() + "\n";
  text += "assistant: ";
  append(text);
  return out;
}

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

}  // namespace

std::optional<ApiError> ParseCompletionRequest(const std::string& body, bool chat,
                                               const Tokenizer& tok, const CompletionLimits& limits,
                                               CompletionRequest* out) {
  const int max_model_len = limits.max_model_len;
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return Fail("", "the request body is not valid JSON");
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
    for (const json& m : j["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
          !kRoles.count(m["role"])) {
        return Fail("messages",
                    "each message needs a role: system, user, assistant, developer or tool");
      }
      if (!m.contains("content") || !m["content"].is_string()) {
        return Fail("messages", "each message needs a string content");
      }
    }
    // Message contents alone need at least as many tokens as their tokens
    // counted up to the context length; a huge prompt stops there.
    size_t content_bytes = 0;
    for (const json& m : j["messages"])
      content_bytes += m["content"].get_ref<const std::string&>().size();
    if (content_bytes >= static_cast<size_t>(max_model_len)) {
      size_t tokens = 0;
      for (const json& m : j["messages"]) {
        tokens += tok.Encode(m["content"].get_ref<const std::string&>(), false,
                             max_model_len - std::min<size_t>(tokens, max_model_len))
                      .size();
        if (tokens > static_cast<size_t>(max_model_len))
          return ContextExceeded(true, tokens, max_model_len);
      }
    }
    r.prompt = ApplyChatTemplate(j["messages"], tok);
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
  *out = std::move(r);
  return std::nullopt;
}

namespace {

// Bytes of `s` that form whole UTF-8 characters (an incomplete tail stays back).
size_t CompleteUtf8(const std::string& s) {
  size_t n = s.size();
  // Look back at most 3 bytes for the start of an incomplete character.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    int need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    return need > static_cast<int>(back) ? n - back : n;
  }
  return n;
}

}  // namespace

std::string TextStream::Add(int32_t token) {
  if (stopped_) return {};
  pending_ += tokenizer_->DecodeOne(token, /*skip_special=*/true);
  for (const std::string& s : stop_) {
    size_t at = pending_.find(s);
    if (at != std::string::npos) {
      stopped_ = true;
      std::string out = pending_.substr(0, at);
      pending_.clear();
      return out;
    }
  }
  // Hold back what could still become a stop string or a whole character.
  size_t safe = CompleteUtf8(pending_);
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
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace failsafe
