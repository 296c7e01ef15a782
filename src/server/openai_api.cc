#include "server/openai_api.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <set>
#include <utility>

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
    {"repetition_penalty", true, true},
    {"min_p", true, true},
    {"min_tokens", true, true},
    {"response_format", true, true},
    {"tools", true, false},
    {"tool_choice", true, false},
    {"parallel_tool_calls", true, false},
    {"resume_token_ids", true, true},
    {"return_token_ids", true, true},
};

// Choices per request (n, best_of), and prompts per completions request.
constexpr int kMaxChoices = 128;

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

// A completions prompt: a string, a list of token ids, or a list of either
// (one choice group per prompt).
std::optional<ApiError> ParsePrompts(const json& p, const Tokenizer& tok, int max_model_len,
                                     CompletionRequest* r) {
  auto ids = [&](const json& list) -> std::optional<ApiError> {
    if (list.size() >= static_cast<size_t>(max_model_len))
      return ContextExceeded(false, list.size(), max_model_len);
    std::vector<int32_t> out;
    for (const json& t : list) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.vocab_size()) {
        return Fail("prompt",
                    "token ids must be integers in [0, " + std::to_string(tok.vocab_size()) + ")");
      }
      out.push_back(t.get<int32_t>());
    }
    r->prompts.push_back(std::move(out));
    r->prompt_texts.emplace_back();
    return std::nullopt;
  };
  auto text = [&](const std::string& s) {
    r->prompts.push_back(tok.Encode(s, /*add_special=*/true, max_model_len));
    r->prompt_texts.push_back(s);
  };
  if (p.is_string()) {
    text(p.get_ref<const std::string&>());
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    if (auto err = ids(p)) return err;
  } else if (p.is_array() && !p.empty() && p.size() <= kMaxChoices) {
    for (const json& one : p) {
      if (one.is_string()) {
        text(one.get_ref<const std::string&>());
      } else if (one.is_array() && !one.empty()) {
        if (auto err = ids(one)) return err;
      } else {
        return Fail("prompt", "each prompt of a list must be a string or a list of token ids");
      }
    }
  } else {
    return Fail("prompt", "prompt must be a string, a list of token ids, or a list of up to " +
                              std::to_string(kMaxChoices) + " of either");
  }
  for (const auto& one : r->prompts) {
    if (one.empty()) return Fail("prompt", "the prompt is empty");
    if (one.size() >= static_cast<size_t>(max_model_len))
      return ContextExceeded(false, one.size(), max_model_len);
  }
  return std::nullopt;
}

// A number in [lo, hi] (or absent: `*out` unchanged).
std::optional<ApiError> Number(const json& j, const char* name, double lo, double hi, float* out) {
  if (!j.contains(name) || j[name].is_null()) return std::nullopt;
  const json& v = j[name];
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo ||
      v.get<double>() > hi) {
    auto num = [](double x) {
      return x == std::floor(x) ? std::to_string(static_cast<int64_t>(x)) : json(x).dump();
    };
    return Fail(name,
                std::string(name) + " must be a number in [" + num(lo) + ", " + num(hi) + "]");
  }
  *out = v.get<float>();
  return std::nullopt;
}

// An integer in [lo, hi] (or absent: `*out` unchanged).
std::optional<ApiError> Integer(const json& j, const char* name, int64_t lo, int64_t hi, int* out) {
  if (!j.contains(name) || j[name].is_null()) return std::nullopt;
  const json& v = j[name];
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    return Fail(name, std::string(name) + " must be an integer in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "]");
  }
  *out = v.get<int>();
  return std::nullopt;
}

std::optional<ApiError> Boolean(const json& j, const char* name, bool* out) {
  if (!j.contains(name) || j[name].is_null()) return std::nullopt;
  if (!j[name].is_boolean()) return Fail(name, std::string(name) + " must be true or false");
  *out = j[name];
  return std::nullopt;
}

// Penalties, biases, min_p, min_tokens and log-probabilities.
std::optional<ApiError> ParseControls(const json& j, bool chat, const Tokenizer& tok,
                                      CompletionRequest* r) {
  LogitControls& c = r->controls;
  if (auto err = Number(j, "presence_penalty", -2, 2, &c.presence_penalty)) return err;
  if (auto err = Number(j, "frequency_penalty", -2, 2, &c.frequency_penalty)) return err;
  if (j.contains("repetition_penalty") && !j["repetition_penalty"].is_null()) {
    const json& v = j["repetition_penalty"];
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      return Fail("repetition_penalty", "repetition_penalty must be a number > 0 (1: off)");
    c.repetition_penalty = v.get<float>();
  }
  if (auto err = Number(j, "min_p", 0, 1, &r->sampling.min_p)) return err;
  if (auto err = Integer(j, "min_tokens", 0, 1 << 30, &c.min_tokens)) return err;
  if (j.contains("logit_bias") && !j["logit_bias"].is_null()) {
    const json& b = j["logit_bias"];
    if (!b.is_object()) return Fail("logit_bias", "logit_bias must map token ids to numbers");
    for (auto& [key, value] : b.items()) {
      char* end = nullptr;
      const long id = std::strtol(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || id >= tok.vocab_size()) {
        return Fail("logit_bias", "logit_bias key '" + key + "' is not a token id in [0, " +
                                      std::to_string(tok.vocab_size()) + ")");
      }
      if (!value.is_number() || value.get<double>() < -100 || value.get<double>() > 100)
        return Fail("logit_bias", "logit_bias values must be numbers in [-100, 100]");
      c.logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
    }
    std::sort(c.logit_bias.begin(), c.logit_bias.end());
    for (size_t i = 1; i < c.logit_bias.size(); ++i) {
      if (c.logit_bias[i].first == c.logit_bias[i - 1].first)
        return Fail("logit_bias", "logit_bias names a token twice");
    }
  }
  if (chat) {
    bool want = false;
    if (auto err = Boolean(j, "logprobs", &want)) return err;
    int top = 0;
    if (auto err = Integer(j, "top_logprobs", 0, kMaxLogprobs, &top)) return err;
    if (j.contains("top_logprobs") && !j["top_logprobs"].is_null() && !want)
      return Fail("top_logprobs", "top_logprobs needs logprobs: true");
    r->logprobs = want ? top : -1;
  } else {
    if (auto err = Integer(j, "logprobs", 0, kMaxLogprobs, &r->logprobs)) return err;
    if (auto err = Boolean(j, "echo", &r->echo)) return err;
  }
  return std::nullopt;
}

// tools, tool_choice and parallel_tool_calls (chat). A forced call
// (required, or a named function) becomes a JSON schema the output follows.
std::optional<ApiError> ParseTools(const json& j, const nlohmann::ordered_json& ordered,
                                   CompletionRequest* r) {
  const bool has_tools = j.contains("tools") && !j["tools"].is_null();
  if (j.contains("parallel_tool_calls") && !j["parallel_tool_calls"].is_null()) {
    if (!j["parallel_tool_calls"].is_boolean())
      return Fail("parallel_tool_calls", "parallel_tool_calls must be true or false");
    r->parallel_tool_calls = j["parallel_tool_calls"];
  }
  if (!has_tools) {
    if (j.contains("tool_choice") && !j["tool_choice"].is_null() && j["tool_choice"] != "none")
      return Fail("tool_choice", "tool_choice needs tools");
    return std::nullopt;
  }
  // In the body's order: the template and the schemas see them as written.
  const nlohmann::ordered_json& tools = ordered["tools"];
  if (!tools.is_array() || tools.empty() || tools.size() > 128)
    return Fail("tools", "tools must be a list of 1 to 128 functions");
  std::set<std::string> names;
  for (const auto& t : tools) {
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
        !t["function"].is_object())
      return Fail("tools", "each tool needs type function and a function object");
    const auto& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string())
      return Fail("tools", "each function needs a name");
    const std::string name = f["name"];
    const bool ok_name =
        !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
        });
    if (!ok_name) return Fail("tools", "function names are 1-64 of a-z, A-Z, 0-9, _ and -");
    if (!names.insert(name).second) return Fail("tools", "two functions are named " + name);
    if (f.contains("parameters") && !f["parameters"].is_object())
      return Fail("tools", "function parameters must be a JSON schema object");
  }
  r->tools = tools;
  r->tool_choice = "auto";
  if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
    const json& c = j["tool_choice"];
    if (c.is_string() && (c == "none" || c == "auto" || c == "required")) {
      r->tool_choice = c;
    } else if (c.is_object() && c.value("type", "") == "function" && c.contains("function") &&
               c["function"].is_object() && c["function"].contains("name") &&
               c["function"]["name"].is_string()) {
      r->tool_choice = "named";
      r->tool_name = c["function"]["name"];
      if (!names.count(r->tool_name))
        return Fail("tool_choice", "tool_choice names no function of tools: " + r->tool_name);
    } else {
      return Fail("tool_choice",
                  "tool_choice must be none, auto, required or {\"type\": \"function\", "
                  "\"function\": {\"name\": ...}}");
    }
  }
  auto parameters = [](const nlohmann::ordered_json& f) {
    return f.contains("parameters") ? f["parameters"] : nlohmann::ordered_json{{"type", "object"}};
  };
  if (r->tool_choice == "named") {
    for (const auto& t : tools) {
      if (t["function"]["name"] == r->tool_name) r->json_schema = parameters(t["function"]).dump();
    }
  } else if (r->tool_choice == "required") {
    nlohmann::ordered_json any = nlohmann::ordered_json::array();
    for (const auto& t : tools) {
      any.push_back({{"type", "object"},
                     {"properties",
                      {{"name", {{"const", t["function"]["name"]}}},
                       {"arguments", parameters(t["function"])}}},
                     {"required", {"name", "arguments"}}});
    }
    nlohmann::ordered_json call = {{"anyOf", any}};
    r->json_schema =
        (r->parallel_tool_calls
             ? nlohmann::ordered_json{{"type", "array"}, {"items", call}, {"minItems", 1}}
             : call)
            .dump();
  }
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
  if (j.contains("suffix") && !j["suffix"].is_null() && j["suffix"] != "")
    return Fail("suffix", "suffix is not supported");
  if (j.contains("user") && !j["user"].is_null() && !j["user"].is_string())
    return Fail("user", "user must be a string");

  // The body with its keys in order, where order matters (the chat
  // template's messages and tools, a schema's properties): parsed once, if
  // needed.
  std::optional<nlohmann::ordered_json> ordered_body;
  auto ordered = [&]() -> const nlohmann::ordered_json& {
    if (!ordered_body) ordered_body = nlohmann::ordered_json::parse(body);
    return *ordered_body;
  };
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
    nlohmann::ordered_json messages = ordered()["messages"];
    for (auto& m : messages) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
          !kRoles.count(m["role"].get<std::string>())) {
        return Fail("messages",
                    "each message needs a role: system, user, assistant, developer or tool");
      }
      // An assistant's tool calls may come without content; their
      // arguments reach the template as objects (as vLLM gives them).
      if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
        if (m["role"] != "assistant" || !m["tool_calls"].is_array())
          return Fail("messages", "tool_calls must be a list, on an assistant message");
        for (auto& call : m["tool_calls"]) {
          if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
              !call["function"].contains("name") || !call["function"]["name"].is_string())
            return Fail("messages", "each tool call needs a function with a name");
          auto& args = call["function"]["arguments"];
          if (args.is_string()) {
            auto parsed = nlohmann::ordered_json::parse(args.get<std::string>(), nullptr, false);
            if (!parsed.is_discarded()) args = std::move(parsed);
          }
        }
        if (!m.contains("content") || m["content"].is_null()) m["content"] = "";
      }
      if (!m.contains("content")) {
        return Fail("messages", "each message needs a string content or a list of text parts");
      }
      std::string text;
      if (auto err = MessageText(m["content"], &text)) return err;
      m["content"] = std::move(text);
    }
    if (auto err = ParseTools(j, ordered(), &r)) return err;
    auto prompt =
        ApplyChatTemplate(tok, messages, /*add_generation_prompt=*/true, max_model_len, r.tools);
    if (!prompt.ok()) return Fail("messages", prompt.status().message());
    r.prompts.emplace_back(prompt->begin(), prompt->end());
    r.prompt_texts.emplace_back();
    if (r.prompts[0].size() >= static_cast<size_t>(max_model_len))
      return ContextExceeded(chat, r.prompts[0].size(), max_model_len);
  } else {
    if (!j.contains("prompt")) return Fail("prompt", "prompt is required");
    if (auto err = ParsePrompts(j["prompt"], tok, max_model_len, &r)) return err;
  }
  if (auto err = ParseControls(j, chat, tok, &r)) return err;
  // Numbers.
  const char* max_key =
      chat && j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  size_t longest = 0;
  for (const auto& p : r.prompts) longest = std::max(longest, p.size());
  const int room = max_model_len - static_cast<int>(longest);
  r.max_tokens = chat ? std::min(room, 1024) : std::min(room, 16);
  if (j.contains(max_key) && !j[max_key].is_null()) {
    // With echo, 0 returns the prompt alone (its logprobs, for scoring).
    const int64_t least = r.echo ? 0 : 1;
    if (!j[max_key].is_number_integer() || j[max_key].get<int64_t>() < least) {
      return Fail(max_key, std::string(max_key) + (least ? " must be a positive integer"
                                                         : " must be a non-negative integer"));
    }
    const int64_t m = j[max_key];
    if (m > room) {
      return Fail(max_key,
                  "the prompt (" + std::to_string(longest) + " tokens) plus " + max_key + " (" +
                      std::to_string(m) + ") exceeds the context length " +
                      std::to_string(max_model_len),
                  "context_length_exceeded");
    }
    r.max_tokens = static_cast<int>(m);
  }
  if (r.controls.min_tokens > r.max_tokens)
    return Fail("min_tokens", "min_tokens must not exceed max_tokens");
  r.sampling.temperature = 1.0f;
  if (auto err = Number(j, "temperature", 0, 2, &r.sampling.temperature)) return err;
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
  if (auto err = Integer(j, "n", 1, kMaxChoices, &r.n)) return err;
  r.best_of = r.n;
  if (auto err = Integer(j, "best_of", 1, kMaxChoices, &r.best_of)) return err;
  if (r.best_of < r.n) return Fail("best_of", "best_of must be at least n");
  if (r.prompts.size() * r.best_of > static_cast<size_t>(kMaxChoices)) {
    return Fail(chat ? "n" : "best_of", "at most " + std::to_string(kMaxChoices) +
                                            " choices per request (prompts times best_of)");
  }
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
  if (auto err = Boolean(j, "stream", &r.stream)) return err;
  if (r.stream && r.best_of > r.n)
    return Fail("best_of", "best_of greater than n cannot be streamed");
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
  if (j.contains("response_format") && !j["response_format"].is_null()) {
    const json& f = j["response_format"];
    const std::string type =
        f.is_object() && f.contains("type") && f["type"].is_string() ? f["type"] : "";
    if (type != "text" && type != "json_object" && type != "json_schema") {
      return Fail("response_format",
                  "response_format type must be text, json_object or json_schema");
    }
    if (type == "json_schema" &&
        (!f.contains("json_schema") || !f["json_schema"].is_object() ||
         !f["json_schema"].contains("schema") ||
         !(f["json_schema"]["schema"].is_object() || f["json_schema"]["schema"].is_boolean()))) {
      return Fail("response_format", "a json_schema response_format needs json_schema.schema");
    }
    // A forced tool call's own schema holds: the answer is the call.
    const bool forced_call = r.tool_choice == "named" || r.tool_choice == "required";
    if (!forced_call && type == "json_object") r.json_object = true;
    if (!forced_call && type == "json_schema") {
      // In the body's order: properties are written in the schema's order.
      r.json_schema = ordered()["response_format"]["json_schema"]["schema"].dump();
    }
  }
  if (auto err = Boolean(j, "return_token_ids", &r.return_token_ids)) return err;
  if (j.contains("resume_token_ids") && !j["resume_token_ids"].is_null()) {
    const json& ids = j["resume_token_ids"];
    if (!ids.is_array()) return Fail("resume_token_ids", "resume_token_ids must be a list");
    for (const json& t : ids) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.vocab_size())
        return Fail("resume_token_ids",
                    "token ids must be integers in [0, " + std::to_string(tok.vocab_size()) + ")");
      r.resume_token_ids.push_back(t.get<int32_t>());
    }
    if (r.best_of != 1 || r.prompts.size() != 1 || r.echo)
      return Fail("resume_token_ids", "a resumed request has one choice and no echo");
    if (static_cast<int>(r.resume_token_ids.size()) >= r.max_tokens)
      return Fail("resume_token_ids", "the resumed tokens leave nothing to generate (max_tokens " +
                                          std::to_string(r.max_tokens) + ")");
  }
  if (auto err = Boolean(j, "ignore_eos", &r.ignore_eos)) return err;
  if (auto err = Boolean(j, "skip_special_tokens", &r.skip_special_tokens)) return err;
  *out = std::move(r);
  return std::nullopt;
}

std::string TextStream::Add(int32_t token) {
  if (stopped_) return {};
  ++added_;
  pending_ += decoder_.Add(token);
  return Release();
}

std::string TextStream::Release() {
  if (added_ < min_tokens_) return std::exchange(pending_, {});
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

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// {"name", "arguments" | "parameters"} as a call.
bool CallOf(const nlohmann::ordered_json& v, ToolCall* out) {
  if (!v.is_object() || !v.contains("name") || !v["name"].is_string()) return false;
  const char* key = v.contains("arguments") ? "arguments" : "parameters";
  if (!v.contains(key)) return false;
  out->name = v["name"];
  out->arguments = v[key].is_string() ? v[key].get<std::string>() : v[key].dump();
  return true;
}

// One call or a list of calls.
bool CallsOf(std::string_view text, std::vector<ToolCall>* out) {
  const auto v = nlohmann::ordered_json::parse(text, nullptr, false);
  if (v.is_discarded()) return false;
  if (v.is_array()) {
    if (v.empty()) return false;
    for (const auto& c : v) {
      ToolCall call;
      if (!CallOf(c, &call)) return false;
      out->push_back(std::move(call));
    }
    return true;
  }
  ToolCall call;
  if (!CallOf(v, &call)) return false;
  out->push_back(std::move(call));
  return true;
}

constexpr std::string_view kToolCallOpen = "<tool_call>", kToolCallClose = "</tool_call>";
constexpr std::string_view kMarkers[] = {"<|python_tag|>", "[TOOL_CALLS]"};

}  // namespace

std::optional<std::vector<ToolCall>> ParseToolCalls(const std::string& text, std::string* content) {
  std::vector<ToolCall> calls;
  const size_t open = text.find(kToolCallOpen);
  if (open != std::string::npos) {
    size_t at = open;
    while (at != std::string::npos) {
      const size_t from = at + kToolCallOpen.size();
      const size_t close = text.find(kToolCallClose, from);
      const std::string_view inner = std::string_view(text).substr(
          from, close == std::string::npos ? std::string::npos : close - from);
      if (!CallsOf(Trim(inner), &calls)) return std::nullopt;
      if (close == std::string::npos) break;
      at = text.find(kToolCallOpen, close);
    }
    *content = std::string(Trim(std::string_view(text).substr(0, open)));
    return calls;
  }
  std::string_view rest = Trim(text);
  for (std::string_view m : kMarkers) {
    if (rest.substr(0, m.size()) == m) rest = Trim(rest.substr(m.size()));
  }
  if (rest.empty() || (rest.front() != '{' && rest.front() != '[')) return std::nullopt;
  if (!CallsOf(rest, &calls)) return std::nullopt;
  content->clear();
  return calls;
}

bool MayBeToolCall(std::string_view text) {
  const std::string_view t = Trim(text);
  if (t.empty()) return true;
  if (t.front() == '{' || t.front() == '[') return true;
  for (std::string_view m : {kToolCallOpen, kMarkers[0], kMarkers[1]}) {
    const size_t n = std::min(m.size(), t.size());
    if (t.substr(0, n) == m.substr(0, n)) return true;
  }
  return false;
}

}  // namespace failsafe
