// Loading tokenizers from model directories: tokenizer.json or
// tokenizer.model, the files beside them, and streaming decode.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "model/file_util.h"
#include "model/tokenizer.h"

namespace failsafe {
namespace {

const std::string kData = FAILSAFE_DATA_DIR;

std::unique_ptr<Tokenizer> MustLoad(const std::string& path) {
  auto t = std::filesystem::is_directory(path) ? Tokenizer::LoadDir(path) : Tokenizer::Load(path);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

TEST(SentencePieceTokenizer, ControlTokensInTextAndBos) {
  auto t = MustLoad(kData + "/tokenizers/mistral-v3/tokenizer.model");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->vocab_size(), 32768);
  EXPECT_EQ(t->TokenId("[INST]"), 3);
  EXPECT_EQ(t->TokenId("no such piece"), -1);
  const auto ids = t->Encode("[INST] Hi [/INST]", /*add_special=*/true);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], 1);  // BOS (add_bos_token defaults to true)
  EXPECT_EQ(ids[1], 3);
  EXPECT_EQ(ids.back(), 4);
  EXPECT_TRUE(t->IsSpecial(3));
  EXPECT_FALSE(t->IsSpecial(ids[2]));
  EXPECT_EQ(t->Decode(ids, /*skip_special=*/true), " Hi ");  // the text between the tokens
  EXPECT_EQ(t->Decode(ids), "<s>[INST] Hi [/INST]");
}

TEST(SentencePieceTokenizer, RoundTripsText) {
  auto t = MustLoad(kData + "/tokenizers/llama-2/tokenizer.model");
  ASSERT_TRUE(t);
  for (std::string s : {"Hello world", "  two leading", "tabs\tand\nnewlines", "日本語 🚀 Ωμέγα",
                        "code: for (i = 0; i < n; ++i) {}"}) {
    EXPECT_EQ(t->Decode(t->Encode(s)), s);
  }
}

// The Llama-2 vocabulary in both formats: the same ids for plain text.
TEST(Tokenizer, JsonAndModelOfOneVocabularyAgree) {
  auto json = MustLoad(kData + "/tokenizers/llama-2");
  auto model = MustLoad(kData + "/tokenizers/llama-2/tokenizer.model");
  ASSERT_TRUE(json && model);
  for (std::string s : {"Hello world", "The engine keeps serving.", " lead", "a  b\n\nc\t",
                        "日本語 🚀", "1234567", "def f(x):\n    return x"}) {
    EXPECT_EQ(json->Encode(s), model->Encode(s)) << s;
  }
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("fs_tokenizer_test_" + std::to_string(::getpid()) + "_" + std::to_string(next_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }
  void Write(const std::string& name, const std::string& text) const {
    EXPECT_TRUE(WriteStringToFile(path() + "/" + name, text).ok());
  }

 private:
  static inline int next_ = 0;
  std::filesystem::path path_;
};

TEST(Tokenizer, LoadDirGathersStopTokensAndSpecialStrings) {
  TempDir d;
  auto json = ReadFileToString(kData + "/tokenizers/phi-3-mini/tokenizer.json");
  auto config = ReadFileToString(kData + "/tokenizers/phi-3-mini/tokenizer_config.json");
  ASSERT_TRUE(json.ok() && config.ok());
  d.Write("tokenizer.json", *json);
  d.Write("tokenizer_config.json", *config);
  d.Write("generation_config.json", R"({"eos_token_id": [32007, 32001]})");
  d.Write("config.json", R"({"eos_token_id": 2})");
  auto t = MustLoad(d.path());
  ASSERT_TRUE(t);
  // generation_config's list, config.json's id and tokenizer_config's <|endoftext|>.
  EXPECT_EQ(t->stop_token_ids(), (std::vector<int>{2, 32000, 32001, 32007}));
  EXPECT_EQ(t->special_tokens().bos, "<s>");
  EXPECT_EQ(t->special_tokens().eos, "<|endoftext|>");

  d.Write("generation_config.json", R"({"eos_token_id": [40000]})");
  auto bad = Tokenizer::LoadDir(d.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("40000"), std::string::npos);
  d.Write("generation_config.json", R"({"eos_token_id": "x"})");
  bad = Tokenizer::LoadDir(d.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("eos_token_id"), std::string::npos);
}

TEST(Tokenizer, LoadDirWithoutTokenizerIsNotFound) {
  TempDir d;
  auto t = Tokenizer::LoadDir(d.path());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  d.Write("tokenizer.model", "not a model");
  t = Tokenizer::LoadDir(d.path());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("SentencePiece"), std::string::npos);
}

// Encoding with a limit stops just past it with a prefix of the whole
// encoding, for every kind of tokenizer; under the limit it is the whole.
TEST(Tokenizer, EncodeStopsPastALimit) {
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += "word" + std::to_string(i) + (i % 7 ? " " : " <s> [INST] ") + "héllo 🚀 ";
  for (const std::string& path :
       {kData + "/tokenizers/llama-2", kData + "/tokenizers/mistral-v3/tokenizer.model",
        kData + "/models/stories260K", kData + "/tokenizers/phi-3-mini"}) {
    auto t = MustLoad(path);
    ASSERT_TRUE(t);
    for (bool special : {false, true}) {
      const std::vector<int> all = t->Encode(text, special);
      ASSERT_GT(all.size(), 500u);
      for (size_t limit : {size_t{0}, size_t{1}, size_t{37}, size_t{300}, all.size() - 1}) {
        const std::vector<int> part = t->Encode(text, special, limit);
        EXPECT_GT(part.size(), limit) << path;
        ASSERT_LE(part.size(), all.size()) << path;
        EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin())) << path << " " << limit;
      }
      EXPECT_EQ(t->Encode(text, special, all.size()), all);
    }
  }
}

// Streamed pieces concatenate to the text of the whole sequence, with
// multi-byte characters split over byte-fallback tokens held back whole.
TEST(StreamDecoder, PiecesConcatenateToTheWholeText) {
  for (const std::string& path :
       {kData + "/tokenizers/llama-2", kData + "/tokenizers/llama-2/tokenizer.model"}) {
    auto t = MustLoad(path);
    ASSERT_TRUE(t);
    const std::vector<int> prompt = t->Encode("Once upon", /*add_special=*/true);
    const std::vector<int> out = t->Encode(" a time 🚀 日本語 there was a <s> end");
    StreamDecoder stream(t.get(), /*skip_special=*/false, prompt);
    std::string text;
    bool held_back = false;
    for (int id : out) {
      std::string piece = stream.Add(id);
      held_back = held_back || piece.empty();
      EXPECT_TRUE(IsValidUtf8(piece));
      text += piece;
    }
    text += stream.Finish();
    EXPECT_TRUE(held_back);  // the emoji's first bytes waited for the rest
    std::vector<int> all = prompt;
    all.insert(all.end(), out.begin(), out.end());
    EXPECT_EQ(t->Decode(prompt) + text, t->Decode(all)) << path;
  }
}

}  // namespace
}  // namespace failsafe
