#include "model/bpe_model.h"

#include <algorithm>
#include <queue>

#include "common/utf8.h"
#include "model/hf_json.h"

namespace failsafe {

using nlohmann::json;

Result<std::unique_ptr<BpeModel>> BpeModel::Parse(const json& j, const std::string& source) {
  auto m = std::unique_ptr<BpeModel>(new BpeModel());
  std::fill(std::begin(m->byte_ids_), std::end(m->byte_ids_), -1);
  const std::string field = source + ": field 'model";
  FS_ASSIGN_OR_RETURN(m->byte_fallback_, OptBool(j, "byte_fallback", false, "model"));
  FS_ASSIGN_OR_RETURN(m->fuse_unk_, OptBool(j, "fuse_unk", false, "model"));
  FS_ASSIGN_OR_RETURN(m->ignore_merges_, OptBool(j, "ignore_merges", false, "model"));
  if (j.contains("dropout") && !j["dropout"].is_null() &&
      !(j["dropout"].is_number() && j["dropout"].get<double>() == 0.0)) {
    return InvalidArgument("{}.dropout': BPE dropout is not supported", field);
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (j.contains(key) && !j[key].is_null() && !(j[key].is_string() && j[key] == ""))
      return InvalidArgument("{}.{}' is not supported", field, key);
  }
  auto vocab = j.find("vocab");
  if (vocab == j.end() || !vocab->is_object())
    return InvalidArgument("{}.vocab' is missing", field);
  std::vector<bool> used;
  for (auto& [tok, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 24)) {
      return InvalidArgument("{}.vocab': token '{}' has an invalid id", field, tok);
    }
    const int i = id.get<int>();
    if (i >= static_cast<int>(used.size())) used.resize(i + 1, false);
    if (used[i]) return InvalidArgument("{}.vocab': id {} is used by two tokens", field, i);
    used[i] = true;
    m->vocab_[tok] = i;
    m->max_id_ = std::max(m->max_id_, i);
    size_t at = 0;
    const int cp = tok.empty() ? -1 : DecodeUtf8(tok, &at);
    if (cp >= 0 && at == tok.size()) m->char_ids_[cp] = i;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = m->vocab_.find(fmt::format("<0x{:02X}>", b));
    if (it != m->vocab_.end()) m->byte_ids_[b] = it->second;
  }
  FS_ASSIGN_OR_RETURN(std::string unk, OptString(j, "unk_token", "", "model"));
  if (!unk.empty()) {
    auto it = m->vocab_.find(unk);
    if (it == m->vocab_.end())
      return InvalidArgument("{}.unk_token': '{}' is not in the vocabulary", field, unk);
    m->unk_id_ = it->second;
  }

  // merges: ["a b", ...] or [["a", "b"], ...]
  auto merges = j.find("merges");
  if (merges == j.end() || !merges->is_array())
    return InvalidArgument("{}.merges' is missing", field);
  int rank = 0;
  for (auto& mj : *merges) {
    std::string a, b;
    if (mj.is_string()) {
      // "a b". Tokens may themselves hold spaces (some files turned U+00A0
      // into spaces): the separator is the first space whose two sides and
      // their concatenation are all tokens.
      const std::string s = mj.get<std::string>();
      size_t sp = s.find(' ', 1);
      if (sp == std::string::npos)
        return InvalidArgument("{}.merges[{}]': '{}' is not 'a b'", field, rank, s);
      for (size_t at = sp; at != std::string::npos && at + 1 < s.size(); at = s.find(' ', at + 1)) {
        const std::string l = s.substr(0, at), r = s.substr(at + 1);
        if (m->vocab_.count(l) && m->vocab_.count(r) && m->vocab_.count(l + r)) {
          sp = at;
          break;
        }
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
      a = mj[0];
      b = mj[1];
    } else {
      return InvalidArgument("{}.merges[{}]' is malformed", field, rank);
    }
    auto ia = m->vocab_.find(a), ib = m->vocab_.find(b), im = m->vocab_.find(a + b);
    if (ia == m->vocab_.end() || ib == m->vocab_.end() || im == m->vocab_.end()) {
      return InvalidArgument("{}.merges[{}]': '{} {}' uses a token not in the vocabulary", field,
                             rank, a, b);
    }
    const uint64_t key =
        static_cast<uint64_t>(ia->second) << 32 | static_cast<uint32_t>(ib->second);
    m->merges_.emplace(key, Merge{rank, im->second});  // the first (lowest) rank wins
    ++rank;
  }
  return m;
}

void BpeModel::Encode(const std::vector<std::string>& words, std::vector<int>* out,
                      size_t max_tokens, size_t fuse_from) const {
  const size_t first = std::min(fuse_from, out->size());
  for (const std::string& w : words) {
    if (out->size() > max_tokens) break;
    EncodeWord(w, out);
  }
  if (!fuse_unk_ || unk_id_ < 0) return;
  auto last = std::unique(out->begin() + static_cast<ptrdiff_t>(first), out->end(),
                          [&](int a, int b) { return a == unk_id_ && b == unk_id_; });
  out->erase(last, out->end());
}

void BpeModel::AppendUnknown(std::string_view piece, std::vector<int>* out) const {
  if (byte_fallback_) {
    bool all = true;
    for (unsigned char c : piece) all = all && byte_ids_[c] >= 0;
    if (all) {
      for (unsigned char c : piece) out->push_back(byte_ids_[c]);
      return;
    }
  }
  if (unk_id_ >= 0) out->push_back(unk_id_);
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  // Symbols over a linked list; a symbol with id -1 is a character outside
  // the vocabulary (it never merges).
  struct Sym {
    int id, prev, next;
    uint32_t begin, end;  // bytes of the word
  };
  std::vector<Sym> sym;
  sym.reserve(word.size());
  for (size_t i = 0; i < word.size();) {
    const size_t b = i;
    const int cp = DecodeUtf8(word, &i);
    auto it = char_ids_.find(cp);
    const int n = static_cast<int>(sym.size());
    sym.push_back({it == char_ids_.end() ? -1 : it->second, n - 1, n + 1, static_cast<uint32_t>(b),
                   static_cast<uint32_t>(i)});
  }
  sym.back().next = -1;
  struct Cand {
    int rank, left, left_id, right_id, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int left) {
    if (left < 0 || sym[left].next < 0) return;
    const int right = sym[left].next;
    if (sym[left].id < 0 || sym[right].id < 0) return;
    auto it = merges_.find(static_cast<uint64_t>(sym[left].id) << 32 |
                           static_cast<uint32_t>(sym[right].id));
    if (it != merges_.end())
      heap.push({it->second.rank, left, sym[left].id, sym[right].id, it->second.merged});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& l = sym[c.left];
    if (l.id != c.left_id || l.next < 0 || sym[l.next].id != c.right_id) continue;  // stale
    const int right = l.next;
    l.id = c.merged;
    l.end = sym[right].end;
    l.next = sym[right].next;
    if (l.next >= 0) sym[l.next].prev = c.left;
    sym[right].id = -2;  // removed
    consider(l.prev);
    consider(c.left);
  }
  for (int i = 0; i >= 0; i = sym[i].next) {
    if (sym[i].id >= 0) {
      out->push_back(sym[i].id);
    } else {
      AppendUnknown(word.substr(sym[i].begin, sym[i].end - sym[i].begin), out);
    }
  }
}

}  // namespace failsafe
