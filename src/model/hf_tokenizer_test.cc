// SentencePiece-style tokenizer.json features on small hand-written files:
// what each normalizer, pre-tokenizer, decoder and added-token flag does, and
// that what is not supported is refused naming its field. (The real files
// are checked against @huggingface/transformers by tests/node.)
#include <gtest/gtest.h>

#include "model/hf_pre_tokenizer.h"
#include "model/tokenizer.h"

namespace failsafe {
namespace {

// A tiny SentencePiece-style BPE: <unk> <s> </s>, the 256 byte tokens, then
// ▁, a, b, c, ▁a, ab, ▁ab, ▁b. `extra` goes inside the top-level object.
std::string SpmJson(const std::string& extra, const std::string& model_extra = "") {
  std::string vocab = R"("<unk>": 0, "<s>": 1, "</s>": 2)";
  for (int b = 0; b < 256; ++b) vocab += fmt::format(", \"<0x{:02X}>\": {}", b, 3 + b);
  vocab +=
      R"(, "▁": 259, "a": 260, "b": 261, "c": 262, "▁a": 263, "ab": 264, "▁ab": 265, "▁b": 266)";
  return R"({"model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true, )" +
         model_extra + R"("vocab": {)" + vocab + R"(}, "merges": ["▁ a", "a b", "▁a b", "▁ b"]},
    "added_tokens": [
      {"id": 0, "content": "<unk>", "special": true, "normalized": false},
      {"id": 1, "content": "<s>", "special": true, "normalized": false},
      {"id": 2, "content": "</s>", "special": true, "normalized": false}],
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})" +
         extra + "}";
}

std::unique_ptr<Tokenizer> Parse(const std::string& json) {
  auto t = Tokenizer::Parse(json, "t.json");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

const char kLegacyNormalizer[] = R"(, "normalizer": {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "▁"},
    {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]})";

TEST(HfTokenizer, LegacyNormalizerMergesAndByteFallback) {
  auto t = Parse(SpmJson(kLegacyNormalizer));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->Encode("ab b"), (std::vector<int>{265, 266}));
  // "é" is not in the vocabulary: its two UTF-8 bytes.
  EXPECT_EQ(t->Encode("é"), (std::vector<int>{259, 3 + 0xC3, 3 + 0xA9}));
  for (std::string s : {"ab b", "é", "a  b c", "日本 🚀", "  lead"})
    EXPECT_EQ(t->Decode(t->Encode(s)), s);
  // Special tokens written in the text; each section gets its own "▁".
  EXPECT_EQ(t->Encode("a<s>b"), (std::vector<int>{263, 1, 266}));
  EXPECT_EQ(t->Decode({263, 1, 266}), "a<s> b");
  EXPECT_EQ(t->Decode({263, 1, 266}, /*skip_special=*/true), "a b");
}

TEST(HfTokenizer, InvalidBytesDecodeToReplacementCharacters) {
  auto t = Parse(SpmJson(kLegacyNormalizer));
  ASSERT_TRUE(t);
  // A lone 0xE6 (the start of a three-byte character) then "a".
  EXPECT_EQ(t->Decode({3 + 0xE6, 260}),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(t->Encode("\xFF"), t->Encode("\xEF\xBF\xBD"));
}

TEST(HfTokenizer, MetaspacePrependSchemes) {
  auto with = [](const std::string& scheme, bool split) {
    return Parse(SpmJson(fmt::format(R"(, "pre_tokenizer": {{"type": "Metaspace",
        "replacement": "▁", "prepend_scheme": "{}", "split": {}}})",
                                     scheme, split ? "true" : "false")));
  };
  auto always = with("always", false), first = with("first", false), never = with("never", false);
  ASSERT_TRUE(always && first && never);
  EXPECT_EQ(always->Encode("ab"), (std::vector<int>{265}));
  EXPECT_EQ(never->Encode("ab"), (std::vector<int>{264}));
  // "first": only the text before the first added token gets the prefix.
  EXPECT_EQ(first->Encode("ab<s>ab"), (std::vector<int>{265, 1, 264}));
  EXPECT_EQ(always->Encode("ab<s>ab"), (std::vector<int>{265, 1, 265}));
  // split: every "▁" starts a word, so "▁" + "▁b" never merges across.
  auto split = with("always", true);
  ASSERT_TRUE(split);
  EXPECT_EQ(split->Encode("a  b"), (std::vector<int>{263, 259, 266}));
}

TEST(HfTokenizer, AddedTokenStripFlags) {
  std::string json = SpmJson(kLegacyNormalizer);
  auto at = json.find(R"({"id": 2)");
  json.insert(at, R"({"id": 267, "content": "<|x|>", "special": true, "normalized": false,
                      "lstrip": true, "rstrip": true}, )");
  auto t = Parse(json);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->vocab_size(), 268);
  // The whitespace on both sides is eaten by the token.
  EXPECT_EQ(t->Encode("a \n <|x|>  \tb"), (std::vector<int>{263, 267, 266}));
  EXPECT_TRUE(t->IsSpecial(267));
}

TEST(HfTokenizer, NormalizedAddedTokensMatchAfterNormalization) {
  std::string json = SpmJson(kLegacyNormalizer);
  json.replace(json.find(R"("content": "<s>", "special": true, "normalized": false)"),
               std::string(R"("content": "<s>", "special": true, "normalized": false)").size(),
               R"("content": "<s>", "special": true, "normalized": true)");
  auto t = Parse(json);
  ASSERT_TRUE(t);
  // The content normalizes to "▁<s>": it matches only after a space.
  EXPECT_EQ(t->Encode("a <s> b"), (std::vector<int>{263, 1, 266}));
  EXPECT_NE(t->Encode("a<s>b")[1], 1);
}

TEST(HfTokenizer, UnknownCharactersWithoutByteFallbackFuseIntoOneUnk) {
  auto t = Parse(SpmJson(kLegacyNormalizer)
                     .replace(SpmJson(kLegacyNormalizer).find("\"byte_fallback\": true"), 21,
                              "\"byte_fallback\": false"));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->Encode("a日本"), (std::vector<int>{263, 0}));
}

TEST(HfTokenizer, UnicodeNormalizers) {
  auto nfc = Parse(SpmJson(R"(, "normalizer": {"type": "NFC"})"));
  auto nfkc = Parse(SpmJson(R"(, "normalizer": {"type": "NFKC"})"));
  ASSERT_TRUE(nfc && nfkc);
  // e + combining acute -> é (two bytes, through byte fallback).
  EXPECT_EQ(nfc->Encode("e\u0301"), (std::vector<int>{3 + 0xC3, 3 + 0xA9}));
  // The "ﬁ" ligature is "fi" under NFKC only.
  EXPECT_EQ(nfkc->Encode("\uFB01"), (std::vector<int>{3 + 'f', 3 + 'i'}));
  EXPECT_EQ(nfc->Encode("\uFB01").size(), 3u);
}

TEST(HfTokenizer, RefusesWhatItDoesNotSupportNamingTheField) {
  auto msg = [](const std::string& json) {
    return Tokenizer::Parse(json, "t.json").status().message();
  };
  auto has = [&](const std::string& json, const std::string& what) {
    const std::string m = msg(json);
    EXPECT_NE(m.find(what), std::string::npos) << m;
  };
  has(SpmJson(R"(, "normalizer": {"type": "BertNormalizer"})"), "field 'normalizer'");
  has(SpmJson(R"(, "normalizer": {"type": "Sequence", "normalizers": [{"type": "Lowercase"}]})"),
      "normalizer.normalizers[0]");
  has(SpmJson(R"(, "pre_tokenizer": {"type": "Whitespace"})"), "field 'pre_tokenizer'");
  has(SpmJson(R"(, "pre_tokenizer": {"type": "Split", "pattern": {"String": " "},
                   "behavior": "MergedWithBoth"})"),
      "pre_tokenizer.behavior");
  has(SpmJson(R"(, "post_processor": {"type": "BertProcessing"})"), "post_processor");
  has(SpmJson("", R"("dropout": 0.1, )"), "model.dropout");
  has(SpmJson("", R"("continuing_subword_prefix": "##", )"), "model.continuing_subword_prefix");
  std::string single = SpmJson("");
  single.replace(single.find(R"("special": true, "normalized": false})"), 37,
                 R"("special": true, "normalized": false, "single_word": true})");
  has(single, "single_word");
  has(R"({"model": {"type": "Unigram", "vocab": []}})", "model.type");
  std::string decoder = SpmJson("");
  decoder.replace(decoder.find(R"({"type": "Fuse"})"), 16, R"({"type": "CTC"})");
  has(decoder, "decoder.decoders[2]");
}

// Hugging Face's own example of its split behaviors ("the-final--countdown"
// on "-"), and an inverted pattern (it matches the pieces to keep).
TEST(HfPreTokenizer, SplitBehaviorsAsHuggingFaceDocumentsThem) {
  auto split = [](const std::string& behavior, const std::string& pattern, bool invert) {
    const std::string j = R"({"type": "Split", "pattern": )" + pattern + R"(, "behavior": ")" +
                          behavior + R"(", "invert": )" + (invert ? "true" : "false") + "}";
    auto pre = HfPreTokenizer::Parse(nlohmann::json::parse(j), "pre_tokenizer");
    EXPECT_TRUE(pre.ok()) << pre.status().ToString();
    std::vector<std::string> pieces = {"the-final--countdown"};
    (*pre)->Split(&pieces, 0);
    std::vector<std::string> each;
    (*pre)->SplitEach("the-final--countdown", 0, [&](std::string&& p) {
      each.push_back(p);
      return true;
    });
    EXPECT_EQ(each, pieces) << behavior;
    return pieces;
  };
  using V = std::vector<std::string>;
  const std::string dash = R"({"String": "-"})";
  EXPECT_EQ(split("Removed", dash, false), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split("Isolated", dash, false), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithPrevious", dash, false), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithNext", dash, false), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split("Contiguous", dash, false), (V{"the", "-", "final", "--", "countdown"}));
  const std::string words = R"({"Regex": "[a-z]+"})";
  EXPECT_EQ(split("Removed", words, true), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split("MergedWithPrevious", words, true), (V{"the-", "final--", "countdown"}));
}

TEST(HfTokenizer, TemplatePostProcessorAddsBos) {
  auto t = Parse(SpmJson(std::string(kLegacyNormalizer) + R"(, "post_processor": {
      "type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}})"));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->Encode("ab", /*add_special=*/true), (std::vector<int>{1, 265}));
  EXPECT_EQ(t->Encode("ab"), (std::vector<int>{265}));
}

}  // namespace
}  // namespace failsafe
