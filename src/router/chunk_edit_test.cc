#include "router/chunk_edit.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace failsafe {
namespace {

TEST(ChunkEdit, TokenIdsAreReadAndStripped) {
  const std::string chunk =
      R"({"choices":[{"finish_reason":null,"index":0,"text":"a \"token_ids\":[9]","token_ids":[5,17,2]}],"created":1,"id":"cmpl-1","model":"tiny"})";
  std::vector<int32_t> ids;
  ASSERT_EQ(AppendChunkTokenIds(chunk, &ids), 3);
  EXPECT_EQ(ids, (std::vector<int32_t>{5, 17, 2}));
  std::string s = chunk;
  StripTokenIds(&s);
  const auto j = nlohmann::json::parse(s);
  EXPECT_FALSE(j["choices"][0].contains("token_ids"));
  EXPECT_EQ(j["choices"][0]["text"], "a \"token_ids\":[9]");

  std::string first = R"({"token_ids":[],"x":1})";
  ids.clear();
  EXPECT_EQ(AppendChunkTokenIds(first, &ids), 0);
  StripTokenIds(&first);
  EXPECT_EQ(first, R"({"x":1})");
  std::string nested = R"({"token_ids":[[1],2],"token_ids":[3]})";
  StripTokenIds(&nested);
  EXPECT_EQ(nested, R"({"token_ids":[[1],2]})");
  EXPECT_EQ(AppendChunkTokenIds(R"({"token_ids":[1,"a"]})", &ids), std::nullopt);
  EXPECT_EQ(AppendChunkTokenIds(R"({"token_ids":[1,)", &ids), std::nullopt);
}

TEST(ChunkEdit, TopLevelIdIsReplacedNotANestedOne) {
  std::string s =
      R"({"choices":[{"delta":{"tool_calls":[{"id":"call_1"}]}}],"id":"chatcmpl-2","x":"\"id\":\"no\""})";
  EXPECT_EQ(TopLevelString(s, "id"), "\"chatcmpl-2\"");
  ASSERT_TRUE(ReplaceTopLevelString(&s, "id", "\"chatcmpl-1\""));
  const auto j = nlohmann::json::parse(s);
  EXPECT_EQ(j["id"], "chatcmpl-1");
  EXPECT_EQ(j["choices"][0]["delta"]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(j["x"], "\"id\":\"no\"");
  std::string none = R"({"choices":[{"id":"x"}]})";
  EXPECT_FALSE(ReplaceTopLevelString(&none, "id", "\"y\""));
}
}  // namespace
}  // namespace failsafe
