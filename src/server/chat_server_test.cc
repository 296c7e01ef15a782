// The model's own text rules through the server: its chat template (a
// raise_exception is a 400), its stop tokens, and skip_special_tokens.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/executor.h"
#include "engine/local_executor.h"
#include "model/file_util.h"
#include "model/synthetic.h"
#include "server/http_server.h"
#include "server/openai_api.h"

namespace failsafe {
namespace {

using nlohmann::json;

struct Server {
  std::string dir;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<EngineService> service;
  std::unique_ptr<HttpServer> http;
  std::unique_ptr<httplib::Client> client;

  // A synthetic model with `tokenizer_config` and `generation_config` beside it.
  Server(const std::string& tokenizer_config, const std::string& generation_config) {
    static int n = 0;
    dir = (std::filesystem::temp_directory_path() /
           ("fs_chat_server_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++)))
              .string();
    SyntheticModelOptions o;
    o.preset = "tiny-llama";
    o.seed = 5;
    EXPECT_TRUE(WriteSyntheticModel(dir, o).ok());
    if (!tokenizer_config.empty()) {
      EXPECT_TRUE(WriteStringToFile(dir + "/tokenizer_config.json", tokenizer_config).ok());
    }
    if (!generation_config.empty()) {
      EXPECT_TRUE(WriteStringToFile(dir + "/generation_config.json", generation_config).ok());
    }
    tok = std::move(Tokenizer::LoadDir(dir)).value();
    auto exec = LocalExecutor::Create(dir, LocalExecutorOptions{});
    EXPECT_TRUE(exec.ok()) << exec.status().ToString();
    SchedulerConfig sc;
    sc.max_model_len = 512;
    service = std::make_unique<EngineService>(std::move(exec).value(), sc, EngineOptions{},
                                              ServiceOptions{});
    ServerOptions opts;
    opts.port = 0;
    http = std::make_unique<HttpServer>(service.get(), tok.get(), opts);
    EXPECT_TRUE(http->Start().ok());
    client = std::make_unique<httplib::Client>("127.0.0.1", http->port());
    client->set_read_timeout(60, 0);
  }
  ~Server() {
    http->Stop();
    std::filesystem::remove_all(dir);
  }
  std::pair<int, json> Post(const std::string& path, const json& body) {
    auto r = client->Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
};

const char kAlternating[] =
    R"({"chat_template": "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('roles must alternate user/assistant') }}{% endif %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"})";

TEST(ChatServer, TheModelsTemplateFormatsThePromptAndItsExceptionsAre400) {
  Server s(kAlternating, "");
  auto [status, body] =
      s.Post("/v1/chat/completions",
             {{"messages", {{{"role", "user"}, {"content", "hello"}}}}, {"max_tokens", 2}});
  ASSERT_EQ(status, 200) << body.dump();
  // The prompt is exactly the rendered template, tokenized.
  EXPECT_EQ(body["usage"]["prompt_tokens"], s.tok->Encode("<user>hello<assistant>", false).size());
  auto [bad, err] =
      s.Post("/v1/chat/completions",
             {{"messages", {{{"role", "assistant"}, {"content", "x"}}}}, {"max_tokens", 2}});
  EXPECT_EQ(bad, 400);
  EXPECT_EQ(err["error"]["param"], "messages");
  EXPECT_NE(err["error"]["message"].get<std::string>().find("roles must alternate"),
            std::string::npos)
      << err.dump();
}

// OpenAI's content arrays: the template sees the text parts joined by
// newlines; other part types and malformed parts are 400s naming them.
TEST(ChatServer, ContentPartsReachTheTemplateAsText) {
  Server s(kAlternating, "");
  const json parts = {{{"type", "text"}, {"text", "hel"}}, {{"type", "text"}, {"text", "lo"}}};
  auto [status, body] =
      s.Post("/v1/chat/completions",
             {{"messages", {{{"role", "user"}, {"content", parts}}}}, {"max_tokens", 2}});
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(body["usage"]["prompt_tokens"],
            s.tok->Encode("<user>hel\nlo<assistant>", false).size());
  const std::pair<json, std::string> refused[] = {
      {json::array({{{"type", "image_url"}, {"image_url", {{"url", "x"}}}}}), "'image_url'"},
      {json::array({{{"text", "no type"}}}), "needs a type"},
      {json::array({{{"type", "text"}, {"text", 5}}}), "string text"},
      {json::array(), "list of text parts"},
      {json(nullptr), "list of text parts"},
  };
  for (auto& [content, needle] : refused) {
    auto [bad, err] =
        s.Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", content}}}}});
    EXPECT_EQ(bad, 400) << content.dump();
    EXPECT_EQ(err["error"]["param"], "messages");
    EXPECT_NE(err["error"]["message"].get<std::string>().find(needle), std::string::npos)
        << err.dump();
  }
}

TEST(ChatServer, GenerationStopsAtTheStopTokensOfGenerationConfig) {
  // Every id is a stop token: generation ends after one token.
  json all = json::array();
  for (int i = 0; i < 512; ++i) all.push_back(i);
  Server s("", json{{"eos_token_id", all}}.dump());
  auto [status, body] = s.Post("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 20}});
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(body["usage"]["completion_tokens"], 1);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  auto [status2, body2] =
      s.Post("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 20}, {"ignore_eos", true}});
  ASSERT_EQ(status2, 200);
  EXPECT_EQ(body2["usage"]["completion_tokens"], 20);
  auto [bad, err] = s.Post("/v1/completions", {{"prompt", "abc"}, {"skip_special_tokens", 3}});
  EXPECT_EQ(bad, 400);
  EXPECT_EQ(err["error"]["param"], "skip_special_tokens");
}

TEST(ChatServer, SkipSpecialTokensChoosesWhetherTheyAreText) {
  const SyntheticTokenizer syn = BuildSyntheticTokenizer(512, 1);
  auto tok = Tokenizer::Parse(syn.json, "t");
  ASSERT_TRUE(tok.ok());
  std::vector<int> out = (*tok)->Encode("Hi");
  out.push_back(syn.eos_id);
  for (bool skip : {true, false}) {
    TextStream stream(tok->get(), {}, skip);
    std::string text;
    for (int id : out) text += stream.Add(id);
    text += stream.Finish();
    EXPECT_EQ(text, skip ? "Hi" : "Hi<|eot_id|>");
  }
}

}  // namespace
}  // namespace failsafe
