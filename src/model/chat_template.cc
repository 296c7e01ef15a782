#include "model/chat_template.h"

#include <algorithm>
#include <ctime>
#include <vector>

#include "jinja/template.h"
#include "model/tokenizer.h"

namespace failsafe {

namespace {

using jinja::Dict;
using jinja::Value;

class RaiseException : public jinja::Function {
 public:
  Result<Value> Call(jinja::Interpreter&, jinja::ValueList args, jinja::KwArgs) const override {
    return InvalidArgument("{}", args.empty() ? std::string("raise_exception") : args[0].Str());
  }
  std::string name() const override { return "raise_exception"; }
};

// strftime_now(format): the local time, as Python's datetime.now().strftime.
class StrftimeNow : public jinja::Function {
 public:
  Result<Value> Call(jinja::Interpreter&, jinja::ValueList args, jinja::KwArgs) const override {
    if (args.size() != 1 || !args[0].is_string())
      return InvalidArgument("strftime_now() takes one format string");
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof(buf), args[0].as_string().c_str(), &tm);
    return Value(std::string(buf, n));
  }
  std::string name() const override { return "strftime_now"; }
};

// Nesting depth of a JSON value, without recursion.
int Depth(const nlohmann::ordered_json& root) {
  int deepest = 0;
  std::vector<std::pair<const nlohmann::ordered_json*, int>> stack = {{&root, 1}};
  while (!stack.empty()) {
    auto [j, d] = stack.back();
    stack.pop_back();
    deepest = std::max(deepest, d);
    if (j->is_structured()) {
      for (const auto& child : *j) stack.emplace_back(&child, d + 1);
    }
  }
  return deepest;
}

}  // namespace

ChatTemplate::~ChatTemplate() = default;

Result<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(const std::string& source,
                                                          const std::string& origin) {
  auto t = std::unique_ptr<ChatTemplate>(new ChatTemplate());
  FS_ASSIGN_OR_RETURN(t->template_, jinja::Template::Parse(source, origin));
  return t;
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                         bool add_generation_prompt,
                                         const SpecialTokenStrings& special,
                                         const nlohmann::ordered_json& tools) const {
  if (Depth(messages) > 64) return InvalidArgument("the messages nest deeper than 64 levels");
  if (Depth(tools) > 64) return InvalidArgument("the tools nest deeper than 64 levels");
  Dict context;
  auto set = [&](const char* name, Value v) { context.Set(Value(name), std::move(v)); };
  set("messages", Value::FromJson(messages));
  set("tools", tools.is_null() ? Value::None() : Value::FromJson(tools));
  set("documents", Value::None());
  set("add_generation_prompt", Value(add_generation_prompt));
  // Hugging Face passes the special tokens that are set.
  if (!special.bos.empty()) set("bos_token", Value(special.bos));
  if (!special.eos.empty()) set("eos_token", Value(special.eos));
  if (!special.unk.empty()) set("unk_token", Value(special.unk));
  if (!special.pad.empty()) set("pad_token", Value(special.pad));
  if (!special.additional.empty()) {
    jinja::ValueList l;
    for (const auto& s : special.additional) l.emplace_back(s);
    set("additional_special_tokens", Value(std::move(l)));
  }
  set("raise_exception", Value(std::make_shared<RaiseException>()));
  set("strftime_now", Value(std::make_shared<StrftimeNow>()));
  return template_->Render(context);
}

Result<std::vector<int>> ApplyChatTemplate(const Tokenizer& tok,
                                           const nlohmann::ordered_json& messages,
                                           bool add_generation_prompt, size_t max_tokens,
                                           const nlohmann::ordered_json& tools) {
  if (const ChatTemplate* t = tok.chat_template()) {
    FS_ASSIGN_OR_RETURN(std::string text,
                        t->Render(messages, add_generation_prompt, tok.special_tokens(), tools));
    return tok.Encode(text, /*add_special=*/false, max_tokens);
  }
  auto field = [](const nlohmann::ordered_json& m, const char* key) {
    auto it = m.find(key);
    return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (!tools.is_null() && tools.is_array() && !tools.empty()) {
    // The built-in format has no tool syntax: the tools lead as a system
    // message saying how to call one.
    nlohmann::ordered_json with = nlohmann::ordered_json::array();
    with.push_back({{"role", "system"},
                    {"content",
                     "You may call one of these tools by answering with {\"name\": "
                     "..., \"arguments\": {...}} alone: " +
                         tools.dump()}});
    for (const auto& m : messages) with.push_back(m);
    return ApplyChatTemplate(tok, with, add_generation_prompt, max_tokens);
  }
  const int bos = tok.TokenId("<|begin_of_text|>"), start = tok.TokenId("<|start_header_id|>"),
            end = tok.TokenId("<|end_header_id|>"), eot = tok.TokenId("<|eot_id|>");
  std::vector<int> out;
  auto append = [&](const std::string& text) {
    if (out.size() > max_tokens) return;
    auto ids = tok.Encode(text, /*add_special=*/false, max_tokens - out.size());
    out.insert(out.end(), ids.begin(), ids.end());
  };
  if (bos >= 0 && start >= 0 && end >= 0 && eot >= 0) {
    out.push_back(bos);
    for (const auto& m : messages) {
      if (out.size() > max_tokens) return out;
      out.push_back(start);
      append(field(m, "role"));
      out.push_back(end);
      append("\n\n" + field(m, "content"));
      out.push_back(eot);
    }
    if (add_generation_prompt) {
      out.push_back(start);
      append("assistant");
      out.push_back(end);
      append("\n\n");
    }
    return out;
  }
  std::string text;
  for (const auto& m : messages) text += field(m, "role") + ": " + field(m, "content") + "\n";
  if (add_generation_prompt) text += "assistant: ";
  return tok.Encode(text, /*add_special=*/true,
                    max_tokens);  // like a completion prompt (e.g. BOS first)
}

}  // namespace failsafe
