// failsafe tokenize: encode and decode with a model's tokenizer, one text or
// a JSON Lines batch (what the reference tests compare against other
// implementations).
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/json_lines.h"
#include "model/tokenizer.h"

namespace failsafe {

namespace {

using nlohmann::json;

std::string ToHex(const std::string& s) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

Result<std::string> FromHex(const std::string& h) {
  auto digit = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  if (h.size() % 2) return InvalidArgument("hex text has an odd length");
  std::string out;
  for (size_t i = 0; i < h.size(); i += 2) {
    const int hi = digit(h[i]), lo = digit(h[i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgument("bad hex digit");
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

// One JSON Lines request -> one response line.
Result<json> Answer(const Tokenizer& tok, const std::string& line) {
  json in = json::parse(line, nullptr, false);
  if (in.is_discarded() || !in.is_object()) return InvalidArgument("not a JSON object");
  json out = json::object();
  std::vector<int> ids;
  if (in.contains("decode")) {
    if (!in["decode"].is_array()) return InvalidArgument("'decode' must be a list of ids");
    for (const json& id : in["decode"]) {
      if (!id.is_number_integer()) return InvalidArgument("'decode' must be a list of ids");
      ids.push_back(id.get<int>());
    }
  } else {
    std::string text;
    if (in.contains("hex") && in["hex"].is_string()) {
      FS_ASSIGN_OR_RETURN(text, FromHex(in["hex"].get<std::string>()));
    } else if (in.contains("text") && in["text"].is_string()) {
      text = in["text"];
    } else {
      return InvalidArgument("expected 'text', 'hex' or 'decode'");
    }
    const bool add_special = in.contains("add_special") && in["add_special"].is_boolean() &&
                             in["add_special"].get<bool>();
    ids = tok.Encode(text, add_special);
    out["ids"] = ids;
  }
  out["decoded_hex"] = ToHex(tok.Decode(ids));
  out["decoded_skip_hex"] = ToHex(tok.Decode(ids, /*skip_special=*/true));
  return out;
}

}  // namespace

CommandFn RegisterTokenize(CLI::App& app) {
  struct Opts {
    std::string tokenizer, text, jsonl;
    bool add_special = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--tokenizer", o->tokenizer,
                 "a model directory, a tokenizer.json or a tokenizer.model")
      ->required();
  app.add_option("--text", o->text, "text to encode");
  app.add_flag("--add-special", o->add_special, "add the tokenizer's special tokens (BOS)");
  app.add_option("--jsonl", o->jsonl,
                 "JSON Lines requests ('-': stdin): {\"text\"|\"hex\": ..., \"add_special\"} or "
                 "{\"decode\": [ids]}; answers {\"ids\", \"decoded_hex\", \"decoded_skip_hex\"}");
  return [o] {
    std::error_code ec;
    auto tok = std::filesystem::is_directory(o->tokenizer, ec) ? Tokenizer::LoadDir(o->tokenizer)
                                                               : Tokenizer::Load(o->tokenizer);
    if (!tok.ok()) return Fail(tok.status().ToString());
    if (o->jsonl.empty()) {
      const std::vector<int> ids = (*tok)->Encode(o->text, o->add_special);
      json j = {{"ids", ids}, {"text", (*tok)->Decode(ids)}};
      std::printf("%s\n", j.dump().c_str());
      return 0;
    }
    Status st = AnswerJsonLines(o->jsonl, [&](const std::string& line) -> Result<std::string> {
      FS_ASSIGN_OR_RETURN(json answer, Answer(**tok, line));
      return answer.dump();
    });
    if (!st.ok()) return Fail(st.ToString());
    return 0;
  };
}

}  // namespace failsafe
