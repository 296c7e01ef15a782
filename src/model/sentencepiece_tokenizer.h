// A SentencePiece tokenizer.model, read and run by libsentencepiece.
//
// Special tokens written in the text (the model's control and unknown pieces,
// and tokenizer_config.json's added tokens) are recognised first, leftmost-
// longest; every other stretch of text is encoded by SentencePiece on its own,
// as Hugging Face's sentencepiece-based (slow, legacy) tokenizers do. Text
// without special tokens encodes exactly as SentencePiece's Encode. Bytes
// reach SentencePiece as they are (it reads invalid UTF-8 as U+FFFD per byte).
// add_special prepends BOS (add_bos_token, default true) and appends EOS
// (add_eos_token, default false).
//
// Thread-safety: immutable after Load; libsentencepiece's encoders are const.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/token_matcher.h"
#include "model/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace failsafe {

class SentencePieceTokenizer : public Tokenizer {
 public:
  ~SentencePieceTokenizer() override;
  static Result<std::unique_ptr<SentencePieceTokenizer>> Load(const std::string& path);

  std::string Decode(const std::vector<int>& ids, bool skip_special = false) const override;
  int vocab_size() const override { return vocab_size_; }
  int TokenId(std::string_view token) const override;
  bool IsSpecial(int id) const override;

  // Every piece as tokenizer.json would list it: id -> (piece, score, kind).
  enum class PieceKind { kNormal, kUnknown, kControl, kByte, kUnused };
  struct Piece {
    std::string text;
    float score = 0;
    PieceKind kind = PieceKind::kNormal;
  };
  std::vector<Piece> Pieces() const;

 protected:
  Status Configure(const TokenizerConfig& config) override;
  std::vector<int> DoEncode(std::string_view text, bool add_special,
                            size_t max_tokens) const override;

 private:
  SentencePieceTokenizer();
  void AddSpecial(const std::string& text, int id);

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int vocab_size_ = 0;
  int num_pieces_ = 0;
  int eos_id_ = -1;
  bool add_bos_ = true, add_eos_ = false;
  bool strips_leading_space_ = false;  // Decode drops a run's leading "▁" (dummy prefix)
  std::unordered_map<std::string, int> special_ids_;  // text -> id, matched in text
  TokenMatcher specials_;                             // -> id
  std::vector<bool> special_by_id_;
  std::unordered_map<int, std::string> extra_tokens_;  // ids beyond the model's pieces
};

}  // namespace failsafe
