#include "server/grammar.h"

#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "common/rng.h"
#include "server/json_schema_grammar.h"
#include "server/test_server.h"

namespace failsafe {
namespace {

using nlohmann::json;

Grammar::Stacks StateAfter(const Grammar& g, const std::string& text) {
  Grammar::Stacks s = g.Start();
  for (unsigned char c : text) {
    s = g.Advance(s, c);
    if (s.empty()) break;
  }
  return s;
}

bool Matches(const Grammar& g, const std::string& text) {
  return Grammar::Accepting(StateAfter(g, text));
}

bool IsPrefix(const Grammar& g, const std::string& text) { return !StateAfter(g, text).empty(); }

Grammar Compile(const nlohmann::ordered_json& schema) {
  auto g = JsonSchemaGrammar(schema);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return std::move(*g);
}

TEST(JsonSchemaGrammar, ObjectsWithRequiredAndOptionalProperties) {
  const Grammar g = Compile(nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 5},
      "age": {"type": "integer"},
      "score": {"type": "number"},
      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
      "ok": {"type": "boolean"},
      "kind": {"enum": ["a", 2, null]}
    },
    "required": ["name", "kind"]
  })"));
  EXPECT_TRUE(Matches(g, R"({"name": "x", "kind": "a"})"));
  EXPECT_TRUE(Matches(g, R"({"name":"abcde","age":-12,"kind":2})"));
  EXPECT_TRUE(Matches(g,
                      "{\n  \"name\" : \"x\" ,\n  \"score\": 1.5e-3,\n  \"tags\": [\"a\", \"b\"],"
                      "\n  \"ok\": false, \"kind\": null\n}"));
  EXPECT_TRUE(Matches(g, R"({"name": "\u00e9\n", "kind": "a"})"));
  EXPECT_FALSE(Matches(g, R"({"kind": "a"})"));                    // name required
  EXPECT_FALSE(Matches(g, R"({"name": "abcdef", "kind": "a"})"));  // maxLength
  EXPECT_FALSE(Matches(g, R"({"name": 1, "kind": "a"})"));
  EXPECT_FALSE(Matches(g, R"({"name": "x", "kind": "b"})"));  // not in the enum
  EXPECT_FALSE(Matches(g, R"({"name": "x", "tags": ["a", "b", "c"], "kind": 2})"));
  EXPECT_FALSE(Matches(g, R"({"name": "x", "other": 1, "kind": 2})"));
  EXPECT_FALSE(Matches(g, R"({"name": "x", "age": 01, "kind": 2})"));
  EXPECT_FALSE(Matches(g, R"({"name": "x", "kind": 2} )"));  // nothing after the value
  EXPECT_TRUE(IsPrefix(g, R"({"name": "ab)"));
  EXPECT_FALSE(Matches(g, R"({"name": "ab)"));
}

TEST(JsonSchemaGrammar, RefsAnyOfConstAndBounds) {
  // A recursive tree through $defs.
  const Grammar tree = Compile(nlohmann::ordered_json::parse(R"({
    "$defs": {"node": {"type": "object", "properties": {
      "v": {"anyOf": [{"type": "integer"}, {"const": "leaf"}]},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}},
    "$ref": "#/$defs/node"
  })"));
  EXPECT_TRUE(Matches(tree, R"({"v": 1, "kids": [{"v": "leaf"}, {"v": 2, "kids": []}]})"));
  EXPECT_FALSE(Matches(tree, R"({"v": "tree"})"));
  const Grammar list = Compile(nlohmann::ordered_json::parse(
      R"({"type": "array", "items": {"type": ["string", "null"]}, "minItems": 2, "maxItems": 3})"));
  EXPECT_FALSE(Matches(list, R"(["a"])"));
  EXPECT_TRUE(Matches(list, R"(["a", null])"));
  EXPECT_TRUE(Matches(list, R"([null,null,"c"])"));
  EXPECT_FALSE(Matches(list, R"(["a", "b", "c", "d"])"));
  // Keywords that would be dropped silently are errors naming them.
  auto bad =
      JsonSchemaGrammar(nlohmann::ordered_json::parse(R"({"type": "string", "pattern": "^a+$"})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("pattern"), std::string::npos);
  EXPECT_FALSE(
      JsonSchemaGrammar(nlohmann::ordered_json::parse(R"({"$ref": "#/$defs/none"})")).ok());
  EXPECT_FALSE(
      JsonSchemaGrammar(nlohmann::ordered_json::parse(R"({"type": "string", "minLength": "x"})"))
          .ok());
}

// Random JSON objects, compact and indented, are all sentences of the JSON
// object grammar; cut short they are prefixes, not sentences.
TEST(JsonSchemaGrammar, JsonModeAcceptsEveryObject) {
  const Grammar g = JsonObjectGrammar();
  Rng rng(5);
  std::function<json(int)> value = [&](int depth) -> json {
    switch (rng.Below(depth > 3 ? 5 : 7)) {
      case 0:
        return nullptr;
      case 1:
        return rng.Below(2) == 0;
      case 2:
        return static_cast<int64_t>(rng.Below(100000)) - 50000;
      case 3:
        return static_cast<double>(rng.Below(1000)) / 7.0;
      case 4:
        return std::string("s\"\\\n\xc3\xa9") + std::to_string(rng.Below(100));
      case 5: {
        json a = json::array();
        for (uint64_t i = rng.Below(4); i > 0; --i) a.push_back(value(depth + 1));
        return a;
      }
      default: {
        json o = json::object();
        for (uint64_t i = rng.Below(4); i > 0; --i) o["k" + std::to_string(i)] = value(depth + 1);
        return o;
      }
    }
  };
  for (int i = 0; i < 200; ++i) {
    json o = json::object();
    for (uint64_t k = rng.Below(5); k > 0; --k) o["key" + std::to_string(k)] = value(0);
    for (int indent : {-1, 2}) {
      const std::string text = o.dump(indent);
      ASSERT_TRUE(Matches(g, text)) << text;
      ASSERT_TRUE(IsPrefix(g, text.substr(0, text.size() - 1)));
      ASSERT_FALSE(Matches(g, text.substr(0, text.size() - 1)));
    }
  }
  EXPECT_FALSE(Matches(g, "[1, 2]"));
  EXPECT_FALSE(Matches(g, "{'a': 1}"));
}

// The trie walk allows exactly the tokens whose bytes the state accepts.
TEST(JsonSchemaGrammar, MasksAreEveryTokenTheStateAccepts) {
  auto tok = std::move(Tokenizer::LoadDir(TestModelDir())).value();
  auto trie = std::make_shared<const TokenTrie>(*tok);
  auto compiled = std::make_shared<const CompiledGrammar>(
      Compile(nlohmann::ordered_json::parse(
          R"({"type": "object", "properties": {"a": {"type": "string"}, "n": {"type": "number"}}})")),
      trie);
  const Grammar& g = compiled->grammar();
  for (const char* prefix : {"", "{", "{\"a\": \"x", "{\"a\": \"x\", \"n\": 1", "{\"n\": -"}) {
    const Grammar::Stacks state = StateAfter(g, prefix);
    ASSERT_FALSE(state.empty()) << prefix;
    auto mask = compiled->Mask(state);
    int allowed = 0;
    for (int t = 0; t < trie->vocab_size(); ++t) {
      const std::string& b = trie->bytes(t);
      bool ok = !b.empty();
      Grammar::Stacks s = state;
      for (unsigned char c : b) {
        if (!ok) break;
        s = g.Advance(s, c);
        ok = !s.empty();
      }
      EXPECT_EQ(mask->allowed[t] != 0, ok)
          << "prefix '" << prefix << "' token " << t << " '" << b << "'";
      allowed += ok;
    }
    EXPECT_GT(allowed, 0) << prefix;
    EXPECT_EQ(mask->any, allowed > 0);
  }
  // The same state again comes from the cache.
  const int64_t computed = compiled->masks_computed();
  compiled->Mask(StateAfter(g, "{"));
  EXPECT_EQ(compiled->masks_computed(), computed);
}

// A request's constraint masks its row: first what the grammar allows, then,
// once the text is whole, only the stop tokens.
TEST(JsonSchemaGrammar, AConstraintLeavesOnlyTheStopsOnceWhole) {
  auto tok = std::move(Tokenizer::LoadDir(TestModelDir())).value();
  auto trie = std::make_shared<const TokenTrie>(*tok);
  int32_t one = -1;
  for (int t = 0; t < trie->vocab_size() && one < 0; ++t) {
    if (trie->bytes(t) == "7") one = t;
  }
  ASSERT_GE(one, 0) << "the test vocabulary spells no 7";
  const int32_t stop = tok->vocab_size() - 1;
  GrammarConstraint c(std::make_shared<const CompiledGrammar>(
                          Compile(nlohmann::ordered_json::parse(R"({"const": 7})")), trie),
                      {stop});
  const float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> logits(trie->vocab_size(), 1.0f);
  std::vector<int32_t> output;
  c.Mask(output, logits);
  for (int t = 0; t < trie->vocab_size(); ++t)
    EXPECT_EQ(logits[t] != kNegInf, trie->bytes(t) == "7") << t;
  output.push_back(one);
  logits.assign(trie->vocab_size(), 2.0f);
  c.Mask(output, logits);
  for (int t = 0; t < trie->vocab_size(); ++t) EXPECT_EQ(logits[t] != kNegInf, t == stop) << t;
  EXPECT_EQ(logits[stop], 2.0f);
}

}  // namespace
}  // namespace failsafe
