#include "model/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>

#include "model/file_util.h"

namespace failsafe {

using nlohmann::json;

namespace {

const char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct ByteMap {
  int to_cp[256];
  int from_cp[512];
  ByteMap() {
    std::fill(std::begin(from_cp), std::end(from_cp), -1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? b : 256 + n++;
      from_cp[to_cp[b]] = b;
    }
  }
};
const ByteMap& Bytes() {
  static const ByteMap m;
  return m;
}

// Decodes one UTF-8 code point at s[*i]; returns -1 (and advances 1) if invalid.
int NextCodePoint(std::string_view s, size_t* i) {
  unsigned char c = static_cast<unsigned char>(s[*i]);
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || *i + len > s.size()) {
    ++*i;
    return -1;
  }
  int cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
  for (int k = 1; k < len; ++k) {
    unsigned char d = static_cast<unsigned char>(s[*i + k]);
    if ((d >> 6) != 2) {
      ++*i;
      return -1;
    }
    cp = (cp << 6) | (d & 0x3f);
  }
  *i += len;
  return cp;
}

}  // namespace

int ByteToCodePoint(unsigned char b) { return Bytes().to_cp[b]; }
int CodePointToByte(int cp) { return cp >= 0 && cp < 512 ? Bytes().from_cp[cp] : -1; }

void AppendUtf8(int cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// A compiled PCRE2 pattern (UTF, Unicode properties, invalid UTF tolerated).
class Tokenizer::Regex {
 public:
  static Result<std::unique_ptr<Regex>> Compile(const std::string& pattern,
                                                const std::string& source) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return InvalidArgument("{}: field 'pre_tokenizer': regex does not compile at offset {}: {}",
                             source, off, reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
    auto r = std::unique_ptr<Regex>(new Regex());
    r->code_ = code;
    return r;
  }
  ~Regex() { pcre2_code_free(code_); }

  // Calls fn(begin, end) for every piece: matches and the gaps between them,
  // until fn returns false.
  template <typename Fn>
  void Split(std::string_view text, Fn fn) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = 0, gap_start = 0;
    while (pos <= text.size()) {
      int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, 0,
                           md, nullptr);
      if (rc < 0) break;
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (e == b) {  // empty match: step over one character
        pos = b + 1;
        while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
        continue;
      }
      if (b > gap_start && !fn(gap_start, b)) {
        gap_start = text.size();
        break;
      }
      if (!fn(b, e)) {
        gap_start = text.size();
        break;
      }
      pos = gap_start = e;
    }
    if (gap_start < text.size()) fn(gap_start, text.size());
    pcre2_match_data_free(md);
  }

 private:
  Regex() = default;
  pcre2_code* code_ = nullptr;
};

Tokenizer::Tokenizer() { std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1); }
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  FS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return Parse(text, path);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Parse(std::string_view text,
                                                    const std::string& source) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("{}: not a JSON object", source);
  auto t = std::unique_ptr<Tokenizer>(new Tokenizer());

  // model
  auto model = j.find("model");
  if (model == j.end() || !model->is_object())
    return InvalidArgument("{}: field 'model' is missing", source);
  if (!model->contains("type") || (*model)["type"] != "BPE") {
    return InvalidArgument("{}: field 'model.type' must be \"BPE\"", source);
  }
  if (model->contains("byte_fallback") && (*model)["byte_fallback"].is_boolean() &&
      (*model)["byte_fallback"]) {
    return InvalidArgument(
        "{}: field 'model.byte_fallback': SentencePiece-style BPE is not supported", source);
  }
  if (model->contains("ignore_merges") && (*model)["ignore_merges"].is_boolean()) {
    t->ignore_merges_ = (*model)["ignore_merges"];
  }
  auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object())
    return InvalidArgument("{}: field 'model.vocab' is missing", source);
  int max_id = -1;
  for (auto& [tok, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 24)) {
      return InvalidArgument("{}: field 'model.vocab': token '{}' has an invalid id", source, tok);
    }
    max_id = std::max(max_id, id.get<int>());
  }
  auto added = j.find("added_tokens");
  if (added != j.end() && !added->is_null()) {
    if (!added->is_array())
      return InvalidArgument("{}: field 'added_tokens' must be a list", source);
    for (auto& a : *added) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string() || a["id"].get<int64_t>() < 0 ||
          a["id"].get<int64_t>() > (1 << 24)) {
        return InvalidArgument(
            "{}: field 'added_tokens': each entry needs an integer 'id' and a string 'content'",
            source);
      }
      if (a["content"].get<std::string>().empty()) {
        return InvalidArgument("{}: field 'added_tokens': empty content", source);
      }
      max_id = std::max(max_id, a["id"].get<int>());
    }
  }
  t->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  t->added_by_id_.assign(static_cast<size_t>(max_id + 1), -1);
  std::vector<bool> used(static_cast<size_t>(max_id + 1), false);
  for (auto& [tok, id] : vocab->items()) {
    const int i = id.get<int>();
    if (used[i])
      return InvalidArgument("{}: field 'model.vocab': id {} is used by two tokens", source, i);
    used[i] = true;
    t->vocab_[tok] = i;
    t->id_to_token_[i] = tok;
  }
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(ByteToCodePoint(static_cast<unsigned char>(b)), &s);
    auto it = t->vocab_.find(s);
    if (it == t->vocab_.end()) {
      return InvalidArgument(
          "{}: field 'model.vocab': byte-level symbol for byte 0x{:02x} is missing", source, b);
    }
    t->byte_ids_[b] = it->second;
  }

  // merges: ["a b", ...] or [["a", "b"], ...]
  auto merges = model->find("merges");
  if (merges == model->end() || !merges->is_array())
    return InvalidArgument("{}: field 'model.merges' is missing", source);
  int rank = 0;
  for (auto& m : *merges) {
    std::string a, b;
    if (m.is_string()) {
      std::string s = m.get<std::string>();
      size_t sp = s.find(' ', 1);
      if (sp == std::string::npos)
        return InvalidArgument("{}: field 'model.merges[{}]': '{}' is not 'a b'", source, rank, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0];
      b = m[1];
    } else {
      return InvalidArgument("{}: field 'model.merges[{}]' is malformed", source, rank);
    }
    auto ia = t->vocab_.find(a), ib = t->vocab_.find(b), im = t->vocab_.find(a + b);
    if (ia == t->vocab_.end() || ib == t->vocab_.end() || im == t->vocab_.end()) {
      return InvalidArgument(
          "{}: field 'model.merges[{}]': '{} {}' uses a token not in the vocabulary", source, rank,
          a, b);
    }
    uint64_t key = static_cast<uint64_t>(ia->second) << 32 | static_cast<uint32_t>(ib->second);
    t->merges_.emplace(key, MergeInfo{rank, im->second});
    ++rank;
  }

  if (added != j.end() && added->is_array()) {
    for (auto& a : *added) {
      AddedToken at{a["id"].get<int>(), a["content"].get<std::string>(),
                    a.contains("special") && a["special"].is_boolean() && a["special"].get<bool>()};
      // An added token may repeat a vocabulary token (same id, same text), nothing else.
      if (t->added_by_id_[at.id] >= 0 || (used[at.id] && t->id_to_token_[at.id] != at.content)) {
        return InvalidArgument("{}: field 'added_tokens': id {} is already used", source, at.id);
      }
      auto existing = t->vocab_.find(at.content);
      if (existing != t->vocab_.end() && existing->second != at.id) {
        return InvalidArgument("{}: field 'added_tokens': '{}' already has id {}", source,
                               at.content, existing->second);
      }
      t->added_by_id_[at.id] = 0;  // marks the id; set to the real index below
      t->id_to_token_[at.id] = at.content;
      t->vocab_[at.content] = at.id;
      t->added_.push_back(at);
    }
    std::stable_sort(t->added_.begin(), t->added_.end(),
                     [](const AddedToken& x, const AddedToken& y) {
                       return x.content.size() > y.content.size();
                     });
    for (size_t i = 0; i < t->added_.size(); ++i) {
      t->added_by_id_[t->added_[i].id] = static_cast<int>(i);
      if (!t->added_[i].content.empty())
        t->added_first_byte_[static_cast<unsigned char>(t->added_[i].content[0])] = true;
    }
  }

  // normalizer: none supported
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    return InvalidArgument(
        "{}: field 'normalizer': normalizers are not supported for byte-level BPE", source);
  }

  // pre_tokenizer
  std::string pattern;
  bool have_byte_level = false;
  auto handle_pre = [&](const json& p, const std::string& field) -> Status {
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
      return InvalidArgument("{}: field '{}' is malformed", source, field);
    }
    std::string type = p["type"];
    if (type == "ByteLevel") {
      have_byte_level = true;
      if (p.contains("add_prefix_space") && p["add_prefix_space"].is_boolean())
        t->add_prefix_space_ = p["add_prefix_space"];
      bool use_regex =
          !p.contains("use_regex") || !p["use_regex"].is_boolean() || p["use_regex"].get<bool>();
      if (use_regex) {
        if (!pattern.empty())
          return InvalidArgument("{}: field '{}': two split patterns", source, field);
        pattern = kGpt2Pattern;
      }
    } else if (type == "Split") {
      if (!p.contains("pattern") || !p["pattern"].is_object() || !p["pattern"].contains("Regex") ||
          !p["pattern"]["Regex"].is_string()) {
        return InvalidArgument("{}: field '{}.pattern.Regex' is missing", source, field);
      }
      if (p.contains("behavior") && p["behavior"] != "Isolated") {
        return InvalidArgument("{}: field '{}.behavior': only \"Isolated\" is supported", source,
                               field);
      }
      if (p.contains("invert") && p["invert"].is_boolean() && p["invert"].get<bool>()) {
        return InvalidArgument("{}: field '{}.invert': inverted splits are not supported", source,
                               field);
      }
      if (!pattern.empty())
        return InvalidArgument("{}: field '{}': two split patterns", source, field);
      pattern = p["pattern"]["Regex"];
    } else {
      return InvalidArgument("{}: field '{}': unsupported pre-tokenizer type '{}'", source, field,
                             type);
    }
    return Status::Ok();
  };
  auto pre = j.find("pre_tokenizer");
  if (pre == j.end() || pre->is_null())
    return InvalidArgument("{}: field 'pre_tokenizer' is missing", source);
  if (pre->is_object() && pre->contains("type") && (*pre)["type"] == "Sequence") {
    if (!pre->contains("pretokenizers") || !(*pre)["pretokenizers"].is_array()) {
      return InvalidArgument("{}: field 'pre_tokenizer.pretokenizers' is missing", source);
    }
    int i = 0;
    for (auto& p : (*pre)["pretokenizers"]) {
      FS_RETURN_IF_ERROR(handle_pre(p, "pre_tokenizer.pretokenizers[" + std::to_string(i++) + "]"));
    }
  } else {
    FS_RETURN_IF_ERROR(handle_pre(*pre, "pre_tokenizer"));
  }
  if (!have_byte_level)
    return InvalidArgument("{}: field 'pre_tokenizer': a ByteLevel pre-tokenizer is required",
                           source);
  if (pattern.empty())
    return InvalidArgument("{}: field 'pre_tokenizer': no split pattern", source);
  FS_ASSIGN_OR_RETURN(t->split_, Regex::Compile(pattern, source));

  // decoder
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    auto& d = j["decoder"];
    if (!d.is_object() || !d.contains("type") || d["type"] != "ByteLevel") {
      return InvalidArgument("{}: field 'decoder': only the ByteLevel decoder is supported",
                             source);
    }
  }

  // post_processor: TemplateProcessing's special tokens around sequence A.
  auto post = j.find("post_processor");
  if (post != j.end() && post->is_object()) {
    const json* tp = nullptr;
    if ((*post)["type"] == "TemplateProcessing") tp = &*post;
    if ((*post)["type"] == "Sequence" && post->contains("processors") &&
        (*post)["processors"].is_array()) {
      for (auto& p : (*post)["processors"]) {
        if (p.is_object() && p["type"] == "TemplateProcessing") tp = &p;
      }
    }
    if (tp && tp->contains("single") && (*tp)["single"].is_array()) {
      bool after = false;
      for (auto& piece : (*tp)["single"]) {
        if (piece.contains("Sequence")) {
          after = true;
        } else if (piece.contains("SpecialToken") && piece["SpecialToken"].contains("id") &&
                   piece["SpecialToken"]["id"].is_string()) {
          int id = t->TokenId(piece["SpecialToken"]["id"].get<std::string>());
          if (id < 0)
            return InvalidArgument("{}: field 'post_processor': unknown special token", source);
          (after ? t->suffix_ids_ : t->prefix_ids_).push_back(id);
        }
      }
    }
  }
  if (!t->prefix_ids_.empty()) t->bos_id_ = t->prefix_ids_.front();
  return t;
}

int Tokenizer::TokenId(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? -1 : it->second;
}

bool Tokenizer::IsSpecial(int id) const {
  if (id < 0 || id >= static_cast<int>(added_by_id_.size()) || added_by_id_[id] < 0) return false;
  return added_[added_by_id_[id]].special;
}

std::vector<int> Tokenizer::Encode(std::string_view text, bool add_special,
                                   size_t max_tokens) const {
  std::vector<int> out;
  if (add_special) out = prefix_ids_;
  // Added tokens are matched in the raw text first, longest first.
  size_t chunk_start = 0;
  for (size_t i = 0; i < text.size();) {
    if (!added_first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const AddedToken* hit = nullptr;
    for (auto& a : added_) {
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > chunk_start) EncodeChunk(text.substr(chunk_start, i - chunk_start), &out, max_tokens);
    if (out.size() > max_tokens) return out;
    out.push_back(hit->id);
    if (out.size() > max_tokens) return out;
    i += hit->content.size();
    chunk_start = i;
  }
  if (chunk_start < text.size()) EncodeChunk(text.substr(chunk_start), &out, max_tokens);
  if (out.size() > max_tokens) return out;
  if (add_special) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

void Tokenizer::EncodeChunk(std::string_view text, std::vector<int>* out, size_t max_tokens) const {
  std::string buf;
  if (add_prefix_space_ && !text.empty() && text[0] != ' ') {
    buf = " ";
    buf += text;
    text = buf;
  }
  split_->Split(text, [&](size_t b, size_t e) {
    EncodeWord(text.substr(b, e - b), out);
    return out->size() <= max_tokens;
  });
}

void Tokenizer::EncodeWord(std::string_view word, std::vector<int>* out) const {
  if (ignore_merges_) {
    std::string mapped;
    for (unsigned char c : word) AppendUtf8(ByteToCodePoint(c), &mapped);
    auto it = vocab_.find(mapped);
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  // Merge pairs lowest rank first (leftmost on ties) over a linked list of
  // symbols with a heap of candidate pairs: O(n log n) in the word length.
  struct Sym {
    int id, prev, next;
  };
  std::vector<Sym> sym(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    sym[i] = {byte_ids_[static_cast<unsigned char>(word[i])], static_cast<int>(i) - 1,
              static_cast<int>(i) + 1};
  }
  if (!sym.empty()) sym.back().next = -1;
  struct Cand {
    int rank, left, left_id, right_id, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int left) {
    if (left < 0 || sym[left].next < 0) return;
    int right = sym[left].next;
    auto it = merges_.find(static_cast<uint64_t>(sym[left].id) << 32 |
                           static_cast<uint32_t>(sym[right].id));
    if (it != merges_.end())
      heap.push({it->second.rank, left, sym[left].id, sym[right].id, it->second.merged});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) consider(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Sym& l = sym[c.left];
    if (l.id != c.left_id || l.next < 0 || sym[l.next].id != c.right_id) continue;  // stale
    int right = l.next;
    l.id = c.merged;
    l.next = sym[right].next;
    if (l.next >= 0) sym[l.next].prev = c.left;
    sym[right].id = -1;
    consider(l.prev);
    consider(c.left);
  }
  for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
}

std::string Tokenizer::DecodeOne(int id, bool skip_special) const {
  std::string out;
  if (id < 0 || id >= static_cast<int>(id_to_token_.size())) return out;
  if (added_by_id_[id] >= 0) {
    const AddedToken& a = added_[added_by_id_[id]];
    if (!(skip_special && a.special)) out = a.content;
    return out;
  }
  const std::string& tok = id_to_token_[id];
  for (size_t i = 0; i < tok.size();) {
    int cp = NextCodePoint(tok, &i);
    int b = CodePointToByte(cp);
    if (b >= 0) out.push_back(static_cast<char>(b));
  }
  return out;
}

std::string Tokenizer::Decode(const std::vector<int>& ids, bool skip_special) const {
  std::string out;
  for (int id : ids) out += DecodeOne(id, skip_special);
  return out;
}

}  // namespace failsafe
