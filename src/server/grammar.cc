#include "server/grammar.h"

#include <algorithm>
#include <limits>

#include "common/check.h"

namespace failsafe {

namespace {

// Rule expansions deeper than this are dropped (a schema nested this deep
// has no use; it bounds the work of a pathological one).
constexpr int kMaxExpandDepth = 256;

}  // namespace

int Grammar::NewRule() {
  rules_.emplace_back();
  return static_cast<int>(rules_.size()) - 1;
}

Grammar::Item Grammar::Char(unsigned char c) {
  CharSet s;
  s.set(c);
  return Chars(s);
}

std::vector<Grammar::Item> Grammar::Literal(std::string_view text) {
  std::vector<Item> out;
  for (char c : text) out.push_back(Char(static_cast<unsigned char>(c)));
  return out;
}

void Grammar::Alt(int rule, std::vector<Item> items) {
  FS_CHECK(rule >= 0 && rule < static_cast<int>(rules_.size()));
  rules_[rule].push_back(std::move(items));
}

void Grammar::Finish() {
  flat_.clear();
  charsets_.clear();
  alt_starts_.assign(rules_.size(), {});
  for (size_t r = 0; r < rules_.size(); ++r) {
    for (const std::vector<Item>& alt : rules_[r]) {
      alt_starts_[r].push_back(static_cast<int32_t>(flat_.size()));
      for (const Item& it : alt) {
        Element e;
        if (it.is_rule) {
          FS_CHECK(it.rule >= 0 && it.rule < static_cast<int>(rules_.size()));
          e.kind = Element::kRule;
          e.rule = it.rule;
        } else {
          e.kind = Element::kChars;
          e.chars = static_cast<int32_t>(charsets_.size());
          charsets_.push_back(it.chars);
        }
        flat_.push_back(e);
      }
      flat_.push_back(Element{});  // kEnd
    }
  }
  rules_.clear();
}

void Grammar::Expand(std::vector<int32_t> stack, Stacks* out, int depth) const {
  if (depth > kMaxExpandDepth) return;
  if (stack.empty() || flat_[stack.back()].kind == Element::kChars) {
    out->push_back(std::move(stack));
    return;
  }
  const int32_t top = stack.back();
  stack.pop_back();
  if (flat_[top + 1].kind != Element::kEnd) stack.push_back(top + 1);
  for (int32_t start : alt_starts_[flat_[top].rule]) {
    std::vector<int32_t> next = stack;
    if (flat_[start].kind != Element::kEnd) next.push_back(start);
    Expand(std::move(next), out, depth + 1);
  }
}

Grammar::Stacks Grammar::Start() const {
  Stacks out;
  for (int32_t start : alt_starts_[root_]) {
    std::vector<int32_t> s;
    if (flat_[start].kind != Element::kEnd) s.push_back(start);
    Expand(std::move(s), &out, 0);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Grammar::Stacks Grammar::Advance(const Stacks& from, unsigned char c) const {
  Stacks out;
  for (const std::vector<int32_t>& s : from) {
    if (s.empty()) continue;
    const int32_t top = s.back();
    if (!charsets_[flat_[top].chars][c]) continue;
    std::vector<int32_t> next(s.begin(), s.end() - 1);
    if (flat_[top + 1].kind != Element::kEnd) next.push_back(top + 1);
    Expand(std::move(next), &out, 0);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool Grammar::Accepting(const Stacks& s) {
  // Sorted: the empty stack comes first.
  return !s.empty() && s.front().empty();
}

TokenTrie::TokenTrie(const Tokenizer& tokenizer) : vocab_(tokenizer.vocab_size()) {
  bytes_.resize(vocab_);
  nodes_.emplace_back();
  // A token's text after plain text ("a"): decoders drop a leading space
  // at the start of the text only.
  const std::vector<int> plain = tokenizer.Encode("a");
  TokenTexts after(&tokenizer,
                   plain.empty() ? std::vector<int32_t>{} : std::vector<int32_t>{plain.back()});
  static const std::string kReplacement = "\xEF\xBF\xBD";
  for (int id = 0; id < vocab_; ++id) {
    if (tokenizer.IsSpecial(id)) continue;
    const std::string text = after.Peek(id);
    // Part of a character: no bytes of its own.
    if (text.empty() || text.find(kReplacement) != std::string::npos) continue;
    bytes_[id] = text;
    int32_t node = 0;
    for (unsigned char c : text) {
      auto& kids = nodes_[node].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(c, int32_t{-1}));
      if (it != kids.end() && it->first == c) {
        node = it->second;
      } else {
        const int32_t fresh = static_cast<int32_t>(nodes_.size());
        kids.insert(it, {c, fresh});
        nodes_.emplace_back();
        node = fresh;
      }
    }
    nodes_[node].tokens.push_back(id);
  }
}

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenTrie> trie)
    : grammar_(std::move(grammar)), trie_(std::move(trie)) {}

std::shared_ptr<const CompiledGrammar::TokenMask> CompiledGrammar::Mask(
    const Grammar::Stacks& state) const {
  std::string key;
  for (const auto& s : state) {
    key.append(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(int32_t));
    key.push_back('\xff');
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
  }
  auto mask = std::make_shared<TokenMask>();
  mask->allowed.assign(trie_->vocab_size(), 0);
  const auto& nodes = trie_->nodes();
  // Depth first through the trie, a state per level: a subtree is skipped at
  // the first byte the grammar refuses.
  struct Frame {
    int32_t node;
    Grammar::Stacks state;
  };
  std::vector<Frame> todo;
  todo.push_back({0, state});
  while (!todo.empty()) {
    Frame f = std::move(todo.back());
    todo.pop_back();
    for (const auto& [byte, child] : nodes[f.node].children) {
      Grammar::Stacks next = grammar_.Advance(f.state, byte);
      if (next.empty()) continue;
      for (int32_t t : nodes[child].tokens) mask->allowed[t] = 1;
      mask->any |= !nodes[child].tokens.empty();
      if (!nodes[child].children.empty()) todo.push_back({child, std::move(next)});
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++computed_;
  // Bounded: a schema whose states never repeat must not grow it forever.
  if (cache_.size() >= 4096) cache_.clear();
  cache_.emplace(std::move(key), mask);
  return mask;
}

int64_t CompiledGrammar::masks_computed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return computed_;
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<const CompiledGrammar> grammar,
                                     std::vector<int32_t> stop_ids)
    : grammar_(std::move(grammar)),
      stop_ids_(std::move(stop_ids)),
      state_(grammar_->grammar().Start()) {}

void GrammarConstraint::Mask(std::span<const int32_t> output, std::span<float> logits) {
  const Grammar& g = grammar_->grammar();
  const TokenTrie& trie = grammar_->trie();
  for (; consumed_ < output.size(); ++consumed_) {
    const int32_t t = output[consumed_];
    if (t < 0 || t >= trie.vocab_size()) continue;
    for (unsigned char c : trie.bytes(t)) state_ = g.Advance(state_, c);
  }
  const auto mask = state_.empty() ? nullptr : grammar_->Mask(state_);
  const bool any = mask && mask->any;
  // Once the output is whole it may end; a dead end (a vocabulary that
  // cannot spell what the grammar needs) ends too rather than wander.
  std::vector<std::pair<int32_t, float>> ends;
  if (Grammar::Accepting(state_) || !any) {
    for (int32_t s : stop_ids_) {
      if (s >= 0 && s < static_cast<int32_t>(logits.size())) ends.emplace_back(s, logits[s]);
    }
  }
  // No way on and no way to end: the constraint lets go.
  if (!any && ends.empty()) return;
  const int n = static_cast<int>(std::min(logits.size(), mask ? mask->allowed.size() : 0));
  for (int t = 0; t < n; ++t) {
    if (!mask->allowed[t]) logits[t] = -std::numeric_limits<float>::infinity();
  }
  for (size_t t = n; t < logits.size(); ++t) logits[t] = -std::numeric_limits<float>::infinity();
  for (const auto& [t, l] : ends) logits[t] = l;
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCache::Get(
    const std::string& key, const std::function<Result<Grammar>()>& build) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->first != key) continue;
    lru_.splice(lru_.begin(), lru_, it);
    return lru_.front().second;
  }
  auto grammar = build();
  if (!grammar.ok()) return grammar.status();
  if (!trie_) trie_ = std::make_shared<const TokenTrie>(*tokenizer_);
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(*grammar), trie_);
  lru_.emplace_front(key, compiled);
  if (lru_.size() > 64) lru_.pop_back();
  return compiled;
}

}  // namespace failsafe
