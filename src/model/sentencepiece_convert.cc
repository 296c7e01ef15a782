#include "model/sentencepiece_convert.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "common/utf8.h"
#include "model/hf_tokenizer.h"

namespace failsafe {

using nlohmann::ordered_json;

namespace {

using Kind = SentencePieceTokenizer::PieceKind;

const char kMeta[] = "\xE2\x96\x81";  // ▁

// Texts the derived tokenizer must encode as SentencePiece does.
const char* kProbes[] = {
    "Once upon a time, there was a little girl named Lily.",
    "  two leading spaces and two  inside and trailing  ",
    "tabs\tand\nnewlines\r\n",
    "digits 1234567890 and 3.14",
    "unicode: héllo wörld 日本語 🚀",
    "<s>special</s> tokens <unk> in text",
    " ",
    "",
    "\xE2\x96\x81 a meta symbol",
};

}  // namespace

Result<std::string> SentencePieceToTokenizerJson(const SentencePieceTokenizer& sp) {
  const auto pieces = sp.Pieces();
  std::unordered_map<std::string, int> id;
  for (size_t i = 0; i < pieces.size(); ++i) id.emplace(pieces[i].text, static_cast<int>(i));
  const int unk = sp.TokenId("<unk>");
  if (unk < 0) return InvalidArgument("the SentencePiece model has no <unk> piece");

  // How the model normalizes, from what it does.
  auto first_piece = [&](const std::string& text) {
    auto ids = sp.Encode(text);
    return ids.empty() ? std::string() : pieces[ids[0]].text;
  };
  const bool dummy_prefix = first_piece("a").rfind(kMeta, 0) == 0;
  const bool remove_extra_spaces =
      sp.Encode("a  b") == sp.Encode("a b") && sp.Encode(" a ") == sp.Encode("a");

  // Merges: every split (l, r) of a piece into two pieces, ordered by the
  // merged piece's score (higher first), then by the ids of l and r.
  struct Merge {
    float score;
    int l, r;
    std::string a, b;
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const auto& p = pieces[i];
    if (p.kind != Kind::kNormal) continue;
    std::vector<Merge> local;
    for (size_t cut = 1; cut < p.text.size(); ++cut) {
      if ((static_cast<unsigned char>(p.text[cut]) & 0xC0) == 0x80) continue;  // inside a character
      auto l = id.find(p.text.substr(0, cut)), r = id.find(p.text.substr(cut));
      if (l == id.end() || r == id.end()) continue;
      local.push_back({p.score, l->second, r->second, l->first, r->first});
    }
    std::sort(local.begin(), local.end(), [](const Merge& x, const Merge& y) {
      return std::tie(x.l, x.r) < std::tie(y.l, y.r);
    });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(),
                   [](const Merge& x, const Merge& y) { return x.score > y.score; });

  ordered_json vocab = ordered_json::object();
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i].text] = i;
  ordered_json merge_list = ordered_json::array();
  for (const Merge& m : merges) merge_list.push_back(ordered_json::array({m.a, m.b}));

  ordered_json added = ordered_json::array();
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].kind != Kind::kControl && pieces[i].kind != Kind::kUnknown) continue;
    added.push_back({{"id", i},
                     {"content", pieces[i].text},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }

  // The normalizer, as SentencePiece's: runs of spaces collapse and leading
  // spaces go (only U+0020), the dummy prefix goes on non-empty text, spaces
  // become ▁, and trailing ▁ go (including ▁ written in the text). Anchors are
  // written as lookarounds, which every regex dialect reads alike.
  ordered_json normalizers = ordered_json::array();
  auto replace = [&](const char* kind, const std::string& pattern, const std::string& content) {
    normalizers.push_back(
        {{"type", "Replace"}, {"pattern", {{kind, pattern}}}, {"content", content}});
  };
  if (remove_extra_spaces) {
    replace("Regex", " {2,}", " ");
    replace("Regex", "(?<![\\s\\S]) ", "");
  }
  if (dummy_prefix) replace("Regex", "(?<![\\s\\S])(?=[\\s\\S])", " ");
  replace("String", " ", kMeta);
  if (remove_extra_spaces) replace("Regex", std::string(kMeta) + "+(?![\\s\\S])", "");

  // Decoding drops the dummy prefix: SentencePiece drops one ▁ from each
  // leading piece until some text appears, which is every leading space when
  // no piece is made of several ▁.
  bool multi_meta = false;
  for (const auto& p : pieces) {
    std::string run;
    while (run.size() < p.text.size()) run += kMeta;
    multi_meta = multi_meta || (p.text.size() >= 6 && p.text == run);
  }
  ordered_json decoders = ordered_json::array(
      {{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
       {{"type", "ByteFallback"}},
       {{"type", "Fuse"}}});
  if (dummy_prefix) {
    decoders.push_back(
        {{"type", "Strip"}, {"content", " "}, {"start", multi_meta ? 1 : 1024}, {"stop", 0}});
  }

  ordered_json j = {{"version", "1.0"},
                    {"truncation", nullptr},
                    {"padding", nullptr},
                    {"added_tokens", added},
                    {"normalizer", {{"type", "Sequence"}, {"normalizers", normalizers}}},
                    {"pre_tokenizer", nullptr}};
  const int bos = sp.bos_id();
  if (bos >= 0) {
    const std::string b = pieces[bos].text;
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single",
                            {{{"SpecialToken", {{"id", b}, {"type_id", 0}}}},
                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                           {"pair",
                            {{{"SpecialToken", {{"id", b}, {"type_id", 0}}}},
                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                             {{"SpecialToken", {{"id", b}, {"type_id", 1}}}},
                             {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
                           {"special_tokens", {{b, {{"id", b}, {"ids", {bos}}, {"tokens", {b}}}}}}};
  } else {
    j["post_processor"] = nullptr;
  }
  j["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", pieces[unk].text},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", true},
                {"byte_fallback", true},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merge_list}};
  std::string text = j.dump(2) + "\n";

  // The derived tokenizer must agree with SentencePiece.
  FS_ASSIGN_OR_RETURN(auto derived, HfTokenizer::Parse(text, "derived tokenizer.json"));
  for (const char* probe : kProbes) {
    if (derived->Encode(probe) != sp.Encode(probe)) {
      return InvalidArgument(
          "the derived tokenizer.json encodes \"{}\" differently from SentencePiece (only BPE "
          "models with byte fallback convert)",
          probe);
    }
  }
  return text;
}

}  // namespace failsafe
