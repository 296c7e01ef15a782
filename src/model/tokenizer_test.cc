#include <gtest/gtest.h>

#include "common/rng.h"
#include "model/synthetic.h"
#include "model/tokenizer.h"

namespace failsafe {
namespace {

std::unique_ptr<Tokenizer> Synthetic(int vocab) {
  auto t = Tokenizer::Parse(BuildSyntheticTokenizer(vocab, 1).json, "tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

TEST(Tokenizer, SyntheticHasExactVocabSize) {
  for (int v : {512, 16384}) EXPECT_EQ(Synthetic(v)->vocab_size(), v);
}

TEST(Tokenizer, RoundTripsText) {
  auto t = Synthetic(2048);
  for (std::string s : {"", "Hello world", "The engine keeps serving when a device fails.",
                        "  leading and trailing spaces  ", "tabs\tand\nnewlines\r\n\n",
                        "numbers 1234567 and 3.14159", "unicode: héllo wörld 日本語 🚀 Ωμέγα",
                        "<|begin_of_text|>special <|eot_id|> inside"}) {
    auto ids = t->Encode(s);
    EXPECT_EQ(t->Decode(ids), s);
  }
}

// Encoding with a limit stops just past it, with a prefix of the whole
// encoding; under the limit it is the whole encoding.
TEST(Tokenizer, EncodeStopsPastALimit) {
  auto t = Synthetic(2048);
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += "word" + std::to_string(i) + (i % 7 ? " " : " <|eot_id|> ") + "héllo ";
  for (bool special : {false, true}) {
    const std::vector<int> all = t->Encode(text, special);
    ASSERT_GT(all.size(), 500u);
    for (size_t limit : {size_t{0}, size_t{1}, size_t{37}, size_t{300}, all.size() - 1}) {
      const std::vector<int> part = t->Encode(text, special, limit);
      EXPECT_GT(part.size(), limit);
      EXPECT_LT(part.size(), all.size() + 1);
      ASSERT_LE(part.size(), all.size());
      EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin())) << limit;
    }
    EXPECT_EQ(t->Encode(text, special, all.size()), all);
    EXPECT_EQ(t->Encode(text, special, all.size() + 100), all);
  }
}

TEST(Tokenizer, RoundTripsRandomBytes) {
  auto t = Synthetic(1024);
  Rng rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    int n = static_cast<int>(rng.Below(64));
    for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(rng.Below(256)));
    EXPECT_EQ(t->Decode(t->Encode(s)), s);
  }
}

TEST(Tokenizer, MergesCompressCorpusText) {
  auto t = Synthetic(4096);
  std::string s = "The engine keeps serving when a device fails.";
  EXPECT_LT(t->Encode(s).size(), s.size() / 2);
}

TEST(Tokenizer, SpecialTokensAndBos) {
  auto t = Synthetic(512);
  auto ids = t->Encode("hi<|eot_id|>", /*add_special=*/true);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), t->bos_id());
  EXPECT_EQ(ids.back(), t->TokenId("<|eot_id|>"));
  EXPECT_TRUE(t->IsSpecial(ids.back()));
  EXPECT_EQ(t->Decode(ids, /*skip_special=*/true), "hi");
}

// A GPT-2 style file: ByteLevel pre-tokenizer with its built-in regex,
// merges given as "a b" strings.
TEST(Tokenizer, Gpt2StyleFile) {
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(ByteToCodePoint(static_cast<unsigned char>(b)), &s);
    if (s == "\"") s = "\\\"";
    if (s == "\\") s = "\\\\";
    vocab += "\"" + s + "\": " + std::to_string(b) + ",";
  }
  vocab += "\"he\": 256, \"Ġhe\": 257, \"ll\": 258, \"hell\": 259, \"hello\": 260}";
  std::string json = R"({"model": {"type": "BPE", "vocab": )" + vocab +
                     R"(, "merges": ["h e", "Ġ he", "l l", "he ll", "hell o"]},
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
      "decoder": {"type": "ByteLevel"}, "added_tokens": []})";
  auto t = Tokenizer::Parse(json, "gpt2.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->Encode("hello he"), (std::vector<int>{260, 257}));
  EXPECT_EQ((*t)->Decode({260, 257}), "hello he");
}

TEST(Tokenizer, RejectsMalformedFiles) {
  auto msg = [](const std::string& s) { return Tokenizer::Parse(s, "t.json").status().message(); };
  EXPECT_NE(msg("[").find("not a JSON object"), std::string::npos);
  EXPECT_NE(msg(R"({"model": {"type": "WordPiece"}})").find("model.type"), std::string::npos);
  EXPECT_NE(msg(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})").find("byte 0x00"),
            std::string::npos);
  std::string good = BuildSyntheticTokenizer(512, 1).json;
  std::string bad_regex = good;
  auto pos = bad_regex.find("(?i:");
  bad_regex.replace(pos, 4, "((((");
  EXPECT_NE(msg(bad_regex).find("regex does not compile"), std::string::npos);
  // Two tokens with one id would break the round trip (found by fuzzing).
  std::string dup = good;
  auto a = dup.find("\"!\": 33,");
  ASSERT_NE(a, std::string::npos);
  dup.replace(a, 8, "\"!\": 34,");
  EXPECT_NE(msg(dup).find("used by two tokens"), std::string::npos) << msg(dup);
}

}  // namespace
}  // namespace failsafe
