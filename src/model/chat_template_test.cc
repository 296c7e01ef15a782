// Chat templates as a model directory carries them (the rendering itself is
// compared with python3-jinja2 by tests/python/chat_template_reference.py).
#include "model/chat_template.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "model/file_util.h"
#include "model/synthetic.h"
#include "model/tokenizer.h"

namespace failsafe {
namespace {

using nlohmann::ordered_json;

const std::string kData = FAILSAFE_DATA_DIR;

class ModelDir {
 public:
  explicit ModelDir(const std::string& copy_from) {
    path_ = std::filesystem::temp_directory_path() /
            ("fs_chat_test_" + std::to_string(::getpid()) + "_" + std::to_string(next_++));
    std::filesystem::create_directories(path_);
    for (const auto& e : std::filesystem::directory_iterator(copy_from))
      std::filesystem::copy_file(e.path(), path_ / e.path().filename());
  }
  ~ModelDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }
  void Write(const std::string& name, const std::string& text) const {
    ASSERT_TRUE(WriteStringToFile(path() + "/" + name, text).ok());
  }

 private:
  static inline int next_ = 0;
  std::filesystem::path path_;
};

ordered_json Chat(std::initializer_list<std::pair<const char*, const char*>> turns) {
  ordered_json m = ordered_json::array();
  for (auto [role, content] : turns) m.push_back({{"role", role}, {"content", content}});
  return m;
}

TEST(ChatTemplate, Phi3TemplateRendersAndTokenizesItsSpecialTokens) {
  auto tok = Tokenizer::LoadDir(kData + "/tokenizers/phi-3-mini");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const ChatTemplate* t = (*tok)->chat_template();
  ASSERT_NE(t, nullptr);
  auto text = t->Render(Chat({{"user", "Hi"}}), true, (*tok)->special_tokens());
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "<|user|>\nHi<|end|>\n<|assistant|>\n");
  auto ids = ApplyChatTemplate(**tok, Chat({{"user", "Hi"}}));
  ASSERT_TRUE(ids.ok());
  // <|user|> Hi <|end|> <|assistant|>: the special tokens eat the newlines (rstrip).
  EXPECT_EQ(*ids, (std::vector<int>{32010, 6324, 32007, 32001}));
  auto closed = t->Render(Chat({{"user", "Hi"}}), false, (*tok)->special_tokens());
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(*closed, "<|user|>\nHi<|end|>\n<|endoftext|>");
}

TEST(ChatTemplate, RaiseExceptionIsARequestError) {
  ModelDir d(kData + "/tokenizers/phi-3-mini");
  d.Write(
      "tokenizer_config.json",
      R"({"chat_template": "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}{{ messages[0].content }}"})");
  auto tok = Tokenizer::LoadDir(d.path());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto bad = ApplyChatTemplate(**tok, Chat({{"system", "x"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("first message must be from the user"), std::string::npos)
      << bad.status().message();
  EXPECT_TRUE(ApplyChatTemplate(**tok, Chat({{"user", "x"}})).ok());
}

TEST(ChatTemplate, UnsupportedConstructFailsAtLoadNamingIt) {
  ModelDir d(kData + "/tokenizers/phi-3-mini");
  d.Write("tokenizer_config.json", R"({"chat_template": "{{ messages | pprint }}"})");
  auto tok = Tokenizer::LoadDir(d.path());
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("unsupported filter 'pprint'"), std::string::npos)
      << tok.status().message();
  d.Write("tokenizer_config.json", R"({"chat_template": "{% include 'other.jinja' %}"})");
  tok = Tokenizer::LoadDir(d.path());
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("include"), std::string::npos);
}

TEST(ChatTemplate, TemplateFileBesideTheTokenizer) {
  ModelDir d(kData + "/tokenizers/llama-2");
  d.Write("chat_template.jinja",
          "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}");
  auto tok = Tokenizer::LoadDir(d.path());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  ASSERT_NE((*tok)->chat_template(), nullptr);
  auto ids = ApplyChatTemplate(**tok, Chat({{"user", "Hello"}}));
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), 1);  // "<s>" written by the template is the BOS token
  EXPECT_EQ((*tok)->Decode(*ids, /*skip_special=*/true), "[user] Hello\n");
}

TEST(ChatTemplate, WithoutATemplateThePlainFormatStays) {
  auto tok = Tokenizer::LoadDir(kData + "/tokenizers/llama-2");
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ((*tok)->chat_template(), nullptr);
  auto ids = ApplyChatTemplate(**tok, Chat({{"system", "Be brief."}, {"user", "Hi"}}));
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), 1);
  EXPECT_EQ((*tok)->Decode(*ids, true), "system: Be brief.\nuser: Hi\nassistant: ");
  // A vocabulary with Llama-3's header tokens gets Llama-3 headers.
  const SyntheticTokenizer s = BuildSyntheticTokenizer(512, 1);
  auto synthetic = Tokenizer::Parse(s.json, "synthetic");
  ASSERT_TRUE(synthetic.ok());
  auto l3 = ApplyChatTemplate(**synthetic, Chat({{"user", "Hi"}}));
  ASSERT_TRUE(l3.ok());
  EXPECT_EQ((*synthetic)->Decode(*l3),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// A chat prompt encoded with a limit stops just past it with a prefix of the
// whole prompt, whichever format the model has: its own template, Llama-3
// headers or plain lines.
TEST(ChatTemplate, LimitedPromptIsAPrefixOfTheWhole) {
  ordered_json chat = ordered_json::array();
  for (int i = 0; i < 40; ++i) {
    std::string content;
    for (int w = 0; w < 12; ++w) content += "word" + std::to_string(i * 12 + w) + " héllo ";
    chat.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", content}});
  }
  std::vector<std::unique_ptr<Tokenizer>> tokenizers;
  auto phi3 = Tokenizer::LoadDir(kData + "/tokenizers/phi-3-mini");
  auto llama2 = Tokenizer::LoadDir(kData + "/tokenizers/llama-2");
  auto synthetic = Tokenizer::Parse(BuildSyntheticTokenizer(512, 1).json, "synthetic");
  ASSERT_TRUE(phi3.ok() && llama2.ok() && synthetic.ok());
  ASSERT_NE((*phi3)->chat_template(), nullptr);
  ASSERT_EQ((*llama2)->chat_template(), nullptr);
  for (const Tokenizer* tok : {phi3->get(), llama2->get(), synthetic->get()}) {
    auto all = ApplyChatTemplate(*tok, chat);
    ASSERT_TRUE(all.ok());
    ASSERT_GT(all->size(), 1000u);
    for (size_t limit : {size_t{0}, size_t{5}, size_t{300}, all->size() - 1}) {
      auto part = ApplyChatTemplate(*tok, chat, true, limit);
      ASSERT_TRUE(part.ok());
      EXPECT_GT(part->size(), limit);
      ASSERT_LE(part->size(), all->size());
      EXPECT_TRUE(std::equal(part->begin(), part->end(), all->begin())) << limit;
      // Llama-2's plain format is one stretch without special tokens, and its
      // SentencePiece-style BPE has no pre-tokenizer: one word, encoded whole.
      if (limit == 300 && tok != llama2->get()) {
        EXPECT_LT(part->size(), all->size() / 2);
      }
    }
    EXPECT_EQ(*ApplyChatTemplate(*tok, chat, true, all->size()), *all);
  }
}

}  // namespace
}  // namespace failsafe
