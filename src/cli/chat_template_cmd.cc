// failsafe chat-template: renders conversations with a chat template (what
// the reference test compares with Python's jinja2), and with a model
// directory also the prompt ids.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/json_lines.h"
#include "model/chat_template.h"
#include "model/file_util.h"
#include "model/tokenizer.h"
#include "model/tokenizer_config.h"

namespace failsafe {

namespace {

using nlohmann::ordered_json;

// Special token strings from {"bos": ..., "eos": ..., "unk": ..., "pad": ...}.
SpecialTokenStrings Specials(const ordered_json& j, SpecialTokenStrings s) {
  if (!j.is_object()) return s;
  auto get = [&](const char* k, std::string* dst) {
    if (j.contains(k) && j[k].is_string()) *dst = j[k];
  };
  get("bos", &s.bos);
  get("eos", &s.eos);
  get("unk", &s.unk);
  get("pad", &s.pad);
  return s;
}

}  // namespace

CommandFn RegisterChatTemplate(CLI::App& app) {
  struct Opts {
    std::string source, jsonl = "-";
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--template", o->source,
                 "a .jinja file, a tokenizer_config.json, or a model directory")
      ->required();
  app.add_option(
         "--jsonl", o->jsonl,
         "JSON Lines ('-': stdin): {\"messages\": [...], \"add_generation_prompt\": true, "
         "\"tools\": [...], "
         "\"special\": {\"bos\", \"eos\", \"unk\", \"pad\"}}; answers {\"text\"[, \"ids\"]} "
         "or {\"error\"}")
      ->capture_default_str();
  return [o] {
    std::error_code ec;
    std::unique_ptr<Tokenizer> tok;
    std::unique_ptr<ChatTemplate> own;
    const ChatTemplate* chat = nullptr;
    SpecialTokenStrings special;
    if (std::filesystem::is_directory(o->source, ec)) {
      auto t = Tokenizer::LoadDir(o->source);
      if (!t.ok()) return Fail(t.status().ToString());
      tok = std::move(t).value();
      chat = tok->chat_template();
      special = tok->special_tokens();
    } else {
      auto text = ReadFileToString(o->source);
      if (!text.ok()) return Fail(text.status().ToString());
      std::string source = *text;
      if (std::filesystem::path(o->source).extension() == ".json") {
        auto config = TokenizerConfig::Parse(*text, o->source);
        if (!config.ok()) return Fail(config.status().ToString());
        source = config->chat_template;
        if (source.empty()) return Fail(o->source + ": no chat_template");
      }
      auto t = ChatTemplate::Parse(source, o->source);
      if (!t.ok()) return Fail(t.status().ToString());
      own = std::move(t).value();
      chat = own.get();
    }
    Status st = AnswerJsonLines(o->jsonl, [&](const std::string& line) -> Result<std::string> {
      ordered_json req = ordered_json::parse(line, nullptr, false);
      if (req.is_discarded() || !req.is_object() || !req.contains("messages"))
        return InvalidArgument("expected {{\"messages\": [...]}}");
      const bool gen = !req.contains("add_generation_prompt") ||
                       !req["add_generation_prompt"].is_boolean() ||
                       req["add_generation_prompt"].get<bool>();
      ordered_json out;
      if (chat) {
        auto text = chat->Render(
            req["messages"], gen,
            Specials(req.contains("special") ? req["special"] : ordered_json(), special),
            req.contains("tools") ? req["tools"] : ordered_json());
        if (text.ok()) {
          out["text"] = *text;
        } else {
          out["error"] = text.status().message();
        }
      }
      if (tok && !out.contains("error")) {
        auto ids = ApplyChatTemplate(*tok, req["messages"], gen, SIZE_MAX,
                                     req.contains("tools") ? req["tools"] : ordered_json());
        if (ids.ok()) {
          out["ids"] = *ids;
        } else {
          out["error"] = ids.status().message();
        }
      }
      return out.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
    });
    if (!st.ok()) return Fail(st.ToString());
    return 0;
  };
}

}  // namespace failsafe
