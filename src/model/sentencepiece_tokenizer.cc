#include "model/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>

#include "model/tokenizer_config.h"

namespace failsafe {

SentencePieceTokenizer::SentencePieceTokenizer()
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

Result<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(
    const std::string& path) {
  auto t = std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer());
  const auto st = t->sp_->Load(path);
  if (!st.ok()) {
    return InvalidArgument("{}: not a SentencePiece model: {}", path, st.ToString());
  }
  t->num_pieces_ = t->vocab_size_ = t->sp_->GetPieceSize();
  for (int id = 0; id < t->num_pieces_; ++id) {
    if (t->sp_->IsControl(id) || t->sp_->IsUnknown(id)) t->AddSpecial(t->sp_->IdToPiece(id), id);
  }
  // Does SentencePiece drop the leading space of a run's first piece?
  for (int id = 0; id < t->num_pieces_; ++id) {
    const std::string& p = t->sp_->IdToPiece(id);
    if (t->sp_->IsControl(id) || t->sp_->IsUnknown(id) || t->sp_->IsByte(id) || p.size() <= 3 ||
        p.rfind("\xE2\x96\x81", 0) != 0) {
      continue;
    }
    std::string text;
    t->sp_->Decode(std::vector<int>{id}, &text).IgnoreError();
    t->strips_leading_space_ = text.empty() || text[0] != ' ';
    break;
  }
  t->bos_id_ = t->sp_->bos_id();
  t->eos_id_ = t->sp_->eos_id();
  return t;
}

void SentencePieceTokenizer::AddSpecial(const std::string& text, int id) {
  if (text.empty() || special_ids_.count(text)) return;
  special_ids_[text] = id;
  specials_.Add(text, id);
  if (id >= static_cast<int>(special_by_id_.size())) special_by_id_.resize(id + 1, false);
  special_by_id_[id] = true;
}

Status SentencePieceTokenizer::Configure(const TokenizerConfig& config) {
  add_bos_ = config.add_bos_token.value_or(true);
  add_eos_ = config.add_eos_token.value_or(false);
  for (const AddedTokenSpec& a : config.added_tokens_decoder) {
    if (a.id < num_pieces_) {
      if (sp_->IdToPiece(a.id) != a.content) {
        return InvalidArgument(
            "tokenizer_config.json: added token {} '{}' is '{}' in tokenizer.model", a.id,
            a.content, sp_->IdToPiece(a.id));
      }
    } else {
      extra_tokens_[a.id] = a.content;
      vocab_size_ = std::max(vocab_size_, a.id + 1);
    }
    if (a.special || a.id >= num_pieces_) AddSpecial(a.content, a.id);
  }
  for (const std::string& s : config.additional_special_tokens) {
    const int id = TokenId(s);
    if (id >= 0) AddSpecial(s, id);
  }
  if (config.bos_token && TokenId(*config.bos_token) >= 0) bos_id_ = TokenId(*config.bos_token);
  if (config.eos_token && TokenId(*config.eos_token) >= 0) eos_id_ = TokenId(*config.eos_token);
  return Status::Ok();
}

int SentencePieceTokenizer::TokenId(std::string_view token) const {
  auto it = special_ids_.find(std::string(token));
  if (it != special_ids_.end()) return it->second;
  const int id = sp_->PieceToId(absl::string_view(token.data(), token.size()));
  if (id >= 0 && id < num_pieces_ && sp_->IdToPiece(id) == token) return id;
  return -1;
}

bool SentencePieceTokenizer::IsSpecial(int id) const {
  if (id < 0 || id >= vocab_size_) return false;
  if (id >= num_pieces_) return true;
  return id < static_cast<int>(special_by_id_.size()) && special_by_id_[id];
}

std::vector<int> SentencePieceTokenizer::DoEncode(std::string_view text, bool add_special,
                                                  size_t max_tokens) const {
  std::vector<int> out;
  if (add_special && add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
  auto encode = [&](std::string_view piece) {
    if (piece.empty()) return;
    std::vector<int> ids;
    sp_->Encode(absl::string_view(piece.data(), piece.size()), &ids).IgnoreError();
    out.insert(out.end(), ids.begin(), ids.end());
  };
  for (const auto& p : specials_.Split(text)) {
    if (out.size() > max_tokens) return out;
    if (p.value >= 0) {
      out.push_back(p.value);
    } else {
      encode(text.substr(p.begin, p.end - p.begin));
    }
  }
  if (out.size() > max_tokens) return out;
  if (add_special && add_eos_ && eos_id_ >= 0) out.push_back(eos_id_);
  return out;
}

std::string SentencePieceTokenizer::Decode(const std::vector<int>& ids, bool skip_special) const {
  std::string out;
  std::vector<int> run;
  bool first = true;  // nothing decoded before this run
  auto flush = [&] {
    if (run.empty()) return;
    std::string text;
    sp_->Decode(run, &text).IgnoreError();
    // SentencePiece drops the dummy-prefix space of a run's first piece; only
    // the text's very first piece loses it (as a decoder over all tokens).
    const std::string& head = sp_->IdToPiece(run.front());
    if (!first && strips_leading_space_ && head.rfind("\xE2\x96\x81", 0) == 0)
      text.insert(text.begin(), ' ');
    out += text;
    first = false;
    run.clear();
  };
  for (int id : ids) {
    if (id < 0 || id >= vocab_size_) continue;
    const bool special = IsSpecial(id);
    if (!special) {
      run.push_back(id);
      continue;
    }
    flush();
    if (skip_special) continue;
    out += id < num_pieces_ ? sp_->IdToPiece(id) : extra_tokens_.at(id);
    first = false;
  }
  flush();
  return out;
}

std::vector<SentencePieceTokenizer::Piece> SentencePieceTokenizer::Pieces() const {
  std::vector<Piece> out(num_pieces_);
  for (int id = 0; id < num_pieces_; ++id) {
    Piece& p = out[id];
    p.text = sp_->IdToPiece(id);
    p.score = sp_->GetScore(id);
    p.kind = sp_->IsUnknown(id)   ? PieceKind::kUnknown
             : sp_->IsControl(id) ? PieceKind::kControl
             : sp_->IsByte(id)    ? PieceKind::kByte
             : sp_->IsUnused(id)  ? PieceKind::kUnused
                                  : PieceKind::kNormal;
  }
  return out;
}

}  // namespace failsafe
