// Constrained decoding: a context-free grammar over bytes, matched by a set
// of pushdown stacks (each stack the elements still to match, top last), and
// the tokens whose bytes a grammar state accepts, found by walking a trie of
// the vocabulary from that state. Masks are cached per state: a JSON string
// or number revisits the same few states token after token.
//
// Grammars are built by code (json_schema_grammar.h), never parsed from
// text, and have no left recursion (a rule's alternatives never start with
// the rule itself), so expanding a stack always terminates.
#pragma once

#include <bitset>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engine/request_sampler.h"
#include "model/tokenizer.h"

namespace failsafe {

class Grammar {
 public:
  using CharSet = std::bitset<256>;

  // A new rule, empty; its alternatives are added with Alt.
  int NewRule();
  // Elements of one alternative: a byte set or a rule reference.
  struct Item {
    bool is_rule = false;
    int rule = -1;
    CharSet chars;
  };
  static Item Chars(const CharSet& set) { return {false, -1, set}; }
  static Item Char(unsigned char c);
  static Item Ref(int rule) { return {true, rule, {}}; }
  // The bytes of `text` one by one.
  static std::vector<Item> Literal(std::string_view text);
  // Adds an alternative (a sequence; empty: matches nothing) to `rule`.
  void Alt(int rule, std::vector<Item> items);
  // The rule a grammar starts from.
  void set_root(int rule) { root_ = rule; }

  // Flattens the rules; the grammar is immutable afterwards.
  void Finish();

  // A parse state: the stacks alive after the bytes so far, each a list of
  // element indices (top last), sorted and unique.
  using Stacks = std::vector<std::vector<int32_t>>;
  Stacks Start() const;
  // The stacks after one more byte (empty: the byte is not allowed).
  Stacks Advance(const Stacks& from, unsigned char c) const;
  // Whether the bytes so far are a whole sentence of the grammar.
  static bool Accepting(const Stacks& s);

 private:
  struct Element {
    enum Kind : uint8_t { kChars, kRule, kEnd } kind = kEnd;
    int32_t rule = -1;
    int32_t chars = -1;  // index into charsets_
  };
  void Expand(std::vector<int32_t> stack, Stacks* out, int depth) const;

  std::vector<std::vector<std::vector<Item>>> rules_;  // while building
  std::vector<Element> flat_;                          // alternatives, each ended by kEnd
  std::vector<std::vector<int32_t>> alt_starts_;  // [rule] -> first element of each alternative
  std::vector<CharSet> charsets_;
  int root_ = 0;
};

// The bytes of every token of a vocabulary as a trie. Tokens whose text is
// not whole UTF-8 on its own (a byte of a character split across tokens)
// have no bytes here, and constrained decoding never draws them.
class TokenTrie {
 public:
  explicit TokenTrie(const Tokenizer& tokenizer);
  int vocab_size() const { return vocab_; }
  // The text a token adds after plain text (empty: none).
  const std::string& bytes(int32_t id) const { return bytes_[id]; }

  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    std::vector<int32_t> tokens;                              // ending here
  };
  const std::vector<Node>& nodes() const { return nodes_; }

 private:
  int vocab_ = 0;
  std::vector<std::string> bytes_;
  std::vector<Node> nodes_;  // [0]: the root
};

// A grammar with a vocabulary: the masks of states, cached (shared by every
// request with the same schema; thread-safe).
class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenTrie> trie);
  const Grammar& grammar() const { return grammar_; }
  const TokenTrie& trie() const { return *trie_; }
  // Tokens whose bytes the state accepts: allowed[t] != 0; `any` if one is.
  struct TokenMask {
    std::vector<uint8_t> allowed;  // [vocab]
    bool any = false;
  };
  std::shared_ptr<const TokenMask> Mask(const Grammar::Stacks& state) const;
  // States computed and served from the cache so far.
  int64_t masks_computed() const;

 private:
  const Grammar grammar_;
  const std::shared_ptr<const TokenTrie> trie_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const TokenMask>> cache_;
  mutable int64_t computed_ = 0;
};

// One request's constraint: its output must be a sentence of the grammar,
// then one of `stop_ids` (the only tokens allowed once it is whole).
class GrammarConstraint : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const CompiledGrammar> grammar, std::vector<int32_t> stop_ids);
  void Mask(std::span<const int32_t> output, std::span<float> logits) override;

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<int32_t> stop_ids_;
  Grammar::Stacks state_;
  size_t consumed_ = 0;
};

// Compiled grammars by key (a schema's text), for one tokenizer: a schema is
// compiled once and its masks are shared by every request that names it.
// Thread-safe. Keeps the most recently used 64.
class GrammarCache {
 public:
  explicit GrammarCache(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}
  Result<std::shared_ptr<const CompiledGrammar>> Get(const std::string& key,
                                                     const std::function<Result<Grammar>()>& build);

 private:
  const Tokenizer* const tokenizer_;
  std::mutex mu_;
  std::shared_ptr<const TokenTrie> trie_;
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> lru_;
};

}  // namespace failsafe
