#include "model/hf_pre_tokenizer.h"

#include <algorithm>

#include "common/utf8.h"
#include "model/hf_json.h"
#include "model/hf_regex.h"

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

// Applies fn to every piece and concatenates what it returns.
template <typename Fn>
void MapPieces(std::vector<std::string>* pieces, Fn fn) {
  std::vector<std::string> out;
  out.reserve(pieces->size());
  for (std::string& p : *pieces) fn(std::move(p), &out);
  pieces->swap(out);
}

class ByteLevelPre : public HfPreTokenizer {
 public:
  bool add_prefix_space = false;
  std::unique_ptr<HfRegex> split;  // null: no regex split
  void Split(std::vector<std::string>* pieces, int) const override {
    MapPieces(pieces, [&](std::string p, std::vector<std::string>* out) {
      if (add_prefix_space && (p.empty() || p[0] != ' ')) p.insert(p.begin(), ' ');
      auto map = [&](std::string_view s) {
        std::string m;
        m.reserve(s.size() * 2);
        for (unsigned char c : s) AppendUtf8(ByteToCodePoint(c), &m);
        out->push_back(std::move(m));
      };
      if (!split) {
        map(p);
        return;
      }
      for (auto [b, e] : split->FindAll(p)) {
        if (e > b) map(std::string_view(p).substr(b, e - b));
      }
    });
  }
  bool SplitEach(std::string p, int section,
                 const std::function<bool(std::string&&)>& emit) const override {
    if (!split) return HfPreTokenizer::SplitEach(std::move(p), section, emit);
    if (add_prefix_space && (p.empty() || p[0] != ' ')) p.insert(p.begin(), ' ');
    bool go = true;
    split->ForEach(p, [&](size_t b, size_t e) {
      if (e == b) return true;
      std::string m;
      m.reserve((e - b) * 2);
      for (size_t i = b; i < e; ++i)
        AppendUtf8(ByteToCodePoint(static_cast<unsigned char>(p[i])), &m);
      return go = emit(std::move(m));
    });
    return go;
  }
};

// Splits on a pattern's matches, as Hugging Face's SplitDelimiterBehavior
// has it: Isolated, the gaps and the matches are pieces; Removed, only the
// gaps; MergedWithPrevious (MergedWithNext), a match joins the piece before
// (after) it unless that is a match too; Contiguous, adjacent matches are
// one piece. `invert`: the pattern matches the pieces, not the delimiters.
class SplitPre : public HfPreTokenizer {
 public:
  enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };
  std::unique_ptr<HfRegex> pattern;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;

  // The pieces of p as [begin, end) offsets.
  std::vector<std::pair<size_t, size_t>> Pieces(const std::string& p) const {
    struct Part {
      size_t b, e;
      bool match;
    };
    std::vector<Part> parts;
    size_t prev = 0;
    for (auto [b, e] : pattern->FindAll(p)) {
      if (e <= b) continue;
      if (b > prev) parts.push_back({prev, b, invert});
      parts.push_back({b, e, !invert});
      prev = std::max(prev, e);
    }
    if (prev < p.size()) parts.push_back({prev, p.size(), invert});
    std::vector<std::pair<size_t, size_t>> out;
    bool previous_match = false;
    switch (behavior) {
      case Behavior::kIsolated:
        for (const Part& x : parts) out.emplace_back(x.b, x.e);
        break;
      case Behavior::kRemoved:
        for (const Part& x : parts) {
          if (!x.match) out.emplace_back(x.b, x.e);
        }
        break;
      case Behavior::kMergedWithPrevious:
        for (const Part& x : parts) {
          if (x.match && !previous_match && !out.empty())
            out.back().second = x.e;
          else
            out.emplace_back(x.b, x.e);
          previous_match = x.match;
        }
        break;
      case Behavior::kMergedWithNext:
        for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
          if (it->match && !previous_match && !out.empty())
            out.back().first = it->b;
          else
            out.emplace_back(it->b, it->e);
          previous_match = it->match;
        }
        std::reverse(out.begin(), out.end());
        break;
      case Behavior::kContiguous:
        for (const Part& x : parts) {
          if (x.match && previous_match)
            out.back().second = x.e;
          else
            out.emplace_back(x.b, x.e);
          previous_match = x.match;
        }
        break;
    }
    return out;
  }
  bool simple() const {
    return !invert && (behavior == Behavior::kIsolated || behavior == Behavior::kRemoved);
  }

  void Split(std::vector<std::string>* pieces, int) const override {
    MapPieces(pieces, [&](std::string p, std::vector<std::string>* out) {
      for (auto [b, e] : Pieces(p)) out->push_back(p.substr(b, e - b));
    });
  }
  bool SplitEach(std::string p, int,
                 const std::function<bool(std::string&&)>& emit) const override {
    if (!simple()) {
      for (auto [b, e] : Pieces(p)) {
        if (!emit(p.substr(b, e - b))) return false;
      }
      return true;
    }
    const bool removed = behavior == Behavior::kRemoved;
    size_t prev = 0;
    bool go = true;
    pattern->ForEach(p, [&](size_t b, size_t e) {
      if (b > prev && !(go = emit(p.substr(prev, b - prev)))) return false;
      if (e > b && !removed && !(go = emit(p.substr(b, e - b)))) return false;
      prev = std::max(prev, e);
      return true;
    });
    if (go && prev < p.size()) go = emit(p.substr(prev));
    return go;
  }
};

class MetaspacePre : public HfPreTokenizer {
 public:
  using Scheme = MetaspaceSettings::Scheme;
  std::string replacement = "\u2581";
  Scheme scheme = Scheme::kAlways;
  bool split = false;
  void Split(std::vector<std::string>* pieces, int section) const override {
    MapPieces(pieces, [&](std::string p, std::vector<std::string>* out) {
      std::string r;
      r.reserve(p.size() + replacement.size());
      for (char c : p) {
        if (c == ' ')
          r += replacement;
        else
          r.push_back(c);
      }
      const bool prepend = scheme == Scheme::kAlways || (scheme == Scheme::kFirst && section == 0);
      if (prepend && r.compare(0, replacement.size(), replacement) != 0) r = replacement + r;
      if (!split) {
        out->push_back(std::move(r));
        return;
      }
      // Every replacement character starts a new word (merged with the next).
      size_t start = 0;
      for (size_t at = r.find(replacement, 1); at != std::string::npos;
           at = r.find(replacement, at + replacement.size())) {
        out->push_back(r.substr(start, at - start));
        start = at;
      }
      if (start < r.size()) out->push_back(r.substr(start));
    });
  }
};

class DigitsPre : public HfPreTokenizer {
 public:
  bool individual = false;
  void Split(std::vector<std::string>* pieces, int) const override {
    MapPieces(pieces, [&](std::string p, std::vector<std::string>* out) {
      size_t i = 0;
      while (i < p.size()) {
        const bool digit = p[i] >= '0' && p[i] <= '9';
        size_t j = i + 1;
        if (!digit || !individual) {
          while (j < p.size() && (p[j] >= '0' && p[j] <= '9') == digit) ++j;
        }
        out->push_back(p.substr(i, j - i));
        i = j;
      }
    });
  }
};

class SequencePre : public HfPreTokenizer {
 public:
  std::vector<std::unique_ptr<HfPreTokenizer>> parts;
  void Split(std::vector<std::string>* pieces, int section) const override {
    for (const auto& p : parts) p->Split(pieces, section);
  }
  // Every part maps each piece on its own, so the later parts may run on the
  // first part's words one at a time.
  bool SplitEach(std::string piece, int section,
                 const std::function<bool(std::string&&)>& emit) const override {
    if (parts.empty()) return emit(std::move(piece));
    return parts[0]->SplitEach(std::move(piece), section, [&](std::string&& word) {
      std::vector<std::string> words{std::move(word)};
      for (size_t k = 1; k < parts.size(); ++k) parts[k]->Split(&words, section);
      for (std::string& w : words) {
        if (!emit(std::move(w))) return false;
      }
      return true;
    });
  }
};

}  // namespace

bool HfPreTokenizer::SplitEach(std::string piece, int section_index,
                               const std::function<bool(std::string&&)>& emit) const {
  std::vector<std::string> words{std::move(piece)};
  Split(&words, section_index);
  for (std::string& w : words) {
    if (!emit(std::move(w))) return false;
  }
  return true;
}

Result<MetaspaceSettings> ParseMetaspace(const json& j, const std::string& field) {
  MetaspaceSettings m;
  FS_ASSIGN_OR_RETURN(m.replacement, OptString(j, "replacement", "\u2581", field));
  if (m.replacement.empty())
    return InvalidArgument("field '{}.replacement' must not be empty", field);
  FS_ASSIGN_OR_RETURN(bool add_prefix, OptBool(j, "add_prefix_space", true, field));
  FS_ASSIGN_OR_RETURN(std::string scheme,
                      OptString(j, "prepend_scheme", add_prefix ? "always" : "never", field));
  if (scheme == "always") {
    m.scheme = MetaspaceSettings::Scheme::kAlways;
  } else if (scheme == "first") {
    m.scheme = MetaspaceSettings::Scheme::kFirst;
  } else if (scheme == "never") {
    m.scheme = MetaspaceSettings::Scheme::kNever;
  } else {
    return InvalidArgument("field '{}.prepend_scheme': unknown '{}' (always, first, never)", field,
                           scheme);
  }
  return m;
}

int ByteToCodePoint(unsigned char b) { return Bytes().to_cp[b]; }
int CodePointToByte(int cp) { return cp >= 0 && cp < 512 ? Bytes().from_cp[cp] : -1; }

Result<std::unique_ptr<HfPreTokenizer>> HfPreTokenizer::Parse(const json& j,
                                                              const std::string& field) {
  FS_ASSIGN_OR_RETURN(const std::string type, ComponentType(j, field));
  if (type == "Sequence") {
    auto s = std::make_unique<SequencePre>();
    FS_ASSIGN_OR_RETURN(s->parts, ParseParts<HfPreTokenizer>(j, "pretokenizers", field, Parse));
    return std::unique_ptr<HfPreTokenizer>(std::move(s));
  }
  if (type == "ByteLevel") {
    auto b = std::make_unique<ByteLevelPre>();
    FS_ASSIGN_OR_RETURN(b->add_prefix_space, OptBool(j, "add_prefix_space", false, field));
    FS_ASSIGN_OR_RETURN(bool use_regex, OptBool(j, "use_regex", true, field));
    if (use_regex) {
      FS_ASSIGN_OR_RETURN(b->split, HfRegex::Compile(kGpt2Pattern, field));
    }
    return std::unique_ptr<HfPreTokenizer>(std::move(b));
  }
  if (type == "Split") {
    auto s = std::make_unique<SplitPre>();
    FS_ASSIGN_OR_RETURN(s->pattern, ParseHfPattern(j.contains("pattern") ? j["pattern"] : json(),
                                                   field + ".pattern"));
    FS_ASSIGN_OR_RETURN(std::string behavior, OptString(j, "behavior", "Isolated", field));
    using B = SplitPre::Behavior;
    static const std::pair<const char*, B> kBehaviors[] = {
        {"Isolated", B::kIsolated},
        {"Removed", B::kRemoved},
        {"MergedWithPrevious", B::kMergedWithPrevious},
        {"MergedWithNext", B::kMergedWithNext},
        {"Contiguous", B::kContiguous}};
    const auto* it = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                                  [&](const auto& b) { return behavior == b.first; });
    if (it == std::end(kBehaviors)) {
      return InvalidArgument(
          "field '{}.behavior': \"{}\" is not supported (Isolated, Removed, MergedWithPrevious, "
          "MergedWithNext, Contiguous)",
          field, behavior);
    }
    s->behavior = it->second;
    FS_ASSIGN_OR_RETURN(s->invert, OptBool(j, "invert", false, field));
    return std::unique_ptr<HfPreTokenizer>(std::move(s));
  }
  if (type == "Metaspace") {
    auto m = std::make_unique<MetaspacePre>();
    FS_ASSIGN_OR_RETURN(MetaspaceSettings settings, ParseMetaspace(j, field));
    m->replacement = settings.replacement;
    m->scheme = settings.scheme;
    FS_ASSIGN_OR_RETURN(m->split, OptBool(j, "split", true, field));
    return std::unique_ptr<HfPreTokenizer>(std::move(m));
  }
  if (type == "Digits") {
    auto d = std::make_unique<DigitsPre>();
    FS_ASSIGN_OR_RETURN(d->individual, OptBool(j, "individual_digits", false, field));
    return std::unique_ptr<HfPreTokenizer>(std::move(d));
  }
  return InvalidArgument("field '{}': unsupported pre-tokenizer type '{}'", field, type);
}

}  // namespace failsafe
